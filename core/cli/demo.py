"""``checkpoint-stores demo``: an agent killed with SIGKILL mid-run, resumed, and checked.

:func:`run_demo` drives it (the crash-loop test uses it too): it runs the
scripted agent of :mod:`checkpoint_stores.demo` in child processes, kills
them (at a phase boundary, or at random points), resumes until the run
finishes, then checks from the store and the tools' outside-world log that
every recorded effect happened exactly once, that ``latest`` never moved
backwards, and that the result equals an uninterrupted run's.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import sys
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import click
from rich.markup import escape
from rich.table import Table

from checkpoint_stores.cli._common import (
    console,
    format_seq,
    option_flag,
    parse_options,
    run_async,
)
from checkpoint_stores.demo import (
    EVENT_PREFIX,
    KILL_POINTS,
    DemoConfig,
    OutsideWorld,
    config_json,
    run_agent,
)
from checkpoint_stores.errors import CheckpointNotFoundError
from checkpoint_stores.keys import EFFECT_PREFIX
from checkpoint_stores.schema import Checkpoint
from checkpoint_stores.store import MemoryStore, open_store
from checkpoint_stores.urls import redact_url

__all__ = ["DemoReport", "demo", "run_demo"]

_SESSION_TIMEOUT: Final = 120.0


@dataclass
class Session:
    """One child process: what it did and how it ended."""

    index: int
    events: list[dict[str, Any]] = field(default_factory=list)
    killed: bool = False
    kill_plan: str = ""
    last_point: str | None = None
    latest_at_kill: Checkpoint | None = None
    returncode: int | None = None
    error: str | None = None

    def first(self, name: str) -> dict[str, Any] | None:
        """The first event called ``name``."""
        return next((e for e in self.events if e.get("event") == name), None)

    def of(self, name: str) -> list[dict[str, Any]]:
        """All events called ``name``."""
        return [e for e in self.events if e.get("event") == name]

    @property
    def epoch(self) -> int | None:
        started = self.first("session")
        return None if started is None else int(started["epoch"])

    @property
    def lost_checkpoints(self) -> int:
        """Checkpoints submitted before the kill that were not durable yet."""
        if not self.killed:
            return 0
        durable = self.latest_at_kill.seq if self.latest_at_kill is not None else -1
        return sum(1 for e in self.of("point") if e.get("seq") is not None and e["seq"] > durable)


@dataclass
class Check:
    """One verdict of the final verification."""

    name: str
    ok: bool
    detail: str


@dataclass
class DemoReport:
    """Everything :func:`run_demo` saw and concluded."""

    config: DemoConfig
    expected: dict[str, Any]
    result: dict[str, Any] | None
    sessions: list[Session]
    history: list[Checkpoint]
    latest: Checkpoint | None
    effects: dict[str, dict[str, Any]]
    outside: list[dict[str, Any]]
    invocations: list[dict[str, Any]]
    llm_calls: list[dict[str, Any]]
    observed_latest: list[int]
    checks: list[Check]

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return all(c.ok for c in self.checks)

    @property
    def kills(self) -> int:
        """How many sessions were killed."""
        return sum(s.killed for s in self.sessions)


def parse_kill_at(kill_at: str, steps: int) -> tuple[str, str | None]:
    """``("random"|"none"|"point", "phase@step")`` from the ``--kill-at`` value."""
    value = kill_at.strip().lower()
    if value in {"random", "none"}:
        return value, None
    phase, _, step_text = value.partition("@")
    if phase not in KILL_POINTS:
        raise click.BadParameter(
            f"{kill_at!r}: use random, none, or one of {', '.join(KILL_POINTS)} "
            "(optionally @STEP, e.g. tool_effect@1)",
            param_hint="--kill-at",
        )
    if step_text:
        if not step_text.isdigit():
            raise click.BadParameter(f"{kill_at!r}: STEP must be a number", param_hint="--kill-at")
        step = int(step_text)
    elif phase == "run_started":
        step = 0
    elif phase == "run_terminal":
        step = steps
    else:
        step = 1 if steps > 2 else 0  # a step with tool calls (the last one only answers)
    return "point", f"{phase}@{step}"


async def _latest(store: MemoryStore, config: DemoConfig) -> Checkpoint | None:
    try:
        return await store.latest(config.thread_id, config.run_id)
    except CheckpointNotFoundError:
        return None


async def _run_session(
    session: Session,
    config: DemoConfig,
    store: MemoryStore,
    observed: list[int],
    kill_after_points: int | None,
    kill_delay: float,
) -> None:
    """Run one child; kill it at its pause point, or after N points (+ a delay)."""
    stderr_path = Path(config.workdir) / f"session-{session.index}.stderr"
    with open(stderr_path, "wb") as stderr:  # noqa: ASYNC230 (a local temp file, opened once)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "checkpoint_stores.demo",
            config_json(config),
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
    stdout = proc.stdout
    assert stdout is not None

    async def pump() -> None:
        points = 0
        while line := await stdout.readline():
            text = line.decode("utf-8", errors="replace").rstrip("\n")
            if not text.startswith(EVENT_PREFIX):
                continue
            event = _json(text[len(EVENT_PREFIX) :])
            session.events.append(event)
            if event.get("event") == "error":
                session.error = f"{event.get('type')}: {event.get('message')}"
            if event.get("event") != "point":
                continue
            points += 1
            session.last_point = f"{event['point']}@{event['step']}"
            latest = await _latest(store, config)
            if latest is not None:
                observed.append(latest.seq)
            paused = config.pause_at is not None and session.last_point == config.pause_at
            if paused or (kill_after_points is not None and points >= kill_after_points):
                if not paused and kill_delay:
                    await asyncio.sleep(kill_delay)  # lands anywhere in what follows
                proc.kill()  # SIGKILL: no cleanup, no flush, like a crash
                session.killed = True
                return

    try:
        await asyncio.wait_for(pump(), _SESSION_TIMEOUT)
    except asyncio.TimeoutError:
        proc.kill()
        session.error = f"process {session.index} did not finish within {_SESSION_TIMEOUT}s"
    session.returncode = await proc.wait()
    if session.killed:
        session.latest_at_kill = await _latest(store, config)
        if session.latest_at_kill is not None:
            observed.append(session.latest_at_kill.seq)
    elif session.returncode != 0 and session.error is None:
        tail = stderr_path.read_text("utf-8", errors="replace")[-2000:]
        session.error = f"exit status {session.returncode}: {tail.strip() or 'no output'}"


def _json(text: str) -> dict[str, Any]:
    value = json.loads(text)
    return value if isinstance(value, dict) else {"event": "garbage", "value": value}


async def _reference(config: DemoConfig) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """An uninterrupted run in memory: the result every resumed run must reach."""
    points: list[tuple[str, int]] = []

    async def emit(event: dict[str, Any]) -> None:
        if event.get("event") == "point":
            points.append((event["point"], event["step"]))

    reference = replace(
        config,
        store_url="memory://",
        store_options={},
        workdir=str(Path(config.workdir) / "reference"),
        pause_at=None,
    )
    async with open_store("memory://") as store:
        result = await run_agent(store, reference, emit)
    return result, points


def _remaining(points: list[tuple[str, int]], latest: Checkpoint | None) -> int:
    """Points the reference run passes after ``latest``'s boundary (to aim random kills)."""
    if latest is None:
        return len(points)
    here = (latest.phase.value, latest.step)
    last = max((i for i, p in enumerate(points) if p == here), default=-1)
    return max(1, len(points) - last - 1)


async def run_demo(
    *,
    store_url: str,
    workdir: str | Path,
    steps: int = 4,
    seed: int = 7,
    kill_at: str = "random",
    kills: int = 1,
    store_options: dict[str, Any] | None = None,
    run_id: str | None = None,
    rng: random.Random | None = None,
) -> DemoReport:
    """Run the crash-and-resume demo and verify it; see the module docstring."""
    mode, pause_at = parse_kill_at(kill_at, steps)
    rng = rng or random.Random(seed)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config = DemoConfig(
        store_url=store_url,
        store_options=dict(store_options or {}),
        workdir=str(workdir / "world"),
        run_id=run_id or f"demo-{uuid.uuid4().hex[:10]}",
        steps=steps,
        seed=seed,
    )
    expected, reference_points = await _reference(config)
    sessions: list[Session] = []
    observed: list[int] = []
    kills_left = 0 if mode == "none" else (1 if mode == "point" else kills)
    async with open_store(store_url, **(store_options or {})) as store:
        if not store.capabilities.cross_process:
            raise click.UsageError(
                f"{redact_url(store_url)} is not shared between processes, and the demo "
                "resumes the agent in a new process; use file://, redis://, postgresql+... "
                "or another cross-process store"
            )
        while True:
            session = Session(index=len(sessions) + 1)
            sessions.append(session)
            child = config
            kill_after: int | None = None
            delay = 0.0
            if kills_left and mode == "point":
                child = replace(config, pause_at=pause_at)
                session.kill_plan = f"frozen at {pause_at}, then SIGKILL"
            elif kills_left:
                remaining = _remaining(reference_points, await _latest(store, config))
                kill_after = rng.randint(1, remaining)
                delay = rng.uniform(0, 0.003)
                session.kill_plan = f"SIGKILL {delay * 1000:.1f} ms after its point #{kill_after}"
            await _run_session(session, child, store, observed, kill_after, delay)
            if not session.killed:
                break  # finished, or failed: either way the verification says which
            kills_left -= 1
        return await _verify(store, config, expected, sessions, observed, mode, pause_at)


async def _verify(
    store: MemoryStore,
    config: DemoConfig,
    expected: dict[str, Any],
    sessions: list[Session],
    observed: list[int],
    mode: str,
    pause_at: str | None,
) -> DemoReport:
    world = OutsideWorld(config.workdir)
    done = sessions[-1].first("done")
    result = done["result"] if done is not None else None
    history = await store.history(config.thread_id, config.run_id)
    latest = await _latest(store, config)
    effects = await store.list_state(config.thread_id, f"{EFFECT_PREFIX}{config.run_id}:")
    outside = world.read(world.effects)
    invocations = world.read(world.invocations)
    llm_calls = world.read(world.llm_calls)
    checks: list[Check] = []

    errors = [s.error for s in sessions if s.error]
    checks.append(
        Check(
            "the run finished",
            result is not None and not errors,
            "; ".join(errors) if errors else f"after {len(sessions)} processes",
        )
    )
    checks.append(
        Check(
            "same result as an uninterrupted run",
            result == expected,
            "identical" if result == expected else f"got {result!r}, expected {expected!r}",
        )
    )
    keys = Counter(e["key"] for e in outside)
    repeated = sorted(k for k, n in keys.items() if n > 1)
    checks.append(
        Check(
            "each outside effect happened exactly once",
            not repeated and bool(outside) == bool(effects),
            f"{len(outside)} effects, {len(repeated)} duplicated" + _ids(repeated),
        )
    )
    recorded = {
        r.get("idempotency_key")
        for r in effects.values()
        if r.get("status", "done") == "done" and r.get("success")
    }
    unrecorded = sorted(set(keys) - recorded)
    missing = sorted(str(k) for k in recorded - set(keys))
    checks.append(
        Check(
            "every recorded effect is in the outside world, and nothing else is",
            not unrecorded and not missing and len(recorded) == len(effects),
            f"{len(recorded)} recorded; {len(unrecorded)} unrecorded, {len(missing)} missing"
            + _ids(unrecorded + missing),
        )
    )
    twice = []
    for record in effects.values():
        attempts = [i["attempt"] for i in invocations if i["key"] == record.get("idempotency_key")]
        if len(attempts) != len(set(attempts)) or len(attempts) > int(record.get("attempt", 1)):
            twice.append(str(record.get("idempotency_key")))
    checks.append(
        Check(
            "no recorded effect was executed twice",
            not twice,
            f"{len(invocations)} tool invocations for {len(effects)} effects"
            + (f"; re-executed after being recorded: {_ids(twice)}" if twice else ""),
        )
    )
    checks.append(
        Check(
            "latest never moved backwards",
            observed == sorted(observed),
            f"{len(observed)} observations while the processes ran and after each kill",
        )
    )
    newest = max((r.seq for r in history), default=-1)
    checks.append(
        Check(
            "latest is the run's newest record and it is terminal",
            latest is not None and latest.is_terminal and latest.seq >= newest,
            f"latest seq {format_seq(latest.seq) if latest else '-'}, newest record "
            f"{format_seq(newest) if newest >= 0 else '-'}",
        )
    )
    if mode == "point":
        landed = any(s.killed for s in sessions)
        checks.append(
            Check(
                f"the kill landed at {pause_at}",
                landed,
                "yes" if landed else f"the run never reached {pause_at}; try another --kill-at",
            )
        )
    return DemoReport(
        config=config,
        expected=expected,
        result=result,
        sessions=sessions,
        history=history,
        latest=latest,
        effects=effects,
        outside=outside,
        invocations=invocations,
        llm_calls=llm_calls,
        observed_latest=observed,
        checks=checks,
    )


def _ids(keys: list[str]) -> str:
    return f" ({', '.join(k[-12:] for k in keys[:5])})" if keys else ""


# -- rendering ----------------------------------------------------------------------------


def render(report: DemoReport) -> None:
    """Print the sessions, the timeline, the effects and the checks."""
    cfg = report.config
    console.rule("[bold]checkpoint-stores demo: crash and resume")
    console.print(
        f"store [cyan]{escape(redact_url(cfg.store_url))}[/]  thread [cyan]{cfg.thread_id}[/]  "
        f"run [cyan]{cfg.run_id}[/]  steps {cfg.steps}  seed {cfg.seed}",
        highlight=False,
    )
    console.print(
        "A scripted agent plans payments and notifications; its tools append to an outside log "
        f"({escape(cfg.workdir)}/outside.jsonl). Each process is a fresh interpreter.\n",
        highlight=False,
    )
    for session in report.sessions:
        _render_session(session)
    console.print()
    _render_timeline(report)
    _render_effects(report)
    _render_llm(report)
    console.print()
    for check in report.checks:
        mark = "[bold green]✓[/]" if check.ok else "[bold red]✗[/]"
        console.print(f"{mark} {check.name} [dim]({escape(check.detail)})[/]", highlight=False)
    verdict = "[bold green]all checks passed[/]" if report.ok else "[bold red]a check failed[/]"
    console.print(f"\n{verdict}")


def _render_session(session: Session) -> None:
    start = session.first("session")
    head = f"[bold]process {session.index}[/]"
    if start is None:
        console.print(f"{head}: died before it claimed the run ({escape(session.error or '')})")
        return
    if not start["resumed"]:
        how = "started a new run (epoch 0)"
    elif start["terminal"]:
        how = "found the run finished: returned its stored result"
    else:
        latest = start["latest"]
        how = (
            f"claimed the run (epoch {start['epoch']}); latest was {latest['phase']}@"
            f"{latest['step']}; resumed at step {start['step']} from "
            f"{'the runtime key' if start['source'] == 'runtime_key' else 'no snapshot'}"
        )
        if start["pending_llm_response"]:
            how += ", reusing the pending LLM response"
    effects = session.of("effect")
    executed = sum(e["executed"] for e in effects)
    replayed = sum(e["replayed"] for e in effects)
    in_doubt = sum(e["in_doubt"] for e in effects)
    doing = f"effects: {executed} executed, {replayed} replayed, {in_doubt} in doubt (re-executed)"
    console.print(f"{head} pid {start['pid']}: {how}. {doing}.", highlight=False)
    if session.killed:
        at_kill = session.latest_at_kill
        durable = (
            f"{at_kill.phase.value}@{at_kill.step} seq {format_seq(at_kill.seq)}"
            if at_kill
            else "nothing"
        )
        console.print(
            f"  [bold red]✗ killed[/] ({session.kill_plan}); last point reported: "
            f"{session.last_point}; durable latest: {durable}; "
            f"{session.lost_checkpoints} submitted checkpoints were not durable yet",
            highlight=False,
        )
    elif session.error:
        console.print(f"  [bold red]error:[/] {escape(session.error)}", highlight=False)
    else:
        console.print("  [green]✓ finished[/]")


def _render_timeline(report: DemoReport) -> None:
    table = Table(title="timeline: the run's checkpoints as stored", title_justify="left")
    for column in ("seq (epoch:n)", "step", "phase", "written by"):
        table.add_column(column)
    by_epoch: dict[int, int] = {}
    for session in report.sessions:
        if session.epoch is not None:
            by_epoch.setdefault(session.epoch, session.index)
    kills = {s.epoch: s for s in report.sessions if s.killed and s.epoch is not None}
    rows = sorted(report.history, key=lambda r: r.seq)
    for i, record in enumerate(rows):
        style = "bold" if record.is_terminal else ""
        table.add_row(
            format_seq(record.seq),
            str(record.step),
            record.phase.value,
            f"process {by_epoch.get(record.epoch, '?')}",
            style=style,
        )
        following = rows[i + 1].epoch if i + 1 < len(rows) else None
        if record.epoch in kills and following != record.epoch:
            session = kills[record.epoch]
            table.add_row(
                "",
                "",
                f"[red]✗ SIGKILL (after {session.last_point})[/]",
                f"process {session.index}",
            )
    console.print(table)


def _render_effects(report: DemoReport) -> None:
    table = Table(title="effects (ledger records vs the outside world)", title_justify="left")
    for column in ("step", "tool call", "tool", "attempts", "per process", "outside"):
        table.add_column(column)
    outside = Counter(e["key"] for e in report.outside)
    for key, record in sorted(report.effects.items()):
        _, _, rest = key.partition(f"{EFFECT_PREFIX}{report.config.run_id}:")
        step, _, call_id = rest.partition(":")
        ikey = record.get("idempotency_key")
        history = []
        for session in report.sessions:
            for e in session.of("effect"):
                if e["key"] == ikey:
                    what = "executed" if e["executed"] else "replayed"
                    history.append(
                        f"{session.index}:{what}{' (in doubt)' if e['in_doubt'] else ''}"
                    )
        table.add_row(
            step,
            call_id,
            str(record.get("tool_name")),
            str(record.get("attempt", 1)),
            ", ".join(history),
            f"{outside.get(ikey, 0)}x",
        )
    console.print(table)


def _render_llm(report: DemoReport) -> None:
    calls = Counter(int(c["step"]) for c in report.llm_calls)
    reused = sum(len(s.of("llm_reused")) for s in report.sessions)
    repeated = sum(n - 1 for n in calls.values() if n > 1)
    console.print(
        f"LLM calls: {sum(calls.values())} for {report.config.steps} steps; pending responses "
        f"reused on resume: {reused}; repeated calls: {repeated} (only when the kill landed "
        "before the response was durable)",
        highlight=False,
    )


# -- the command ----------------------------------------------------------------------------


@click.command()
@click.option(
    "--store",
    "store_url",
    metavar="URL",
    help="Store to run against (default: file:// in a temporary directory).",
)
@click.option(
    "--kill-at",
    default="random",
    show_default=True,
    metavar="PHASE[@STEP]|random|none",
    help=f"Where to SIGKILL the agent: {', '.join(KILL_POINTS)}, random, or none.",
)
@click.option("--steps", default=4, show_default=True, type=click.IntRange(2, 50))
@click.option("--seed", default=7, show_default=True, type=int, help="Seeds the plan and kills.")
@click.option(
    "--kills",
    default=1,
    show_default=True,
    type=click.IntRange(0, 100),
    help="With --kill-at random: how many processes to kill before letting one finish.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary directory (store and logs).")
@option_flag
@run_async
async def demo(
    store_url: str | None,
    kill_at: str,
    steps: int,
    seed: int,
    kills: int,
    keep: bool,
    options: tuple[str, ...],
) -> None:
    """Kill a scripted agent with SIGKILL mid-run, resume it, and prove nothing ran twice."""
    workdir = Path(tempfile.mkdtemp(prefix="checkpoint-stores-demo-"))
    url = store_url or f"file://{workdir}/store"
    try:
        report = await run_demo(
            store_url=url,
            workdir=workdir,
            steps=steps,
            seed=seed,
            kill_at=kill_at,
            kills=kills,
            store_options=parse_options(options),
        )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    render(report)
    if keep or not report.ok:
        console.print(f"files kept in {workdir}", highlight=False)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if not report.ok:
        sys.exit(1)
