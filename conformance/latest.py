"""Group 1, latest-key semantics: newest wins, stale writers change nothing, the chain never forks.

The concurrency checks are where stores usually fail, so they look at the
whole history, not only the end state:

* **fork**: several writers commit the *same* seq (competing continuations of
  one chain). Exactly one may succeed. Two successes mean two writers each
  believe they own the run -- the hole LangGraph's conformance suite misses.
* **backwards**: a commit that *started after* another commit with a higher seq
  had *returned* success must be refused (real-time order, measured with a
  clock every process shares).
* **observers**: readers polling ``latest`` while writers race must never see
  the seq go down, and every value they read must decode.
* **end state**: latest holds the highest seq, and exactly the record of the
  writer whose commit of that seq succeeded.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from checkpoint_stores import (
    AgentCheckpointCorruptionError,
    Checkpoint,
    CheckpointNotFoundError,
    MemoryStore,
    Phase,
    StaleWriterError,
)
from checkpoint_stores.conformance.checks import check
from checkpoint_stores.conformance.context import CheckContext, RecordingBackend
from checkpoint_stores.conformance.processes import run_workers, start_workers
from checkpoint_stores.keys import checkpoint_latest_key, runtime_key

__all__ = ["Attempt", "LatestChecks", "commit_history_problems"]

_PHASES = [p for p in Phase if p is not Phase.RUNTIME_STATE]


@dataclass(frozen=True)
class Attempt:
    """One commit of a race: who, which seq, the answer, and when it ran."""

    writer: int
    seq: int
    ok: bool
    start: float
    end: float


# Seqs the next writer skips after a kill: above any commit still in flight.
_KILLED_WRITER_SEQ_GAP = 1000


def commit_history_problems(attempts: Sequence[Attempt]) -> list[str]:
    """Forks and backward moves in a history of racing commits (empty if none).

    A fork: one seq accepted more than once. A backward move: a commit accepted
    although it started after a commit of a higher or equal seq had returned True.
    """
    problems: list[str] = []
    accepted = [a for a in attempts if a.ok]
    by_seq = Counter(a.seq for a in accepted)
    for seq, count in sorted(by_seq.items()):
        if count > 1:
            writers = sorted(a.writer for a in accepted if a.seq == seq)
            problems.append(
                f"FORK: seq {seq} was accepted {count} times (writers {writers}); each of them "
                "now believes it owns the run's chain"
            )
    ordered = sorted(accepted, key=lambda a: a.end)
    for i, first in enumerate(ordered):
        for later in ordered[i + 1 :]:
            if later.start > first.end and later.seq < first.seq:
                problems.append(
                    f"BACKWARDS: writer {first.writer} committed seq {first.seq} (returned at "
                    f"+{first.end - ordered[0].start:.4f}s); afterwards writer {later.writer}'s "
                    f"commit of lower seq {later.seq} (started at "
                    f"+{later.start - ordered[0].start:.4f}s) was accepted too: latest went "
                    "backwards"
                )
                if len(problems) >= 8:
                    return problems
    return problems


def _monotonic_problems(seen: Sequence[int], who: str) -> list[str]:
    for before, after in itertools.pairwise(seen):
        if after < before:
            return [f"{who} read latest seq {before}, then later seq {after}: it went backwards"]
    return []


def _phase_for(seq: int) -> Phase:
    return _PHASES[seq % len(_PHASES)]


class LatestChecks:
    """Group 1 of the kit (``conformance_latest``). Mixed into ``StoreConformance``."""

    #: Concurrent writer tasks per race.
    race_tasks: int = 12
    #: Rounds per race (each round: every writer commits once).
    race_rounds: int = 6
    #: Worker processes for the cross-process races.
    race_processes: int = 4

    # -- plain semantics ---------------------------------------------------------------

    @check("latest.newest_append_is_latest")
    async def test_latest_newest_append_is_latest(self, ctx: CheckContext) -> None:
        """latest returns the newest appended record of a run, after every append, and the chain is
        complete
        """
        store, thread, run = ctx.store, ctx.thread(), ctx.run_id()
        for seq in range(1, 13):
            cp = Checkpoint(
                run_id=run,
                thread_id=thread,
                seq=seq,
                step=seq,
                phase=Phase.RUNTIME_STATE if seq % 4 == 0 else _phase_for(seq),
                payload={"n": seq, "text": f"record {seq}"},
            )
            await store.append(cp)
            latest = await store.latest(thread, run)
            ctx.expect(
                latest.seq == seq and latest.payload.get("n") == seq and latest.phase == cp.phase,
                f"after appending seq {seq}, latest returned "
                f"seq {latest.seq} ({latest.phase.value}, payload n={latest.payload.get('n')!r})",
            )
        history = await store.history(thread, run)
        ctx.expect(
            [cp.seq for cp in history] == list(range(1, 13)),
            lambda: f"history of 12 appends returned seqs {[cp.seq for cp in history]}",
        )
        runs = await store.list_runs(thread)
        ctx.expect(runs == [run], f"list_runs returned {runs!r}, expected [{run!r}]")

    @check("latest.runs_and_threads_isolated")
    async def test_latest_runs_and_threads_isolated(self, ctx: CheckContext) -> None:
        """runs and threads never see each other's records (same run id in two threads, prefix-
        related ids)
        """
        store = ctx.store
        base = ctx.thread("iso")
        threads = [base, ctx.track(base + ":"), ctx.track(base + "/x"), ctx.track(base + "x")]
        run = ctx.run_id()
        runs = [run, run + "x", run + "-1"]
        for ti, thread in enumerate(threads):
            for ri, run_id in enumerate(runs):
                for seq in range(1, 2 + ti + ri):
                    await store.append(
                        Checkpoint(
                            run_id=run_id,
                            thread_id=thread,
                            seq=seq,
                            step=seq,
                            phase=_phase_for(seq),
                            payload={"owner": f"{ti}/{ri}", "seq": seq},
                        )
                    )
        for ti, thread in enumerate(threads):
            for ri, run_id in enumerate(runs):
                latest = await store.latest(thread, run_id)
                want = 1 + ti + ri
                ctx.expect(
                    latest.payload.get("owner") == f"{ti}/{ri}" and latest.seq == want,
                    f"latest of run {run_id!r} in thread {thread!r} is seq {latest.seq} of "
                    f"{latest.payload.get('owner')!r}; expected seq {want} of '{ti}/{ri}'",
                )
                history = await store.history(thread, run_id)
                owners = {cp.payload.get("owner") for cp in history}
                ctx.expect(
                    owners == {f"{ti}/{ri}"} and len(history) == want,
                    f"history of run {run_id!r} in thread {thread!r} holds records of {owners} "
                    f"({len(history)} records, expected {want} of '{ti}/{ri}'): prefix-related "
                    "runs or threads leaked into each other",
                )
        await store.delete_run(threads[0], runs[0])
        try:
            await store.latest(threads[0], runs[0])
            ctx.fail("latest of a deleted run still returned a record")
        except CheckpointNotFoundError:
            pass
        survivor = await store.latest(threads[0], runs[1])
        ctx.expect(
            survivor.payload.get("owner") == "0/1",
            f"delete_run({runs[0]!r}) damaged run {runs[1]!r} of the same thread",
        )
        other = await store.latest(threads[1], runs[0])
        ctx.expect(
            other.payload.get("owner") == "1/0",
            f"delete_run in thread {threads[0]!r} damaged the same run id in thread {threads[1]!r}",
        )

    @check("latest.stale_commit_changes_nothing")
    async def test_latest_stale_commit_changes_nothing(self, ctx: CheckContext) -> None:
        """a commit whose seq is not above the head returns False and writes nothing: head, records
        and runtime key unchanged
        """
        store, backend, thread, run = ctx.store, ctx.backend, ctx.thread(), ctx.run_id()
        await store.append(
            Checkpoint(
                run_id=run,
                thread_id=thread,
                seq=10,
                step=5,
                phase=Phase.RUNTIME_STATE,
                payload={"step": 5, "who": "owner"},
            )
        )
        await store.append(
            Checkpoint(
                run_id=run,
                thread_id=thread,
                seq=11,
                step=6,
                phase=Phase.PRE_LLM,
                payload={"who": "owner"},
            )
        )
        before = {key: value async for key, value in backend.list(thread)}
        for stale in (11, 10, 3, 0):
            cp = Checkpoint(
                run_id=run,
                thread_id=thread,
                seq=stale,
                step=99,
                phase=Phase.RUNTIME_STATE,
                payload={"step": 99, "who": "zombie"},
            )
            moved = await store.commit_checkpoint(cp)
            ctx.expect(not moved, f"commit of stale seq {stale} (head is at 11) returned True")
            try:
                await store.append(cp)
                ctx.fail(
                    f"append of stale seq {stale} (head is at 11) did not raise StaleWriterError"
                )
            except StaleWriterError:
                pass
            after = {key: value async for key, value in backend.list(thread)}
            if after != before:
                added = sorted(set(after) - set(before))
                changed = sorted(k for k in before if k in after and after[k] != before[k])
                removed = sorted(set(before) - set(after))
                ctx.fail(
                    f"a refused commit of stale seq {stale} changed the thread: added {added}, "
                    f"changed {changed}, removed {removed}"
                )
        # The same at the SPI: the refused commit's extra writes must not land.
        head = checkpoint_latest_key(run)
        moved = await backend.commit(thread, [("stale-extra", b"zombie")], head, b"zombie", 11)
        ctx.expect(not moved, "backend.commit with seq equal to the head's returned True")
        leaked = await backend.get(thread, "stale-extra")
        ctx.expect(
            leaked is None, "backend.commit returned False but wrote its extra key 'stale-extra'"
        )
        runtime = await store.runtime_snapshot(thread, run)
        ctx.expect(
            runtime is not None and runtime.payload.get("who") == "owner",
            "the runtime key changed after refused commits",
        )

    @check("latest.put_head_is_lowest")
    async def test_latest_put_head_is_lowest(self, ctx: CheckContext) -> None:
        """a head written by plain put or create has no seq: any commit, seq 0 included, moves it"""
        backend, thread = ctx.backend, ctx.thread()
        await backend.put(thread, "head-a", b"written by put")
        moved = await backend.commit(thread, [("rec-a", b"r")], "head-a", b"v0", 0)
        ctx.expect(moved, "commit(seq=0) over a head written by put returned False")
        value = await backend.get(thread, "head-a")
        ctx.expect(value == b"v0", f"after that commit the head holds {value!r}, expected b'v0'")
        await backend.create(thread, "head-b", b"written by create")
        moved = await backend.commit(thread, [], "head-b", b"v1", 3)
        ctx.expect(moved, "commit(seq=3) over a head written by create returned False")
        # AFK writes latest with put_state: a put over a committed head drops its seq.
        ok = await backend.commit(thread, [], "head-c", b"seq5", 5)
        ctx.expect(ok, "commit(seq=5) of a new head returned False")
        await backend.put(thread, "head-c", b"afk put")
        moved = await backend.commit(thread, [], "head-c", b"seq1", 1)
        ctx.expect(
            moved,
            "after put() overwrote a committed head (seq 5), commit(seq=1) was refused: the "
            "stored seq must go with the value a put replaces (a head written by put has no seq)",
        )
        value = await backend.get(thread, "head-c")
        ctx.expect(value == b"seq1", f"head holds {value!r}, expected b'seq1'")

    # -- races between tasks -------------------------------------------------------------

    async def _task_race(
        self, ctx: CheckContext, thread: str, run: str, *, same_seq: bool, base: int
    ) -> tuple[list[Attempt], list[str]]:
        """Writers race in rounds while an observer polls latest; return attempts and observer
        problems.
        """
        store = ctx.store
        writers = range(self.race_tasks)
        attempts: list[Attempt] = []
        seen: list[int] = []
        undecodable: list[str] = []
        stop = asyncio.Event()

        async def observe() -> None:
            while not stop.is_set():
                try:
                    seen.append((await store.latest(thread, run)).seq)
                except CheckpointNotFoundError:
                    pass
                except AgentCheckpointCorruptionError as exc:
                    undecodable.append(str(exc).splitlines()[0])
                await asyncio.sleep(0)

        async def commit(writer: int, seq: int) -> None:
            cp = Checkpoint(
                run_id=run,
                thread_id=thread,
                seq=seq,
                step=seq,
                phase=_phase_for(seq),
                payload={"writer": writer, "seq": seq},
            )
            start = time.monotonic()
            ok = await store.commit_checkpoint(cp)
            attempts.append(Attempt(writer, seq, ok, start, time.monotonic()))

        observer = asyncio.ensure_future(observe())
        try:
            for rnd in range(self.race_rounds):
                if same_seq:
                    plan = dict.fromkeys(writers, base + rnd + 1)
                else:
                    order = list(writers)
                    ctx.rng.shuffle(order)
                    plan = {w: base + rnd * len(order) + order[w] + 1 for w in writers}
                await asyncio.gather(*(commit(w, s) for w, s in plan.items()))
        finally:
            stop.set()
            await observer
        problems = _monotonic_problems(seen, "an observer task")
        if undecodable:
            problems.append(f"an observer read an undecodable latest: {undecodable[0]}")
        return attempts, problems

    async def _final_state_problems(
        self, store: MemoryStore, thread: str, run: str, attempts: Sequence[Attempt]
    ) -> list[str]:
        top = max(a.seq for a in attempts)
        winners = [a for a in attempts if a.seq == top and a.ok]
        try:
            latest = await store.latest(thread, run)
        except AgentCheckpointCorruptionError as exc:
            return [f"after the race latest does not decode: {exc}"]
        problems = []
        if latest.seq != top:
            problems.append(f"after the race latest is at seq {latest.seq}, the highest was {top}")
        if len(winners) != 1:
            problems.append(f"{len(winners)} writers were told their commit of the top seq won")
        elif latest.payload.get("writer") != winners[0].writer:
            problems.append(
                f"writer {winners[0].writer}'s commit of seq {top} succeeded, but latest holds "
                f"writer {latest.payload.get('writer')}'s record"
            )
        try:
            await store.history(thread, run)
        except AgentCheckpointCorruptionError as exc:
            problems.append(f"a record written during the race does not decode: {exc}")
        return problems

    async def _expect_race_outcome(
        self,
        ctx: CheckContext,
        thread: str,
        run: str,
        attempts: Sequence[Attempt],
        problems: list[str],
        *,
        seqs_needing_a_winner: int,
        who: str,
        setup: str,
    ) -> None:
        """Judge a race: every contested seq had a winner, the commit history never
        forked or went backwards, the final state is sound; else fail with ``setup``."""
        for seq in range(1, seqs_needing_a_winner + 1):
            if not any(a.ok for a in attempts if a.seq == seq):
                problems.append(f"no {who}'s commit of seq {seq} succeeded")
        problems = commit_history_problems(attempts) + problems
        problems += await self._final_state_problems(ctx.store, thread, run, attempts)
        ctx.expect(not problems, lambda: "\n".join(problems[:8]) + f"\n({setup})")

    @check("latest.concurrent_tasks_no_fork")
    async def test_latest_concurrent_tasks_no_fork(self, ctx: CheckContext) -> None:
        """of many tasks committing the same seq at once, exactly one succeeds and latest holds its
        record (no forked chain)
        """
        thread, run = ctx.thread(), ctx.run_id()
        attempts, problems = await self._task_race(ctx, thread, run, same_seq=True, base=0)
        await self._expect_race_outcome(
            ctx, thread, run, attempts, problems,
            seqs_needing_a_winner=self.race_rounds,
            who="writer",
            setup=f"{self.race_tasks} tasks x {self.race_rounds} rounds, same seq per round",
        )  # fmt: skip

    @check("latest.concurrent_tasks_highest_wins")
    async def test_latest_concurrent_tasks_highest_wins(self, ctx: CheckContext) -> None:
        """concurrent commits of different seqs leave latest at the highest seq; it never goes
        backwards and always decodes
        """
        thread, run = ctx.thread(), ctx.run_id()
        attempts, problems = await self._task_race(ctx, thread, run, same_seq=False, base=0)
        await self._expect_race_outcome(
            ctx, thread, run, attempts, problems,
            seqs_needing_a_winner=0,
            who="writer",
            setup=f"{self.race_tasks} tasks x {self.race_rounds} rounds, shuffled seqs",
        )  # fmt: skip

    @check("latest.concurrent_losers_write_nothing", needs=("fenced_commit",))
    async def test_latest_concurrent_losers_write_nothing(self, ctx: CheckContext) -> None:
        """a commit that loses a race writes none of its records (race-time fencing)"""
        store, thread, run = ctx.store, ctx.thread(), ctx.run_id()
        attempts, _ = await self._task_race(ctx, thread, run, same_seq=False, base=0)
        leaked = []
        for attempt in attempts:
            if attempt.ok:
                continue
            record = await store.get_checkpoint(thread, run, attempt.seq, _phase_for(attempt.seq))
            if record is not None:
                leaked.append(attempt.seq)
        ctx.expect(
            not leaked,
            lambda: (
                f"commits of seqs {sorted(leaked)[:10]} returned False (they lost the race) "
                "but their records were written anyway"
            ),
        )
        same_run = ctx.run_id()
        attempts, _ = await self._task_race(ctx, thread, same_run, same_seq=True, base=0)
        for seq in range(1, self.race_rounds + 1):
            winners = [a.writer for a in attempts if a.seq == seq and a.ok]
            record = await store.get_checkpoint(thread, same_run, seq, _phase_for(seq))
            if len(winners) == 1 and record is not None:
                ctx.expect(
                    record.payload.get("writer") == winners[0],
                    f"writer {winners[0]} won seq {seq}, but the record under its key was "
                    f"overwritten by losing writer {record.payload.get('writer')}",
                )

    # -- races between processes ----------------------------------------------------------

    @check("latest.concurrent_processes_no_fork", needs=("cross_process",))
    async def test_latest_concurrent_processes_no_fork(self, ctx: CheckContext) -> None:
        """writers in several OS processes: each seq accepted at most once, latest never goes
        backwards and ends at the highest seq
        """
        thread, run = ctx.thread(), ctx.run_id()
        procs, rounds = self.race_processes, max(self.race_rounds, 6)
        specs = []
        for w in range(procs):
            same = [r + 1 for r in range(rounds)]
            distinct = [rounds + r * procs + (w + r) % procs + 1 for r in range(rounds)]
            specs.append(
                ctx.worker_spec(
                    "commit_race",
                    {
                        "thread_id": thread,
                        "run_id": run,
                        "writer": w,
                        "plan": same + distinct,
                        "slot": 0.03,
                    },
                )
            )
        results = await run_workers(specs)
        attempts: list[Attempt] = []
        problems: list[str] = []
        for w, rows in enumerate(results):
            seen = []
            for writer, seq, ok, t0, t1, seen_seq, _ in rows:
                attempts.append(Attempt(writer, seq, ok, t0, t1))
                seen.append(seen_seq)
                if ok and seen_seq < seq:
                    problems.append(
                        f"process {w} committed seq {seq} successfully, then read latest seq "
                        f"{seen_seq}: its own write is not visible or was overwritten by a "
                        "lower seq"
                    )
            problems += _monotonic_problems(seen, f"process {w}")
        await self._expect_race_outcome(
            ctx, thread, run, attempts, problems,
            seqs_needing_a_winner=rounds,
            who="process",
            setup=f"{procs} processes x {2 * rounds} commits: same seq, then interleaved seqs",
        )  # fmt: skip

    async def _kill_writers(
        self,
        ctx: CheckContext,
        thread: str,
        run: str,
        verify: Callable[[Checkpoint], Awaitable[None]],
    ) -> None:
        """Kill a writer process mid-stream three times; ``verify`` the latest after each kill."""
        next_seq = 1
        for _ in range(3):
            spec = ctx.worker_spec(
                "writer",
                {"thread_id": thread, "run_id": run, "first_seq": next_seq, "pad": 64 * 1024},
            )
            async with start_workers([spec]) as (worker,):
                await worker.send("go")
                target = ctx.rng.randint(2, 10)
                while (await worker.expect("progress", 120))["n"] < target:
                    pass
                await asyncio.sleep(ctx.rng.random() * 0.01)
                worker.kill()
            try:
                latest = await self._settled_latest(ctx, thread, run)
            except AgentCheckpointCorruptionError as exc:
                ctx.fail(f"after a writer process was killed, latest does not decode: {exc}")
            await verify(latest)
            # A request the killed process had already sent may still be applied by the
            # server later; start the next writer far above anything it could have sent.
            next_seq = latest.seq + _KILLED_WRITER_SEQ_GAP

    @staticmethod
    async def _settled_latest(ctx: CheckContext, thread: str, run: str) -> Checkpoint:
        """Latest once it stopped changing (a killed client's last request may land late)."""
        latest = await ctx.store.latest(thread, run)
        for _ in range(20):
            await asyncio.sleep(0.3)
            again = await ctx.store.latest(thread, run)
            if again.seq == latest.seq:
                return again
            latest = again
        return latest

    @check("latest.killed_writer_head_names_existing_record", needs=("cross_process",))
    async def test_latest_killed_writer_head_names_existing_record(self, ctx: CheckContext) -> None:
        """after a writer process is killed mid-commit, latest decodes and names a record that
        exists
        """
        store, thread, run = ctx.store, ctx.thread(), ctx.run_id()

        async def verify(latest: Checkpoint) -> None:
            record = await store.get_checkpoint(thread, run, latest.step, latest.phase)
            ctx.expect(
                record is not None and record.seq == latest.seq,
                f"latest is seq {latest.seq} (step {latest.step}, {latest.phase.value}) but its "
                f"record is {'missing' if record is None else f'at seq {record.seq}'}: the head "
                "moved before (or without) the data it names",
            )
            try:
                await store.runtime_snapshot(thread, run)
                await store.history(thread, run)
            except AgentCheckpointCorruptionError as exc:
                ctx.fail(f"after a writer was killed, a stored record does not decode: {exc}")

        await self._kill_writers(ctx, thread, run, verify)

    @check("latest.killed_writer_commit_all_or_nothing", needs=("cross_process", "atomic_commit"))
    async def test_latest_killed_writer_commit_all_or_nothing(self, ctx: CheckContext) -> None:
        """with atomic_commit, a writer killed mid-commit leaves no record above the head's seq"""
        store, thread, run = ctx.store, ctx.thread(), ctx.run_id()

        async def verify(latest: Checkpoint) -> None:
            above = [cp.seq for cp in await store.history(thread, run) if cp.seq > latest.seq]
            ctx.expect(
                not above,
                f"latest is at seq {latest.seq}, yet records of seqs {above[:10]} exist: a killed "
                "commit was applied in part although the store declares atomic_commit",
            )

        await self._kill_writers(ctx, thread, run, verify)

    # -- O(1) reads ------------------------------------------------------------------------

    @check("latest.runtime_key_o1_current")
    async def test_latest_runtime_key_o1_current(self, ctx: CheckContext) -> None:
        """latest and runtime_snapshot read exactly one key each, however long the chain, and return
        the newest records
        """
        recording = RecordingBackend(ctx.backend)
        store = MemoryStore(recording)
        await store.setup()
        thread, run = ctx.thread(), ctx.run_id()
        newest_runtime = 0
        seq = 0
        for chain_length in (6, 40):
            while seq < chain_length:
                seq += 1
                phase = Phase.RUNTIME_STATE if seq % 3 == 0 else _phase_for(seq)
                if phase is Phase.RUNTIME_STATE:
                    newest_runtime = seq
                await store.append(
                    Checkpoint(
                        run_id=run,
                        thread_id=thread,
                        seq=seq,
                        step=seq,
                        phase=phase,
                        payload={"step": seq, "seq": seq} if phase is Phase.RUNTIME_STATE else {},
                    )
                )
            recording.reset()
            snapshot = await store.runtime_snapshot(thread, run)
            calls = list(recording.calls)
            ctx.expect(
                calls == [("get", thread, runtime_key(run))],
                f"runtime_snapshot with {seq} records made these backend calls: {calls}",
            )
            ctx.expect(
                snapshot is not None and snapshot.seq == newest_runtime,
                f"runtime_snapshot returned seq {snapshot.seq if snapshot else None}, the newest "
                f"runtime_state record is seq {newest_runtime}",
            )
            recording.reset()
            latest = await store.latest(thread, run)
            calls = list(recording.calls)
            ctx.expect(
                calls == [("get", thread, checkpoint_latest_key(run))],
                f"latest with {seq} records made these backend calls: {calls}",
            )
            ctx.expect(latest.seq == seq, f"latest returned seq {latest.seq}, newest is {seq}")
