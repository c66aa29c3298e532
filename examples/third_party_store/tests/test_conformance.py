"""The conformance kit in the example's own test suite: subclass, point at a store, done."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpoint_stores.conformance import StoreConformance


class TestSqliteConformance(StoreConformance):
    """Every group of the kit against a fresh SQLite file."""

    @pytest.fixture(scope="class")
    @classmethod
    def store_url(cls, tmp_path_factory: pytest.TempPathFactory) -> str:
        path: Path = tmp_path_factory.mktemp("example-sqlite") / "kit.db"
        return f"example-sqlite://{path}"
