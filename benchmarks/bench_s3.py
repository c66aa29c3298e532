"""S3: the backend and the store facade against raw aiobotocore doing the same requests.

* commit: ``S3Backend.commit`` (HEAD the head, PUT the record, PUT the head
  with ``If-Match``) against raw aiobotocore sending those three requests
  (``head_object``, ``put_object``, ``put_object(IfMatch=etag)`` with the seq
  in metadata) on one client, one operation at a time;
* append: ``MemoryStore.append`` (codec + commit) against the same three raw
  requests carrying the same encoded bytes;
* latest: ``MemoryStore.latest`` (GET, framing, codec, schema validation) and
  ``S3Backend.get`` against a raw ``get_object`` plus body read.

Records of 1 KB and 100 KB. Run: ``python -m benchmarks s3``. The server is
``CHECKPOINT_STORES_TEST_S3_URL`` (with the standard AWS credentials) when
set, otherwise a moto server started in a child process on a free loopback
port (its own process, so server work does not share this process's GIL),
with a bucket of its own; it is stopped afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from benchmarks._harness import Report, Unavailable, compare
from checkpoint_stores import MemoryStore
from checkpoint_stores.keys import checkpoint_key, checkpoint_latest_key
from checkpoint_stores.schema import Checkpoint, Phase

SIZES = {"1 KB": 1024, "100 KB": 100 * 1024}
OPS = {"ops": 40, "rounds": 7, "warmup": 5}
MOTO_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[tuple[str, dict[str, Any], str]]:
    """``(url, options, description)`` of the S3 to measure against."""
    external = os.environ.get("CHECKPOINT_STORES_TEST_S3_URL", "").strip()
    if external:
        base, sep, query = external.partition("?")
        url = f"{base.rstrip('/')}/bench-{uuid.uuid4().hex[:8]}{sep}{query}"
        yield url, {}, "CHECKPOINT_STORES_TEST_S3_URL"
        return
    try:
        import moto
        from aiobotocore.session import get_session
    except ImportError as exc:
        raise Unavailable(f"moto or aiobotocore is missing ({exc}): pip install moto[s3]") from None
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "moto.server",
        "-H",
        "127.0.0.1",
        "-p",
        str(port),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            if time.monotonic() > deadline or proc.returncode is not None:
                raise Unavailable("the moto server did not start")
            await asyncio.sleep(0.05)
        bucket = f"cs-bench-{uuid.uuid4().hex[:8]}"
        async with get_session().create_client(
            "s3", endpoint_url=endpoint, region_name="us-east-1", **MOTO_CREDENTIALS
        ) as client:
            await client.create_bucket(Bucket=bucket)
        options = {"endpoint_url": endpoint, "region_name": "us-east-1", **MOTO_CREDENTIALS}
        yield f"s3://{bucket}/bench", options, f"moto {moto.__version__} server, own process"
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()


async def main(report: Report) -> None:
    """Run the S3 comparisons."""
    try:
        from aiobotocore.session import get_session

        from checkpoint_stores.backends.s3 import S3Backend
    except ImportError as exc:
        raise Unavailable(
            f'aiobotocore is not installed ({exc}): pip install "checkpoint-stores[s3]"'
        ) from None
    async with _server() as (url, options, where):
        report.console.print(f"  server: {where}")
        backend = S3Backend(url, **options)
        store = MemoryStore(backend, url=url)
        await store.setup()
        client_options = {
            k: options[k]
            for k in ("endpoint_url", "region_name", *MOTO_CREDENTIALS)
            if k in options
        }
        session = get_session()
        async with session.create_client("s3", **client_options) as raw:
            try:
                await _run(report, store, backend, raw)
            finally:
                threads = [t async for t in backend.list_threads()]
                for thread in threads:
                    await backend.delete_thread(thread)
                await store.close()


async def _run(report: Report, store: MemoryStore, backend: Any, raw: Any) -> None:
    bucket = backend.bucket
    thread_id = "bench-thread"
    seqs = itertools.count(1)
    for label, size in SIZES.items():
        run_id = f"run-{size}"
        record_key = checkpoint_key(run_id, 1, Phase.PRE_LLM.value)
        head_key = checkpoint_latest_key(run_id)
        value = os.urandom(size)
        # Raw uses names of its own, so neither side's If-Match sees the other's writes.
        raw_record = f"{backend._root}raw-{size}/record"
        raw_head = f"{backend._root}raw-{size}/head"
        await raw.put_object(Bucket=bucket, Key=raw_head, Body=b"", Metadata={"seq": "0"})

        async def raw_commit(
            body: bytes, raw_record: str = raw_record, raw_head: str = raw_head
        ) -> None:
            seq = next(seqs)
            head = await raw.head_object(Bucket=bucket, Key=raw_head)
            assert int(head["Metadata"]["seq"]) < seq
            await raw.put_object(Bucket=bucket, Key=raw_record, Body=body)
            await raw.put_object(
                Bucket=bucket,
                Key=raw_head,
                Body=body,
                IfMatch=head["ETag"],
                Metadata={"seq": str(seq)},
            )

        async def ours_commit(
            record_key: str = record_key, head_key: str = head_key, value: bytes = value
        ) -> None:
            assert await backend.commit(
                thread_id, [(record_key, value)], head_key, value, next(seqs)
            )

        async def raw_commit_value(value: bytes = value) -> None:
            await raw_commit(value)

        await compare(
            report,
            "s3",
            f"commit {label}: backend vs raw HEAD+PUT+PUT(If-Match)",
            ours_commit,
            raw_commit_value,
            target=0.8,
            **OPS,
        )

        # Random text: JSON of about `size` bytes that zstd cannot shrink to nothing.
        blob = base64.b64encode(os.urandom(max(0, size - 200) * 3 // 4)).decode()
        payload = {"blob": blob}

        def checkpoint(
            seq: int, run_id: str = run_id, payload: dict[str, str] = payload
        ) -> Checkpoint:
            return Checkpoint(
                run_id=run_id,
                thread_id=thread_id,
                seq=seq,
                step=1,
                phase=Phase.PRE_LLM,
                payload=payload,
            )

        sample = store.encode_checkpoint(checkpoint(1))

        async def ours_append() -> None:
            await store.append(checkpoint(next(seqs)))

        async def raw_append(sample: bytes = sample) -> None:
            await raw_commit(sample)

        await compare(
            report,
            "s3",
            f"append {label}: store vs raw same bytes",
            ours_append,
            raw_append,
            target=0.8,
            **OPS,
        )

        async def ours_latest(run_id: str = run_id) -> None:
            await store.latest(thread_id, run_id)

        async def ours_get(head_key: str = head_key) -> None:
            assert await backend.get(thread_id, head_key) is not None

        async def raw_get(raw_head: str = raw_head) -> None:
            response = await raw.get_object(Bucket=bucket, Key=raw_head)
            async with response["Body"] as stream:
                assert await stream.read()

        await compare(
            report,
            "s3",
            f"latest {label}: store.latest vs raw GET",
            ours_latest,
            raw_get,
            target=0.8,
            **OPS,
        )
        await compare(
            report,
            "s3",
            f"get {label}: backend vs raw GET",
            ours_get,
            raw_get,
            target=0.8,
            **OPS,
        )
