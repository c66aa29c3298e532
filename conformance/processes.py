"""Worker processes for the cross-process checks (the parent side).

A worker is ``python -m checkpoint_stores.conformance.worker``: it reads one
JSON job from stdin, opens the store, says ``ready``, waits for ``go`` (so all
workers start their race together), runs the scenario and prints one JSON
result. Workers print only JSON lines on stdout; their stderr is kept and
shown when one fails. Every worker is stopped (by its own pid) when the check ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Worker", "WorkerError", "WorkerSpec", "run_workers", "start_workers"]

_STDERR_TAIL = 3000


class WorkerError(RuntimeError):
    """A worker process failed, timed out or broke the protocol."""


@dataclass(frozen=True)
class WorkerSpec:
    """One worker's job: which store, which scenario, which parameters."""

    url: str
    options: dict[str, Any]
    scenario: str
    params: dict[str, Any]
    imports: Sequence[str] = ()
    sys_path: Sequence[str] = field(default_factory=lambda: list(sys.path))

    def to_json(self) -> str:
        """The job as one JSON line."""
        return json.dumps(
            {
                "url": self.url,
                "options": self.options,
                "scenario": self.scenario,
                "params": self.params,
                "imports": list(self.imports),
                "sys_path": list(self.sys_path),
            }
        )


class Worker:
    """One running worker process."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc = proc
        self.name = name
        self._stderr = bytearray()
        assert proc.stderr is not None
        self._drain = asyncio.ensure_future(self._read_stderr(proc.stderr))

    async def _read_stderr(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self._stderr.extend(chunk)
            del self._stderr[: max(0, len(self._stderr) - 4 * _STDERR_TAIL)]

    def stderr_tail(self) -> str:
        """The last lines the worker wrote to stderr."""
        return self._stderr.decode("utf-8", "replace")[-_STDERR_TAIL:]

    async def send(self, line: str) -> None:
        """Write one line to the worker's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode("utf-8") + b"\n")
        await self.proc.stdin.drain()

    async def event(self, timeout: float) -> dict[str, Any]:
        """The worker's next JSON event; :class:`WorkerError` if it dies, errs or hangs."""
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except asyncio.TimeoutError:
            raise WorkerError(f"{self.name} sent nothing for {timeout:.0f}s (hung?)") from None
        if not line:
            code = await self.proc.wait()
            await asyncio.sleep(0.05)
            raise WorkerError(
                f"{self.name} exited (status {code}) before finishing.\n"
                f"worker stderr:\n{self.stderr_tail()}"
            )
        try:
            event: dict[str, Any] = json.loads(line)
        except ValueError:
            raise WorkerError(f"{self.name} printed a non-JSON line: {line[:200]!r}") from None
        if event.get("event") == "error":
            raise WorkerError(
                f"{self.name} failed: {event.get('type')}: {event.get('message')}\n"
                f"{event.get('traceback', '')}"
            )
        return event

    async def expect(self, kind: str, timeout: float) -> dict[str, Any]:
        """The next event, which must be of ``kind``."""
        event = await self.event(timeout)
        if event.get("event") != kind:
            raise WorkerError(f"{self.name} sent {event.get('event')!r}, expected {kind!r}")
        return event

    def kill(self) -> None:
        """SIGKILL the worker (a crash, as far as the store can tell)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def stop(self) -> None:
        """Make sure the worker is gone and its pipes are closed."""
        self.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait(), 10)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self._drain.cancel()
        with contextlib.suppress(BaseException):
            await self._drain


async def _spawn(spec: WorkerSpec, name: str) -> Worker:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "checkpoint_stores.conformance.worker",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        limit=16 * 1024 * 1024,
    )
    worker = Worker(proc, name)
    await worker.send(spec.to_json())
    return worker


@contextlib.asynccontextmanager
async def start_workers(
    specs: Sequence[WorkerSpec], *, ready_timeout: float = 120.0
) -> AsyncIterator[list[Worker]]:
    """Start one worker per spec and wait until each has opened the store.

    The workers are stopped when the block exits, whatever happened.
    """
    workers: list[Worker] = []
    try:
        for i, spec in enumerate(specs):
            workers.append(await _spawn(spec, f"worker {i} ({spec.scenario})"))
        for worker in workers:
            await worker.expect("ready", ready_timeout)
        yield workers
    finally:
        for worker in workers:
            await worker.stop()


async def run_workers(specs: Sequence[WorkerSpec], *, timeout: float = 180.0) -> list[Any]:
    """Start the workers, release them at once, and return each one's result, in order."""
    async with start_workers(specs) as workers:
        # A shared start instant (CLOCK_MONOTONIC is system-wide): round r of every
        # worker begins at the same moment, so the race is real, not sequential.
        start = time.monotonic() + 0.25
        for worker in workers:
            await worker.send(f"go {start!r}")
        results = await asyncio.gather(*(w.expect("result", timeout) for w in workers))
    return [event.get("data") for event in results]
