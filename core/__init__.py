"""checkpoint-stores: durable, resumable agent-run checkpoints on the storage you already run.

>>> from checkpoint_stores import open_store
>>> store = open_store("file:///tmp/runs")   # or redis://, postgresql+asyncpg://, s3://, ...

The public surface is this module's ``__all__``; everything else is private.
"""

from __future__ import annotations

from checkpoint_stores.codec import Cipher, Codec
from checkpoint_stores.errors import (
    AgentCheckpointCorruptionError,
    BackendNotFoundError,
    CheckpointEncodeError,
    CheckpointFlushError,
    CheckpointNotFoundError,
    CheckpointStoreError,
    DecryptionError,
    EffectConflictError,
    EffectInDoubtError,
    EffectIntegrityError,
    InvalidIdentifierError,
    MissingDependencyError,
    PluginLoadError,
    StaleWriterError,
    StoreUnavailableError,
    ValueTooLargeError,
)
from checkpoint_stores.keys import (
    checkpoint_key,
    checkpoint_latest_key,
    effect_key,
    runtime_key,
)
from checkpoint_stores.normalize import normalize_checkpoint_record
from checkpoint_stores.plugins import (
    BackendRegistry,
    get_registry,
    hookimpl,
    hookspec,
    open_backend,
)
from checkpoint_stores.schema import (
    CURRENT_SCHEMA_VERSION,
    Checkpoint,
    EffectRecord,
    LLMResponseSnapshot,
    Phase,
    RuntimeSnapshot,
)
from checkpoint_stores.spi import Capabilities, StorageBackend
from checkpoint_stores.store import MemoryStore, open_store

__version__ = "0.1.0"

__all__ = [
    "CURRENT_SCHEMA_VERSION",
    "AgentCheckpointCorruptionError",
    "BackendNotFoundError",
    "BackendRegistry",
    "Capabilities",
    "Checkpoint",
    "CheckpointEncodeError",
    "CheckpointFlushError",
    "CheckpointNotFoundError",
    "CheckpointStoreError",
    "Cipher",
    "Codec",
    "DecryptionError",
    "EffectConflictError",
    "EffectInDoubtError",
    "EffectIntegrityError",
    "EffectRecord",
    "InvalidIdentifierError",
    "LLMResponseSnapshot",
    "MemoryStore",
    "MissingDependencyError",
    "Phase",
    "PluginLoadError",
    "RuntimeSnapshot",
    "StaleWriterError",
    "StorageBackend",
    "StoreUnavailableError",
    "ValueTooLargeError",
    "__version__",
    "checkpoint_key",
    "checkpoint_latest_key",
    "effect_key",
    "get_registry",
    "hookimpl",
    "hookspec",
    "normalize_checkpoint_record",
    "open_backend",
    "open_store",
    "runtime_key",
]
