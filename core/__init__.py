"""checkpoint-stores: durable, resumable agent-run checkpoints on the storage you already run.

>>> from checkpoint_stores import open_store
>>> store = open_store("file:///tmp/runs")   # or redis://, postgresql+asyncpg://, s3://, ...

The public surface is this module's ``__all__``; everything else is private.
"""

from __future__ import annotations

from checkpoint_stores.codec import Cipher, Codec
from checkpoint_stores.copy import CopyReport, copy_store
from checkpoint_stores.effects import (
    EffectLedger,
    EffectOutcome,
    EffectStats,
    ToolCall,
    idempotency_key,
    input_hash,
    output_hash,
)
from checkpoint_stores.encryption import AESGCMCipher, rotate
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
from checkpoint_stores.inventory import ThreadListingUnsupportedError
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
from checkpoint_stores.resume import (
    ResumePoint,
    RunCursor,
    claim_run,
    load_resume_point,
    start_run,
)
from checkpoint_stores.retention import PruneReport, prune
from checkpoint_stores.schema import (
    CURRENT_SCHEMA_VERSION,
    Checkpoint,
    EffectRecord,
    LLMResponseSnapshot,
    Phase,
    RuntimeSnapshot,
)
from checkpoint_stores.spi import (
    Capabilities,
    DelegatingBackend,
    Expirer,
    StorageBackend,
    ThreadLister,
)
from checkpoint_stores.stats import StoreStats, collect_stats
from checkpoint_stores.store import MemoryStore, open_store
from checkpoint_stores.writer import CheckpointWriter, WriteFailure, WriterStats

__version__ = "0.1.0"

__all__ = [
    "CURRENT_SCHEMA_VERSION",
    "AESGCMCipher",
    "AgentCheckpointCorruptionError",
    "BackendNotFoundError",
    "BackendRegistry",
    "Capabilities",
    "Checkpoint",
    "CheckpointEncodeError",
    "CheckpointFlushError",
    "CheckpointNotFoundError",
    "CheckpointStoreError",
    "CheckpointWriter",
    "Cipher",
    "Codec",
    "CopyReport",
    "DecryptionError",
    "DelegatingBackend",
    "EffectConflictError",
    "EffectInDoubtError",
    "EffectIntegrityError",
    "EffectLedger",
    "EffectOutcome",
    "EffectRecord",
    "EffectStats",
    "Expirer",
    "InvalidIdentifierError",
    "LLMResponseSnapshot",
    "MemoryStore",
    "MissingDependencyError",
    "Phase",
    "PluginLoadError",
    "PruneReport",
    "ResumePoint",
    "RunCursor",
    "RuntimeSnapshot",
    "StaleWriterError",
    "StorageBackend",
    "StoreStats",
    "StoreUnavailableError",
    "ThreadLister",
    "ThreadListingUnsupportedError",
    "ToolCall",
    "ValueTooLargeError",
    "WriteFailure",
    "WriterStats",
    "__version__",
    "checkpoint_key",
    "checkpoint_latest_key",
    "claim_run",
    "collect_stats",
    "copy_store",
    "effect_key",
    "get_registry",
    "hookimpl",
    "hookspec",
    "idempotency_key",
    "input_hash",
    "load_resume_point",
    "normalize_checkpoint_record",
    "open_backend",
    "open_store",
    "output_hash",
    "prune",
    "rotate",
    "runtime_key",
    "start_run",
]
