"""Which version of the workers' code this is, in Temporal's Worker Deployment: the
deployment's name and the build id (by default derived from the workflow code itself, so
two builds whose workflow code differs never share an id, and a build whose workflow code
did not change keeps its id whatever else changed)."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from temporalio.api.workflowservice.v1 import SetWorkerDeploymentCurrentVersionRequest
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion

import waystation.workflows
from waystation.settings import Settings

# How many hex digits of the workflow code's hash a build id carries.
_HASH_DIGITS = 12


@cache
def code_build_id() -> str:
    """`<package version>+<hash>`, e.g. `0.1.0+3f2a9c1b7d4e`: the hash of the code a replay
    runs (waystation/workflows/**/*.py and the two modules they import, vocabulary.py and
    prices.py) and of the Temporal SDK's version, whose workflow runtime replays it too."""
    package_root = Path(waystation.workflows.__file__).parent.parent
    sources = [
        *sorted((package_root / "workflows").rglob("*.py")),
        package_root / "vocabulary.py",
        package_root / "prices.py",
    ]
    digest = hashlib.sha256(f"temporalio {_version_of('temporalio')}\0".encode())
    for path in sources:
        digest.update(path.relative_to(package_root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return f"{_version_of('waystation')}+{digest.hexdigest()[:_HASH_DIGITS]}"


def _version_of(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:  # a checkout used without installing it
        return "0.0.0"


def worker_version(settings: Settings) -> WorkerDeploymentVersion:
    """The version a worker of these settings joins its deployment as."""
    return WorkerDeploymentVersion(
        deployment_name=settings.worker_deployment,
        build_id=settings.build_id or code_build_id(),
    )


async def make_current(
    client: Client,
    deployment: str,
    build_id: str,
    conflict_token: bytes,
    identity: str | None = None,
) -> None:
    """Make `build_id` the deployment's current version (the token of the description the
    decision was made on: a change meanwhile refuses it)."""
    await client.workflow_service.set_worker_deployment_current_version(
        SetWorkerDeploymentCurrentVersionRequest(
            namespace=client.namespace,
            deployment_name=deployment,
            build_id=build_id,
            conflict_token=conflict_token,
            identity=identity or client.identity,
        )
    )
