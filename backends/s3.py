"""``s3://bucket/prefix``: Amazon S3 and compatibles (MinIO, R2, ...) on aiobotocore.

Layout under the prefix::

    PREFIX/.checkpoint-stores/layout     marker with the layout version (written by setup)
    PREFIX/<thread name>/<key name>      one object per key

Names are the lowercase hex of the id's UTF-8 bytes. Hex keeps every id safe
(no ``/``, ``..``, ``%`` or NUL reaches S3) and, unlike percent-encoding, it
preserves order and prefixes: S3 lists names in byte order, hex digits sort
like the bytes they stand for, and ``hex(p)`` starts ``hex(k)`` exactly when
``p`` starts ``k``. So ``list`` is one ordered, prefix-exact listing.

Ids longer than 96 bytes (thread) or 200 bytes (key) would push names past
S3's 1,024-byte limit: their name is the hex of the first 96/200 bytes, then
``~`` and 128 bits of SHA-256. The truncated head keeps them in place in the
listing (only ids sharing those first bytes sort by hash; ``list`` re-sorts
such a group after reading it) and the original id is in the object body,
so ``list`` stays lossless.

Every object body is a 44-byte header (magic, seq, a random write id, thread
and key lengths, value length) followed by the thread id, the key and the
value: a truncated or foreign object is detected, and the write id makes
every ETag unique, so an ``If-Match`` compare-and-swap cannot be fooled by a
head that changed and changed back (ABA). A head's seq is also kept in
object metadata (``x-amz-meta-seq``) so one ``HEAD`` request reads it.

``commit`` is ordered, not atomic (S3 has no multi-object transaction):

1. ``HEAD`` the head object: its ETag and seq. If the seq is at or above the
   new one the commit is stale: return ``False``, nothing written.
2. ``PUT`` the record objects (concurrently).
3. ``PUT`` the head with ``If-Match: <etag>`` (or ``If-None-Match: *`` when
   absent). A 412, 409 or 404 means another writer moved it first: ``HEAD``
   again and decide (stale -> ``False``, else retry the swap).

The head never names a record that is missing. A writer that loses the race
*after* step 2 has already overwritten or added record objects (for example
the run's runtime key), which is why ``atomic_commit`` and ``fenced_commit``
are declared ``False``.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import random
import secrets
import struct
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from checkpoint_stores.errors import AgentCheckpointCorruptionError, StoreUnavailableError
from checkpoint_stores.options import option_bool, option_int, option_seconds
from checkpoint_stores.spi import Capabilities
from checkpoint_stores.urls import redact_url

__all__ = ["S3Backend"]

LAYOUT_VERSION: Final = "1"
_MARKER: Final = ".checkpoint-stores/layout"
_MARKER_BODY: Final = f"checkpoint-stores s3 layout {LAYOUT_VERSION}\n".encode()

# magic, seq (-1: written by put/create), write id, thread length, key length, value length
_HEADER: Final = struct.Struct(">4sq16sIIQ")
_MAGIC: Final = b"CSS1"
_NO_SEQ: Final = -1

# Bytes of an id kept verbatim (as hex) in object names; longer ids are hashed.
# Worst case: 256 (prefix) + 2*96+1+32 + 1 + 2*200+1+32 = 915 bytes <= S3's 1,024.
_THREAD_PLAIN: Final = 96
_KEY_PLAIN: Final = 200
_MAX_ROOT: Final = 256
_HASH_MARK: Final = "~"
_HASH_HEX: Final = 32
_HEX: Final = frozenset("0123456789abcdef")

_MAX_KEY_BYTES: Final = 64 * 1024
_MAX_VALUE_BYTES: Final = 256 * 1024 * 1024
_DELETE_BATCH: Final = 1000  # DeleteObjects accepts at most 1,000 keys
_CAS_ATTEMPTS: Final = 64

# Error codes S3 (and compatibles) use.
_MISSING: Final = frozenset({"NoSuchKey", "NotFound", "404"})
_PRECONDITION: Final = frozenset({"PreconditionFailed", "412"})
_CONFLICT: Final = frozenset({"ConditionalRequestConflict", "OperationAborted", "409"})
_CREDENTIALS: Final = frozenset(
    {
        "AccessDenied",
        "403",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AuthorizationHeaderMalformed",
        "InvalidClientTokenId",
    }
)
_THROTTLED: Final = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "429",
        "ServiceUnavailable",
        "503",
        "InternalError",
        "500",
        "RequestTimeout",
    }
)

_OPTIONS: Final = frozenset(
    {
        "endpoint_url",
        "region_name",
        "addressing_style",
        "max_attempts",
        "retry_mode",
        "retries",
        "connect_timeout",
        "read_timeout",
        "max_pool_connections",
        "concurrency",
        "page_size",
        "profile_name",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "request_checksum_calculation",
        "create_bucket",
        "verify_conditional_writes",
    }
)
_ALIASES: Final = {"region": "region_name", "profile": "profile_name", "endpoint": "endpoint_url"}
_SECRETS: Final = frozenset({"aws_access_key_id", "aws_secret_access_key", "aws_session_token"})

T = TypeVar("T")


# -- names ----------------------------------------------------------------------


def _name(text: str, plain: int) -> str:
    """Object-name segment of an id: hex of its bytes, or truncated hex + ``~`` + hash."""
    raw = text.encode("utf-8")
    if len(raw) <= plain:
        return raw.hex()
    digest = hashlib.sha256(raw).hexdigest()[:_HASH_HEX]
    return raw[:plain].hex() + _HASH_MARK + digest


def _name_prefix(prefix: str, plain: int) -> str:
    """The listing prefix that finds every id starting with ``prefix`` (and, if long, a few more).

    For a prefix within the verbatim part it is exact; a longer prefix can only
    start hashed ids, so it selects the hashed names sharing its first bytes
    and the caller filters on the ids read from the bodies.
    """
    raw = prefix.encode("utf-8")
    if len(raw) <= plain:
        return raw.hex()
    return raw[:plain].hex() + _HASH_MARK


@dataclass(frozen=True)
class _Name:
    """A parsed object-name segment: the id if stored verbatim, else the hashed group stem."""

    text: str | None
    stem: str | None


def _parse_name(segment: str) -> _Name | None:
    """Parse a name segment; ``None`` for names this backend did not write."""
    head, mark, digest = segment.partition(_HASH_MARK)
    if not head or len(head) % 2 or not set(head) <= _HEX:
        return None
    if mark:
        if len(digest) != _HASH_HEX or not set(digest) <= _HEX:
            return None
        return _Name(None, head)
    try:
        return _Name(bytes.fromhex(head).decode("utf-8"), None)
    except UnicodeDecodeError:
        return None


# -- object bodies --------------------------------------------------------------


@dataclass(frozen=True)
class _Record:
    seq: int | None
    write_id: bytes
    thread_id: str
    key: str
    value: bytes


def _frame(thread_id: str, key: str, value: bytes, seq: int | None, write_id: bytes) -> bytes:
    thread_raw = thread_id.encode("utf-8")
    key_raw = key.encode("utf-8")
    header = _HEADER.pack(
        _MAGIC,
        _NO_SEQ if seq is None else seq,
        write_id,
        len(thread_raw),
        len(key_raw),
        len(value),
    )
    return b"".join((header, thread_raw, key_raw, value))


def _unframe(body: bytes, where: str) -> _Record:
    """Parse an object body, or raise corruption naming the object."""
    if len(body) < _HEADER.size or body[:4] != _MAGIC:
        raise AgentCheckpointCorruptionError(
            f"{where} is not a checkpoint-stores object (bad or missing header, "
            f"{len(body)} bytes): it was damaged or written by another tool. Delete it, or "
            "restore it from a bucket version if versioning is on"
        )
    _, seq, write_id, thread_len, key_len, value_len = _HEADER.unpack_from(body)
    expected = _HEADER.size + thread_len + key_len + value_len
    if len(body) != expected:
        raise AgentCheckpointCorruptionError(
            f"{where} is truncated or padded: {len(body)} bytes where its header says "
            f"{expected}. Delete it, or restore it from a bucket version if versioning is on"
        )
    start = _HEADER.size
    try:
        thread_id = body[start : start + thread_len].decode("utf-8")
        key = body[start + thread_len : start + thread_len + key_len].decode("utf-8")
    except UnicodeDecodeError:
        raise AgentCheckpointCorruptionError(
            f"{where} has a damaged header (its ids are not UTF-8); delete or restore it"
        ) from None
    value = body[start + thread_len + key_len :]
    return _Record(None if seq == _NO_SEQ else seq, write_id, thread_id, key, value)


def _head_seq(metadata: dict[str, str], where: str) -> int | None:
    raw = metadata.get("seq")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise AgentCheckpointCorruptionError(
            f"{where} carries a damaged seq in its metadata ({raw[:40]!r}); "
            "delete the object or rewrite it with put"
        ) from None


# -- options --------------------------------------------------------------------


def _error_code(exc: Exception) -> tuple[str, int | None]:
    response: dict[str, Any] = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", "") or "")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code or (str(status) if status else "?"), status


class _Missing(Exception):
    """The object does not exist (404)."""


class _Lost(Exception):
    """A conditional write failed: 412 (condition false) or 409 (concurrent conflict)."""

    def __init__(self, conflict: bool) -> None:
        super().__init__("conflict" if conflict else "precondition failed")
        self.conflict = conflict


@dataclass(frozen=True)
class _HeadState:
    etag: str
    seq: int | None
    write_id: str | None


class S3Backend:
    """One S3 object per key, commit by conditional writes. Durable and cross-process.

    URL: ``s3://bucket`` or ``s3://bucket/prefix`` (options may also go in the
    query string: ``s3://bucket/runs?endpoint_url=http://127.0.0.1:9000``).

    Options:
        endpoint_url: S3-compatible endpoint (MinIO, R2, moto); default AWS.
        region_name: region (default: the AWS config chain; ``us-east-1`` with
            an ``endpoint_url`` and no configured region).
        addressing_style: ``auto``, ``virtual`` or ``path`` (default ``path``
            with an ``endpoint_url``, else ``auto``).
        max_attempts, retry_mode: botocore retries (default 5, ``standard``;
            ``adaptive`` adds client-side rate limiting). ``retries={...}``
            (botocore's dict) is accepted too.
        connect_timeout, read_timeout: seconds (default 10 and 60).
        max_pool_connections: HTTP connections kept (default 32).
        concurrency: parallel requests per ``list``/``get_many``/``commit`` (default 16).
        page_size: names per ``ListObjectsV2`` page (1 to 1000, default 1000).
        profile_name: a profile of ``~/.aws/config``.
        aws_access_key_id, aws_secret_access_key, aws_session_token: explicit
            credentials (prefer the standard chain: environment, profile,
            container or instance role). Never shown in a repr or an error.
        request_checksum_calculation: botocore's ``when_supported`` (default)
            or ``when_required`` (for S3 compatibles that reject CRC checksums).
        create_bucket: create the bucket in ``setup`` if it is missing (default false).
        verify_conditional_writes: ``setup`` checks that the server enforces
            ``If-None-Match``/``If-Match`` and refuses a server that ignores
            them (default true; needs write access).
    """

    def __init__(self, url: str, **options: Any) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() != "s3":
            raise ValueError(f"S3Backend needs an s3:// URL, got {redact_url(url)!r}")
        if "@" in parts.netloc:
            raise ValueError(
                "credentials in an s3:// URL are not supported; use the standard AWS chain "
                "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance role) or "
                "the aws_access_key_id/aws_secret_access_key options"
            )
        bucket = parts.netloc
        if not bucket or not 3 <= len(bucket) <= 63:
            raise ValueError(
                f"s3:// URL {redact_url(url)!r} needs a bucket name of 3 to 63 characters: "
                "s3://my-bucket/optional/prefix"
            )
        prefix = unquote(parts.path).strip("/")
        root = f"{prefix}/" if prefix else ""
        if len(root.encode("utf-8")) > _MAX_ROOT:
            raise ValueError(
                f"s3:// prefix is {len(root.encode('utf-8'))} bytes; at most {_MAX_ROOT} "
                "fit beside encoded ids in S3's 1,024-byte key limit"
            )
        opts: dict[str, Any] = {}
        for key, value in [*parse_qsl(parts.query, keep_blank_values=True), *options.items()]:
            opts[_ALIASES.get(key, key)] = value
        unknown = set(opts) - _OPTIONS
        if unknown:
            raise TypeError(
                f"s3:// does not take options {sorted(unknown)}; "
                f"it takes: {', '.join(sorted(_OPTIONS))}"
            )
        self.url = url
        self.bucket = bucket
        self.prefix = prefix
        self._root = root
        self._endpoint: str | None = opts.get("endpoint_url") or None
        retries = dict(opts.get("retries") or {})
        self._max_attempts = option_int(
            opts.get(
                "max_attempts", retries.get("max_attempts", retries.get("total_max_attempts", 5))
            ),
            "max_attempts",
            scheme="s3://",
        )
        self._retry_mode = str(opts.get("retry_mode", retries.get("mode", "standard")))
        if self._retry_mode not in {"standard", "adaptive", "legacy"}:
            raise ValueError(
                "s3:// option retry_mode must be standard, adaptive or legacy, "
                f"got {self._retry_mode!r}"
            )
        style = opts.get("addressing_style") or ("path" if self._endpoint else "auto")
        if style not in {"auto", "virtual", "path"}:
            raise ValueError(
                f"s3:// option addressing_style must be auto, virtual or path, got {style!r}"
            )
        self._addressing_style = str(style)
        self._region: str | None = opts.get("region_name") or None
        self._connect_timeout = option_seconds(
            opts.get("connect_timeout", 10), "connect_timeout", scheme="s3://"
        )
        self._read_timeout = option_seconds(
            opts.get("read_timeout", 60), "read_timeout", scheme="s3://"
        )
        self._pool = option_int(
            opts.get("max_pool_connections", 32), "max_pool_connections", scheme="s3://", minimum=1
        )
        self._concurrency = max(
            1, option_int(opts.get("concurrency", 16), "concurrency", scheme="s3://")
        )
        self._page_size = option_int(opts.get("page_size", 1000), "page_size", scheme="s3://")
        if not 1 <= self._page_size <= 1000:
            raise ValueError(f"s3:// option page_size must be 1 to 1000, got {self._page_size}")
        self._profile: str | None = opts.get("profile_name") or None
        self._checksum: str | None = opts.get("request_checksum_calculation") or None
        self._create_bucket = option_bool(
            opts.get("create_bucket", False), "create_bucket", scheme="s3://"
        )
        self._verify = option_bool(
            opts.get("verify_conditional_writes", True), "verify_conditional_writes", scheme="s3://"
        )
        # Kept apart from everything that is printed.
        self._secrets = {k: str(v) for k, v in opts.items() if k in _SECRETS and v}
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._setup_lock: asyncio.Lock | None = None
        self._setup_task: asyncio.Task[Any] | None = None
        self._ready = False

    def __repr__(self) -> str:
        where = f", endpoint_url={redact_url(self._endpoint)!r}" if self._endpoint else ""
        return f"S3Backend({redact_url(self.url.split('?', 1)[0])!r}{where})"

    @property
    def capabilities(self) -> Capabilities:
        """Ordered (not atomic) commit by conditional writes; durable and cross-process."""
        return _CAPABILITIES

    # -- lifecycle ---------------------------------------------------------------

    async def setup(self) -> None:
        """Create the client; check the bucket, the layout marker and conditional writes.

        Idempotent and safe when several processes start at once: the marker is
        created with ``If-None-Match: *``, so exactly one process writes it.
        """
        if self._setup_lock is None:
            self._setup_lock = asyncio.Lock()
        async with self._setup_lock:
            if self._ready:
                return
            stack = contextlib.AsyncExitStack()
            # Requests made by this task while setting up must not wait for setup.
            self._setup_task = asyncio.current_task()
            try:
                self._client = await stack.enter_async_context(self._create_client())
                self._stack = stack
                await self._ensure_bucket()
                await self._check_layout()
                self._ready = True
            except BaseException:
                self._client = None
                self._stack = None
                await stack.aclose()
                raise
            finally:
                self._setup_task = None

    async def close(self) -> None:
        """Close the HTTP connections. ``setup`` (or any call) reopens them."""
        stack, self._stack, self._client, self._ready = self._stack, None, None, False
        if stack is not None:
            await stack.aclose()

    # -- reads -------------------------------------------------------------------

    async def get(self, thread_id: str, key: str) -> bytes | None:
        """One ``GetObject``; the value, or ``None``."""
        name = self._object(thread_id, key)
        body = await self._get_body(name)
        if body is None:
            return None
        return self._check(body, name, thread_id, key).value

    async def get_many(self, thread_id: str, keys: Sequence[str]) -> list[bytes | None]:
        """Values of ``keys`` in order, fetched concurrently."""
        return await self._gather([self.get(thread_id, key) for key in keys])

    # -- writes ------------------------------------------------------------------

    async def put(self, thread_id: str, key: str, value: bytes) -> None:
        """One unconditional ``PutObject`` (no seq: a head written here counts as lowest)."""
        await self._put(self._object(thread_id, key), _frame(thread_id, key, value, None, _wid()))

    async def create(self, thread_id: str, key: str, value: bytes) -> bool:
        """``PutObject`` with ``If-None-Match: *``: exactly one concurrent creator wins."""
        name = self._object(thread_id, key)
        write_id = _wid()
        body = _frame(thread_id, key, value, None, write_id)
        for attempt in range(_CAS_ATTEMPTS):
            try:
                await self._put(name, body, write_id=write_id, IfNoneMatch="*")
                return True
            except _Lost as lost:
                if lost.conflict:  # 409: a concurrent write was in flight; S3 says retry
                    await _backoff(attempt)
                    continue
                # 412. If a retried request of ours had already landed, that write is ours.
                state = await self._head(name)
                return state is not None and state.write_id == write_id.hex()
        raise self._unavailable("PutObject", name, "kept conflicting with concurrent writers")

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        """Check the head's seq, write the records, then compare-and-swap the head."""
        head_name = self._object(thread_id, head_key)
        state = await self._head(head_name)
        if state is not None and state.seq is not None and state.seq >= seq:
            return False  # stale before anything was written
        await self._gather(
            [
                self._put(self._object(thread_id, k), _frame(thread_id, k, v, None, _wid()))
                for k, v in writes
            ]
        )
        write_id = _wid()
        body = _frame(thread_id, head_key, head_value, seq, write_id)
        for attempt in range(_CAS_ATTEMPTS):
            condition = {"IfNoneMatch": "*"} if state is None else {"IfMatch": state.etag}
            try:
                await self._put(head_name, body, seq=seq, write_id=write_id, **condition)
                return True
            except (_Lost, _Missing) as lost:
                if isinstance(lost, _Lost) and lost.conflict:
                    await _backoff(attempt)
            state = await self._head(head_name)
            if state is not None and state.write_id == write_id.hex():
                return True  # a retried request of ours landed before the 412
            if state is not None and state.seq is not None and state.seq >= seq:
                return False  # a newer writer owns the head (our records may remain)
        raise self._unavailable(
            "PutObject", head_name, "kept losing the head to concurrent writers"
        )

    # -- listing -----------------------------------------------------------------

    async def list(self, thread_id: str, prefix: str = "") -> AsyncIterator[tuple[str, bytes]]:
        """Keys starting with ``prefix``, sorted, with values: one listing plus one GET per key."""
        base = self._thread_dir(thread_id)
        start = _name_prefix(prefix, _KEY_PLAIN)
        async for batch in self._batches(self._names(base + start), base):
            records = await self._gather([self._fetch(base + seg, thread_id) for seg, _ in batch])
            found = sorted((r.key, r.value) for r in records if r is not None)
            for key, value in found:
                if key.startswith(prefix):
                    yield key, value

    async def list_threads(self, prefix: str = "") -> AsyncIterator[str]:
        """Thread ids that hold at least one key, sorted (a delimiter listing)."""
        start = _name_prefix(prefix, _THREAD_PLAIN)
        async for batch in self._batches(self._dirs(self._root + start), self._root):
            ids = await self._gather([self._thread_of(seg, n) for seg, n in batch])
            for thread_id in sorted(t for t in ids if t is not None):
                if thread_id.startswith(prefix):
                    yield thread_id

    # -- deletes -----------------------------------------------------------------

    async def delete(self, thread_id: str, key: str) -> bool:
        """``HeadObject`` then ``DeleteObject`` (S3's delete does not say if it found anything)."""
        name = self._object(thread_id, key)
        if await self._head(name) is None:
            return False
        await self._request("delete_object", Key=name)
        return True

    async def delete_prefix(self, thread_id: str, prefix: str) -> int:
        """List the keys under ``prefix`` and remove them with ``DeleteObjects``."""
        base = self._thread_dir(thread_id)
        plain = len(prefix.encode("utf-8")) <= _KEY_PLAIN
        doomed: builtins.list[str] = []
        async for batch in self._batches(
            self._names(base + _name_prefix(prefix, _KEY_PLAIN)), base
        ):
            if plain:  # every listed name starts with the prefix: no need to read bodies
                doomed.extend(base + seg for seg, _ in batch)
                continue
            records = await self._gather([self._fetch(base + seg, thread_id) for seg, _ in batch])
            doomed.extend(
                base + seg
                for (seg, _), r in zip(batch, records, strict=True)
                if r is not None and r.key.startswith(prefix)
            )
        return await self._delete_names(doomed)

    async def delete_thread(self, thread_id: str) -> int:
        """Delete every object of the thread."""
        return await self.delete_prefix(thread_id, "")

    # -- internals: names --------------------------------------------------------

    def _thread_dir(self, thread_id: str) -> str:
        return f"{self._root}{_name(thread_id, _THREAD_PLAIN)}/"

    def _object(self, thread_id: str, key: str) -> str:
        return self._thread_dir(thread_id) + _name(key, _KEY_PLAIN)

    def _where(self, name: str) -> str:
        return f"object {name!r} in bucket {self.bucket!r}"

    def _check(self, body: bytes, name: str, thread_id: str, key: str | None) -> _Record:
        """Parse a body and make sure it belongs where its name puts it (``key=None``: any key)."""
        record = _unframe(body, self._where(name))
        expected = key if key is not None else record.key
        if (
            record.thread_id != thread_id
            or record.key != expected
            or (key is None and self._object(thread_id, record.key) != name)
        ):
            raise AgentCheckpointCorruptionError(
                f"{self._where(name)} holds key {record.key[:80]!r} of thread "
                f"{record.thread_id[:80]!r}, not the one its name says: it was copied or renamed "
                "by another tool. Delete it or move it back"
            )
        return record

    async def _names(self, start: str) -> AsyncIterator[str]:
        """Object names starting with ``start``, in S3 (byte) order, every page."""
        token: str | None = None
        while True:
            params: dict[str, Any] = {"Prefix": start, "MaxKeys": self._page_size}
            if token:
                params["ContinuationToken"] = token
            page = await self._request("list_objects_v2", **params)
            for item in page.get("Contents", ()):
                yield item["Key"]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    async def _dirs(self, start: str) -> AsyncIterator[str]:
        """Thread directories (``CommonPrefixes`` with delimiter ``/``), in order."""
        token: str | None = None
        while True:
            params: dict[str, Any] = {
                "Prefix": start,
                "Delimiter": "/",
                "MaxKeys": self._page_size,
            }
            if token:
                params["ContinuationToken"] = token
            page = await self._request("list_objects_v2", **params)
            for item in page.get("CommonPrefixes", ()):
                yield item["Prefix"][:-1]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    async def _batches(
        self, names: AsyncIterator[str], base: str
    ) -> AsyncIterator[builtins.list[tuple[str, _Name]]]:
        """Group listed names into batches that never split a group of hashed names.

        Listing order equals id order except inside a group of hashed names that
        share their truncated head; a batch boundary between groups keeps every
        batch entirely below the next, so sorting each batch sorts the whole.
        """
        batch: builtins.list[tuple[str, _Name]] = []
        size = max(self._concurrency * 4, 32)
        async for full in names:
            segment = full[len(base) :]
            parsed = _parse_name(segment)
            if parsed is None:
                continue  # not ours (e.g. the layout marker or a foreign object)
            if len(batch) >= size and (parsed.stem is None or parsed.stem != batch[-1][1].stem):
                yield batch
                batch = []
            batch.append((segment, parsed))
        if batch:
            yield batch

    async def _fetch(self, name: str, thread_id: str) -> _Record | None:
        body = await self._get_body(name)
        if body is None:
            return None  # deleted since it was listed
        return self._check(body, name, thread_id, None)

    async def _thread_of(self, segment: str, parsed: _Name) -> str | None:
        if parsed.text is not None:
            return parsed.text
        # A hashed thread name: read the id from the header of any one of its objects.
        page = await self._request("list_objects_v2", Prefix=f"{self._root}{segment}/", MaxKeys=1)
        items = page.get("Contents") or []
        if not items:
            return None
        name = items[0]["Key"]
        # The thread id follows the header: read the header, then exactly the id.
        head = await self._get_body(name, byte_range=f"bytes=0-{_HEADER.size - 1}")
        if head is None or len(head) < _HEADER.size or head[:4] != _MAGIC:
            return None
        thread_len = _HEADER.unpack_from(head)[3]
        if not thread_len:
            return None
        end = _HEADER.size + thread_len - 1
        raw = await self._get_body(name, byte_range=f"bytes={_HEADER.size}-{end}")
        if raw is None or len(raw) != thread_len:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None

    # -- internals: requests -----------------------------------------------------

    def _create_client(self) -> Any:
        try:
            from aiobotocore.config import AioConfig
            from aiobotocore.session import get_session
        except ImportError as exc:  # pragma: no cover - the extra is missing
            raise ImportError(
                f'the s3:// backend needs aiobotocore: pip install "checkpoint-stores[s3]" ({exc})'
            ) from exc
        config: dict[str, Any] = {
            "retries": {"max_attempts": self._max_attempts, "mode": self._retry_mode},
            "connect_timeout": self._connect_timeout,
            "read_timeout": self._read_timeout,
            "max_pool_connections": self._pool,
            "s3": {"addressing_style": self._addressing_style},
        }
        if self._checksum:
            config["request_checksum_calculation"] = self._checksum
        session = get_session()
        if self._profile:
            session.set_config_variable("profile", self._profile)
        region = self._region or session.get_config_variable("region")
        if region is None and self._endpoint:
            region = "us-east-1"  # compatibles ignore it, but signing needs one
        return session.create_client(
            "s3",
            endpoint_url=self._endpoint,
            region_name=region,
            config=AioConfig(**config),
            aws_access_key_id=self._secrets.get("aws_access_key_id"),
            aws_secret_access_key=self._secrets.get("aws_secret_access_key"),
            aws_session_token=self._secrets.get("aws_session_token"),
        )

    async def _ensure_bucket(self) -> None:
        try:
            await self._request("head_bucket")
        except _Missing:
            if not self._create_bucket:
                raise self._unavailable(
                    "HeadBucket",
                    None,
                    f"bucket {self.bucket!r} does not exist; create it "
                    f"(aws s3 mb s3://{self.bucket}) or open the store with create_bucket=true",
                ) from None
            params: dict[str, Any] = {}
            region = self._client.meta.region_name
            if region and region != "us-east-1":
                params["CreateBucketConfiguration"] = {"LocationConstraint": region}
            try:
                await self._request("create_bucket", **params)
            except _Lost:
                pass  # 409 BucketAlreadyOwnedByYou: another process created it first

    async def _check_layout(self) -> None:
        name = self._root + _MARKER
        write_id = _wid()
        if self._verify:
            try:
                await self._put(name, _MARKER_BODY, write_id=write_id, IfNoneMatch="*")
                created = True
            except _Lost:
                created = False
            if created:
                # We just created it, so this must be refused: proves If-None-Match works.
                try:
                    await self._put(name, _MARKER_BODY, write_id=write_id, IfNoneMatch="*")
                except _Lost:
                    pass
                else:
                    raise self._ignored("If-None-Match: *")
        body = await self._get_body(name)
        if body is None:
            if self._verify:
                raise self._unavailable(
                    "GetObject", name, "the layout marker vanished during setup"
                )
            return  # read-only use of an empty prefix: nothing to check yet
        if body != _MARKER_BODY:
            raise StoreUnavailableError(
                f"{self._where(name)} says {body[:60]!r}; this library writes layout "
                f"{LAYOUT_VERSION}. Upgrade checkpoint-stores or use another prefix"
            )
        if self._verify:
            try:
                await self._put(name, _MARKER_BODY, write_id=write_id, IfMatch='"0"')
            except (_Lost, _Missing):
                pass
            else:
                raise self._ignored("If-Match")

    def _ignored(self, header: str) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"the S3 server at {self._location()} ignored {header} on PutObject, so this store "
            "cannot keep a run's latest from going backwards. Use a server with S3 conditional "
            "writes (AWS S3, Cloudflare R2, a MinIO from RELEASE.2024-05-07 on, ...); "
            "verify_conditional_writes=false skips this check at your own risk"
        )

    async def _request(self, operation: str, **params: Any) -> Any:
        """Call one S3 operation; map errors (404 and conditional failures stay distinct)."""
        if not self._ready and asyncio.current_task() is not self._setup_task:
            await self.setup()
        try:
            return await getattr(self._client, operation)(Bucket=self.bucket, **params)
        except Exception as exc:
            mapped = self._map(exc, operation, params.get("Key"))
            if mapped is exc:
                raise
            raise mapped from exc

    async def _get_body(self, name: str, byte_range: str | None = None) -> bytes | None:
        params: dict[str, Any] = {"Key": name}
        if byte_range:
            params["Range"] = byte_range
        try:
            response = await self._request("get_object", **params)
        except _Missing:
            return None
        try:
            async with response["Body"] as stream:
                data: bytes = await stream.read()
        except Exception as exc:
            mapped = self._map(exc, "GetObject", name)
            if mapped is exc:
                raise
            raise mapped from exc
        return data

    async def _head(self, name: str) -> _HeadState | None:
        try:
            response = await self._request("head_object", Key=name)
        except _Missing:
            return None
        metadata: dict[str, str] = response.get("Metadata") or {}
        return _HeadState(
            etag=response["ETag"],
            seq=_head_seq(metadata, self._where(name)),
            write_id=metadata.get("write-id"),
        )

    async def _put(
        self,
        name: str,
        body: bytes,
        *,
        seq: int | None = None,
        write_id: bytes | None = None,
        **condition: str,
    ) -> None:
        metadata: dict[str, str] = {}
        if seq is not None:
            metadata["seq"] = str(seq)
        if write_id is not None:
            metadata["write-id"] = write_id.hex()
        await self._request("put_object", Key=name, Body=body, Metadata=metadata, **condition)

    async def _delete_names(self, names: Sequence[str]) -> int:
        removed = 0
        for i in range(0, len(names), _DELETE_BATCH):
            chunk = names[i : i + _DELETE_BATCH]
            response = await self._request(
                "delete_objects",
                Delete={"Objects": [{"Key": n} for n in chunk], "Quiet": True},
            )
            errors = response.get("Errors") or []
            if errors:
                first = errors[0]
                raise self._unavailable(
                    "DeleteObjects",
                    first.get("Key"),
                    f"{len(errors)} of {len(chunk)} deletes failed ({first.get('Code')}); "
                    "the rest were removed. Retry the delete",
                )
            removed += len(chunk)
        return removed

    async def _gather(self, calls: Iterable[Awaitable[T]]) -> builtins.list[T]:
        """Run ``calls`` concurrently, at most ``concurrency`` at a time, results in order."""
        pending = builtins.list(calls)
        if len(pending) <= 1:
            return [await call for call in pending]
        limit = asyncio.Semaphore(self._concurrency)

        async def one(call: Awaitable[T]) -> T:
            async with limit:
                return await call

        return builtins.list(await asyncio.gather(*(one(c) for c in pending)))

    # -- internals: errors -------------------------------------------------------

    def _location(self) -> str:
        where = redact_url(self.url.split("?", 1)[0])
        if self._endpoint:
            where += f" (endpoint {redact_url(self._endpoint)})"
        return where

    def _unavailable(self, operation: str, name: str | None, why: str) -> StoreUnavailableError:
        target = f" on {name!r}" if name else ""
        return StoreUnavailableError(f"S3 {operation}{target} at {self._location()} failed: {why}")

    def _map(self, exc: Exception, operation: str, name: str | None) -> Exception:
        """The library's error for a driver exception (credentials never appear in it)."""
        if isinstance(
            exc, (_Missing, _Lost, StoreUnavailableError, AgentCheckpointCorruptionError)
        ):
            return exc
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            NoCredentialsError,
            NoRegionError,
            PartialCredentialsError,
        )

        op = "".join(p.capitalize() for p in operation.split("_"))
        if isinstance(exc, ClientError):
            code, status = _error_code(exc)
            if code == "NoSuchBucket":
                return self._unavailable(
                    op,
                    name,
                    f"bucket {self.bucket!r} does not exist; create it or open the store "
                    "with create_bucket=true",
                )
            if code in _MISSING or status == 404:
                return _Missing(code)
            if code in _PRECONDITION or status == 412:
                return _Lost(conflict=False)
            if code in {"BucketAlreadyOwnedByYou"}:
                return _Lost(conflict=False)
            if code in _CONFLICT or status == 409:
                return _Lost(conflict=True)
            if code in _CREDENTIALS or status == 403:
                return self._unavailable(
                    op,
                    name,
                    f"access denied ({code}): the credentials were refused or lack permission. "
                    "Check the AWS credential chain (AWS_PROFILE, AWS_ACCESS_KEY_ID, role) and "
                    "the bucket policy; credentials are never shown",
                )
            if code in _THROTTLED or (status is not None and status >= 500):
                return self._unavailable(
                    op,
                    name,
                    f"the server is throttling or failing ({code}) after {self._max_attempts} "
                    "attempts; retry later, or raise max_attempts / use retry_mode=adaptive",
                )
            return self._unavailable(op, name, f"{code} (HTTP {status})")
        if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
            return self._unavailable(
                op,
                name,
                "no usable AWS credentials found: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run with an instance/container role",
            )
        if isinstance(exc, NoRegionError):
            return self._unavailable(op, name, "no region configured: pass region_name=...")
        if isinstance(exc, (BotoCoreError, OSError, asyncio.TimeoutError)):
            return self._unavailable(
                op,
                name,
                f"cannot reach the server ({type(exc).__name__}); check endpoint_url, the "
                "network and the timeouts",
            )
        return exc


def _wid() -> bytes:
    """A random write id: makes every ETag unique; lets a writer recognise its own write."""
    return secrets.token_bytes(16)


async def _backoff(attempt: int) -> None:
    # Jittered, capped: 409s come from writes in flight on the same key.
    await asyncio.sleep(random.uniform(0, min(0.5, 0.005 * 2**attempt)))


_CAPABILITIES: Final = Capabilities(
    atomic_commit=False,
    fenced_commit=False,
    cross_process=True,
    durable=True,
    ttl=False,
    max_value_bytes=_MAX_VALUE_BYTES,
    max_key_bytes=_MAX_KEY_BYTES,
    notes=(
        "commit is ordered, not atomic: record objects are written first, then the head moves "
        "by a conditional PUT (If-Match on its ETag, If-None-Match for the first). The head never "
        "names a missing record, and a stale commit seen before writing writes nothing; but a "
        "writer that loses the race after writing its records leaves them behind (possibly "
        "overwriting the winner's record or runtime key of the same step). Needs S3 conditional "
        "writes; list order relies on the server listing keys in byte order (S3 general-purpose "
        "buckets, MinIO, R2; not S3 Express directory buckets)"
    ),
)
