"""The codec: JSON in a checksummed envelope; every damage detected, nothing turned into null."""

from __future__ import annotations

import math
import os
import struct
import zlib
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from checkpoint_stores import (
    AgentCheckpointCorruptionError,
    CheckpointEncodeError,
    Cipher,
    Codec,
    DecryptionError,
)
from checkpoint_stores.codec import FLAG_ENCRYPTED, FLAG_ZSTD, HEADER_SIZE, MAGIC, is_envelope

SMALL = {"run_id": "r", "n": [1, 2.5, None, True], "s": "é\x00"}


def flags_of(data: bytes) -> int:
    return data[4]


def body_length(data: bytes) -> int:
    return int(struct.unpack_from(">I", data, 9)[0])


# -- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        {},
        [],
        None,
        0,
        -(2**63),
        2**64 - 1,
        1.5e-300,
        "",
        "naïve ☃ 𝄞 \u200b",
        "nul\x00inside\x00",
        {"\x00key": "\x00"},
        {"nested": {"deep": [[[{"x": "y"}]]]}},
        {"emoji 🙂": ["\U0010ffff", "\ud7ff", "\ue000"]},
    ],
)
def test_round_trip(value: Any) -> None:
    codec = Codec()
    data = codec.encode(value)
    assert is_envelope(data)
    assert codec.decode(data) == value


def test_large_value_is_compressed_and_round_trips() -> None:
    codec = Codec(compress_threshold=16 * 1024)
    value = {"messages": [{"role": "user", "content": f"message {i} " * 20} for i in range(500)]}
    raw = orjson.dumps(value)
    assert len(raw) > 16 * 1024
    data = codec.encode(value)
    assert flags_of(data) & FLAG_ZSTD
    assert len(data) < len(raw) // 4  # compression actually applied
    assert codec.decode(data) == value


def test_value_below_threshold_is_not_compressed() -> None:
    codec = Codec(compress_threshold=16 * 1024)
    data = codec.encode({"x": "a" * 1000})
    assert not flags_of(data) & FLAG_ZSTD
    assert data[HEADER_SIZE:] == orjson.dumps({"x": "a" * 1000})


def test_compression_off() -> None:
    codec = Codec(compress_threshold=None)
    data = codec.encode({"x": "a" * 100_000})
    assert not flags_of(data) & FLAG_ZSTD
    assert codec.decode(data) == {"x": "a" * 100_000}


def test_incompressible_value_is_stored_plain() -> None:
    codec = Codec(compress_threshold=1)
    value = os.urandom(30_000).hex()  # hex of random bytes compresses a little ...
    data = codec.encode(value)
    assert codec.decode(data) == value
    noise = orjson.dumps("\u00ff" * 3)  # ... but a tiny body cannot shrink under zstd's frame
    tiny = codec.wrap(noise)
    assert not flags_of(tiny) & FLAG_ZSTD


def test_any_codec_reads_any_compression_setting() -> None:
    value = {"x": "abc" * 10_000}
    compressed = Codec(compress_threshold=1, compression_level=19).encode(value)
    assert Codec(compress_threshold=None).decode(compressed) == value


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values, threshold=st.sampled_from([None, 1, 64, 16 * 1024]))
def test_arbitrary_json_round_trips(value: Any, threshold: int | None) -> None:
    codec = Codec(compress_threshold=threshold)
    assert codec.decode(codec.encode(value)) == value


# -- values JSON cannot hold ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (math.nan, "<value>"),
        ({"a": math.inf}, "a"),
        ({"a": {"b": [0.0, 1.0, -math.inf]}}, "a.b[2]"),
        ([{"x": 1}, {"y": math.nan}], "[1].y"),
        ({"t": (1, math.nan)}, "t[1]"),
    ],
)
def test_nan_and_infinity_are_rejected_with_the_path(value: Any, path: str) -> None:
    with pytest.raises(CheckpointEncodeError) as info:
        Codec().encode(value)
    message = str(info.value)
    assert f"value at {path} is NaN or Infinity" in message
    assert "None or a string" in message  # says what to do instead


def test_nan_inside_a_pydantic_model_is_rejected_not_nulled() -> None:
    class Usage(BaseModel):
        cost: float

    with pytest.raises(CheckpointEncodeError, match="cost"):
        Codec().encode({"usage": Usage(cost=math.nan)})
    # A finite model value goes through model_dump.
    assert Codec().decode(Codec().encode({"usage": Usage(cost=1.5)})) == {"usage": {"cost": 1.5}}


def test_null_in_data_is_not_mistaken_for_nan() -> None:
    value = {"a": None, "text": "null", "null": [None]}
    assert Codec().decode(Codec().encode(value)) == value


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({1: "x"}, "Dict key must be str"),
        ({(1, 2): "x"}, "Dict key must be str"),
        ({"blob": b"\x00\x01"}, "bytes"),
        ({"n": 2**64}, "64-bit"),
        ({"n": -(2**63) - 1}, "64-bit"),
        ({"s": {1, 2}}, "set"),
        ({"o": object()}, "object"),
        ({"s": "lone \ud800 surrogate"}, "str"),
    ],
)
def test_unsupported_values_raise_encode_error(value: Any, fragment: str) -> None:
    with pytest.raises(CheckpointEncodeError) as info:
        Codec().encode(value)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)  # callers catching ValueError see it too


# -- foreign JSON --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b'{"run_id": "r", "phase": "pre_llm"}', b"[1, 2]", b'  {"a": "\\u0000"}\n', b"null", b"7"],
)
def test_raw_json_from_other_tools_decodes(raw: bytes) -> None:
    assert Codec().decode(raw) == orjson.loads(raw)


@pytest.mark.parametrize("raw", [b'{"a": NaN}', b'{"a": Infinity}', b"{'a': 1}", b"\xc3\x28"])
def test_raw_non_json_is_corruption(raw: bytes) -> None:
    with pytest.raises(AgentCheckpointCorruptionError, match="invalid JSON"):
        Codec().decode(raw)


# -- damage --------------------------------------------------------------------------------


def test_empty_value_is_corruption() -> None:
    with pytest.raises(AgentCheckpointCorruptionError, match="empty"):
        Codec().decode(b"")


@pytest.mark.parametrize("threshold", [None, 1])
def test_every_truncation_is_detected(threshold: int | None) -> None:
    codec = Codec(compress_threshold=threshold)
    data = codec.encode({"k": "v" * 40})
    assert flags_of(data) & FLAG_ZSTD == (FLAG_ZSTD if threshold else 0)
    for length in range(len(data)):
        with pytest.raises(AgentCheckpointCorruptionError):
            codec.decode(data[:length])


@pytest.mark.parametrize("threshold", [None, 1])
def test_every_single_bit_flip_is_detected(threshold: int | None) -> None:
    codec = Codec(compress_threshold=threshold)
    data = codec.encode({"k": "v" * 40})
    for bit in range(len(data) * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(AgentCheckpointCorruptionError):
            codec.decode(bytes(damaged))


def test_trailing_bytes_are_detected() -> None:
    data = Codec().encode(SMALL)
    with pytest.raises(AgentCheckpointCorruptionError, match="trailing bytes"):
        Codec().decode(data + b"\x00")


def test_damage_messages_name_the_problem_and_the_value() -> None:
    data = Codec().encode(SMALL)
    with pytest.raises(AgentCheckpointCorruptionError) as info:
        Codec().decode(data[:5], what="latest of run 'r1'")
    assert "latest of run 'r1'" in str(info.value)
    assert "header is 13" in str(info.value)
    flipped = bytearray(data)
    flipped[-1] ^= 1
    with pytest.raises(AgentCheckpointCorruptionError, match="checksum mismatch"):
        Codec().decode(bytes(flipped))


def test_newer_envelope_version_says_upgrade() -> None:
    data = bytearray(Codec().encode(SMALL))
    data[3] = 2
    with pytest.raises(AgentCheckpointCorruptionError, match="upgrade checkpoint-stores"):
        Codec().decode(bytes(data))


def test_unknown_flags_are_corruption() -> None:
    data = bytearray(Codec().encode(SMALL))
    data[4] = 0x80
    with pytest.raises(AgentCheckpointCorruptionError, match="unknown envelope flags 0x80"):
        Codec().decode(bytes(data))


def test_valid_checksum_over_a_bad_zstd_frame_is_corruption() -> None:
    body = b"definitely not zstd"
    data = struct.pack(">3sBBII", MAGIC, 1, FLAG_ZSTD, zlib.crc32(body), len(body)) + body
    with pytest.raises(AgentCheckpointCorruptionError, match="zstd frame is invalid"):
        Codec().decode(data)


# -- encryption hooks (the envelope side; the AES-GCM cipher is tested with its module) --------


class XorCipher:
    """A toy cipher with key rotation: enough to test what the envelope does with a Cipher."""

    def __init__(self, keys: dict[str, int], active: str) -> None:
        self.keys = keys
        self._active = active
        self.seen_aad: list[bytes] = []

    @property
    def active_key_id(self) -> str:
        return self._active

    def encrypt(self, plaintext: bytes, associated_data: bytes) -> bytes:
        self.seen_aad.append(associated_data)
        key = self.keys[self._active]
        return bytes(b ^ key for b in plaintext)

    def decrypt(self, key_id: str, ciphertext: bytes, associated_data: bytes) -> bytes:
        if key_id not in self.keys:
            raise DecryptionError(f"no key {key_id!r}")
        return bytes(b ^ self.keys[key_id] for b in ciphertext)


def test_cipher_round_trip_with_key_rotation() -> None:
    old = XorCipher({"k1": 0x5A}, "k1")
    assert isinstance(old, Cipher)
    value = {"secret": "payload" * 3000}
    data = Codec(cipher=old, compress_threshold=1).encode(value)
    assert flags_of(data) & FLAG_ENCRYPTED
    assert flags_of(data) & FLAG_ZSTD
    assert b"payload" not in data
    assert old.seen_aad == [data[:5]]  # magic, version and flags are authenticated
    rotated = XorCipher({"k1": 0x5A, "k2": 0x33}, "k2")
    assert Codec(cipher=rotated).decode(data) == value  # old records stay readable
    newer = Codec(cipher=rotated).encode(value)
    with pytest.raises(DecryptionError, match="k2"):
        Codec(cipher=old).decode(newer)


def test_encrypted_value_without_a_cipher_is_a_clear_error() -> None:
    data = Codec(cipher=XorCipher({"prod-key": 1}, "prod-key")).encode(SMALL)
    with pytest.raises(DecryptionError) as info:
        Codec().decode(data)
    assert "'prod-key'" in str(info.value)
    assert "no cipher" in str(info.value)
    assert isinstance(info.value, AgentCheckpointCorruptionError)


def test_key_id_length_is_checked() -> None:
    with pytest.raises(CheckpointEncodeError, match=r"1\.\.255"):
        Codec(cipher=XorCipher({"": 1}, "")).encode(SMALL)
    with pytest.raises(CheckpointEncodeError, match=r"1\.\.255"):
        Codec(cipher=XorCipher({"k" * 256: 1}, "k" * 256)).encode(SMALL)


def test_repr_does_not_show_the_cipher() -> None:
    text = repr(Codec(cipher=XorCipher({"k": 1}, "k")))
    assert "cipher=on" in text
    assert "Xor" not in text
    assert body_length(Codec().encode(None)) == 4
