"""The conformance kit: prove that a store keeps checkpoint-stores' guarantees.

Three ways to run it:

* subclass :class:`StoreConformance` in your test suite and override the
  ``store_url`` fixture (and ``store_options``);
* ``pytest --checkpoint-store-url mydb://...`` (the pytest plugin this
  package registers; inert unless a URL is given);
* ``checkpoint-stores conformance mydb://...`` (a table of groups, exit status 1
  on any failure).

:data:`CHECKS` lists every check (name, group, guarantee, needed capabilities);
a backend lists the names it knowingly fails in ``Capabilities.divergences``.

Imports are lazy: the pytest plugin loads this package in every pytest
session, and must cost nothing there unless the kit is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from checkpoint_stores.conformance.base import (
        ConformanceTarget,
        StoreConformance,
        describe_store,
    )
    from checkpoint_stores.conformance.checks import (
        CHECKS,
        GROUPS,
        CheckInfo,
        ConformanceFailure,
    )
    from checkpoint_stores.conformance.context import CheckContext, RecordingBackend
    from checkpoint_stores.conformance.results import ConformanceResults, StoreDescription

__all__ = [
    "CHECKS",
    "GROUPS",
    "CheckContext",
    "CheckInfo",
    "ConformanceFailure",
    "ConformanceResults",
    "ConformanceTarget",
    "RecordingBackend",
    "StoreConformance",
    "StoreDescription",
    "describe_store",
]

_HOME = {
    "CHECKS": "checks",
    "GROUPS": "checks",
    "CheckInfo": "checks",
    "ConformanceFailure": "checks",
    "CheckContext": "context",
    "RecordingBackend": "context",
    "ConformanceResults": "results",
    "StoreDescription": "results",
    "ConformanceTarget": "base",
    "StoreConformance": "base",
    "describe_store": "base",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name == "CHECKS":
        # Every check registers itself when its group module is imported.
        importlib.import_module(f"{__name__}.base")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
