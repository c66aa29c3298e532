"""The kit's checks as data: names, groups, the guarantee each one proves, what it needs.

Every conformance test is declared with :func:`check`, which turns an
``async def`` (or plain ``def``) body taking a ``CheckContext`` into a sync
pytest test with the group's marker, and records a
:class:`CheckInfo` in :data:`CHECKS`. A backend lists check names it knowingly
fails in ``Capabilities.divergences``; the kit then runs them as strict
expected failures.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import pytest

if TYPE_CHECKING:
    from checkpoint_stores.conformance.context import CheckContext

__all__ = [
    "CAPABILITY_SKIP",
    "CHECKS",
    "GROUPS",
    "CheckInfo",
    "ConformanceFailure",
    "check",
    "group_marker",
]

# Group name -> one line on what it proves. The order is the report's order.
GROUPS: Final[dict[str, str]] = {
    "latest": "latest-key semantics: newest wins, stale writers change nothing, no forks",
    "corruption": "damaged or legacy records: clear errors, or normalized",
    "replay": "replay idempotency of tool effects (EffectLedger on this store)",
    "spi": "the StorageBackend SPI itself: create, list, ids, sizes, deletes, durability",
    "stateful": "a Hypothesis state machine: the store against a dict model",
}

# Skip reasons that start with this mean "the store does not declare it": the
# summary counts them apart from skips for other reasons (no server, ...).
CAPABILITY_SKIP: Final = "not declared by the store:"

# Capability names a check may need (attributes of Capabilities), plus the
# optional SPI extension ``list_threads``.
_NEEDS: Final = frozenset(
    {"atomic_commit", "fenced_commit", "cross_process", "durable", "ttl", "list_threads"}
)


def group_marker(group: str) -> str:
    """The pytest marker of a group: ``conformance_<group>``."""
    return f"conformance_{group}"


@dataclass(frozen=True)
class CheckInfo:
    """One check of the kit.

    Attributes:
        name: ``group.check`` -- the name a backend lists in ``divergences``.
        group: one of :data:`GROUPS`.
        guarantee: the guarantee it proves, in one line (shown when it fails).
        needs: capabilities (or ``list_threads``) the store must declare for it to run.
    """

    name: str
    group: str
    guarantee: str
    needs: tuple[str, ...] = ()

    @property
    def test_name(self) -> str:
        """The pytest function name: ``test_<group>_<check>``."""
        return "test_" + self.name.replace(".", "_")


# name -> CheckInfo, filled by @check as the group modules are imported.
CHECKS: dict[str, CheckInfo] = {}


class ConformanceFailure(AssertionError):
    """A store broke a guarantee. The message names the check, the guarantee and what happened."""

    def __init__(self, info: CheckInfo, detail: str, store: str = "") -> None:
        self.info = info
        self.detail = detail
        self.store = store
        lines = [
            f"[{info.name}] broken guarantee: {info.guarantee}",
            *(f"  {line}" for line in detail.splitlines()),
        ]
        if store:
            lines.append(f"  store: {store}")
        super().__init__("\n".join(lines))

    @property
    def explanation(self) -> str:
        """The first line of what happened (for summaries)."""
        return f"[{self.info.name}] {self.detail.splitlines()[0] if self.detail else ''}"


CheckBody = Callable[[Any, "CheckContext"], Any]


def check(name: str, *, needs: tuple[str, ...] = ()) -> Callable[[CheckBody], Any]:
    """Declare a conformance check.

    The decorated method, named ``test_<group>_<check>``, takes ``(self, ctx)``;
    its docstring's first paragraph is the guarantee. It becomes a sync pytest test
    that runs the body in its own event loop on a freshly opened backend (see
    ``StoreConformance``): no pytest-asyncio, no loop-scope questions.
    """
    group, sep, short = name.partition(".")
    if not sep or group not in GROUPS or not short:
        raise ValueError(f"check name {name!r} must be '<group>.<check>' with a known group")
    unknown = set(needs) - _NEEDS
    if unknown:
        raise ValueError(f"check {name!r} needs unknown capabilities {sorted(unknown)}")
    if name in CHECKS:
        raise ValueError(f"check {name!r} is declared twice")

    def decorate(body: CheckBody) -> Any:
        doc = inspect.getdoc(body) or ""
        # The guarantee is the docstring's first paragraph, on one line.
        guarantee = " ".join(doc.split("\n\n")[0].split()) if doc else name
        info = CheckInfo(name=name, group=group, guarantee=guarantee, needs=tuple(needs))
        if body.__name__ != info.test_name:
            raise ValueError(f"check {name!r} must be defined as {info.test_name}()")
        CHECKS[name] = info

        def test(self: Any, conformance_target: Any) -> None:
            self._conformance_run(info, body, conformance_target)

        # Not functools.wraps: pytest must see this sync signature, not the body's.
        test.__name__ = info.test_name
        test.__qualname__ = body.__qualname__
        test.__doc__ = doc
        test.__module__ = body.__module__
        test._conformance_check = info  # type: ignore[attr-defined]
        test._conformance_body = body  # type: ignore[attr-defined]
        return getattr(pytest.mark, group_marker(group))(test)

    return decorate
