"""Values as bytes: JSON via orjson inside a small checksummed envelope.

Envelope layout (big-endian)::

    0   3  magic b"\\xffCP"  (0xFF never starts JSON text, so raw JSON stays readable)
    3   1  envelope version (1)
    4   1  flags: bit 0 zstd-compressed, bit 1 encrypted
    5   4  CRC-32 of the body
    9   4  body length
    13  .. body: JSON, then zstd if compressed, then the cipher's output if encrypted
           (an encrypted body starts with a 1-byte key id length and the key id)

The checksum and length catch truncation and bit flips; the key id lets keys
rotate (old records stay readable with the old key). Values that do not start
with the magic are read as plain JSON, so records written by AFK's own stores
(or any other tool writing JSON) still decode.
"""

from __future__ import annotations

import math
import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any, Final, Protocol, runtime_checkable

import orjson
import zstandard

from checkpoint_stores.errors import (
    AgentCheckpointCorruptionError,
    CheckpointEncodeError,
    DecryptionError,
)

__all__ = [
    "DEFAULT_CODEC",
    "Cipher",
    "Codec",
    "decode_json_value",
    "dumps_json",
    "envelope_key_id",
    "is_envelope",
]

MAGIC: Final = b"\xffCP"
ENVELOPE_VERSION: Final = 1
FLAG_ZSTD: Final = 0x01
FLAG_ENCRYPTED: Final = 0x02
_KNOWN_FLAGS: Final = FLAG_ZSTD | FLAG_ENCRYPTED
_HEADER: Final = struct.Struct(">3sBBII")
HEADER_SIZE: Final = _HEADER.size
_MAX_BODY: Final = 0xFFFFFFFF
# Decompressed values above this are refused (a corrupt or hostile frame must not exhaust memory).
_MAX_DECOMPRESSED: Final = 2 * 1024**3


@runtime_checkable
class Cipher(Protocol):
    """Encrypts envelope bodies. ``checkpoint_stores.encryption.AESGCMCipher`` implements it."""

    @property
    def active_key_id(self) -> str:
        """Id of the key new values are encrypted with (at most 255 bytes of UTF-8)."""
        ...

    def encrypt(self, plaintext: bytes, associated_data: bytes) -> bytes:
        """Encrypt with the active key; authenticate ``associated_data`` too."""
        ...

    def decrypt(self, key_id: str, ciphertext: bytes, associated_data: bytes) -> bytes:
        """Decrypt with key ``key_id``; raise :class:`DecryptionError` on any failure."""
        ...


def _non_finite_path(value: Any) -> str | None:
    """Path of the first NaN/Infinity inside ``value``, or ``None``."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if type(item) is float:
            if not math.isfinite(item):
                return path or "<value>"
        elif isinstance(item, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in item.items())
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            return path or "<value>"
        elif callable(getattr(item, "model_dump", None)):
            # _default serializes models through model_dump: look inside them the same way.
            stack.append((path, item.model_dump(mode="python")))
    return None


def _default(obj: Any) -> Any:
    dump: Callable[..., Any] | None = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="python")
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def dumps_json(value: Any) -> bytes:
    """Serialize ``value`` to JSON bytes, refusing what JSON cannot hold.

    orjson writes NaN and Infinity as ``null``; that would silently change
    data, so they are rejected here with the path of the offending value.
    """
    try:
        data = orjson.dumps(value, default=_default)
    except TypeError as exc:
        raise CheckpointEncodeError(
            f"value cannot be stored as JSON: {exc}. Convert it to JSON types first "
            "(str, int, float, bool, None, list, dict with str keys; base64 for bytes)"
        ) from None
    # NaN/Infinity can only hide behind a "null" in the output: walk only then.
    if b"null" in data:
        path = _non_finite_path(value)
        if path is not None:
            raise CheckpointEncodeError(
                f"value at {path} is NaN or Infinity, which JSON cannot represent "
                "(it would silently become null); store None or a string instead"
            )
    return data


def is_envelope(data: bytes) -> bool:
    """True if ``data`` starts with this library's envelope magic."""
    return data[:3] == MAGIC


def envelope_key_id(data: bytes) -> str | None:
    """Key id of an encrypted envelope, ``None`` for anything else (plain, JSON, damaged).

    Reads only the header and the key-id framing (no decryption, no checksum):
    enough to tell which values ``rotate`` still has to re-encrypt.
    """
    if len(data) <= HEADER_SIZE or data[:3] != MAGIC or not data[4] & FLAG_ENCRYPTED:
        return None
    key_len = data[HEADER_SIZE]
    raw = data[HEADER_SIZE + 1 : HEADER_SIZE + 1 + key_len]
    if not key_len or len(raw) != key_len:
        return None
    return raw.decode("utf-8", errors="replace")


def _corrupt(what: str, problem: str) -> AgentCheckpointCorruptionError:
    return AgentCheckpointCorruptionError(
        f"{what}: {problem}. The stored value is damaged; restore it from a copy "
        "or delete the run (the store never returns partial data)"
    )


class _ThreadLocalZstd(threading.local):
    def __init__(self, level: int) -> None:
        self.compressor = zstandard.ZstdCompressor(level=level)
        self.decompressor = zstandard.ZstdDecompressor()


class Codec:
    """Encode JSON values to envelope bytes and back.

    Args:
        compress_threshold: bodies of at least this many bytes are zstd-compressed
            (``None`` turns compression off). Compression is kept only when it saves space.
        compression_level: zstd level (1 fast .. 19 small).
        cipher: optional :class:`Cipher` for encryption at rest.

    >>> codec = Codec()
    >>> codec.decode(codec.encode({"a": [1, 2.5, None]}))
    {'a': [1, 2.5, None]}
    """

    def __init__(
        self,
        *,
        compress_threshold: int | None = 16 * 1024,
        compression_level: int = 3,
        cipher: Cipher | None = None,
    ) -> None:
        self.compress_threshold = compress_threshold
        self.compression_level = compression_level
        self.cipher = cipher
        self._zstd = _ThreadLocalZstd(compression_level)

    def __repr__(self) -> str:
        return (
            f"Codec(compress_threshold={self.compress_threshold}, "
            f"compression_level={self.compression_level}, "
            f"cipher={'on' if self.cipher is not None else 'off'})"
        )

    def encode(self, value: Any) -> bytes:
        """Serialize ``value`` into an envelope."""
        return self.wrap(dumps_json(value))

    def wrap(self, body: bytes) -> bytes:
        """Put already-serialized JSON bytes into an envelope."""
        flags = 0
        if self.compress_threshold is not None and len(body) >= self.compress_threshold:
            compressed = self._zstd.compressor.compress(body)
            if len(compressed) < len(body):
                body, flags = compressed, flags | FLAG_ZSTD
        if self.cipher is not None:
            flags |= FLAG_ENCRYPTED
            key_id = self.cipher.active_key_id.encode("utf-8")
            if not 0 < len(key_id) < 256:
                raise CheckpointEncodeError("cipher key id must be 1..255 bytes of UTF-8")
            aad = _HEADER.pack(MAGIC, ENVELOPE_VERSION, flags, 0, 0)[:5]
            body = bytes([len(key_id)]) + key_id + self.cipher.encrypt(body, aad)
        if len(body) > _MAX_BODY:
            raise CheckpointEncodeError("value is larger than 4 GiB; split it into smaller values")
        return _HEADER.pack(MAGIC, ENVELOPE_VERSION, flags, zlib.crc32(body), len(body)) + body

    def unwrap(self, data: bytes, *, what: str = "value") -> bytes:
        """Check an envelope and return its JSON bytes (decrypted, decompressed)."""
        if len(data) < HEADER_SIZE:
            raise _corrupt(what, f"envelope truncated to {len(data)} bytes (header is 13)")
        magic, version, flags, crc, length = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise _corrupt(what, "not a checkpoint-stores envelope")
        if version != ENVELOPE_VERSION:
            raise AgentCheckpointCorruptionError(
                f"{what}: envelope version {version} is newer than this library reads "
                f"({ENVELOPE_VERSION}); upgrade checkpoint-stores"
            )
        if flags & ~_KNOWN_FLAGS:
            raise _corrupt(what, f"unknown envelope flags 0x{flags:02x}")
        body = bytes(data[HEADER_SIZE:])
        if len(body) != length:
            state = "truncated" if len(body) < length else "has trailing bytes"
            raise _corrupt(
                what, f"envelope {state}: body is {len(body)} bytes, header says {length}"
            )
        if zlib.crc32(body) != crc:
            raise _corrupt(what, "checksum mismatch (bit flip or partial write)")
        if flags & FLAG_ENCRYPTED:
            body = self._decrypt(body, data[:5], what)
        if flags & FLAG_ZSTD:
            try:
                body = self._zstd.decompressor.decompress(body, max_output_size=_MAX_DECOMPRESSED)
            except zstandard.ZstdError as exc:
                raise _corrupt(what, f"zstd frame is invalid ({exc})") from None
        return body

    def _decrypt(self, body: bytes, aad: bytes, what: str) -> bytes:
        key_len = body[0] if body else 0
        if not key_len or len(body) < 1 + key_len:
            raise _corrupt(what, "encrypted body has no key id")
        key_id = body[1 : 1 + key_len].decode("utf-8", errors="replace")
        if self.cipher is None:
            raise DecryptionError(
                f"{what} is encrypted with key {key_id!r} but this store has no cipher; "
                "open it with the encryption keys (see README, 'Encryption at rest')"
            )
        try:
            return self.cipher.decrypt(key_id, body[1 + key_len :], aad)
        except DecryptionError as exc:
            # The cipher does not know which value it was given; say it here.
            raise DecryptionError(f"{what}: {exc}") from None

    def decode(self, data: bytes | bytearray | memoryview, *, what: str = "value") -> Any:
        """Decode an envelope, or plain JSON written by another tool."""
        raw = bytes(data)
        if is_envelope(raw):
            raw = self.unwrap(raw, what=what)
        elif not raw:
            raise _corrupt(what, "value is empty")
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise _corrupt(what, f"invalid JSON ({exc})") from None


DEFAULT_CODEC: Final = Codec()


def decode_json_value(data: bytes | bytearray | memoryview | str, *, what: str = "value") -> Any:
    """Decode bytes (envelope or JSON) or JSON text with the default codec."""
    if isinstance(data, str):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise _corrupt(what, f"invalid JSON ({exc})") from None
    return DEFAULT_CODEC.decode(data, what=what)
