"""The conformance kit, every group, against the standalone Redis and the session's Cluster.

The backdoor damages a value with a plain ``SET`` on its Redis key, below the
SPI (the head's seq and the index stay as they were), so the kit proves the
codec's checks catch damage that Redis hands back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from checkpoint_stores import StorageBackend
from checkpoint_stores.backends.redis import RedisBackend
from checkpoint_stores.conformance import StoreConformance
from tests.support import ServerInfo


class _RedisConformance(StoreConformance):
    """Shared backdoor: overwrite the value key directly."""

    async def backdoor_corrupt(
        self,
        backend: StorageBackend,
        thread_id: str,
        key: str,
        mutate: Callable[[bytes], bytes],
    ) -> None:
        assert isinstance(backend, RedisBackend)
        name = backend.key_names(thread_id).value_prefix + key.encode("utf-8")
        client = backend._connect()
        value = await client.get(name)
        if value is None:
            raise LookupError(f"backdoor_corrupt: nothing stored under {key!r}")
        assert await client.set(name, mutate(value), xx=True)


@pytest.mark.redis
class TestRedisConformance(_RedisConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def store_url(cls, redis_server: ServerInfo) -> str:
        return redis_server.url

    @pytest.fixture(scope="class")
    @classmethod
    def store_options(cls, redis_server: ServerInfo) -> dict[str, Any]:
        return redis_server.options


@pytest.mark.redis
class TestRedisClusterConformance(_RedisConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def store_url(cls, redis_cluster_server: ServerInfo) -> str:
        return redis_cluster_server.url

    @pytest.fixture(scope="class")
    @classmethod
    def store_options(cls, redis_cluster_server: ServerInfo) -> dict[str, Any]:
        return redis_cluster_server.options
