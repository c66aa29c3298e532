"""A third-party checkpoint-stores plugin: the ``example-sqlite://`` scheme.

The entry point in ``pyproject.toml`` names :data:`plugin`; checkpoint-stores
calls its hook with the backend registry. The target is a lazy string, so
the backend module is imported only when the scheme is opened.
"""

from __future__ import annotations

from checkpoint_stores import BackendRegistry, hookimpl

__all__ = ["plugin"]
__version__ = "0.1.0"


class _Plugin:
    @hookimpl
    def checkpoint_stores_register_backends(self, registry: BackendRegistry) -> None:
        """Register ``example-sqlite`` (a file path after the scheme)."""
        registry.add(
            "example-sqlite",
            "example_sqlite_store.backend:SqliteBackend",
            description="example third-party backend: SQLite via the standard library",
        )


plugin = _Plugin()
