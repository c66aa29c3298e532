"""The error hierarchy. Every message says what went wrong and what to do next.

CheckpointStoreError
├── AgentCheckpointCorruptionError        a record is missing, malformed or unreadable
│   ├── CheckpointNotFoundError           no checkpoint where one was expected
│   ├── EffectIntegrityError              a stored effect output fails its hash
│   └── DecryptionError                   wrong or missing key, tampered ciphertext
├── InvalidIdentifierError (ValueError)   an id or key the store cannot accept
├── ValueTooLargeError (ValueError)       a value above the backend's declared maximum
├── CheckpointEncodeError (ValueError)    a value that is not JSON (NaN, bytes, ...)
├── BackendNotFoundError (LookupError)    no backend for a URL scheme
│   └── MissingDependencyError            the backend exists, its driver is not installed
├── PluginLoadError                       a plugin failed to load (strict mode)
├── StoreUnavailableError (ConnectionError)  the server cannot be reached or failed
├── StaleWriterError                      a newer writer owns the run (fencing)
├── CheckpointFlushError                  the write-behind writer could not make writes durable
├── EffectConflictError                   a tool call was replayed with different input
└── EffectInDoubtError                    a tool started but its result was never recorded
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "AgentCheckpointCorruptionError",
    "BackendNotFoundError",
    "CheckpointEncodeError",
    "CheckpointFlushError",
    "CheckpointNotFoundError",
    "CheckpointStoreError",
    "DecryptionError",
    "EffectConflictError",
    "EffectInDoubtError",
    "EffectIntegrityError",
    "InvalidIdentifierError",
    "MissingDependencyError",
    "PluginLoadError",
    "StaleWriterError",
    "StoreUnavailableError",
    "ValueTooLargeError",
]


class CheckpointStoreError(Exception):
    """Base class of every error this library raises on purpose."""


class AgentCheckpointCorruptionError(CheckpointStoreError):
    """A checkpoint record is missing, malformed, truncated or otherwise unusable.

    The name matches AFK's error so code written against AFK catches ours. The
    runner must not attempt partial recovery from it: the record is never
    returned as garbage.
    """


class CheckpointNotFoundError(AgentCheckpointCorruptionError):
    """No checkpoint exists where one was expected (for example, resuming an unknown run)."""


class EffectIntegrityError(AgentCheckpointCorruptionError):
    """A recorded tool effect does not match its stored output hash (tampered or corrupted)."""


class DecryptionError(AgentCheckpointCorruptionError):
    """An encrypted value could not be decrypted: wrong key, missing key id, or tampering."""


class InvalidIdentifierError(CheckpointStoreError, ValueError):
    """An id or key the store cannot accept (empty, contains ':', not valid Unicode, too long)."""


class ValueTooLargeError(CheckpointStoreError, ValueError):
    """An encoded value is larger than the backend declares it can store."""


class CheckpointEncodeError(CheckpointStoreError, ValueError):
    """A value cannot be stored as JSON (NaN or Infinity, non-string keys, unsupported types)."""


class BackendNotFoundError(CheckpointStoreError, LookupError):
    """No installed backend handles the URL's scheme."""


class MissingDependencyError(BackendNotFoundError):
    """The backend for this scheme is registered but its driver is not installed."""


class PluginLoadError(CheckpointStoreError):
    """A plugin failed to load or register (raised only when strict plugin loading is on)."""


class StoreUnavailableError(CheckpointStoreError, ConnectionError):
    """The storage server cannot be reached, timed out, or failed the operation.

    The message carries the store's URL with any password redacted; retrying
    later is safe because a commit either happened whole or not at all.
    """


class StaleWriterError(CheckpointStoreError):
    """A newer writer owns this run: the commit was fenced out and changed nothing.

    Raised when a checkpoint's seq is not above the run's stored head, which
    happens when another process resumed (claimed) the run after this one.
    Stop writing to the run; load it again to continue from its newest state.
    """


class CheckpointFlushError(CheckpointStoreError):
    """Submitted checkpoint writes could not be made durable (failed or timed out).

    ``failures`` lists what failed (``checkpoint_stores.writer.WriteFailure``
    objects: run, seq, phase, the error, attempts).
    """

    def __init__(self, message: str, failures: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.failures: tuple[Any, ...] = tuple(failures)


class EffectConflictError(CheckpointStoreError):
    """A tool call id was recorded with different input: replaying it would be wrong."""


class EffectInDoubtError(CheckpointStoreError):
    """A tool call started (intent recorded) but no result was recorded.

    The outside effect may or may not have happened. Check it with the
    idempotency key the tool was given, then record the result or re-execute.
    """
