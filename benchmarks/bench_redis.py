"""Redis: the backend and the store facade against raw redis-py doing the same work.

* commit: ``RedisBackend.commit`` (and ``MemoryStore.append``, which adds the
  codec) against raw redis-py running the very same Lua script
  (``LUA_COMMIT``) with the same keys and arguments, one client, one
  operation at a time, for 1 KB and 100 KB records;
* latest: ``MemoryStore.latest`` (GET, codec, schema validation) and
  ``RedisBackend.get`` against a raw ``GET`` of the same bytes.

Run: ``python -m benchmarks redis``. Uses the Redis at
``CHECKPOINT_STORES_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``)
under a key prefix of its own, removed afterwards.
"""

from __future__ import annotations

import base64
import itertools
import os
import uuid

import orjson

from benchmarks._harness import Report, Unavailable, compare
from checkpoint_stores import MemoryStore
from checkpoint_stores.keys import checkpoint_key, checkpoint_latest_key
from checkpoint_stores.schema import Checkpoint, Phase

SIZES = {"1 KB": 1024, "100 KB": 100 * 1024}


async def main(report: Report) -> None:
    """Run the Redis comparisons."""
    try:
        import redis.asyncio as aioredis

        from checkpoint_stores.backends.redis import LUA_COMMIT, RedisBackend
    except ImportError as exc:
        raise Unavailable(
            f'redis-py is not installed ({exc}): pip install "checkpoint-stores[redis]"'
        ) from None
    url = os.environ.get("CHECKPOINT_STORES_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    raw = aioredis.Redis.from_url(url)
    try:
        await raw.ping()
    except (aioredis.RedisError, OSError) as exc:
        await raw.aclose()
        raise Unavailable(f"no Redis at {url}: {exc}") from None

    prefix = f"cs-bench-{uuid.uuid4().hex[:8]}:"
    backend = RedisBackend(url, key_prefix=prefix)
    store = MemoryStore(backend, url=url)
    await store.setup()
    raw_commit = raw.register_script(LUA_COMMIT)
    thread_id = "bench-thread"
    names = backend.key_names(thread_id)
    seqs = itertools.count(1)  # shared: ours and raw advance the same head
    try:
        for label, size in SIZES.items():
            run_id = f"run-{size}"
            record_key = checkpoint_key(run_id, 1, Phase.PRE_LLM.value)
            head_key = checkpoint_latest_key(run_id)
            value = os.urandom(size)
            raw_keys = [
                names.index_key,
                names.seqs_key,
                names.value_prefix + head_key.encode(),
                names.value_prefix + record_key.encode(),
            ]

            async def ours_commit(
                record_key: str = record_key, head_key: str = head_key, value: bytes = value
            ) -> None:
                assert await backend.commit(
                    thread_id, [(record_key, value)], head_key, value, next(seqs)
                )

            async def raw_commit_op(
                raw_keys: list[bytes] = raw_keys,
                record_key: str = record_key,
                head_key: str = head_key,
                value: bytes = value,
            ) -> None:
                args = [str(next(seqs)), 0, head_key.encode(), value, record_key.encode(), value]
                assert await raw_commit(keys=raw_keys, args=args)

            await compare(
                report,
                "redis",
                f"commit {label}: backend vs raw script",
                ours_commit,
                raw_commit_op,
                target=0.8,
            )

            # Random text: JSON of about `size` bytes that zstd cannot shrink to nothing.
            blob = base64.b64encode(os.urandom(max(0, size - 200) * 3 // 4)).decode()
            payload = {"blob": blob}

            async def ours_append(run_id: str = run_id, payload: dict[str, str] = payload) -> None:
                await store.append(
                    Checkpoint(
                        run_id=run_id,
                        thread_id=thread_id,
                        seq=next(seqs),
                        step=1,
                        phase=Phase.PRE_LLM,
                        payload=payload,
                    )
                )

            sample = store.encode_checkpoint(
                Checkpoint(
                    run_id=run_id, thread_id=thread_id, seq=1, step=1, phase=Phase.PRE_LLM,
                    payload=payload,
                )
            )  # fmt: skip

            async def raw_same_bytes(
                raw_keys: list[bytes] = raw_keys,
                record_key: str = record_key,
                head_key: str = head_key,
                sample: bytes = sample,
            ) -> None:
                args = [str(next(seqs)), 0, head_key.encode(), sample, record_key.encode(), sample]
                assert await raw_commit(keys=raw_keys, args=args)

            await compare(
                report,
                "redis",
                f"append {label}: store (codec + commit) vs raw script",
                ours_append,
                raw_same_bytes,
                target=None,
                note=f"record {len(sample):,} bytes",
            )

            latest_key = names.value_prefix + head_key.encode()

            async def ours_latest(run_id: str = run_id) -> None:
                await store.latest(thread_id, run_id)

            async def ours_get(head_key: str = head_key) -> None:
                await backend.get(thread_id, head_key)

            async def raw_get(latest_key: bytes = latest_key) -> None:
                await raw.get(latest_key)

            await compare(
                report, "redis", f"latest() {label}: store vs raw GET", ours_latest, raw_get,
                target=0.8,
            )  # fmt: skip
            await compare(
                report, "redis", f"get {label}: backend vs raw GET", ours_get, raw_get,
                target=0.8,
            )  # fmt: skip

            async def raw_get_parsed(latest_key: bytes = latest_key) -> None:
                # What any reader of this record must do: fetch, unwrap the envelope
                # (checksum, zstd) and parse the JSON -- everything but validation.
                orjson.loads(store.codec.unwrap(await raw.get(latest_key)))

            await compare(
                report, "redis", f"latest() {label}: store vs raw GET + JSON parse",
                ours_latest, raw_get_parsed, target=None,
                note="information: raw unwraps and parses too; the gap is record validation",
            )  # fmt: skip
    finally:
        await backend.delete_thread(thread_id)
        await store.close()
        await raw.aclose()
