"""Which version of the workers' code this is, in Temporal's Worker Deployment: the
deployment's name and the build id (by default derived from the workflow code itself, so
two builds whose workflow code differs never share an id, and a build whose workflow code
did not change keeps its id whatever else changed)."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from temporalio.common import WorkerDeploymentVersion

import waystation.workflows
from waystation.settings import Settings

# How many hex digits of the workflow code's hash a build id carries.
_HASH_DIGITS = 12


@cache
def code_build_id() -> str:
    """`<package version>+<hash of waystation/workflows/**/*.py>`, e.g. `0.1.0+3f2a9c1b7d4e`."""
    root = Path(waystation.workflows.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    try:
        package = version("waystation")
    except PackageNotFoundError:  # a checkout used without installing it
        package = "0.0.0"
    return f"{package}+{digest.hexdigest()[:_HASH_DIGITS]}"


def worker_version(settings: Settings) -> WorkerDeploymentVersion:
    """The version a worker of these settings joins its deployment as."""
    return WorkerDeploymentVersion(
        deployment_name=settings.worker_deployment,
        build_id=settings.build_id or code_build_id(),
    )
