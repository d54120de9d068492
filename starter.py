"""Start and drive agent tasks from a checkout: `python starter.py ARGS` is `ws ARGS`.

The code lives in the package (waystation/cli/); this file keeps the layout of
Temporal's samples, where a starter script sits beside the workflows and activities.
"""

from waystation.cli.starter import cli

if __name__ == "__main__":
    cli()
