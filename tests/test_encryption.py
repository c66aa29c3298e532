"""AES-GCM encryption at rest: round trip, wrong/missing key, tampering, key parsing, rotate."""

from __future__ import annotations

import base64
import struct
import zlib

import pytest

from checkpoint_stores import (
    CheckpointStoreError,
    Codec,
    DecryptionError,
    MemoryStore,
    Phase,
    StaleWriterError,
    open_store,
)
from checkpoint_stores.codec import HEADER_SIZE, envelope_key_id
from checkpoint_stores.encryption import AESGCMCipher, generate_key, parse_key, rotate
from tests.ops_samples import cp, dump, fill, write_run

K1 = generate_key()
K2 = generate_key()


def codec(keys: dict[str, str], active: str | None = None) -> Codec:
    return Codec(cipher=AESGCMCipher(keys, active_key_id=active))


def reframe(data: bytes, body: bytes, flags: int | None = None) -> bytes:
    """An envelope with ``body`` and a correct CRC and length (so only AES-GCM can object)."""
    magic, version, old_flags = data[:3], data[3], data[4]
    header = struct.pack(
        ">3sBBII",
        magic,
        version,
        old_flags if flags is None else flags,
        zlib.crc32(body),
        len(body),
    )
    return header + body


# -- round trip --------------------------------------------------------------------


async def test_round_trip_through_a_store_keeps_ids_and_keys_readable() -> None:
    store = open_store("memory://", codec=codec({"k1": K1}))
    async with store:
        await store.append(cp("thread/1", "run-1", 1, 0, Phase.RUN_STARTED, agent_name="SECRET-X"))
        await store.put_state("thread/1", "notes", {"password": "SECRET-Y"})
        latest = await store.latest("thread/1", "run-1")
        assert latest.payload == {"agent_name": "SECRET-X"}
        assert await store.get_state("thread/1", "notes") == {"password": "SECRET-Y"}
        stored = await dump(store, ["thread/1"])
        keys = [k for k, _ in stored["thread/1"]]
        assert keys == ["checkpoint:run-1:0:run_started", "checkpoint:run-1:latest", "notes"]
        for _, value in stored["thread/1"]:
            assert envelope_key_id(value) == "k1"
            assert b"SECRET" not in value
            assert b"run_started" not in value


def test_large_values_are_compressed_then_encrypted() -> None:
    c = codec({"k1": K1})
    value = {"text": "abc " * 50_000}
    data = c.encode(value)
    assert data[4] == 0x03  # zstd + encrypted
    assert len(data) < 20_000
    assert c.decode(data) == value


def test_every_encryption_uses_a_fresh_nonce() -> None:
    c = codec({"k1": K1})
    first, second = c.encode({"a": 1}), c.encode({"a": 1})
    assert first != second
    nonce_at = HEADER_SIZE + 1 + len("k1")
    assert first[nonce_at : nonce_at + 12] != second[nonce_at : nonce_at + 12]


# -- wrong key, missing key, tampering -----------------------------------------------


def test_wrong_key_material_is_a_decryption_error_never_garbage() -> None:
    data = codec({"k1": K1}).encode({"a": 1})
    with pytest.raises(DecryptionError, match="authentication failed with key id 'k1'") as info:
        codec({"k1": K2}).decode(data, what="state 'x'")
    message = str(info.value)
    assert message.startswith("state 'x':")
    assert K1 not in message
    assert K2 not in message


def test_missing_key_id_names_it() -> None:
    data = codec({"old": K1}).encode({"a": 1})
    with pytest.raises(DecryptionError, match=r"'old'.*do not include.*'new'"):
        codec({"new": K2}).decode(data)


def test_store_without_cipher_says_the_value_is_encrypted() -> None:
    data = codec({"k1": K1}).encode({"a": 1})
    with pytest.raises(DecryptionError, match="no cipher"):
        Codec().decode(data)


def test_decryption_error_is_a_corruption_error() -> None:
    from checkpoint_stores import AgentCheckpointCorruptionError

    assert issubclass(DecryptionError, AgentCheckpointCorruptionError)


@pytest.mark.parametrize("where", ["nonce", "ciphertext", "tag"])
def test_tampered_ciphertext_is_detected(where: str) -> None:
    c = codec({"k1": K1})
    data = c.encode({"amount": 100, "to": "alice"})
    body = bytearray(data[HEADER_SIZE:])
    start = 1 + len("k1")
    offset = {"nonce": start, "ciphertext": start + 12 + 3, "tag": len(body) - 1}[where]
    body[offset] ^= 0x01
    with pytest.raises(DecryptionError, match="tampered"):
        c.decode(reframe(data, bytes(body)))


def test_flipped_header_flag_is_detected() -> None:
    """The header is associated data: claiming compression on a plain body fails to decrypt."""
    c = codec({"k1": K1})
    data = c.encode({"a": 1})
    assert data[4] == 0x02
    with pytest.raises(DecryptionError):
        c.decode(reframe(data, data[HEADER_SIZE:], flags=0x03))


def test_relabelled_key_id_is_detected() -> None:
    """Both keys identical: only the bound key id can tell the relabelling apart."""
    c = codec({"aa": K1, "bb": K1}, active="aa")
    data = c.encode({"a": 1})
    body = data[HEADER_SIZE:].replace(b"\x02aa", b"\x02bb", 1)
    with pytest.raises(DecryptionError):
        c.decode(reframe(data, body))


def test_truncated_ciphertext_is_detected() -> None:
    c = codec({"k1": K1})
    data = c.encode({"a": 1})
    body = data[HEADER_SIZE : HEADER_SIZE + 1 + 2 + 10]
    with pytest.raises(DecryptionError, match="truncated"):
        c.decode(reframe(data, body))


# -- keys ----------------------------------------------------------------------------


def test_keys_from_bytes_base64_and_urlsafe_base64() -> None:
    raw = bytes(range(32))
    assert parse_key(raw) == raw
    assert parse_key(base64.b64encode(raw).decode()) == raw
    assert parse_key(base64.urlsafe_b64encode(raw).decode().rstrip("=")) == raw
    data = codec({"k": base64.b64encode(raw).decode()}).encode([1])
    assert Codec(cipher=AESGCMCipher({"k": raw})).decode(data) == [1]


@pytest.mark.parametrize("bad", [b"short", "not base64 !!", base64.b64encode(b"x" * 20).decode()])
def test_bad_keys_are_refused_without_echoing_them(bad: bytes | str) -> None:
    with pytest.raises(ValueError, match="'mykey'") as info:
        parse_key(bad, key_id="mykey")
    assert str(bad) not in str(info.value)


def test_repr_never_shows_key_material() -> None:
    cipher = AESGCMCipher({"k1": K1, "k2": K2}, active_key_id="k2")
    assert repr(cipher) == "AESGCMCipher(active_key_id='k2', key_ids=['k1', 'k2'])"
    assert K1 not in repr(Codec(cipher=cipher))


def test_active_key_rules() -> None:
    with pytest.raises(ValueError, match="active_key_id"):
        AESGCMCipher({"a": K1, "b": K2})
    with pytest.raises(ValueError, match="not among"):
        AESGCMCipher({"a": K1}, active_key_id="b")
    with pytest.raises(ValueError, match="at least one"):
        AESGCMCipher({})
    assert AESGCMCipher({"only": K1}).active_key_id == "only"


def test_keys_from_environment() -> None:
    env = {"MY_KEYS": f"new:{K2}, old:{K1}"}
    cipher = AESGCMCipher.from_env("MY_KEYS", environ=env)
    assert cipher.active_key_id == "new"
    assert cipher.key_ids == {"new", "old"}
    with pytest.raises(ValueError, match="MY_KEYS is not set"):
        AESGCMCipher.from_env("MY_KEYS", environ={})
    with pytest.raises(ValueError, match="id:BASE64"):
        AESGCMCipher.from_spec("just-a-key")
    with pytest.raises(ValueError, match="twice"):
        AESGCMCipher.from_spec(f"a:{K1},a:{K2}")


# -- rotation ------------------------------------------------------------------------


async def _all_key_ids(store: MemoryStore, threads: list[str]) -> set[str | None]:
    return {
        envelope_key_id(v) for values in (await dump(store, threads)).values() for _, v in values
    }


async def test_rotation_moves_every_value_to_the_active_key() -> None:
    old = open_store("memory://rot", codec=codec({"k1": K1}))
    threads = await fill(old, "rot-", suffixes=("a", "b/../c"))
    assert await _all_key_ids(old, threads) == {"k1"}
    before = {t: await old.history(t, "done-run") for t in threads}
    old_latest = {t: await old.latest(t, "live-run") for t in threads}

    both = open_store("memory://rot", codec=codec({"k2": K2, "k1": K1}, active="k2"))
    # Before rotation: old records read with the old key, new writes use the new one.
    assert await both.history(threads[0], "done-run") == before[threads[0]]
    report = await rotate(both)
    assert report.ok, report.failed
    assert await _all_key_ids(both, threads) == {"k2"}
    assert sorted(r for _, r, _, _ in report.restamped) == [
        "done-run",
        "done-run",
        "live-run",
        "live-run",
    ]

    only_new = open_store("memory://rot", codec=codec({"k2": K2}))
    for thread in threads:
        assert await only_new.history(thread, "done-run") == before[thread]
        assert await only_new.get_state(thread, "notes") == {"owner": thread, "tags": ["a", "b"]}
        latest = await only_new.latest(thread, "live-run")
        assert latest.seq == old_latest[thread].seq + 1  # re-stamped in the same epoch
        assert latest.payload == old_latest[thread].payload
        snapshot = await only_new.runtime_snapshot(thread, "live-run")
        assert snapshot is not None
    with pytest.raises(DecryptionError):
        await old.latest(threads[0], "live-run")

    # Idempotent: nothing left to do.
    again = await rotate(both)
    assert again.reencrypted == 0
    assert again.restamped == []
    assert again.already_current == sum(len(v) for v in (await dump(both, threads)).values())


async def test_rotation_restamp_fences_the_old_writer_and_keeps_the_runtime_copy_in_step() -> None:
    store = open_store("memory://", codec=codec({"k1": K1}))
    chain = await write_run(store, "t", "r", finished=False, steps=1)  # ends with post_llm
    await store.append(cp("t", "r", chain[-1].seq + 1, 2, Phase.RUNTIME_STATE, messages=[]))
    seq = chain[-1].seq + 1
    store.codec = codec({"k2": K2, "k1": K1}, active="k2")
    report = await rotate(store)
    assert report.restamped == [("t", "r", seq, seq + 1)]
    latest = await store.latest("t", "r")
    runtime = await store.runtime_snapshot("t", "r")
    assert runtime is not None
    assert latest.seq == runtime.seq == seq + 1  # same record under both keys, same seq
    # A writer that was about to commit seq + 1 is now stale (documented: rotate idle runs).
    with pytest.raises(StaleWriterError):
        await store.append(cp("t", "r", seq + 1, 3, Phase.PRE_LLM))
    await store.append(cp("t", "r", seq + 2, 3, Phase.PRE_LLM))
    assert (await store.latest("t", "r")).seq == seq + 2


async def test_rotation_dry_run_and_one_run_only() -> None:
    store = open_store("memory://", codec=codec({"k1": K1}))
    threads = await fill(store, "d-", suffixes=("a",))
    store.codec = codec({"k2": K2, "k1": K1}, active="k2")
    before = await dump(store, threads)
    plan = await rotate(store, dry_run=True)
    assert await dump(store, threads) == before
    assert plan.reencrypted == sum(len(v) for v in before.values())
    report = await rotate(store, run_id="done-run")
    after = await dump(store, threads)
    for key_, value in after[threads[0]]:
        expected = "k2" if ":done-run:" in key_ else "k1"
        assert envelope_key_id(value) == expected, key_
    assert report.reencrypted == sum(1 for k, _ in before[threads[0]] if ":done-run:" in k)


async def test_rotation_encrypts_plain_values_and_reports_unreadable_ones() -> None:
    store = open_store("memory://")
    await store.put_state("t", "plain", {"a": 1})
    await store.backend.put("t", "afk-json", b'{"b": 2}')
    await store.backend.put("t", "garbage", b"\x00\x01 not json")
    store.codec = codec({"k1": K1})
    report = await rotate(store)
    assert [(k, e[:6]) for _, k, e in report.failed] == [("garbage", "'garba")]
    assert not report.ok
    assert await store.get_state("t", "plain") == {"a": 1}
    assert await store.get_state("t", "afk-json") == {"b": 2}
    assert envelope_key_id(await store.backend.get("t", "afk-json") or b"") == "k1"
    assert await store.backend.get("t", "garbage") == b"\x00\x01 not json"  # left as it was


async def test_rotation_with_an_unknown_old_key_fails_loudly_and_keeps_the_value() -> None:
    store = open_store("memory://", codec=codec({"lost": K1}))
    await store.put_state("t", "notes", {"a": 1})
    raw = await store.backend.get("t", "notes")
    store.codec = codec({"k2": K2})
    report = await rotate(store)
    assert [k for _, k, _ in report.failed] == ["notes"]
    assert "'lost'" in report.failed[0][2]
    assert await store.backend.get("t", "notes") == raw


async def test_rotation_needs_a_cipher() -> None:
    with pytest.raises(CheckpointStoreError, match="needs a store opened with a cipher"):
        await rotate(open_store("memory://"))


async def test_rotation_retries_when_a_writer_moves_the_head_meanwhile() -> None:
    from checkpoint_stores.backends.memory import MemoryBackend
    from tests.ops_samples import WrappedBackend

    inner = MemoryBackend()
    writer = open_store("memory://", codec=codec({"k1": K1}))
    writer.backend = inner
    chain = await write_run(writer, "t", "r", finished=False, steps=1)
    seq = chain[-1].seq

    class RacingBackend(WrappedBackend):
        raced = False

        async def commit(self, thread_id, writes, head_key, head_value, seq_):  # type: ignore[no-untyped-def]
            if not self.raced:
                self.raced = True  # the writer lands its next checkpoint first (old key)
                await writer.append(cp("t", "r", seq + 1, 2, Phase.PRE_LLM))
            return await super().commit(thread_id, writes, head_key, head_value, seq_)

    rotating = MemoryStore(RacingBackend(inner), codec=codec({"k2": K2, "k1": K1}, active="k2"))
    report = await rotate(rotating)
    assert report.ok, report.failed
    # The first re-stamp lost to the writer; the retry re-stamped the writer's head.
    assert report.restamped == [("t", "r", seq + 1, seq + 2)]
    latest = await rotating.latest("t", "r")
    assert (latest.seq, latest.step) == (seq + 2, 2)
    assert envelope_key_id(await inner.get("t", "checkpoint:r:latest") or b"") == "k2"
    # The record the writer added during the scan is still on k1; a rerun finishes the job.
    await rotate(rotating)
    assert await _all_key_ids(rotating, ["t"]) == {"k2"}
