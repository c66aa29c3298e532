"""The public surface: ``checkpoint_stores.__all__`` is sorted, complete and documented."""

from __future__ import annotations

import importlib.metadata
import inspect
from pathlib import Path

import checkpoint_stores

# Names users and plugin authors build on. More may be added; none of these may go.
PINNED = {
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
    # runtime (issue 4)
    "CheckpointWriter",
    "EffectLedger",
    "EffectOutcome",
    "EffectStats",
    "ResumePoint",
    "RunCursor",
    "ToolCall",
    "WriteFailure",
    "WriterStats",
    "claim_run",
    "idempotency_key",
    "input_hash",
    "load_resume_point",
    "output_hash",
    "start_run",
    # operations (issue 9)
    "AESGCMCipher",
    "CopyReport",
    "PruneReport",
    "StoreStats",
    "ThreadListingUnsupportedError",
    "collect_stats",
    "copy_store",
    "prune",
    "rotate",
    # SPI helpers and optional extensions
    "DelegatingBackend",
    "Expirer",
    "ThreadLister",
}


def isort_key(name: str) -> tuple[int, str]:
    """ruff's RUF022 order: SCREAMING_CASE, then CamelCase, then everything else."""
    if name.isupper():
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


def test_all_is_sorted_without_duplicates() -> None:
    names = checkpoint_stores.__all__
    assert names == sorted(names, key=isort_key)
    assert len(names) == len(set(names))


def test_every_name_in_all_exists() -> None:
    missing = [n for n in checkpoint_stores.__all__ if not hasattr(checkpoint_stores, n)]
    assert missing == []
    namespace: dict[str, object] = {}
    exec("from checkpoint_stores import *", namespace)
    assert set(checkpoint_stores.__all__) <= set(namespace)


def test_pinned_names_are_exported() -> None:
    assert sorted(PINNED - set(checkpoint_stores.__all__)) == []


def test_public_classes_and_functions_have_docstrings() -> None:
    undocumented = []
    for name in checkpoint_stores.__all__:
        obj = getattr(checkpoint_stores, name)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and not inspect.getdoc(obj):
            undocumented.append(name)
    assert undocumented == []


def test_error_hierarchy() -> None:
    cs = checkpoint_stores
    for name in cs.__all__:
        obj = getattr(cs, name)
        if inspect.isclass(obj) and issubclass(obj, Exception):
            assert issubclass(obj, cs.CheckpointStoreError), name
    corruption = cs.AgentCheckpointCorruptionError
    for sub in (cs.CheckpointNotFoundError, cs.EffectIntegrityError, cs.DecryptionError):
        assert issubclass(sub, corruption)
    for sub in (cs.InvalidIdentifierError, cs.ValueTooLargeError, cs.CheckpointEncodeError):
        assert issubclass(sub, ValueError)
    assert issubclass(cs.MissingDependencyError, cs.BackendNotFoundError)
    assert issubclass(cs.BackendNotFoundError, LookupError)
    assert issubclass(cs.StoreUnavailableError, ConnectionError)


def test_version_matches_the_distribution() -> None:
    assert checkpoint_stores.__version__ == importlib.metadata.version("checkpoint-stores")


def test_package_is_typed() -> None:
    assert (Path(checkpoint_stores.__file__).parent / "py.typed").is_file()
