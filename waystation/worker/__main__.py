"""`python -m waystation.worker`: what `ws worker` does."""

from waystation.worker import run

run()
