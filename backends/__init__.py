"""The built-in backends, registered through the same entry-point group a third party uses.

Each ``*_plugin`` object below is one entry point in ``pyproject.toml``
(``[project.entry-points.checkpoint_stores]``). Targets are lazy
``"module:Class"`` strings: a driver is imported only when its scheme is
opened, so ``pip install checkpoint-stores`` without extras still lists every
scheme and says which extra to install.
"""

from __future__ import annotations

from collections.abc import Mapping

from checkpoint_stores.plugins import BackendRegistry, hookimpl

__all__ = [
    "file_plugin",
    "memory_plugin",
    "mongodb_plugin",
    "redis_plugin",
    "s3_plugin",
    "sql_plugin",
]


class BuiltinPlugin:
    """Registers a table of ``scheme -> (target, extra)`` with one description."""

    def __init__(self, schemes: Mapping[str, tuple[str, str | None]], description: str) -> None:
        self.schemes = dict(schemes)
        self.description = description

    def __repr__(self) -> str:
        return f"BuiltinPlugin({sorted(self.schemes)})"

    @hookimpl
    def checkpoint_stores_register_backends(self, registry: BackendRegistry) -> None:
        """Add every scheme of the table."""
        for scheme, (target, extra) in self.schemes.items():
            registry.add(scheme, target, extra=extra, description=self.description)


_MEMORY = "checkpoint_stores.backends.memory:MemoryBackend"
_FILE = "checkpoint_stores.backends.file:FileBackend"
_REDIS = "checkpoint_stores.backends.redis:RedisBackend"
_SQL = "checkpoint_stores.backends.sql:SQLBackend"
_MONGODB = "checkpoint_stores.backends.mongodb:MongoBackend"
_S3 = "checkpoint_stores.backends.s3:S3Backend"

memory_plugin = BuiltinPlugin({"memory": (_MEMORY, None)}, "in-process dict (tests, reference)")
file_plugin = BuiltinPlugin({"file": (_FILE, None)}, "local filesystem, fsync'd (embedded default)")
redis_plugin = BuiltinPlugin(
    {
        "redis": (_REDIS, "redis"),
        "rediss": (_REDIS, "redis"),
        "unix": (_REDIS, "redis"),
        "redis+cluster": (_REDIS, "redis"),
        "rediss+cluster": (_REDIS, "redis"),
    },
    "Redis and Redis Cluster (redis-py asyncio, Lua commit)",
)
sql_plugin = BuiltinPlugin(
    {
        "postgresql": (_SQL, "postgres"),
        "postgresql+asyncpg": (_SQL, "postgres"),
        "postgresql+psycopg": (_SQL, "psycopg"),
        "sqlite": (_SQL, "sqlite"),
        "sqlite+aiosqlite": (_SQL, "sqlite"),
        "mysql": (_SQL, "mysql"),
        "mysql+aiomysql": (_SQL, "mysql"),
        "mysql+asyncmy": (_SQL, "mysql"),
        "mariadb": (_SQL, "mysql"),
        "mariadb+aiomysql": (_SQL, "mysql"),
        "mariadb+asyncmy": (_SQL, "mysql"),
    },
    "SQL through SQLAlchemy 2 async Core (PostgreSQL, SQLite, MySQL/MariaDB)",
)
mongodb_plugin = BuiltinPlugin(
    {"mongodb": (_MONGODB, "mongodb"), "mongodb+srv": (_MONGODB, "mongodb")},
    "MongoDB (PyMongo native async)",
)
s3_plugin = BuiltinPlugin(
    {"s3": (_S3, "s3")}, "S3 and compatibles (aiobotocore, conditional writes)"
)
