"""The package imports and the built-in plugins load without errors."""

from checkpoint_stores import get_registry


def test_builtin_plugins_load_without_failures() -> None:
    registry = get_registry(reload=True)
    assert registry.failures == []
    assert {"memory", "file", "redis", "postgresql+asyncpg", "mongodb", "s3"} <= set(
        registry.schemes()
    )
