"""Which workers in Temporal's poller list still serve: a command's own worker counts only
while its process runs on this machine, whether or not it names its storage."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from waystation.activities.storage.deployment import worker_identity
from waystation.client.pollers import CLI_WORKER_PREFIX, cli_worker_identity, serving


def test_a_commands_worker_counts_while_its_process_runs_with_or_without_its_storage() -> None:
    mine = cli_worker_identity()
    for identity in (mine, worker_identity(mine, "sqlite")):
        assert serving(identity, this_process=True)
        assert not serving(identity, this_process=False)
    here = socket.gethostname()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = f"{CLI_WORKER_PREFIX}{sleeper.pid}@{here}"
        assert serving(alive, this_process=False)
        assert serving(worker_identity(alive, "postgresql"), this_process=False)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not serving(worker_identity(alive, "postgresql"), this_process=False)
    elsewhere = f"{CLI_WORKER_PREFIX}{os.getpid()}@another-machine"
    assert not serving(worker_identity(elsewhere, "sqlite"), this_process=False)
    assert serving(worker_identity(f"{os.getpid()}@another-machine", "sqlite"), this_process=False)
