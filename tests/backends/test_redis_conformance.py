"""The conformance kit, every group, against the standalone Redis and the session's Cluster.

The backdoor damages a value with a plain ``SET`` on its Redis key, below the
SPI (the head's seq and the index stay as they were), so the kit proves the
codec's checks catch damage that Redis hands back.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from checkpoint_stores import StorageBackend
from checkpoint_stores.backends.redis import RedisBackend
from tests.kit_support import ServerConformance


class _RedisConformance(ServerConformance):
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
    server_fixture = "redis_server"


@pytest.mark.redis
class TestRedisClusterConformance(_RedisConformance):
    server_fixture = "redis_cluster_server"
