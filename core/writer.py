"""Write-behind checkpointing: the run keeps going while its checkpoints are written.

>>> import asyncio
>>> from checkpoint_stores import Phase, open_store
>>> from checkpoint_stores.resume import RunCursor
>>> async def main():
...     store = open_store("memory://")
...     cursor = RunCursor("t1", "r1")
...     async with CheckpointWriter(store) as writer:       # closing flushes
...         await writer.submit(cursor.checkpoint(Phase.RUN_STARTED, 0, {}))
...         await writer.submit(cursor.checkpoint(Phase.STEP_STARTED, 0, {}))
...         await writer.flush()                              # durable from here on
...     return (await store.latest("t1", "r1")).phase
>>> asyncio.run(main())
<Phase.STEP_STARTED: 'step_started'>

Guarantees:

* ``submit`` encodes the record at once (the caller's payload may change
  afterwards; encoding errors and oversize records raise right there) and
  queues it. The queue is bounded: when ``max_pending`` records wait,
  ``submit`` waits too (backpressure) instead of letting memory grow.
* One background task writes. Records of one run are written in submit order
  (per-run FIFO) through the backend's compare-seq ``commit`` (records, runtime
  key and latest together), so ``latest`` only moves forward. Records of a run
  that queued up behind a slow write go in one commit (``max_batch``).
* ``runtime_state`` records are coalesced per run: a newer snapshot submitted
  while an older one still waits replaces it (only the newest is written).
* Errors are retried with bounded, jittered exponential backoff, then
  reported: to ``on_error`` at once, and by the next ``flush()`` as a
  :class:`CheckpointFlushError` naming every failed record. Nothing is
  swallowed. A :class:`StaleWriterError` (a newer writer claimed the run) is
  not retried: it is reported at once, the run's pending records are dropped
  and further ``submit`` calls for that run raise it.
* ``flush(timeout)`` returns only when everything submitted before it is
  durable; ``close()`` (and leaving ``async with``) is a final flush.

``synchronous=True`` writes inside ``submit`` instead (same retries; a
failure raises from ``submit``: :class:`StaleWriterError` when fenced,
:class:`CheckpointFlushError` otherwise), for callers that want every write
acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final, Literal

from checkpoint_stores.errors import (
    AgentCheckpointCorruptionError,
    CheckpointFlushError,
    CheckpointStoreError,
    StaleWriterError,
)
from checkpoint_stores.keys import (
    validate_run_id,
    validate_thread_id,
)
from checkpoint_stores.schema import Checkpoint, Phase
from checkpoint_stores.store import MemoryStore

__all__ = ["CheckpointWriter", "WriteFailure", "WriterStats"]

logger = logging.getLogger("checkpoint_stores.writer")

_RunKey = tuple[str, str]
_LISTED_FAILURES: Final = 10


@dataclass(frozen=True)
class WriteFailure:
    """A checkpoint the writer could not make durable.

    Attributes:
        thread_id: the record's thread.
        run_id: the record's run.
        seq: the record's seq.
        step: the record's step.
        phase: the record's phase.
        error: the last error (a :class:`StaleWriterError` when fenced out).
        attempts: how many commits were tried.
        dropped: later records of the same run dropped with it (stale runs only).
    """

    thread_id: str
    run_id: str
    seq: int
    step: int
    phase: str
    error: BaseException
    attempts: int
    dropped: int = 0

    @property
    def stale(self) -> bool:
        """True when a newer writer owns the run (no retry can help)."""
        return isinstance(self.error, StaleWriterError)

    def describe(self) -> str:
        """One line naming the record and what went wrong."""
        what = f"run {self.run_id!r} seq {self.seq} ({self.phase} at step {self.step})"
        tail = f"; {self.dropped} later records of the run dropped" if self.dropped else ""
        tries = "" if self.stale else f" after {self.attempts} attempts"
        return f"{what}: {type(self.error).__name__}{tries}: {self.error}{tail}"


@dataclass
class WriterStats:
    """What the writer did.

    ``submitted / commits`` is the coalescing ratio (records per backend
    commit): ``coalesced`` records were superseded by a newer runtime snapshot
    before being written, and records queued behind each other are committed
    together (``written`` counts records, ``commits`` backend commits).
    """

    submitted: int = 0
    written: int = 0
    commits: int = 0
    coalesced: int = 0
    retries: int = 0
    failed: int = 0


@dataclass
class _Item:
    checkpoint: Checkpoint
    data: bytes
    ticket: int
    attempts: int = 0


@dataclass
class _RunQueue:
    items: deque[_Item] = field(default_factory=deque)
    # idle: nothing scheduled; ready: in the ready deque; busy: the first `in_flight`
    # items are being written; backoff: waiting for a retry timer.
    state: Literal["idle", "ready", "busy", "backoff"] = "idle"
    in_flight: int = 0


class CheckpointWriter:
    """Write-behind (or synchronous) checkpoint writer for one :class:`MemoryStore`.

    Args:
        store: where the checkpoints go.
        max_pending: most records waiting (or being written) before ``submit`` blocks.
        synchronous: write inside ``submit`` and raise there on failure.
        coalesce: replace a waiting ``runtime_state`` record of a run by a newer one.
        max_batch: most queued records of one run written by one backend commit (the
            records, the runtime key and latest together); 1 turns batching off.
        max_batch_bytes: size cap of one such commit (a single record may exceed it).
        max_attempts: commits tried per record before it is reported as failed.
        backoff_initial: first retry delay in seconds (doubles per attempt, jittered).
        backoff_max: cap of the retry delay in seconds.
        on_error: called with each :class:`WriteFailure` as soon as it is final.
    """

    def __init__(
        self,
        store: MemoryStore,
        *,
        max_pending: int = 1000,
        synchronous: bool = False,
        coalesce: bool = True,
        max_batch: int = 32,
        max_batch_bytes: int = 1 << 20,
        max_attempts: int = 5,
        backoff_initial: float = 0.05,
        backoff_max: float = 2.0,
        on_error: Callable[[WriteFailure], object] | None = None,
    ) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        if max_attempts < 1 or max_batch < 1:
            raise ValueError("max_attempts and max_batch must be at least 1")
        self.store = store
        self.max_pending = max_pending
        self.synchronous = synchronous
        self.coalesce = coalesce
        self.max_batch = max_batch
        self.max_batch_bytes = max_batch_bytes
        self.max_attempts = max_attempts
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.on_error = on_error
        self.stats = WriterStats()
        self._runs: dict[_RunKey, _RunQueue] = {}
        self._ready: deque[_RunKey] = deque()
        self._lost: dict[_RunKey, tuple[int, StaleWriterError]] = {}
        self._failures: list[WriteFailure] = []
        self._pending = 0
        self._next_ticket = 0
        self._unresolved: list[int] = []  # heap of tickets, lazily cleaned
        self._resolved: set[int] = set()
        self._wakeup: asyncio.Event | None = None
        self._changed: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._worker_error: BaseException | None = None
        self._sync_locks: dict[_RunKey, asyncio.Lock] = {}
        self._closed = False

    def __repr__(self) -> str:
        mode = "synchronous" if self.synchronous else "write-behind"
        return f"<CheckpointWriter {mode} on {self.store!r} pending={self._pending}>"

    @property
    def pending(self) -> int:
        """Records submitted and not yet resolved (written, coalesced or failed)."""
        return self._pending

    # -- submitting -----------------------------------------------------------------

    async def submit(self, checkpoint: Checkpoint) -> None:
        """Queue ``checkpoint`` (or, in synchronous mode, write it now).

        Raises:
            StaleWriterError: a newer writer owns the run (found by an earlier write).
            InvalidIdentifierError, ValueTooLargeError, CheckpointEncodeError: the
                record cannot be stored at all (nothing was queued).
            CheckpointFlushError: synchronous mode only, the write failed.
            RuntimeError: the writer is closed.
        """
        if self._closed:
            raise RuntimeError("this CheckpointWriter is closed; open a new one")
        if self._worker_error is not None:
            raise self._dead_error()
        validate_thread_id(checkpoint.thread_id, max_bytes=self.store.capabilities.max_key_bytes)
        validate_run_id(checkpoint.run_id)
        key = (checkpoint.thread_id, checkpoint.run_id)
        self._check_lost(key, checkpoint)
        # Encode now: the caller may mutate the payload later, and a record that can
        # never be stored must fail here, not in the background.
        data = self.store.encode_checkpoint(checkpoint)
        self.stats.submitted += 1
        if self.synchronous:
            await self._submit_sync(key, checkpoint, data)
            return
        self._ensure_worker()
        while self._pending >= self.max_pending and not self._coalescible(key, checkpoint):
            assert self._changed is not None
            self._changed.clear()
            await self._changed.wait()
            if self._worker_error is not None:
                raise self._dead_error()
            self._check_lost(key, checkpoint)
        queue = self._runs.get(key)
        if queue is None:
            queue = self._runs[key] = _RunQueue()
        if checkpoint.phase is Phase.RUNTIME_STATE and self.coalesce:
            self._drop_waiting_snapshot(queue)
        queue.items.append(_Item(checkpoint, data, self._issue_ticket()))
        self._pending += 1
        if queue.state == "idle":
            self._make_ready(key, queue)

    def _check_lost(self, key: _RunKey, checkpoint: Checkpoint) -> None:
        lost = self._lost.get(key)
        if lost is not None and checkpoint.epoch <= lost[0]:
            raise StaleWriterError(
                f"run {checkpoint.run_id!r} was taken over by a newer writer (epoch above "
                f"{lost[0]}); seq {checkpoint.seq} was not queued. Stop writing this run: "
                f"{lost[1]}"
            )

    def _coalescible(self, key: _RunKey, checkpoint: Checkpoint) -> bool:
        if not (self.coalesce and checkpoint.phase is Phase.RUNTIME_STATE):
            return False
        queue = self._runs.get(key)
        return queue is not None and self._waiting_snapshot(queue) is not None

    @staticmethod
    def _waiting_snapshot(queue: _RunQueue) -> _Item | None:
        first = queue.in_flight  # never touch records being written
        for index in range(first, len(queue.items)):
            if queue.items[index].checkpoint.phase is Phase.RUNTIME_STATE:
                return queue.items[index]
        return None

    def _drop_waiting_snapshot(self, queue: _RunQueue) -> None:
        # At most one snapshot waits per run (each new one replaces it), and the new
        # one goes to the tail: its seq is the highest, so order stays increasing.
        older = self._waiting_snapshot(queue)
        if older is not None:
            queue.items.remove(older)
            self.stats.coalesced += 1
            self._resolve(older.ticket)

    def _issue_ticket(self) -> int:
        ticket = self._next_ticket
        self._next_ticket += 1
        heapq.heappush(self._unresolved, ticket)
        return ticket

    def _resolve(self, ticket: int) -> None:
        self._resolved.add(ticket)
        self._pending -= 1
        while self._unresolved and self._unresolved[0] in self._resolved:
            self._resolved.discard(heapq.heappop(self._unresolved))
        if self._changed is not None:
            self._changed.set()

    def _make_ready(self, key: _RunKey, queue: _RunQueue) -> None:
        queue.state = "ready"
        self._ready.append(key)
        assert self._wakeup is not None
        self._wakeup.set()

    # -- synchronous mode -------------------------------------------------------------

    async def _submit_sync(self, key: _RunKey, checkpoint: Checkpoint, data: bytes) -> None:
        lock = self._sync_locks.setdefault(key, asyncio.Lock())
        async with lock:
            self._check_lost(key, checkpoint)
            item = _Item(checkpoint, data, ticket=-1)
            while True:
                error = await self._commit([item])
                if error is None:
                    return
                if self._is_final(error, item):
                    # Raised right here, so no later flush reports it again.
                    failure = self._fail(key, item, error, dropped=0, for_flush=False)
                    if isinstance(error, StaleWriterError):
                        raise error
                    raise CheckpointFlushError(
                        f"checkpoint not written: {failure.describe()}", failures=[failure]
                    ) from error
                self.stats.retries += 1
                await asyncio.sleep(self._delay(item.attempts))

    # -- the background task ----------------------------------------------------------

    def _ensure_worker(self) -> None:
        if self._worker is not None and not self._worker.done():
            return
        self._wakeup = self._wakeup or asyncio.Event()
        self._changed = self._changed or asyncio.Event()
        self._worker = asyncio.get_running_loop().create_task(
            self._work(), name="checkpoint-writer"
        )
        self._worker.add_done_callback(self._worker_done)

    def _worker_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._worker_error = task.exception()
            logger.error("checkpoint writer task died: %r", self._worker_error)
            if self._changed is not None:
                self._changed.set()

    def _dead_error(self) -> CheckpointFlushError:
        return CheckpointFlushError(
            f"the checkpoint writer's background task died ({self._worker_error!r}); "
            f"{self._pending} records were not written. Open a new writer and resume the run"
        )

    async def _work(self) -> None:
        assert self._wakeup is not None
        while True:
            while not self._ready:
                self._wakeup.clear()
                await self._wakeup.wait()
            key = self._ready.popleft()
            queue = self._runs[key]
            batch = self._take_batch(queue)
            queue.state = "busy"
            queue.in_flight = len(batch)
            error = await self._commit(batch)
            queue.in_flight = 0
            head = batch[0]
            if error is None:
                for item in batch:
                    queue.items.popleft()
                    self._resolve(item.ticket)
            elif self._is_final(error, head):
                for _ in batch:
                    queue.items.popleft()
                if isinstance(error, StaleWriterError):
                    # The run belongs to a newer writer: nothing queued for it may land.
                    dropped = len(batch) - 1 + len(queue.items)
                    for item in batch:
                        self._resolve(item.ticket)
                    while queue.items:
                        self._resolve(queue.items.popleft().ticket)
                    self._fail(key, head, error, dropped)
                else:
                    for item in batch:
                        self._resolve(item.ticket)
                        self._fail(key, item, error, 0)
            else:
                self.stats.retries += 1
                queue.state = "backoff"
                delay = self._delay(head.attempts)
                logger.warning(
                    "checkpoint write of run %r seq %d..%d failed (attempt %d of %d), retrying "
                    "in %.2fs: %s: %s",
                    head.checkpoint.run_id,
                    head.checkpoint.seq,
                    batch[-1].checkpoint.seq,
                    head.attempts,
                    self.max_attempts,
                    delay,
                    type(error).__name__,
                    error,
                )
                asyncio.get_running_loop().call_later(delay, self._retry_due, key)
                continue
            if queue.items:
                self._make_ready(key, queue)
            else:
                queue.state = "idle"
                del self._runs[key]

    def _take_batch(self, queue: _RunQueue) -> list[_Item]:
        batch = [queue.items[0]]
        size = len(batch[0].data)
        for item in itertools.islice(queue.items, 1, self.max_batch):
            size += len(item.data)
            if size > self.max_batch_bytes:
                break
            batch.append(item)
        return batch

    def _retry_due(self, key: _RunKey) -> None:
        queue = self._runs.get(key)
        if queue is not None and queue.state == "backoff":
            self._make_ready(key, queue)

    # -- one commit -------------------------------------------------------------------

    async def _commit(self, batch: list[_Item]) -> Exception | None:
        """Try one backend commit of ``batch`` (one run's oldest records); the error if any."""
        for item in batch:
            item.attempts += 1
        first, last = batch[0].checkpoint, batch[-1].checkpoint
        try:
            moved = await self.store.commit_checkpoints([(i.checkpoint, i.data) for i in batch])
        except Exception as exc:
            return exc
        if moved:
            self.stats.written += len(batch)
            self.stats.commits += 1
            return None
        current = "?"
        with contextlib.suppress(CheckpointStoreError):
            current = str((await self.store.latest(first.thread_id, first.run_id)).seq)
        seqs = f"seq {first.seq}" if first is last else f"seqs {first.seq}..{last.seq}"
        return StaleWriterError(
            f"checkpoint {seqs} (epoch {first.epoch}) of run {first.run_id!r} was refused: the "
            f"run's latest is at seq {current}. Another writer (a resumer) owns the run; stop "
            "writing it and load it again to continue"
        )

    def _is_final(self, error: Exception, item: _Item) -> bool:
        if isinstance(error, (StaleWriterError, AgentCheckpointCorruptionError)):
            return True  # no retry can change a fenced run or a damaged stored value
        if isinstance(error, (ValueError, TypeError)):
            return True  # the record itself is unacceptable
        return item.attempts >= self.max_attempts

    def _delay(self, attempts: int) -> float:
        base: float = min(self.backoff_max, self.backoff_initial * 2.0 ** (attempts - 1))
        return base * (0.5 + random.random() / 2)

    def _fail(
        self, key: _RunKey, item: _Item, error: Exception, dropped: int, *, for_flush: bool = True
    ) -> WriteFailure:
        cp = item.checkpoint
        failure = WriteFailure(
            thread_id=cp.thread_id,
            run_id=cp.run_id,
            seq=cp.seq,
            step=cp.step,
            phase=cp.phase.value,
            error=error,
            attempts=item.attempts,
            dropped=dropped,
        )
        if isinstance(error, StaleWriterError):
            previous = self._lost.get(key)
            if previous is None or previous[0] < cp.epoch:
                self._lost[key] = (cp.epoch, error)
        if for_flush:
            self._failures.append(failure)
        self.stats.failed += 1 + dropped
        logger.error("checkpoint not written: %s", failure.describe())
        if self.on_error is not None:
            try:
                self.on_error(failure)
            except Exception:
                logger.exception("the writer's on_error callback raised")
        return failure

    # -- flushing ---------------------------------------------------------------------

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until everything submitted so far is durable.

        Raises:
            CheckpointFlushError: a record failed (each failure is reported by one
                flush), or ``timeout`` seconds passed first (the error names what is
                still pending; it stays queued).
        """
        target = self._next_ticket - 1
        if not self.synchronous and self._worker is not None:
            try:
                await asyncio.wait_for(self._wait_resolved(target), timeout)
            except asyncio.TimeoutError:
                raise self._timeout_error(target, timeout) from None
        self._raise_failures()

    async def _wait_resolved(self, target: int) -> None:
        assert self._changed is not None
        while self._unresolved and self._unresolved[0] <= target:
            if self._worker_error is not None:
                raise self._dead_error()
            self._changed.clear()
            await self._changed.wait()

    def _raise_failures(self) -> None:
        if not self._failures:
            return
        failures, self._failures = self._failures, []
        lines = [f.describe() for f in failures[:_LISTED_FAILURES]]
        if len(failures) > _LISTED_FAILURES:
            lines.append(f"... and {len(failures) - _LISTED_FAILURES} more")
        raise CheckpointFlushError(
            f"{len(failures)} checkpoint writes failed:\n  " + "\n  ".join(lines),
            failures=failures,
        )

    def _timeout_error(self, target: int, timeout: float | None) -> CheckpointFlushError:
        waiting = [
            item for queue in self._runs.values() for item in queue.items if item.ticket <= target
        ]
        named = ", ".join(
            f"run {i.checkpoint.run_id!r} seq {i.checkpoint.seq} ({i.checkpoint.phase.value}, "
            f"{i.attempts} attempts)"
            for i in waiting[:_LISTED_FAILURES]
        )
        more = f" and {len(waiting) - _LISTED_FAILURES} more" if len(waiting) > 10 else ""
        failed = f"; also {len(self._failures)} failed writes" if self._failures else ""
        return CheckpointFlushError(
            f"flush timed out after {timeout}s with {len(waiting)} checkpoint writes not yet "
            f"durable: {named}{more}{failed}. They stay queued; check the store, then flush "
            "again",
            failures=list(self._failures),
        )

    # -- lifecycle --------------------------------------------------------------------

    async def close(self, timeout: float | None = None) -> None:
        """Final flush, then stop the background task. Idempotent.

        Raises:
            CheckpointFlushError: as :meth:`flush`; records still pending are abandoned.
        """
        if self._closed:
            return
        self._closed = True
        try:
            await self.flush(timeout)
        finally:
            if self._worker is not None:
                self._worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._worker
                self._worker = None

    async def __aenter__(self) -> CheckpointWriter:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
