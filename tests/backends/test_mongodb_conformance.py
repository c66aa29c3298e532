"""The conformance kit, every group, against the session's MongoDB-wire server.

Run twice: with transactions (the replica-set path: atomic and fenced commits)
and with ``transactions=off`` (the ordered path a standalone ``mongod`` gets),
each in a collection of its own. ``transactions`` is passed explicitly because
the kit reads capabilities before connecting, and ``auto`` only knows after
``setup`` which one the deployment gives.

The backdoor damages a value with a plain ``update_one`` on its document, below
the SPI (the head's seq and the other fields stay as they were), so the kit
proves the codec's checks catch damage that MongoDB hands back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient

from checkpoint_stores import StorageBackend
from checkpoint_stores.backends.mongodb import MongoBackend
from tests.kit_support import ServerConformance
from tests.support import ServerInfo


def _has_transactions(url: str) -> bool:
    client: MongoClient[dict[str, Any]] = MongoClient(url)
    try:
        hello = client.admin.command("hello")
    finally:
        client.close()
    return "setName" in hello or hello.get("msg") == "isdbgrid"


class _MongoConformance(ServerConformance):
    server_fixture = "mongodb_server"

    """Shared backdoor: overwrite the document's ``value`` directly."""

    async def backdoor_corrupt(
        self,
        backend: StorageBackend,
        thread_id: str,
        key: str,
        mutate: Callable[[bytes], bytes],
    ) -> None:
        assert isinstance(backend, MongoBackend)
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(backend._driver_url)
        try:
            coll = client.get_database(backend.database).get_collection(backend.collection)
            doc = await coll.find_one({"thread": thread_id, "key": key})
            if doc is None:
                raise LookupError(f"backdoor_corrupt: nothing stored under {key!r}")
            result = await coll.update_one(
                {"_id": doc["_id"]}, {"$set": {"value": mutate(bytes(doc["value"]))}}
            )
            assert result.matched_count == 1
        finally:
            await client.close()


@pytest.mark.mongodb
class TestMongoConformance(_MongoConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def store_options(cls, server: ServerInfo) -> dict[str, Any]:
        if not _has_transactions(server.url):
            if "SecantusDB" in server.description:
                pytest.fail("the session's SecantusDB must be a replica set (transactions)")
            pytest.skip("a standalone server: covered by TestMongoConformanceWithoutTransactions")
        return {**server.options, "collection": "kit", "transactions": "on"}


@pytest.mark.mongodb
class TestMongoConformanceWithoutTransactions(_MongoConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def store_options(cls, server: ServerInfo) -> dict[str, Any]:
        return {**server.options, "collection": "kit_ordered", "transactions": "off"}
