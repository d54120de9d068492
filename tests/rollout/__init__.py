"""Builds of the workflow code for the roll-out tests (tests/test_rollout.py): version 2,
which cannot replay version 1's histories, and version 1.1, a compatible change behind
`workflow.patched`; each served by a real worker process (`python -m tests.rollout.…`)."""
