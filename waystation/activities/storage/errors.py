"""What can go wrong with the storage, as exceptions a worker or a tool can tell apart."""

from __future__ import annotations


class StorageError(Exception):
    """The storage cannot do what was asked; the message says why in one sentence."""


class StorageUnavailableError(StorageError):
    """The database cannot be reached (or stayed unreachable longer than a retry waits)."""


class SchemaTooNewError(StorageError):
    """The database was migrated by a newer waystation than this one."""


class ClaimLostError(StorageError):
    """This attempt's claim on an idempotency key expired and another attempt took it over."""


class DeploymentMismatchError(StorageError):
    """A worker's workspace or host does not fit the deployment it would join."""
