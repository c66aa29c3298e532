"""Kit results as data: per store, per group, per check; the conformance level; text and JSON.

The pytest plugin fills a :class:`ConformanceResults` while tests run; the
terminal summary, the ``--checkpoint-store-report`` JSON file and the
``checkpoint-stores conformance`` table are all rendered from it.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import pytest

from checkpoint_stores.conformance.checks import GROUPS

__all__ = [
    "STORE_STASH",
    "CheckResult",
    "ConformanceResults",
    "StoreDescription",
    "StoreResults",
]

OUTCOMES: Final = ("passed", "failed", "skipped", "xfailed")


@dataclass(frozen=True)
class StoreDescription:
    """What the kit tells about a store: where, which plugin, what it declares."""

    label: str  # the URL, redacted
    scheme: str
    backend: str  # module:Class
    plugin: str | None
    distribution: str | None
    version: str | None
    capabilities: dict[str, Any]
    thread_lister: bool

    @property
    def provider(self) -> str:
        """``distribution version`` (or the plugin name) for headers."""
        if self.distribution:
            return f"{self.distribution} {self.version or ''}".strip()
        return self.plugin or "registered at runtime"

    def capability_line(self) -> str:
        """Capabilities on one line."""
        parts = []
        for name, value in self.capabilities.items():
            if name == "notes":
                continue
            if isinstance(value, bool):
                parts.append(f"{name}={'yes' if value else 'no'}")
            elif isinstance(value, list):
                parts.append(f"{name}=[{', '.join(value)}]" if value else f"{name}=[]")
            else:
                parts.append(f"{name}={'none' if value is None else value}")
        parts.append(f"list_threads={'yes' if self.thread_lister else 'no'}")
        return " ".join(parts)


# Set by the kit on each test item, read by the plugin to group results by store.
STORE_STASH: Final = pytest.StashKey[StoreDescription]()


@dataclass
class CheckResult:
    """The outcome of one check on one store.

    ``outcome`` is one of passed, failed, skipped, xfailed; ``capability`` marks a
    skip for a capability the store does not declare (``missing`` names them);
    ``explanation`` is the
    first line of what went wrong (or the skip/xfail reason).
    """

    name: str
    group: str
    nodeid: str
    outcome: str = "passed"
    capability: bool = False
    missing: list[str] = field(default_factory=list)
    explanation: str = ""
    detail: str = ""


@dataclass
class StoreResults:
    """Every check run against one store."""

    key: str
    description: StoreDescription | None = None
    checks: dict[str, CheckResult] = field(default_factory=dict)

    def counts(self) -> dict[str, Counter[str]]:
        """group -> Counter of outcomes."""
        out: dict[str, Counter[str]] = {g: Counter() for g in GROUPS}
        for result in self.checks.values():
            out.setdefault(result.group, Counter())[result.outcome] += 1
        return out

    def first_failure(self, group: str) -> str:
        """The first failed check's explanation in ``group`` ('' if none)."""
        for result in self.checks.values():
            if result.group == group and result.outcome == "failed":
                return result.explanation
        return ""

    def failed(self) -> list[CheckResult]:
        """Failed checks, in run order."""
        return [r for r in self.checks.values() if r.outcome == "failed"]

    def level(self) -> str:
        """``full``, ``partial (...)``, ``incomplete (...)`` or ``non-conformant (...)``."""
        results = list(self.checks.values())
        failed = [r.name for r in results if r.outcome == "failed"]
        if failed:
            more = "..." if len(failed) > 6 else ""
            return f"non-conformant (broken: {', '.join(failed[:6])}{more})"
        other_skips = [r for r in results if r.outcome == "skipped" and not r.capability]
        ran_groups = {r.group for r in results}
        notes = []
        missing_groups = [g for g in GROUPS if g not in ran_groups]
        if missing_groups:
            notes.append(f"groups not run: {', '.join(missing_groups)}")
        if other_skips:
            notes.append(f"{len(other_skips)} checks skipped: {other_skips[0].explanation}")
            return f"incomplete ({'; '.join(notes)})"
        diverged = sorted(r.name for r in results if r.outcome == "xfailed")
        undeclared = sorted({need for r in results if r.capability for need in r.missing})
        if diverged:
            notes.append(f"declared divergences: {', '.join(diverged)}")
        if undeclared:
            notes.append(f"not declared, so not checked: {', '.join(undeclared)}")
        if notes:
            return f"partial ({'; '.join(notes)})"
        return "full"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "store": asdict(self.description) if self.description else {"label": self.key},
            "level": self.level(),
            "groups": {
                g: {o: c.get(o, 0) for o in OUTCOMES} | {"first_failure": self.first_failure(g)}
                for g, c in self.counts().items()
            },
            "checks": [asdict(r) for r in self.checks.values()],
        }


@dataclass
class ConformanceResults:
    """Results of every store the kit ran against in one pytest session."""

    stores: dict[str, StoreResults] = field(default_factory=dict)

    def store(self, key: str, description: StoreDescription | None) -> StoreResults:
        """The results of store ``key`` (created on first use)."""
        found = self.stores.get(key)
        if found is None:
            found = self.stores[key] = StoreResults(key=key, description=description)
        elif found.description is None and description is not None:
            found.description = description
        return found

    def ok(self) -> bool:
        """True if no check failed on any store."""
        return not any(s.failed() for s in self.stores.values())

    def to_json(self) -> str:
        """Every store's results as JSON."""
        return json.dumps({"stores": [s.as_dict() for s in self.stores.values()]}, indent=2)

    def text_lines(self) -> list[str]:
        """The plain-text summary the pytest plugin prints."""
        lines: list[str] = []
        for results in self.stores.values():
            desc = results.description
            if desc is not None:
                lines.append(f"store: {desc.label} ({desc.provider}; {desc.backend})")
                lines.append(f"  capabilities: {desc.capability_line()}")
            else:
                lines.append(f"store: {results.key}")
            lines.append(f"  {'group':<12}{'passed':>8}{'failed':>8}{'skipped':>9}{'xfailed':>9}")
            for group, counts in results.counts().items():
                if not sum(counts.values()):
                    continue
                lines.append(
                    f"  {group:<12}{counts['passed']:>8}{counts['failed']:>8}"
                    f"{counts['skipped']:>9}{counts['xfailed']:>9}"
                )
            for failure in results.failed():
                lines.append(f"  FAILED {failure.explanation}")
            lines.append(f"  conformance level: {results.level()}")
        return lines
