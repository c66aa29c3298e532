"""Session fixture ``s3_server``: moto's S3 over real HTTP on loopback, or a real S3/MinIO.

* ``CHECKPOINT_STORES_TEST_S3_URL`` set (``s3://bucket/prefix?endpoint_url=...``,
  credentials from the standard AWS environment): the session uses a fresh
  sub-prefix of it and deletes what it wrote at the end.
* Otherwise: moto's ``ThreadedMotoServer`` on a free 127.0.0.1 port, a bucket
  created for the session, the server stopped at the end.

moto checks ``If-Match``/``If-None-Match`` on PutObject and then stores the
object without holding a lock, so two racing conditional PUTs could in
principle both pass (S3 itself serializes them). The fixture's server wraps
moto's WSGI app so that writes (PUT, POST, DELETE) run one at a time, which
gives moto S3's atomic conditional writes; reads stay concurrent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from tests.support import ServerInfo, backend_unavailable, free_port

S3_URL_ENV = "CHECKPOINT_STORES_TEST_S3_URL"
MOTO_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
_WRITES = frozenset({"PUT", "POST", "DELETE"})

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def serialized_writes(app: WSGIApp) -> WSGIApp:
    """Wrap a WSGI app so write requests run one at a time (reads stay concurrent)."""
    lock = threading.Lock()

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") in _WRITES:
            with lock:
                # moto builds the whole response inside the call; materialize it under the lock.
                body = app(environ, start_response)
                try:
                    return list(body)
                finally:
                    close = getattr(body, "close", None)
                    if close is not None:
                        close()
        return app(environ, start_response)

    return wrapped


def start_moto(*, serialize_writes: bool = True) -> tuple[Any, str, str]:
    """Start moto's ThreadedMotoServer on a free loopback port: ``(server, endpoint, version)``."""
    try:
        import moto
        from moto.moto_server.threaded_moto_server import ThreadedMotoServer
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server
    except ImportError as exc:
        backend_unavailable(
            "s3", f"moto's server could not be imported ({exc}); pip install moto[s3] flask"
        )

    class SerializedMotoServer(ThreadedMotoServer):  # type: ignore[misc]
        """ThreadedMotoServer whose writes are serialized (see the module docstring)."""

        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)
            self._server = make_server(
                self._ip_address,
                self._port,
                serialized_writes(app),
                True,
                request_handler=MotoRequestHandler,
            )
            self._server_ready_event.set()
            self._server.serve_forever()

    # One access-log line per request would drown the test output.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    cls = SerializedMotoServer if serialize_writes else ThreadedMotoServer
    port = free_port()
    server = cls(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, f"http://127.0.0.1:{port}", str(moto.__version__)


async def _create_bucket(endpoint: str, bucket: str) -> None:
    from aiobotocore.session import get_session

    session = get_session()
    async with session.create_client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", **MOTO_CREDENTIALS
    ) as client:
        await client.create_bucket(Bucket=bucket)


async def _purge(url: str, options: dict[str, object]) -> int:
    """Delete everything under the session's prefix of a real S3 (what the session wrote)."""
    from checkpoint_stores.backends.s3 import S3Backend

    backend = S3Backend(url, **options)
    try:
        await backend.setup()
        threads = [t async for t in backend.list_threads()]
        removed = sum([await backend.delete_thread(t) for t in threads])
        # The layout marker setup wrote (private name: test clean-up only).
        await backend._request("delete_object", Key=backend._root + ".checkpoint-stores/layout")
        return removed
    finally:
        await backend.close()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[ServerInfo]:
    """An S3 bucket and prefix for the session (moto, or ``CHECKPOINT_STORES_TEST_S3_URL``)."""
    external = os.environ.get(S3_URL_ENV, "").strip()
    if external:
        from checkpoint_stores.urls import redact_url

        base, sep, query = external.partition("?")
        url = f"{base.rstrip('/')}/session-{uuid.uuid4().hex[:12]}{sep}{query}"
        info = ServerInfo("s3", url, {}, description=f"external S3 at {redact_url(external)}")
        try:
            yield info
        finally:
            asyncio.run(_purge(url, {}))
        return
    server, endpoint, version = start_moto()
    try:
        bucket = f"checkpoint-stores-test-{uuid.uuid4().hex[:12]}"
        asyncio.run(_create_bucket(endpoint, bucket))
        options: dict[str, object] = {
            "endpoint_url": endpoint,
            "region_name": "us-east-1",
            **MOTO_CREDENTIALS,
        }
        yield ServerInfo(
            "s3",
            f"s3://{bucket}/session",
            options,
            description=(
                f"moto {version} ThreadedMotoServer on {endpoint.removeprefix('http://')} "
                "(writes serialized: moto's conditional PUT is check-then-write)"
            ),
        )
    finally:
        server.stop()
