"""The conformance kit against the built-in memory:// and file:// stores: every group runs."""

from __future__ import annotations

from typing import Any

import pytest

from checkpoint_stores.conformance import StoreConformance
from tests.support import ServerInfo


class TestMemoryConformance(StoreConformance):
    """memory:// honestly lacks cross_process and durable: those checks skip, the rest pass."""

    @pytest.fixture(scope="class")
    @classmethod
    def store_url(cls, memory_server: ServerInfo) -> str:
        return memory_server.url

    @pytest.fixture(scope="class")
    @classmethod
    def store_options(cls, memory_server: ServerInfo) -> dict[str, Any]:
        return memory_server.options


@pytest.mark.file
class TestFileConformance(StoreConformance):
    """file:// declares cross_process and durable, so the process races and reopen checks run."""

    @pytest.fixture(scope="class")
    @classmethod
    def store_url(cls, file_server: ServerInfo) -> str:
        return file_server.url

    @pytest.fixture(scope="class")
    @classmethod
    def store_options(cls, file_server: ServerInfo) -> dict[str, Any]:
        return file_server.options
