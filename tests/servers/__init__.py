"""Fixtures that provide real servers to the tests, one module per backend.

Each module defines session-scoped fixtures returning ``tests.support.ServerInfo``;
``BACKEND_FIXTURES`` names them all, so a test can run against every backend with
``@pytest.mark.parametrize("server", BACKEND_FIXTURES, indirect=True)``-style
lookups (``request.getfixturevalue(name)``).
"""

BACKEND_FIXTURES = [
    "memory_server",
    "file_server",
    "redis_server",
    "redis_cluster_server",
    "postgres_server",
    "sqlite_server",
    "mariadb_server",
    "mongodb_server",
    "s3_server",
]
