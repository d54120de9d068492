"""Run a waystation worker from a checkout: `python worker.py` does what `ws worker` does.

The code lives in the package (waystation/worker/); this file keeps the layout of
Temporal's samples, where a worker script sits beside the workflows and activities.
"""

from waystation.worker import run

if __name__ == "__main__":
    run()
