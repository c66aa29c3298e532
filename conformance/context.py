"""What one check runs with: a fresh backend, a fresh namespace, and cleanup that is verified.

Every check gets its own :class:`CheckContext`: a backend opened with
``open_backend(url, **options)`` and set up, a :class:`MemoryStore` on it,
thread ids under a unique namespace (so concurrent kit runs against one
server never meet), and, afterwards, ``delete_thread`` of every thread the
check used followed by a check that nothing is left.
"""

from __future__ import annotations

import asyncio
import builtins
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from checkpoint_stores import Capabilities, MemoryStore, StorageBackend, open_backend
from checkpoint_stores.conformance.checks import CheckInfo, ConformanceFailure
from checkpoint_stores.spi import ThreadLister

if TYPE_CHECKING:
    from checkpoint_stores.conformance.processes import WorkerSpec

__all__ = ["CheckContext", "RecordingBackend"]

T = TypeVar("T")
Mutate = Callable[[bytes], bytes]
Backdoor = Callable[[StorageBackend, str, str, Mutate], Awaitable[None]]


class RecordingBackend:
    """Wraps a backend and records every SPI call (name, thread, key or prefix).

    The O(1) checks count calls through it: "reads exactly one key" is a fact
    about calls, not about time.
    """

    def __init__(self, inner: StorageBackend) -> None:
        self.inner = inner
        self.calls: builtins.list[tuple[str, str, str]] = []

    @property
    def capabilities(self) -> Capabilities:
        """The wrapped backend's capabilities."""
        return self.inner.capabilities

    def reset(self) -> None:
        """Forget the calls recorded so far."""
        self.calls.clear()

    async def setup(self) -> None:
        """Set the wrapped backend up."""
        self.calls.append(("setup", "", ""))
        await self.inner.setup()

    async def close(self) -> None:
        """Close the wrapped backend."""
        self.calls.append(("close", "", ""))
        await self.inner.close()

    async def get(self, thread_id: str, key: str) -> bytes | None:
        """Recorded ``get``."""
        self.calls.append(("get", thread_id, key))
        return await self.inner.get(thread_id, key)

    async def get_many(self, thread_id: str, keys: Sequence[str]) -> builtins.list[bytes | None]:
        """Recorded ``get_many``."""
        self.calls.append(("get_many", thread_id, ",".join(keys)))
        return await self.inner.get_many(thread_id, keys)

    async def put(self, thread_id: str, key: str, value: bytes) -> None:
        """Recorded ``put``."""
        self.calls.append(("put", thread_id, key))
        await self.inner.put(thread_id, key, value)

    async def create(self, thread_id: str, key: str, value: bytes) -> bool:
        """Recorded ``create``."""
        self.calls.append(("create", thread_id, key))
        return await self.inner.create(thread_id, key, value)

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        """Recorded ``commit``."""
        self.calls.append(("commit", thread_id, head_key))
        return await self.inner.commit(thread_id, writes, head_key, head_value, seq)

    async def list(self, thread_id: str, prefix: str = "") -> AsyncIterator[tuple[str, bytes]]:
        """Recorded ``list``."""
        self.calls.append(("list", thread_id, prefix))
        async for item in self.inner.list(thread_id, prefix):
            yield item

    async def delete(self, thread_id: str, key: str) -> bool:
        """Recorded ``delete``."""
        self.calls.append(("delete", thread_id, key))
        return await self.inner.delete(thread_id, key)

    async def delete_prefix(self, thread_id: str, prefix: str) -> int:
        """Recorded ``delete_prefix``."""
        self.calls.append(("delete_prefix", thread_id, prefix))
        return await self.inner.delete_prefix(thread_id, prefix)

    async def delete_thread(self, thread_id: str) -> int:
        """Recorded ``delete_thread``."""
        self.calls.append(("delete_thread", thread_id, ""))
        return await self.inner.delete_thread(thread_id)


class CheckContext:
    """The per-check environment handed to every check body.

    Attributes:
        info: the check being run.
        url: the store URL (may hold secrets: never print it; use ``label``).
        options: backend options (JSON-serializable).
        label: the redacted URL, for messages.
        backend: the backend under test (fresh, set up). A check that reopens the
            store assigns the new instance here, so cleanup uses it.
        store: a :class:`MemoryStore` on ``backend``.
        ns: this check's namespace; every thread id the context hands out starts with it.
        rng: a seeded random generator (the seed is in ``ns``).
    """

    def __init__(
        self,
        *,
        info: CheckInfo,
        url: str,
        options: dict[str, Any],
        label: str,
        backdoor: Backdoor,
        worker_imports: Sequence[str] = (),
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.info = info
        self.url = url
        self.options = dict(options)
        self.label = label
        self._backdoor = backdoor
        self.worker_imports = tuple(worker_imports)
        self.settings = dict(settings or {})
        self.ns = f"csk{uuid.uuid4().hex[:12]}-"
        self.rng = random.Random(self.ns)
        self._threads: builtins.list[str] = []
        self._extra_backends: builtins.list[StorageBackend] = []
        self._counter = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.backend: StorageBackend
        self.store: MemoryStore

    # -- lifecycle (called by StoreConformance) ---------------------------------------

    async def open(self) -> None:
        """Open and set up the backend under test."""
        self._loop = asyncio.get_running_loop()
        self.backend = await self.new_backend(track=False)
        self.store = MemoryStore(self.backend, url=self.url)
        await self.store.setup()

    async def new_backend(self, *, track: bool = True) -> StorageBackend:
        """Open another instance of the store (same URL and options), set up.

        Instances opened here are closed after the check unless they became
        ``self.backend``.
        """
        backend = open_backend(self.url, **self.options)
        await backend.setup()
        if track:
            self._extra_backends.append(backend)
        return backend

    def store_on(self, backend: StorageBackend) -> MemoryStore:
        """A :class:`MemoryStore` on ``backend`` (already set up)."""
        return MemoryStore(backend, url=self.url)

    async def cleanup(self) -> builtins.list[str]:
        """Delete every thread the check used; return what was left behind."""
        problems: builtins.list[str] = []
        backend = self.backend
        for thread_id in dict.fromkeys(self._threads):
            try:
                await backend.delete_thread(thread_id)
                left = [key async for key, _ in backend.list(thread_id)]
            except Exception as exc:
                problems.append(f"delete_thread({thread_id!r}) raised {type(exc).__name__}: {exc}")
                continue
            if left:
                problems.append(
                    f"delete_thread({thread_id!r}) left {len(left)} key(s) behind, "
                    f"e.g. {left[:3]!r}"
                )
        if isinstance(backend, ThreadLister):
            try:
                remaining = [t async for t in backend.list_threads(self.ns)]
            except Exception as exc:
                problems.append(f"list_threads({self.ns!r}) raised {type(exc).__name__}: {exc}")
            else:
                if remaining:
                    problems.append(
                        f"after cleanup list_threads({self.ns!r}) still yields {remaining[:3]!r}"
                    )
        return problems

    async def close(self) -> None:
        """Close every backend instance the check opened (each once)."""
        closed: set[int] = set()
        for backend in [*self._extra_backends, self.backend]:
            if id(backend) in closed:
                continue
            closed.add(id(backend))
            try:
                await backend.close()
            except Exception:  # closing after a failure must not hide the failure
                pass
        self._extra_backends.clear()

    # -- ids ------------------------------------------------------------------------

    def thread(self, label: str = "t") -> str:
        """A new thread id in this check's namespace (tracked for cleanup)."""
        self._counter += 1
        return self.track(f"{self.ns}{label}-{self._counter}")

    def track(self, thread_id: str) -> str:
        """Remember a thread id built by the check itself, for cleanup."""
        self._threads.append(thread_id)
        return thread_id

    def run_id(self, label: str = "run") -> str:
        """A new run id (no ``:``, no wildcard characters)."""
        self._counter += 1
        return f"{label}-{uuid.uuid4().hex[:8]}-{self._counter}"

    # -- failing ----------------------------------------------------------------------

    def fail(self, detail: str) -> NoReturn:
        """Fail the check: the store broke its guarantee (``detail`` says how)."""
        raise ConformanceFailure(self.info, detail, self.label)

    def expect(self, condition: object, detail: str | Callable[[], str]) -> None:
        """Fail with ``detail`` unless ``condition`` holds."""
        if not condition:
            self.fail(detail() if callable(detail) else detail)

    # -- helpers --------------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        """The backend's declared capabilities."""
        return self.backend.capabilities

    async def corrupt(self, thread_id: str, key: str, mutate: Mutate) -> None:
        """Damage a stored value below the checks' view (the suite's backdoor)."""
        await self._backdoor(self.backend, thread_id, key, mutate)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the check's loop (for sync check bodies only)."""
        assert self._loop is not None, "the context is not open"
        return self._loop.run_until_complete(coro)

    def worker_spec(self, scenario: str, params: dict[str, Any]) -> WorkerSpec:
        """A worker-process job for this store (see ``processes``)."""
        from checkpoint_stores.conformance.processes import WorkerSpec

        return WorkerSpec(
            url=self.url,
            options=self.options,
            imports=self.worker_imports,
            scenario=scenario,
            params=params,
        )
