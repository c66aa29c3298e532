"""Encryption at rest: AES-GCM for the codec's envelope, and key rotation.

Only values are encrypted; thread ids and keys stay readable so lists, prefix
scans and the operating tools keep working. Install the extra::

    pip install "checkpoint-stores[encryption]"

>>> from checkpoint_stores import Codec, open_store
>>> from checkpoint_stores.encryption import AESGCMCipher, generate_key
>>> cipher = AESGCMCipher({"2025-06": generate_key()})
>>> store = open_store("memory://", codec=Codec(cipher=cipher))

Each value gets a fresh 96-bit random nonce; the envelope carries the key id,
so several keys can read (old records stay readable) while one key writes.
The associated data binds the envelope header (magic, version, flags) and the
key id: flipping the compression flag or relabelling the key is detected like
any other tampering. A wrong or missing key raises :class:`DecryptionError`,
never garbage.

Keys come as raw bytes (16, 24 or 32), base64 text, or an environment variable
``CHECKPOINT_STORES_ENCRYPTION_KEYS="2025-06:BASE64,2024-01:BASE64"`` whose
first entry is the active key (:meth:`AESGCMCipher.from_env`).

:func:`rotate` re-encrypts a store (or some threads or one run) with the active key.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from checkpoint_stores.codec import envelope_key_id
from checkpoint_stores.errors import (
    AgentCheckpointCorruptionError,
    CheckpointStoreError,
    DecryptionError,
)
from checkpoint_stores.inventory import (
    KeyKind,
    check_run_id,
    classify_key,
    iter_thread_ids,
    run_prefixes,
    value_body,
)
from checkpoint_stores.keys import LATEST_SUFFIX, RUNTIME_SUFFIX
from checkpoint_stores.store import MemoryStore

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "DEFAULT_KEYS_ENV",
    "AESGCMCipher",
    "RotationReport",
    "generate_key",
    "parse_key",
    "rotate",
]

DEFAULT_KEYS_ENV: Final = "CHECKPOINT_STORES_ENCRYPTION_KEYS"
NONCE_BYTES: Final = 12
TAG_BYTES: Final = 16
_KEY_SIZES: Final = (16, 24, 32)
_INSTALL: Final = 'pip install "checkpoint-stores[encryption]"'
# A commit refused while restamping a head means a writer moved it; look again this often.
_HEAD_ATTEMPTS: Final = 3


def generate_key(bits: int = 256) -> str:
    """A new random AES key as base64 text (store it in your secret manager).

    >>> len(base64.b64decode(generate_key()))
    32
    """
    if bits not in (128, 192, 256):
        raise ValueError("AES keys are 128, 192 or 256 bits")
    return base64.b64encode(secrets.token_bytes(bits // 8)).decode("ascii")


def parse_key(key: bytes | str, *, key_id: str = "?") -> bytes:
    """Key material from raw bytes or base64 text (standard or URL-safe alphabet).

    The error never shows the key: only its id and its length.
    """
    if isinstance(key, (bytes, bytearray, memoryview)):
        material = bytes(key)
    elif isinstance(key, str):
        text = key.strip()
        padded = text + "=" * (-len(text) % 4)
        try:
            alphabet = b"-_" if ("-" in text or "_" in text) else None
            material = base64.b64decode(padded, altchars=alphabet, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(
                f"encryption key {key_id!r} is not valid base64; generate one with "
                "`python -c 'from checkpoint_stores.encryption import generate_key; "
                "print(generate_key())'`"
            ) from None
    else:
        raise TypeError(f"encryption key {key_id!r} must be bytes or base64 str")
    if len(material) not in _KEY_SIZES:
        raise ValueError(
            f"encryption key {key_id!r} is {len(material)} bytes; AES-GCM needs 16, 24 or 32 "
            "(32 recommended: generate_key())"
        )
    return material


def _check_key_id(key_id: object) -> str:
    if not isinstance(key_id, str) or not key_id:
        raise ValueError("an encryption key id must be a non-empty string")
    if len(key_id.encode("utf-8")) > 255:
        raise ValueError(f"encryption key id {key_id[:40]!r}... is longer than 255 bytes")
    return key_id


class AESGCMCipher:
    """AES-GCM for the codec (:class:`~checkpoint_stores.codec.Cipher` protocol).

    Args:
        keys: key id -> key (raw bytes or base64 text). Every key can decrypt.
        active_key_id: the key new values are encrypted with; may be omitted
            when ``keys`` holds exactly one key.

    Output layout: 12-byte random nonce, then ciphertext and 16-byte tag. The
    repr shows key ids only, never key material.
    """

    def __init__(
        self, keys: Mapping[str, bytes | str], *, active_key_id: str | None = None
    ) -> None:
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:
            raise ImportError(f"encryption needs the cryptography package: {_INSTALL}") from None
        if not keys:
            raise ValueError("AESGCMCipher needs at least one key: {key_id: key}")
        self._aead: dict[str, AESGCM] = {
            _check_key_id(kid): AESGCM(parse_key(k, key_id=kid)) for kid, k in keys.items()
        }
        if active_key_id is None:
            if len(self._aead) != 1:
                raise ValueError(
                    f"several keys given ({sorted(self._aead)}); say which one encrypts new "
                    "values with active_key_id="
                )
            active_key_id = next(iter(self._aead))
        if active_key_id not in self._aead:
            raise ValueError(
                f"active key id {active_key_id!r} is not among the keys {sorted(self._aead)}"
            )
        self._active = active_key_id

    @classmethod
    def from_spec(cls, spec: str) -> AESGCMCipher:
        """Keys from ``"id:BASE64[,id:BASE64...]"``; the first entry is the active key."""
        keys: dict[str, str] = {}
        for position, item in enumerate(p.strip() for p in spec.split(",") if p.strip()):
            key_id, sep, material = item.partition(":")
            if not sep or not key_id.strip() or not material.strip():
                raise ValueError(
                    f"encryption key entry {position + 1} is not 'id:BASE64' "
                    "(write e.g. 2025-06:<base64 key>,2024-01:<older key>)"
                )
            if key_id.strip() in keys:
                raise ValueError(f"encryption key id {key_id.strip()!r} appears twice")
            keys[key_id.strip()] = material.strip()
        if not keys:
            raise ValueError("no encryption keys given (expected 'id:BASE64[,id:BASE64...]')")
        return cls(keys, active_key_id=next(iter(keys)))

    @classmethod
    def from_env(
        cls, var: str = DEFAULT_KEYS_ENV, *, environ: Mapping[str, str] | None = None
    ) -> AESGCMCipher:
        """Keys from an environment variable in :meth:`from_spec` form (first = active)."""
        env = os.environ if environ is None else environ
        spec = env.get(var, "")
        if not spec.strip():
            raise ValueError(
                f"environment variable {var} is not set; set it to 'id:BASE64[,id:BASE64...]' "
                "(first entry encrypts new values, the others only decrypt)"
            )
        return cls.from_spec(spec)

    def __repr__(self) -> str:
        return f"AESGCMCipher(active_key_id={self._active!r}, key_ids={sorted(self._aead)!r})"

    @property
    def active_key_id(self) -> str:
        """Id of the key new values are encrypted with."""
        return self._active

    @property
    def key_ids(self) -> frozenset[str]:
        """Ids of every key that can decrypt."""
        return frozenset(self._aead)

    @staticmethod
    def _associated(associated_data: bytes, key_id: str) -> bytes:
        # The codec frames the key id outside the ciphertext; binding it here too
        # means a relabelled key id fails authentication instead of being trusted.
        encoded = key_id.encode("utf-8")
        return associated_data + bytes([len(encoded)]) + encoded

    def encrypt(self, plaintext: bytes, associated_data: bytes) -> bytes:
        """Encrypt with the active key: nonce + ciphertext + tag."""
        nonce = os.urandom(NONCE_BYTES)
        aad = self._associated(associated_data, self._active)
        return nonce + self._aead[self._active].encrypt(nonce, plaintext, aad)

    def decrypt(self, key_id: str, ciphertext: bytes, associated_data: bytes) -> bytes:
        """Decrypt with key ``key_id``; :class:`DecryptionError` on any failure."""
        from cryptography.exceptions import InvalidTag

        aead = self._aead.get(key_id)
        if aead is None:
            raise DecryptionError(
                f"encrypted with key id {key_id!r}, which this store's keys do not include "
                f"(it has {sorted(self._aead)}); add that key to read it (old keys keep "
                "decrypting), then `checkpoint-stores rotate` moves values to the active key"
            )
        if len(ciphertext) < NONCE_BYTES + TAG_BYTES:
            raise DecryptionError(
                f"ciphertext for key id {key_id!r} is {len(ciphertext)} bytes, shorter than a "
                "nonce and tag: the value is truncated"
            )
        try:
            return aead.decrypt(
                ciphertext[:NONCE_BYTES],
                ciphertext[NONCE_BYTES:],
                self._associated(associated_data, key_id),
            )
        except InvalidTag:
            raise DecryptionError(
                f"authentication failed with key id {key_id!r}: the key material is not the "
                "one the value was written with, or the stored value was tampered with. "
                "Nothing was returned; check the key for this id"
            ) from None


# -- rotation ------------------------------------------------------------------------


@dataclass
class RotationReport:
    """What :func:`rotate` did (or, with ``dry_run``, would do)."""

    dry_run: bool = False
    threads: int = 0
    reencrypted: int = 0
    already_current: int = 0
    restamped: list[tuple[str, str, int, int]] = field(default_factory=list)
    failed: list[tuple[str, str, str]] = field(default_factory=list)
    bytes: int = 0

    @property
    def ok(self) -> bool:
        """True when every value is (or would be) on the active key."""
        return not self.failed

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {
            "dry_run": self.dry_run,
            "threads": self.threads,
            "reencrypted": self.reencrypted,
            "already_current": self.already_current,
            "restamped_heads": [
                {"thread_id": t, "run_id": r, "old_seq": a, "new_seq": b}
                for t, r, a, b in self.restamped
            ],
            "failed": [{"thread_id": t, "key": k, "error": e} for t, k, e in self.failed],
            "bytes": self.bytes,
        }


class _Rotator:
    def __init__(
        self,
        store: MemoryStore,
        report: RotationReport,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        cipher = store.codec.cipher
        if cipher is None:
            raise CheckpointStoreError(
                "rotate needs a store opened with a cipher: open_store(url, "
                "codec=Codec(cipher=AESGCMCipher(...))) or, on the CLI, the key variable "
                f"{DEFAULT_KEYS_ENV} (first key = the new active key, older keys after it)"
            )
        self.store = store
        self.backend = store.backend
        self.codec = store.codec
        self.active = cipher.active_key_id
        self.report = report
        self.progress = progress
        self.limit = store.capabilities.max_value_bytes

    def _current(self, raw: bytes) -> bool:
        return envelope_key_id(raw) == self.active

    def _tick(self, size: int) -> None:
        if self.progress is not None:
            self.progress(1, size)

    def _fits(self, thread_id: str, key: str, data: bytes) -> bool:
        if self.limit is not None and len(data) > self.limit:
            self.report.failed.append(
                (
                    thread_id,
                    key,
                    f"re-encrypted value is {len(data)} bytes, above the backend's "
                    f"{self.limit}; left as it was",
                )
            )
            return False
        return True

    async def value(self, thread_id: str, key: str, raw: bytes) -> None:
        """Re-encrypt one non-head value with ``put`` (checked against a fresh read)."""
        self._tick(len(raw))
        if self._current(raw):
            self.report.already_current += 1
            return
        what = f"{key!r} of thread {thread_id!r}"
        try:
            data = self.codec.wrap(value_body(self.codec, raw, what=what))
        except AgentCheckpointCorruptionError as exc:
            self.report.failed.append((thread_id, key, str(exc)))
            return
        if not self._fits(thread_id, key, data):
            return
        if not self.report.dry_run:
            # Effects (intent -> done) and runtime keys change in place: never put an old
            # value back over one a writer replaced since the scan.
            if await self.backend.get(thread_id, key) != raw:
                self.report.failed.append(
                    (thread_id, key, "changed while rotating (a writer is active); rerun rotate")
                )
                return
            await self.backend.put(thread_id, key, data)
        self.report.reencrypted += 1
        self.report.bytes += len(data)

    def _restamp(self, raw: bytes, what: str) -> tuple[dict[str, Any], int]:
        value = self.codec.decode(raw, what=what)
        if not isinstance(value, dict):
            raise AgentCheckpointCorruptionError(f"{what}: the latest record is not a JSON object")
        seq = value.get("seq", 0) or 0
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise AgentCheckpointCorruptionError(f"{what}: seq {seq!r} is not an integer")
        return value, seq

    async def head(
        self, thread_id: str, run_id: str, head: bytes | None, runtime: bytes | None
    ) -> None:
        """Re-encrypt a run's latest (and runtime copy) by a commit at seq + 1."""
        checkpoint, _ = run_prefixes(run_id)
        head_key, runtime_key = checkpoint + LATEST_SUFFIX, checkpoint + RUNTIME_SUFFIX
        if head is None:
            if runtime is not None:
                await self.value(thread_id, runtime_key, runtime)
            return
        for _ in range(_HEAD_ATTEMPTS):
            head_current = self._current(head)
            runtime_current = runtime is None or self._current(runtime)
            if head_current:
                self._tick(len(head))
                self.report.already_current += 1
                if runtime is not None:
                    await self.value(thread_id, runtime_key, runtime)
                return
            what = f"latest of run {run_id!r} in thread {thread_id!r}"
            try:
                value, seq = self._restamp(head, what)
                value["seq"] = seq + 1
                new_head = self.codec.encode(value)
                writes: list[tuple[str, bytes]] = []
                if runtime is not None:
                    rt_what = f"runtime of run {run_id!r} in thread {thread_id!r}"
                    rt_value, rt_seq = self._restamp(runtime, rt_what)
                    if rt_seq == seq:
                        # The runtime key holds the same record as latest: keep them equal.
                        rt_value["seq"] = seq + 1
                        writes.append((runtime_key, self.codec.encode(rt_value)))
                    elif not runtime_current:
                        writes.append(
                            (
                                runtime_key,
                                self.codec.wrap(value_body(self.codec, runtime, what=rt_what)),
                            )
                        )
            except AgentCheckpointCorruptionError as exc:
                self.report.failed.append((thread_id, head_key, str(exc)))
                return
            if not all(self._fits(thread_id, k, v) for k, v in [*writes, (head_key, new_head)]):
                return
            if self.report.dry_run:
                moved = True
            else:
                moved = await self.backend.commit(thread_id, writes, head_key, new_head, seq + 1)
            if moved:
                self._tick(len(head))
                self.report.reencrypted += 1 + len(writes)
                self.report.bytes += len(new_head) + sum(len(v) for _, v in writes)
                self.report.restamped.append((thread_id, run_id, seq, seq + 1))
                return
            # A writer moved the head since the scan: look at what it wrote.
            fresh = await self.backend.get_many(thread_id, [head_key, runtime_key])
            head, runtime = fresh[0], fresh[1]
            if head is None:
                return
        self.report.failed.append(
            (
                thread_id,
                head_key,
                "the run's latest kept moving while rotating (a writer is active); "
                "rotate it again when the run is idle",
            )
        )


async def rotate(
    store: MemoryStore,
    *,
    thread_ids: Iterable[str] | None = None,
    thread_prefix: str = "",
    run_id: str | None = None,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> RotationReport:
    """Re-encrypt values with the store's active key; idempotent.

    ``store`` must be opened with a codec whose cipher holds the active key and
    every older key still in use. Values already on the active key are left
    alone, so rerunning after an interruption only does what is left.

    Records, effects and state are re-encrypted with ``put``. A run's latest
    keeps its seq beside the value (fencing), which a ``put`` would drop and a
    ``commit`` at the same seq refuses, so each latest is re-stamped: committed
    at ``seq + 1`` with the record's seq updated (within the same epoch, like
    a claim). A writer still appending to that run then gets
    :class:`~checkpoint_stores.errors.StaleWriterError` on its next commit and
    must reload the run: rotate idle or finished runs.

    Args:
        store: the store, opened with ``Codec(cipher=AESGCMCipher(...))``.
        thread_ids: threads to rotate; default every thread (needs ``list_threads``).
        thread_prefix: only threads whose id starts with it (when enumerating).
        run_id: only this run's keys (checkpoints and effects) in each thread.
        dry_run: count what would change, write nothing.
        progress: called with ``(items, bytes)`` as values are examined.
    """
    report = RotationReport(dry_run=dry_run)
    rotator = _Rotator(store, report, progress)
    run = check_run_id(run_id)
    async for thread_id in iter_thread_ids(store, thread_ids, prefix=thread_prefix):
        report.threads += 1
        heads: dict[str, bytes] = {}
        runtimes: dict[str, bytes] = {}
        prefixes = [""] if run is None else list(run_prefixes(run))
        for prefix in prefixes:
            async for key, raw in store.backend.list(thread_id, prefix):
                kind, owner = classify_key(key)
                if kind is KeyKind.HEAD and owner is not None:
                    heads[owner] = bytes(raw)
                elif kind is KeyKind.RUNTIME and owner is not None:
                    runtimes[owner] = bytes(raw)
                else:
                    await rotator.value(thread_id, key, bytes(raw))
        for owner in sorted(heads.keys() | runtimes.keys()):
            await rotator.head(thread_id, owner, heads.get(owner), runtimes.get(owner))
    return report
