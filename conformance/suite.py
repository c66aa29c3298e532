"""The kit as collected by the pytest plugin for ``--checkpoint-store-url`` (one class per URL).

Not imported by users: the plugin adds this file to the session's arguments
when a store URL is configured, and parametrizes ``checkpoint_store_url``.
"""

from __future__ import annotations

from typing import Any

import pytest

from checkpoint_stores.conformance.base import StoreConformance

__all__ = ["TestStoreConformance"]


class TestStoreConformance(StoreConformance):
    """The kit against each store of ``--checkpoint-store-url`` / ``CHECKPOINT_STORES_TEST_URL``."""

    @pytest.fixture(scope="class")
    @classmethod
    def store_url(cls, checkpoint_store_url: str) -> str:
        """The configured URL (parametrized by the plugin)."""
        return checkpoint_store_url

    @pytest.fixture(scope="class")
    @classmethod
    def store_options(cls, checkpoint_store_options: dict[str, Any]) -> dict[str, Any]:
        """Options from ``--checkpoint-store-option key=value``."""
        return checkpoint_store_options
