"""The conformance kit against the session's server fixtures (``tests/servers``)."""

from __future__ import annotations

from typing import ClassVar

import pytest

from checkpoint_stores.conformance import StoreConformance
from tests.support import ServerInfo


class ServerConformance(StoreConformance):
    """The kit against the ``ServerInfo`` fixture named by ``server_fixture``.

    Subclasses name the fixture (``server_fixture = "redis_server"``) and may still
    override ``store_url`` or ``store_options`` to vary what the server provides.
    """

    server_fixture: ClassVar[str] = ""

    @pytest.fixture(scope="class")
    @classmethod
    def server(cls, request: pytest.FixtureRequest) -> ServerInfo:
        info = request.getfixturevalue(cls.server_fixture)
        assert isinstance(info, ServerInfo), f"{cls.server_fixture} is not a server fixture"
        return info

    @pytest.fixture(scope="class")
    @classmethod
    def store_url(cls, server: ServerInfo) -> str:
        return server.url

    @pytest.fixture(scope="class")
    @classmethod
    def store_options(cls, server: ServerInfo) -> dict[str, object]:
        return server.options
