"""A loopback TCP proxy that injects faults between a client and a real server.

Runs its own event loop in a thread, so it serves clients of any loop (and
other processes). Faults:

* ``latency``: seconds added before each chunk is forwarded, both ways;
* ``cut()``: close every open connection now (the server sees a reset);
* ``blackhole``: accept connections but forward nothing (timeouts);
* ``refuse``: close new connections at once (server down);
* ``recover()``: clear every fault.

>>> with FaultProxy("127.0.0.1", 6379) as proxy:   # doctest: +SKIP
...     url = f"redis://127.0.0.1:{proxy.port}/0"
...     proxy.cut()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from types import TracebackType


class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``target_host:target_port``, with faults on demand."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.latency = 0.0
        self.blackhole = False
        self.refuse = False
        self.connections_accepted = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fault-proxy", daemon=True
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port: int = sock.getsockname()[1]
        self._sock = sock

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> FaultProxy:
        """Start listening."""
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        fut.result(timeout=10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, sock=self._sock)

    def stop(self) -> None:
        """Close everything and stop the thread."""

        async def _stop() -> None:
            if self._server is not None:
                self._server.close()
            self._close_all()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- faults --------------------------------------------------------------------
    def cut(self) -> None:
        """Reset every open connection now."""
        asyncio.run_coroutine_threadsafe(self._cut(), self._loop).result(timeout=10)

    async def _cut(self) -> None:
        self._close_all()

    def recover(self) -> None:
        """Clear latency, blackhole and refuse."""
        self.latency = 0.0
        self.blackhole = False
        self.refuse = False

    def _close_all(self) -> None:
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                transport = writer.transport
                sock = transport.get_extra_info("socket")
                if sock is not None:  # RST rather than FIN: what a crashed peer looks like
                    sock.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                    )
                transport.abort()
        self._writers.clear()

    # -- forwarding ----------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        if self.refuse:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )
        for w in (writer, up_writer):
            self._writers.discard(w)
            with contextlib.suppress(Exception):
                w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                while self.blackhole:  # noqa: ASYNC110 - a flag flipped from another thread
                    await asyncio.sleep(0.05)
                if self.latency:
                    await asyncio.sleep(self.latency)
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()
