"""The conformance kit against the built-in memory:// and file:// stores: every group runs."""

from __future__ import annotations

import pytest

from tests.kit_support import ServerConformance


class TestMemoryConformance(ServerConformance):
    """memory:// honestly lacks cross_process and durable: those checks skip, the rest pass."""

    server_fixture = "memory_server"


@pytest.mark.file
class TestFileConformance(ServerConformance):
    """file:// declares cross_process and durable, so the process races and reopen checks run."""

    server_fixture = "file_server"
