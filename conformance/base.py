"""``StoreConformance``: the base class a store's test suite subclasses to run the whole kit.

>>> import pytest
>>> from checkpoint_stores.conformance import StoreConformance
>>> class TestMyStore(StoreConformance):
...     @pytest.fixture(scope="class")
...     def store_url(self) -> str:
...         return "memory://"

Each check is a plain sync pytest test that runs its own event loop, opens a
fresh backend with ``open_backend(store_url, **store_options)``, works under
unique thread ids, and deletes them afterwards (checking nothing is left).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import pytest

from checkpoint_stores import StorageBackend, get_registry, open_backend
from checkpoint_stores.conformance.checks import (
    CAPABILITY_SKIP,
    CheckInfo,
    ConformanceFailure,
)
from checkpoint_stores.conformance.context import CheckContext
from checkpoint_stores.conformance.corruption import CorruptionChecks
from checkpoint_stores.conformance.latest import LatestChecks
from checkpoint_stores.conformance.processes import WorkerError
from checkpoint_stores.conformance.replay import ReplayChecks
from checkpoint_stores.conformance.results import STORE_STASH, StoreDescription
from checkpoint_stores.conformance.spi import SpiChecks
from checkpoint_stores.conformance.stateful import StatefulChecks
from checkpoint_stores.spi import Capabilities, ThreadLister
from checkpoint_stores.urls import redact_url, scheme_of

__all__ = ["ConformanceTarget", "StoreConformance", "describe_store"]

# Why a capability gates a check, for skip reasons.
_WHY: dict[str, str] = {
    "cross_process": "several processes sharing the store are not promised",
    "durable": "data is not promised to survive close and reopen",
    "fenced_commit": "a losing racer may leave its writes behind",
    "atomic_commit": "a commit killed mid-way may be applied in part",
    "ttl": "no native expiry",
    "list_threads": "the optional ThreadLister extension is not implemented",
}


def describe_store(url: str, options: dict[str, Any]) -> StoreDescription:
    """Open and set up ``url``, then describe it: plugin, version, capabilities.

    Capabilities are read after ``setup()`` because a backend may refine them
    from what it finds on the server (MongoDB: whether transactions exist).
    """
    backend = open_backend(url, **options)

    async def capabilities_after_setup() -> Capabilities:
        try:
            await backend.setup()
            return backend.capabilities
        finally:
            with contextlib.suppress(Exception):
                await backend.close()

    caps = asyncio.run(capabilities_after_setup())
    entry = get_registry().entry(scheme_of(url))
    capabilities = asdict(caps)
    capabilities["divergences"] = sorted(caps.divergences)
    return StoreDescription(
        label=redact_url(url),
        scheme=scheme_of(url),
        backend=f"{type(backend).__module__}:{type(backend).__qualname__}",
        plugin=entry.plugin,
        distribution=entry.distribution,
        version=entry.version,
        capabilities=capabilities,
        thread_lister=isinstance(backend, ThreadLister),
    )


@dataclass(frozen=True)
class ConformanceTarget:
    """What a check runs against: the store's URL, options and description."""

    url: str
    options: dict[str, Any]
    description: StoreDescription


class StoreConformance(LatestChecks, CorruptionChecks, ReplayChecks, SpiChecks, StatefulChecks):
    """The whole conformance kit as a test class. Subclass it and say which store to test.

    Override the class-scoped fixture ``store_url`` (and ``store_options`` if the
    backend needs options; they must be JSON-serializable, because the
    cross-process checks hand them to worker processes). Optionally override
    :meth:`backdoor_corrupt` to damage stored values below the SPI.

    Class attributes tune the kit: ``race_tasks``, ``race_rounds``,
    ``race_processes``, ``effect_racers``, ``effect_processes``,
    ``large_value_bytes``, ``list_probe_keys``, ``create_racers``,
    ``stateful_max_examples``, ``stateful_step_count``, ``check_timeout``, and
    ``worker_imports`` (modules a worker process imports before opening the
    store: use it when the scheme is registered at runtime, not by an entry point).
    """

    #: Modules each worker process imports before it opens the store.
    worker_imports: tuple[str, ...] = ()
    #: Seconds one check may run before the kit reports the store as hung.
    check_timeout: float = 300.0

    # -- fixtures a subclass overrides -------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def store_url(cls) -> str:
        """The URL of the store under test. Override it in your subclass."""
        pytest.fail(
            f"{cls.__name__} must override the store_url fixture: "
            "@pytest.fixture(scope='class') def store_url(self): return 'mydb://...'",
            pytrace=False,
        )

    @pytest.fixture(scope="class")
    @classmethod
    def store_options(cls) -> dict[str, Any]:
        """Backend options (JSON-serializable). Override it if your backend needs some."""
        return {}

    # -- machinery ------------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_store(cls, store_url: str, store_options: dict[str, Any]) -> StoreDescription:
        """The store's description (plugin, version, capabilities), read once per class."""
        try:
            return describe_store(store_url, dict(store_options))
        except Exception as exc:
            pytest.fail(
                f"cannot open the store {redact_url(store_url)}: {type(exc).__name__}: {exc}",
                pytrace=False,
            )

    @pytest.fixture
    def conformance_target(
        self,
        request: pytest.FixtureRequest,
        store_url: str,
        store_options: dict[str, Any],
        conformance_store: StoreDescription,
    ) -> ConformanceTarget:
        """Gate the check on the store's capabilities and divergences, then hand it the store."""
        request.node.stash[STORE_STASH] = conformance_store
        info: CheckInfo | None = getattr(request.function, "_conformance_check", None)
        if info is not None:
            caps = conformance_store.capabilities
            missing = [
                need
                for need in info.needs
                if not (conformance_store.thread_lister if need == "list_threads" else caps[need])
            ]
            if missing:
                pytest.skip(
                    f"{CAPABILITY_SKIP} {', '.join(missing)} "
                    f"({'; '.join(_WHY.get(m, m) for m in missing)})"
                )
            if info.name in caps["divergences"]:
                request.node.add_marker(
                    pytest.mark.xfail(
                        strict=True,
                        reason=f"declared divergence: the store lists {info.name!r} in "
                        "Capabilities.divergences",
                    )
                )
        return ConformanceTarget(store_url, dict(store_options), conformance_store)

    async def backdoor_corrupt(
        self,
        backend: StorageBackend,
        thread_id: str,
        key: str,
        mutate: Callable[[bytes], bytes],
    ) -> None:
        """Replace the value under ``key`` with ``mutate(value)``, as damage from outside would.

        The default reads and writes through the SPI (``get``, then ``put``).
        Override it to damage the value below the SPI -- in the file, row or
        object your store keeps -- so the kit also proves your own framing
        (checksums, headers) reports damage. ``mutate`` receives the bytes
        ``get`` returns and its result must be what ``get`` returns afterwards.
        """
        value = await backend.get(thread_id, key)
        if value is None:
            raise LookupError(f"backdoor_corrupt: nothing stored under {key!r}")
        await backend.put(thread_id, key, mutate(value))

    def _conformance_run(
        self, info: CheckInfo, body: Callable[..., Any], target: ConformanceTarget
    ) -> None:
        """Run one check body in a fresh event loop on a fresh backend, then clean up."""
        label = target.description.label
        ctx = CheckContext(
            info=info,
            url=target.url,
            options=target.options,
            label=label,
            backdoor=self.backdoor_corrupt,
            worker_imports=self.worker_imports,
        )
        loop = asyncio.new_event_loop()
        failure: BaseException | None = None
        try:
            try:
                loop.run_until_complete(ctx.open())
            except Exception as exc:
                raise ConformanceFailure(
                    info, f"the store could not be opened and set up: {type(exc).__name__}: {exc}"
                ) from exc
            try:
                if inspect.iscoroutinefunction(body):
                    loop.run_until_complete(asyncio.wait_for(body(self, ctx), self.check_timeout))
                else:
                    body(self, ctx)
            except (ConformanceFailure, pytest.skip.Exception, pytest.fail.Exception) as exc:
                failure = exc
                raise
            except asyncio.TimeoutError as exc:
                failure = exc
                raise ConformanceFailure(
                    info,
                    f"the check did not finish within {self.check_timeout:.0f}s: the store hung "
                    "(a lost wake-up, a lock never released, a request without a timeout?)",
                    label,
                ) from exc
            except WorkerError as exc:
                failure = exc
                raise ConformanceFailure(info, f"a worker process failed: {exc}", label) from exc
            except Exception as exc:
                failure = exc
                raise ConformanceFailure(
                    info, f"the store raised {type(exc).__name__}: {exc}", label
                ) from exc
            finally:
                try:
                    problems = loop.run_until_complete(ctx.cleanup())
                except Exception as exc:
                    problems = [f"cleanup raised {type(exc).__name__}: {exc}"]
                if problems and failure is None:
                    raise ConformanceFailure(
                        info,
                        "the check passed, but its namespace was not empty after cleanup:\n"
                        + "\n".join(problems),
                        label,
                    )
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(ctx.close())
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
