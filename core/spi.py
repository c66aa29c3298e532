"""The storage-backend SPI: what a plugin implements. Bytes in, bytes out.

A backend knows nothing about checkpoints, JSON or the codec. It stores
opaque byte values under ``(thread_id, key)``, both opaque strings that it
must keep losslessly and without collisions (``/``, ``..``, ``{``, ``*``,
``%``, ``_``, ``:`` and NUL never change meaning), plus one extra power:
:meth:`StorageBackend.commit`, a compare-seq-then-write that keeps a run's
head from ever going backwards.

The in-memory backend (``checkpoint_stores.backends.memory``) is the readable
reference implementation; start a new backend by copying it.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["Capabilities", "DelegatingBackend", "Expirer", "StorageBackend", "ThreadLister"]


@dataclass(frozen=True)
class Capabilities:
    """What a backend guarantees, declared as data.

    A backend may refine its capabilities in ``setup()`` from what it finds on
    the server (MongoDB: whether transactions exist), so read them after setup.
    The facade uses it at runtime (size checks) and the conformance kit uses it
    to decide which guarantees to test: a test needing an undeclared capability
    is skipped with the reason, and every name in ``divergences`` runs as a
    strict expected failure (if the backend passes it after all, the kit says so).

    Attributes:
        atomic_commit: ``commit`` is all-or-nothing, even if the process dies mid-way.
            Without it, writes land before the head moves, so a head never names
            missing data, but a crash can leave extra records.
        fenced_commit: a stale ``commit`` writes nothing, even when racing a newer
            writer (``atomic_commit`` implies it for practical backends; a backend
            that checks then writes without a lock does not have it).
        cross_process: several processes (or hosts) may share the store safely.
        durable: data written before ``close()`` is there after reopening.
        ttl: the backend can expire finished runs natively.
        max_value_bytes: largest value ``put``/``commit`` accept (``None``: no limit
            below the codec's 4 GiB).
        max_key_bytes: longest thread id or key, in UTF-8 bytes.
        divergences: names of kit checks the backend knowingly fails (documented).
        notes: free text shown by the kit and ``checkpoint-stores plugins``.
    """

    atomic_commit: bool = False
    fenced_commit: bool = False
    cross_process: bool = False
    durable: bool = False
    ttl: bool = False
    max_value_bytes: int | None = None
    max_key_bytes: int = 1024
    divergences: frozenset[str] = field(default_factory=frozenset)
    notes: str = ""


@runtime_checkable
class StorageBackend(Protocol):
    """A byte store with one compare-and-write. All methods are coroutines.

    Contract (checked by ``checkpoint_stores.conformance`` on every backend):

    * ``get``/``put``/``delete`` behave like a dict per thread; ``put`` upserts.
    * ``create`` writes only if the key is absent and returns whether it wrote;
      under races exactly one caller wins.
    * ``commit(thread_id, writes, head_key, head_value, seq)`` stores ``writes``
      and moves ``head_key`` to ``head_value`` only if the head is absent or
      its stored seq is lower than ``seq``; it returns whether the head moved.
      If it returns ``False`` nothing was written. The seq is kept beside the
      value (a column, a hash field, metadata), never parsed out of it; a head
      written by plain ``put`` counts as lower than any seq.
    * ``list`` yields ``(key, value)`` sorted by key (Python string order, which
      is UTF-8 byte order), exactly the keys starting with ``prefix``: no
      LIKE or glob over-matching.
    * ``setup`` is idempotent and safe when several processes start at once.
    """

    @property
    def capabilities(self) -> Capabilities:
        """What this backend guarantees."""
        ...

    async def setup(self) -> None:
        """Create tables, indexes, directories or connections. Idempotent."""
        ...

    async def close(self) -> None:
        """Release connections. The backend may not be used afterwards."""
        ...

    async def get(self, thread_id: str, key: str) -> bytes | None:
        """The value under ``key``, or ``None``."""
        ...

    async def get_many(self, thread_id: str, keys: Sequence[str]) -> list[bytes | None]:
        """Values of several keys, in order, ideally in one round trip."""
        ...

    async def put(self, thread_id: str, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (upsert)."""
        ...

    async def create(self, thread_id: str, key: str, value: bytes) -> bool:
        """Store ``value`` only if ``key`` is absent; return whether it was stored."""
        ...

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        """Store ``writes`` and advance the head if ``seq`` is above its stored seq."""
        ...

    def list(self, thread_id: str, prefix: str = "") -> AsyncIterator[tuple[str, bytes]]:
        """Yield ``(key, value)`` for keys starting with ``prefix``, sorted by key."""
        ...

    async def delete(self, thread_id: str, key: str) -> bool:
        """Delete one key; return whether it existed."""
        ...

    async def delete_prefix(self, thread_id: str, prefix: str) -> int:
        """Delete every key starting with ``prefix``; return how many."""
        ...

    async def delete_thread(self, thread_id: str) -> int:
        """Delete every key of the thread; return how many."""
        ...


@runtime_checkable
class ThreadLister(Protocol):
    """Optional SPI extension: enumerate thread ids (used by copy, stats and prune).

    Backends that can list their threads implement it; tools that need it say
    so clearly when a backend does not (pass ``--thread`` instead).
    """

    def list_threads(self, prefix: str = "") -> AsyncIterator[str]:
        """Yield thread ids starting with ``prefix``, sorted."""
        ...


@runtime_checkable
class Expirer(Protocol):
    """Optional SPI extension: native expiry (``Capabilities.ttl``), e.g. for finished runs.

    Retention calls it to hand old runs to the database's own TTL machinery
    (Redis ``EXPIRE``, a MongoDB TTL index) instead of deleting them itself.
    """

    async def expire_prefix(self, thread_id: str, prefix: str, ttl_seconds: float) -> int:
        """Make every key under ``prefix`` expire in ``ttl_seconds``; return how many keys."""
        ...


class DelegatingBackend:
    """A backend that forwards every SPI call to ``inner``: subclass it to wrap one.

    Override only what the wrapper changes (count commits, add latency, inject a
    failure, record calls); everything else reaches the real backend untouched.
    The optional extensions (``list_threads``, ``expire_prefix``) are not
    forwarded, so a wrapper exposes them only if it defines them.

    >>> class Counting(DelegatingBackend):
    ...     commits = 0
    ...     async def commit(self, thread_id, writes, head_key, head_value, seq):
    ...         self.commits += 1
    ...         return await super().commit(thread_id, writes, head_key, head_value, seq)
    """

    def __init__(self, inner: StorageBackend) -> None:
        self.inner = inner

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    @property
    def capabilities(self) -> Capabilities:
        """The wrapped backend's capabilities."""
        return self.inner.capabilities

    async def setup(self) -> None:
        """Set the wrapped backend up."""
        await self.inner.setup()

    async def close(self) -> None:
        """Close the wrapped backend."""
        await self.inner.close()

    async def get(self, thread_id: str, key: str) -> bytes | None:
        """Forwarded ``get``."""
        return await self.inner.get(thread_id, key)

    async def get_many(self, thread_id: str, keys: Sequence[str]) -> builtins.list[bytes | None]:
        """Forwarded ``get_many``."""
        return await self.inner.get_many(thread_id, keys)

    async def put(self, thread_id: str, key: str, value: bytes) -> None:
        """Forwarded ``put``."""
        await self.inner.put(thread_id, key, value)

    async def create(self, thread_id: str, key: str, value: bytes) -> bool:
        """Forwarded ``create``."""
        return await self.inner.create(thread_id, key, value)

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        """Forwarded ``commit``."""
        return await self.inner.commit(thread_id, writes, head_key, head_value, seq)

    async def list(self, thread_id: str, prefix: str = "") -> AsyncIterator[tuple[str, bytes]]:
        """Forwarded ``list``."""
        async for item in self.inner.list(thread_id, prefix):
            yield item

    async def delete(self, thread_id: str, key: str) -> bool:
        """Forwarded ``delete``."""
        return await self.inner.delete(thread_id, key)

    async def delete_prefix(self, thread_id: str, prefix: str) -> int:
        """Forwarded ``delete_prefix``."""
        return await self.inner.delete_prefix(thread_id, prefix)

    async def delete_thread(self, thread_id: str) -> int:
        """Forwarded ``delete_thread``."""
        return await self.inner.delete_thread(thread_id)
