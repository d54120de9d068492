"""The storage of a deployment: the idempotency ledger, a content-addressed blob store and
the deployment's identity. SQLite in the data directory for one machine; PostgreSQL
(WAYSTATION_DATABASE_URL) when workers on several machines serve one task queue."""

from waystation.activities.storage.backend import LedgerEntry
from waystation.activities.storage.blobs import BlobStore, digest_of
from waystation.activities.storage.errors import (
    ClaimLostError,
    DeploymentMismatchError,
    SchemaTooNewError,
    StorageError,
    StorageUnavailableError,
)
from waystation.activities.storage.ledger import Ledger, LedgerAttempt
from waystation.activities.storage.storage import PruneReport, Storage, open_storage

__all__ = [
    "BlobStore",
    "ClaimLostError",
    "DeploymentMismatchError",
    "Ledger",
    "LedgerAttempt",
    "LedgerEntry",
    "PruneReport",
    "SchemaTooNewError",
    "Storage",
    "StorageError",
    "StorageUnavailableError",
    "digest_of",
    "open_storage",
]
