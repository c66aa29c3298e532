"""``mongodb://`` and ``mongodb+srv://``: MongoDB through PyMongo's native async API.

Built on :class:`pymongo.AsyncMongoClient` (Motor is deprecated). One
collection holds every key; one document per ``(thread_id, key)``::

    {_id: "<len(thread_id)>:<thread_id>:<key>",   # lossless, collision-free identity
     thread: <thread_id>, key: <key>,             # plain string fields, for range scans
     value: BinData(...),                         # the bytes, never parsed
     seq: <int64>,                                # only on heads written by commit
     expires_at: <date>}                          # only after expire_prefix (TTL index)

The ``_id`` starts with the thread id's length in code points, so no two
``(thread_id, key)`` pairs share one whatever characters they hold (``:``,
``.``, ``$``, NUL). Ids and keys are stored as values, never as field names.

Indexes, created by :meth:`MongoBackend.setup` (idempotent; identical
``createIndexes`` from several processes at once are no-ops for the server):
``thread_key`` on ``(thread, key)`` for ``list``, ``delete_prefix``,
``delete_thread`` and ``list_threads``, and a sparse TTL index on
``expires_at``. Prefix scans are exact ranges (``prefix <= key <
prefix_upper_bound(prefix)``), never a regex: MongoDB compares strings
bytewise in UTF-8 under the default (simple) collation, which is Python's
string order, so the index order is the SPI's order.

``commit`` writes the records and the head in one ordered ``bulk_write``;
the head is a ``ReplaceOne`` whose filter admits only a lower or missing seq,
with ``upsert=True``, so a newer head turns the upsert into a duplicate-key
error: the commit is stale. On a replica set or sharded cluster (found with
``hello`` at setup) the bulk write runs in a transaction: all-or-nothing,
and a stale commit writes nothing. On a standalone server (or with
``transactions=off``) the bulk write is ordered, records first, so a head
never names a missing record, but a stale writer's records can land before
its head is refused: ``capabilities`` then says ``atomic_commit=False``,
``fenced_commit=False``.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from bson.int64 import Int64
from pymongo import AsyncMongoClient, ReplaceOne
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.driver_info import DriverInfo
from pymongo.errors import (
    BulkWriteError,
    ConnectionFailure,
    DuplicateKeyError,
    OperationFailure,
    PyMongoError,
    WriteConcernError,
)
from pymongo.read_concern import ReadConcern
from pymongo.read_preferences import ReadPreference
from pymongo.write_concern import WriteConcern

from checkpoint_stores import __version__
from checkpoint_stores.errors import AgentCheckpointCorruptionError, StoreUnavailableError
from checkpoint_stores.keys import prefix_upper_bound
from checkpoint_stores.options import option_bool, option_seconds
from checkpoint_stores.spi import Capabilities
from checkpoint_stores.urls import redact_url

__all__ = ["MongoBackend"]

Document = dict[str, Any]
_T = TypeVar("_T")

DEFAULT_DATABASE: Final = "checkpoint_stores"
DEFAULT_COLLECTION: Final = "checkpoints"
# A BSON document is at most 16 MiB; the value shares it with the ids (up to
# 4 x 16 KiB) and the field names, so 15 MiB leaves a wide margin.
MAX_VALUE_BYTES: Final = 15 * 1024 * 1024
MAX_KEY_BYTES: Final = 16 * 1024
# MongoDB 4.2 (wire version 8): no index key size limit, transactions on
# sharded clusters, update pipelines ($$NOW) for expiry.
MIN_WIRE_VERSION: Final = 8
# How long a commit keeps retrying write conflicts before it gives up with
# StoreUnavailableError. Above mongod's transactionLifetimeLimitSeconds (60): a
# writer killed inside its transaction leaves it open, holding the run's head,
# until the server aborts it; the next commit of that run waits that long.
COMMIT_RETRY_SECONDS: Final = 90.0
_INDEX_THREAD_KEY: Final = "thread_key"
_INDEX_TTL: Final = "expires_at_ttl"
_OUR_OPTIONS: Final = frozenset(
    {"database", "collection", "transactions", "commit_retry_seconds", "w", "j", "wtimeout"}
)
_DUPLICATE_KEY: Final = 11000
_CHUNK: Final = 1000
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_DB_FORBIDDEN: Final = frozenset('/\\. "$*<>:|?\x00')


def _doc_id(thread_id: str, key: str) -> str:
    """The ``_id`` of ``(thread_id, key)``: injective because the length comes first."""
    return f"{len(thread_id)}:{thread_id}:{key}"


def _key_range(prefix: str) -> dict[str, str]:
    """A query on ``key`` matching exactly the keys that start with ``prefix``."""
    condition = {"$gte": prefix}
    upper = prefix_upper_bound(prefix)
    if upper is not None:
        condition["$lt"] = upper
    return condition


def _thread_filter(thread_id: str, prefix: str) -> Document:
    if not prefix:
        return {"thread": thread_id}
    return {"thread": thread_id, "key": _key_range(prefix)}


def _transactions_mode(value: Any) -> bool | None:
    """``None`` for auto (decided by ``hello`` at setup), else forced on or off."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    return option_bool(value, "transactions", scheme="mongodb://")


def _check_database_name(name: str) -> str:
    if not name or len(name.encode("utf-8")) >= 64 or _DB_FORBIDDEN & set(name):
        raise ValueError(
            f"MongoDB database name {name!r} is not usable: it must be 1-63 bytes without "
            'any of / \\ . space " $ * < > : | ? or NUL; pass database=... or put a valid '
            "name in the URL path (mongodb://host/mydb)"
        )
    return name


def _check_collection_name(database: str, name: str) -> str:
    if (
        not name
        or "$" in name
        or "\x00" in name
        or name.startswith(("system.", "."))
        or name.endswith(".")
        or len(f"{database}.{name}".encode()) > 255
    ):
        raise ValueError(
            f"MongoDB collection name {name!r} is not usable: it must be non-empty, without "
            "'$' or NUL, not start with 'system.' and keep 'database.collection' within 255 "
            "bytes; pass collection=... (default 'checkpoints')"
        )
    return name


def _check_seq(seq: int) -> Int64:
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise TypeError(f"seq must be an int, got {type(seq).__name__}")
    if not _INT64_MIN <= seq <= _INT64_MAX:
        raise ValueError(
            f"seq {seq} does not fit in a signed 64-bit integer, the largest MongoDB stores; "
            "keep epochs below 2**31 (seq = epoch << 32 | counter)"
        )
    return Int64(seq)


def _value_of(doc: Mapping[str, Any], thread_id: str, key: str) -> bytes:
    """The stored bytes, or a corruption error if the document was damaged."""
    value = doc.get("value")
    if not isinstance(value, bytes):  # bson.Binary of any subtype is a bytes too
        raise AgentCheckpointCorruptionError(
            f"MongoDB document for key {key!r} of thread {thread_id!r} has no binary 'value' "
            f"(found {type(value).__name__}); it was changed outside checkpoint-stores. "
            "Restore it from a backup or delete it"
        )
    return bytes(value)


def _duplicate_at(exc: BulkWriteError, index: int) -> bool:
    """True if the bulk write stopped on a duplicate key at op ``index``."""
    errors = exc.details.get("writeErrors") or []
    return any(e.get("code") == _DUPLICATE_KEY and e.get("index") == index for e in errors)


class MongoBackend:
    """One MongoDB collection; atomic and fenced on replica sets and sharded clusters.

    URL: ``mongodb://[user:password@]host[:port][,host...]/[database][?options]`` or
    ``mongodb+srv://...``. PyMongo's own URL options (``replicaSet``, ``tls``,
    ``serverSelectionTimeoutMS``, ``w``, ``journal``, ``readConcernLevel`` ...) apply.

    Options (keyword arguments, or in the URL query string):

    * ``database``: database name (default: the URL path, else ``checkpoint_stores``);
    * ``collection``: collection name (default ``checkpoints``);
    * ``transactions``: ``auto`` (default: use them where the deployment has them),
      ``on`` (refuse to start without them) or ``off``;
    * ``commit_retry_seconds``: how long a commit retries write conflicts (default 90,
      above mongod's 60 s ``transactionLifetimeLimitSeconds``: a writer killed inside
      its transaction holds the run's head until the server aborts it);
    * ``w``, ``j``, ``wtimeout`` (ms): the write concern; each one given replaces that
      part of the default ``w="majority", j=True``. Given none, a write concern set on
      the client (PyMongo's ``journal``/``wTimeoutMS`` URL options, or ``client=``) is
      used as it is. ``w=0`` is refused (a commit must know if it won);
    * ``client``: an :class:`pymongo.AsyncMongoClient` of yours to use instead of
      opening one (it is not closed by :meth:`close`);
    * any other keyword goes to ``AsyncMongoClient`` (e.g. ``serverSelectionTimeoutMS``).

    Reads use the primary and read concern ``majority`` (unless the URL sets a read
    concern level), so ``latest`` never reads an older head than a commit returned.

    >>> backend = MongoBackend("mongodb://localhost:27017/runs?collection=agent_runs")
    >>> backend
    MongoBackend('mongodb://localhost:27017/runs', database='runs', collection='agent_runs')
    """

    def __init__(self, url: str, **options: Any) -> None:
        scheme, sep, _ = url.partition("://")
        if not sep or scheme.lower() not in {"mongodb", "mongodb+srv"}:
            raise ValueError(
                f"{redact_url(url)!r} is not a MongoDB URL; write mongodb://host:27017/db "
                "or mongodb+srv://cluster.example.net/db"
            )
        parts = urlsplit(url)
        ours: dict[str, Any] = {}
        driver_query: builtins.list[str] = []
        # Filter the raw segments rather than re-encode them: PyMongo has its own
        # quoting rules (authMechanismProperties=A:b,C:d) that must reach it unchanged.
        for segment in filter(None, parts.query.split("&")):
            pairs = parse_qsl(segment, keep_blank_values=True)
            if pairs and pairs[0][0] in _OUR_OPTIONS:
                ours[pairs[0][0]] = pairs[0][1]
            else:
                driver_query.append(segment)
        ours.update({k: v for k, v in options.items() if k in _OUR_OPTIONS and v is not None})
        client = options.pop("client", None)
        self._driver_options = {k: v for k, v in options.items() if k not in _OUR_OPTIONS}
        if client is not None and not isinstance(client, AsyncMongoClient):
            raise TypeError(
                f"client= must be a pymongo.AsyncMongoClient, got {type(client).__name__}; "
                "the synchronous MongoClient and Motor clients cannot be used here"
            )
        if client is not None and self._driver_options:
            raise TypeError(
                f"options {sorted(self._driver_options)} configure a client, but client= "
                "was given: configure your client instead"
            )
        # The URL without our options is what PyMongo sees (it warns on unknown ones).
        self._driver_url = urlunsplit(
            (parts.scheme, parts.netloc, parts.path, "&".join(driver_query), parts.fragment)
        )
        self.url = url
        self._redacted = redact_url(self._driver_url)
        path_db = unquote(parts.path.lstrip("/"))
        database = ours.get("database", path_db or DEFAULT_DATABASE)
        self.database = _check_database_name(str(database))
        collection = ours.get("collection", DEFAULT_COLLECTION)
        self.collection = _check_collection_name(self.database, str(collection))
        self._transactions_option = _transactions_mode(ours.get("transactions"))
        self._commit_retry_seconds = option_seconds(
            ours.get("commit_retry_seconds", COMMIT_RETRY_SECONDS),
            "commit_retry_seconds",
            scheme="mongodb://",
        )
        self._write_concern_option = self._parse_write_concern(ours)
        self._client: AsyncMongoClient[Document] | None = client
        self._owns_client = client is None
        self._coll: AsyncCollection[Document] | None = None
        self._use_transactions = False
        self._setup_lock: asyncio.Lock | None = None

    @staticmethod
    def _parse_write_concern(ours: Mapping[str, Any]) -> dict[str, Any] | None:
        """The write concern from our options: each one given replaces that part of the
        default ``{w: "majority", j: true}``; ``None`` if none was given."""
        if not {"w", "j", "wtimeout"} & set(ours):
            return None
        doc: dict[str, Any] = {"w": "majority", "j": True}
        if "w" in ours:
            w = ours["w"]
            doc["w"] = int(w) if isinstance(w, str) and w.isdigit() else w
        if "j" in ours:
            doc["j"] = option_bool(ours["j"], "j", scheme="mongodb://")
        if doc["w"] == 0:
            raise ValueError(
                "MongoDB option w=0 (unacknowledged writes) cannot tell whether a commit "
                "won or was fenced out; use w=1 or w='majority' (the default)"
            )
        try:
            if "wtimeout" in ours:
                doc["wtimeout"] = int(ours["wtimeout"])
            WriteConcern(**doc)
        except (TypeError, ValueError, PyMongoError) as exc:
            raise ValueError(
                f"invalid MongoDB write concern {doc}: {exc}; use w=1 or w='majority', "
                "j=true/false and wtimeout in milliseconds"
            ) from None
        return doc

    def __repr__(self) -> str:
        return (
            f"MongoBackend({self._redacted!r}, database={self.database!r}, "
            f"collection={self.collection!r})"
        )

    @property
    def capabilities(self) -> Capabilities:
        """Atomic and fenced with transactions (decided at setup); durable, TTL, cross-process."""
        transactional = (
            self._use_transactions if self._coll is not None else bool(self._transactions_option)
        )
        if transactional:
            notes = (
                "commit is one multi-document transaction (replica set or sharded cluster); "
                "a writer killed mid-commit holds its run's head until the server aborts its "
                "transaction (transactionLifetimeLimitSeconds, 60 s by default). TTL expiry "
                "runs in the server's TTL monitor (about once a minute)"
            )
        else:
            notes = (
                "no transactions (standalone server or transactions=off): commit writes the "
                "records, then the head, in one ordered bulk write; a stale writer is refused "
                "at the head but its records may land. TTL expiry runs in the server's TTL "
                "monitor (about once a minute)"
            )
        return Capabilities(
            atomic_commit=transactional,
            fenced_commit=transactional,
            cross_process=True,
            durable=True,
            ttl=True,
            max_value_bytes=MAX_VALUE_BYTES,
            max_key_bytes=MAX_KEY_BYTES,
            notes=notes,
        )

    # -- errors ------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        """``text`` with the URL's password removed, whatever the driver put in it."""
        password = urlsplit(self.url).password
        if password:
            for form in {password, unquote(password)}:
                text = text.replace(form, "***")
        return text

    def _unavailable(self, action: str, exc: PyMongoError) -> StoreUnavailableError:
        detail = self._scrub(str(exc))[:500]
        where = f"MongoDB {self._redacted} (database {self.database!r})"
        if isinstance(exc, ConnectionFailure):
            hint = (
                "the server is unreachable or timed out; check that it is running and reachable "
                "(host, port, TLS, replicaSet, credentials), then retry"
            )
        elif isinstance(exc, WriteConcernError) or (
            isinstance(exc, OperationFailure)
            and exc.has_error_label("UnknownTransactionCommitResult")
        ):
            hint = (
                "the write was not confirmed by the requested write concern; it may or may not "
                "have been applied, and retrying it is safe"
            )
        elif isinstance(exc, OperationFailure) and exc.code == 18:
            hint = (
                "authentication failed; check the user name, the password (percent-encoded "
                "in the URL) and authSource"
            )
        else:
            hint = "the server refused the operation; check permissions and the deployment"
        return StoreUnavailableError(
            f"{where}: {action} failed: {type(exc).__name__}: {detail}. {hint}"
        )

    @contextlib.contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        """Turn driver errors into :class:`StoreUnavailableError` with the URL redacted."""
        try:
            yield
        except PyMongoError as exc:
            raise self._unavailable(action, exc) from exc

    # -- lifecycle ---------------------------------------------------------------

    async def setup(self) -> None:
        """Connect, check the server, detect transactions, create the indexes (idempotent)."""
        if self._coll is not None:
            return
        if self._setup_lock is None:
            self._setup_lock = asyncio.Lock()
        async with self._setup_lock:
            if self._coll is None:
                await self._setup_once()

    async def _setup_once(self) -> None:
        client = self._client
        if client is None:
            try:
                client = AsyncMongoClient(
                    self._driver_url,
                    driver=DriverInfo("checkpoint-stores", __version__),
                    **self._driver_options,
                )
            except (PyMongoError, ValueError, TypeError) as exc:  # InvalidURI, bad options
                raise ValueError(
                    f"cannot use MongoDB URL {self._redacted}: {self._scrub(str(exc))}"
                ) from None
        try:
            with self._translate("connecting"):
                hello = await client.admin.command("hello")
            wire = int(hello.get("maxWireVersion", 0))
            if wire < MIN_WIRE_VERSION:
                raise StoreUnavailableError(
                    f"MongoDB {self._redacted} speaks wire version {wire}; checkpoint-stores "
                    "needs MongoDB 4.2 or newer (wire version 8). Upgrade the server"
                )
            supported = "setName" in hello or hello.get("msg") == "isdbgrid"
            if self._transactions_option is True and not supported:
                raise StoreUnavailableError(
                    f"MongoDB {self._redacted} is a standalone server, which has no "
                    "transactions, but transactions=on was asked for; use a replica set "
                    "(a single-node one is fine) or transactions=auto"
                )
            use_transactions = supported and self._transactions_option is not False
            coll = client.get_database(self.database).get_collection(
                self.collection,
                write_concern=self._write_concern(client),
                read_concern=self._read_concern(client),
                # Secondaries may lag: latest() must never read an older head.
                read_preference=ReadPreference.PRIMARY,
            )
            await self._create_indexes(coll)
        except BaseException:
            if self._owns_client:
                await client.close()
            raise
        self._client = client
        self._use_transactions = use_transactions
        self._coll = coll

    def _write_concern(self, client: AsyncMongoClient[Document]) -> WriteConcern:
        if self._write_concern_option is not None:
            return WriteConcern(**self._write_concern_option)
        if not client.write_concern.is_server_default:
            if client.write_concern.document.get("w") == 0:
                raise ValueError(
                    "the MongoDB client uses w=0 (unacknowledged writes), which cannot tell "
                    "whether a commit won; use w=1 or w='majority'"
                )
            return client.write_concern
        # j=True as well: on a standalone mongod "majority" is not journaled, and
        # SecantusDB acknowledges un-journaled majority writes that a crash then loses.
        return WriteConcern(w="majority", j=True)

    @staticmethod
    def _read_concern(client: AsyncMongoClient[Document]) -> ReadConcern:
        if client.read_concern.level is not None:
            return client.read_concern
        return ReadConcern("majority")

    async def _create_indexes(self, coll: AsyncCollection[Document]) -> None:
        # Several processes may run this at once: identical index specs are a
        # no-op for the server; a race on creating the collection itself can
        # surface as a transient error, so try a few times.
        for attempt in range(5):
            try:
                await coll.create_index([("thread", 1), ("key", 1)], name=_INDEX_THREAD_KEY)
                await coll.create_index(
                    "expires_at", name=_INDEX_TTL, expireAfterSeconds=0, sparse=True
                )
                return
            except OperationFailure as exc:
                if exc.code in {85, 86}:  # IndexOptionsConflict, IndexKeySpecsConflict
                    raise StoreUnavailableError(
                        f"MongoDB collection {self.database}.{self.collection} has an index "
                        f"that conflicts with checkpoint-stores' {_INDEX_THREAD_KEY!r} or "
                        f"{_INDEX_TTL!r} ({self._scrub(str(exc))[:300]}); use another "
                        "collection (collection=...) or drop the conflicting index"
                    ) from exc
                if attempt == 4 or isinstance(exc, ConnectionFailure):
                    raise self._unavailable("creating indexes", exc) from exc
                await asyncio.sleep(0.05 * (attempt + 1))
            except PyMongoError as exc:
                raise self._unavailable("creating indexes", exc) from exc

    async def close(self) -> None:
        """Close the client if this backend opened it (a caller's client stays open)."""
        client, self._coll = self._client, None
        if self._owns_client and client is not None:
            self._client = None
            await client.close()

    async def _collection(self) -> AsyncCollection[Document]:
        if self._coll is None:
            await self.setup()
        assert self._coll is not None
        return self._coll

    # -- SPI ---------------------------------------------------------------------

    async def get(self, thread_id: str, key: str) -> bytes | None:
        """One lookup by ``_id``."""
        coll = await self._collection()
        with self._translate("get"):
            doc = await coll.find_one({"_id": _doc_id(thread_id, key)}, {"value": 1})
        return None if doc is None else _value_of(doc, thread_id, key)

    async def get_many(self, thread_id: str, keys: Sequence[str]) -> list[bytes | None]:
        """One ``$in`` query on ``_id``, answered in the order of ``keys``."""
        if not keys:
            return []
        coll = await self._collection()
        ids = list(dict.fromkeys(_doc_id(thread_id, k) for k in keys))
        found: dict[str, bytes] = {}
        with self._translate("get_many"):
            async for doc in coll.find({"_id": {"$in": ids}}, {"key": 1, "value": 1}):
                key = doc.get("key")
                if isinstance(key, str):
                    found[key] = _value_of(doc, thread_id, key)
        return [found.get(k) for k in keys]

    def _record(self, thread_id: str, key: str, value: bytes) -> Document:
        # A whole replacement document: it also clears a previous seq or expires_at.
        return {"_id": _doc_id(thread_id, key), "thread": thread_id, "key": key, "value": value}

    async def put(self, thread_id: str, key: str, value: bytes) -> None:
        """Replace the document (upsert); drops any seq, so the head counts as lowest."""
        coll = await self._collection()
        doc = self._record(thread_id, key, bytes(value))
        with self._translate("put"):
            for attempt in range(3):
                try:
                    await coll.replace_one({"_id": doc["_id"]}, doc, upsert=True)
                    return
                except DuplicateKeyError:
                    # Two upserts of a new _id raced; the loser's retry updates instead.
                    if attempt == 2:
                        raise

    async def create(self, thread_id: str, key: str, value: bytes) -> bool:
        """``insert_one``: the unique ``_id`` makes the first writer win."""
        coll = await self._collection()
        with self._translate("create"):
            try:
                await coll.insert_one(self._record(thread_id, key, bytes(value)))
            except DuplicateKeyError:
                return False
        return True

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        """Records then the seq-guarded head in one ordered bulk write (in a transaction
        where the deployment has them); a duplicate key on the head means stale."""
        stored_seq = _check_seq(seq)
        coll = await self._collection()
        head_id = _doc_id(thread_id, head_key)
        ops: builtins.list[ReplaceOne[Document]] = [
            ReplaceOne({"_id": doc["_id"]}, doc, upsert=True)
            for doc in (self._record(thread_id, k, bytes(v)) for k, v in writes)
        ]
        head = self._record(thread_id, head_key, bytes(head_value))
        head["seq"] = stored_seq
        # Matches a head with a lower seq or none (missing or null: written by put).
        guard = {"_id": head_id, "$or": [{"seq": {"$lt": stored_seq}}, {"seq": None}]}
        ops.append(ReplaceOne(guard, head, upsert=True))
        with self._translate("commit"):
            if self._use_transactions:
                return await self._commit_in_transaction(coll, ops)
            return await self._commit_ordered(coll, ops, head_id, stored_seq)

    async def _commit_in_transaction(
        self, coll: AsyncCollection[Document], ops: builtins.list[ReplaceOne[Document]]
    ) -> bool:
        head_index = len(ops) - 1

        async def work(session: AsyncClientSession) -> tuple[bool, bool]:
            try:
                await coll.bulk_write(ops, ordered=True, session=session)
            except (BulkWriteError, DuplicateKeyError) as exc:
                if isinstance(exc, DuplicateKeyError) or _duplicate_at(exc, head_index):
                    return False, False  # a newer head exists: abort, undoing our records
                raise
            return True, True

        return await self._transaction(coll, work)

    async def _transaction(
        self,
        coll: AsyncCollection[Document],
        work: Callable[[AsyncClientSession], Awaitable[tuple[_T, bool]]],
    ) -> _T:
        """Run ``work`` in a transaction, redone on transient errors; it returns
        ``(result, commit)``, and ``commit=False`` aborts the transaction."""
        assert self._client is not None
        deadline = time.monotonic() + self._commit_retry_seconds
        attempt = network_failures = 0
        while True:
            attempt += 1
            try:
                async with self._client.start_session(causal_consistency=False) as session:
                    await session.start_transaction(
                        read_concern=ReadConcern("majority"),
                        write_concern=coll.write_concern,
                    )
                    result, commit = await work(session)
                    if commit:
                        await self._commit_transaction(session, deadline)
                    else:
                        await session.abort_transaction()
                    return result
            except PyMongoError as exc:
                # Write conflicts with a concurrent committer of the same documents (or a
                # dead writer's transaction the server has not aborted yet) or a step-down:
                # the whole transaction is safe to redo, until the deadline. A network
                # error is redone once (as retryable writes do): a server that is down
                # should be reported now, not after the deadline.
                if not exc.has_error_label("TransientTransactionError"):
                    raise
                if isinstance(exc, ConnectionFailure):
                    network_failures += 1
                    if network_failures > 1:
                        raise
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(min(0.5, 0.005 * 2**attempt) * random.random())

    @staticmethod
    async def _commit_transaction(session: AsyncClientSession, deadline: float) -> None:
        network_failures = 0
        while True:
            try:
                await session.commit_transaction()
                return
            except PyMongoError as exc:
                # The commit may have been applied; committing again is idempotent. An
                # unreachable server is reported after one more try (the outcome stays
                # unknown, and the caller's retry of the whole commit is safe).
                if not exc.has_error_label("UnknownTransactionCommitResult"):
                    raise
                if isinstance(exc, ConnectionFailure):
                    network_failures += 1
                    if network_failures > 1:
                        raise
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.05)

    async def _commit_ordered(
        self,
        coll: AsyncCollection[Document],
        ops: builtins.list[ReplaceOne[Document]],
        head_id: str,
        seq: Int64,
    ) -> bool:
        # Without transactions, check first so an obviously stale writer writes nothing;
        # a writer that loses the race after the check is still refused at the head.
        current = await coll.find_one({"_id": head_id}, {"seq": 1})
        if current is not None and current.get("seq") is not None and current["seq"] >= seq:
            return False
        head_index = len(ops) - 1
        attempt = 0
        while True:
            attempt += 1
            try:
                await coll.bulk_write(ops, ordered=True)
                return True
            except BulkWriteError as exc:
                if _duplicate_at(exc, head_index):
                    return False
                errors = exc.details.get("writeErrors") or []
                # Upsert race on a record's new _id: the records are idempotent, redo them.
                if attempt >= 3 or not all(e.get("code") == _DUPLICATE_KEY for e in errors):
                    raise

    async def list(self, thread_id: str, prefix: str = "") -> AsyncIterator[tuple[str, bytes]]:
        """An index range scan on ``(thread, key)``, sorted by key (bytewise = Python order)."""
        coll = await self._collection()
        cursor = coll.find(
            _thread_filter(thread_id, prefix), {"_id": 0, "key": 1, "value": 1}
        ).sort([("thread", 1), ("key", 1)])
        try:
            with self._translate("list"):
                async for doc in cursor:
                    key = doc.get("key")
                    if not isinstance(key, str):
                        raise AgentCheckpointCorruptionError(
                            f"MongoDB document in thread {thread_id!r} has a non-string 'key' "
                            f"({type(key).__name__}); it was changed outside checkpoint-stores"
                        )
                    yield key, _value_of(doc, thread_id, key)
        finally:
            # A caller that stops early must not leave a server-side cursor behind.
            with contextlib.suppress(PyMongoError):
                await cursor.close()

    async def list_threads(self, prefix: str = "") -> AsyncIterator[str]:
        """Distinct thread ids (grouped on the server), sorted."""
        coll = await self._collection()
        match = {"thread": _key_range(prefix)} if prefix else {}
        pipeline: builtins.list[Document] = [
            {"$match": match},
            {"$group": {"_id": "$thread"}},
            {"$sort": {"_id": 1}},
        ]
        with self._translate("list_threads"):
            cursor = await coll.aggregate(pipeline)
        try:
            with self._translate("list_threads"):
                async for doc in cursor:
                    if isinstance(doc.get("_id"), str):
                        yield doc["_id"]
        finally:
            with contextlib.suppress(PyMongoError):
                await cursor.close()

    async def delete(self, thread_id: str, key: str) -> bool:
        """``delete_one`` by ``_id``."""
        coll = await self._collection()
        with self._translate("delete"):
            result = await coll.delete_one({"_id": _doc_id(thread_id, key)})
        return result.deleted_count == 1

    async def delete_prefix(self, thread_id: str, prefix: str) -> int:
        """Delete the exact key range (in transactions of up to 1,000 keys, if in use)."""
        coll = await self._collection()
        with self._translate("delete_prefix"):
            return await self._delete_where(coll, _thread_filter(thread_id, prefix))

    async def delete_thread(self, thread_id: str) -> int:
        """Delete every key of the thread (in transactions of up to 1,000 keys, if in use)."""
        coll = await self._collection()
        with self._translate("delete_thread"):
            return await self._delete_where(coll, {"thread": thread_id})

    async def _delete_where(self, coll: AsyncCollection[Document], query: Document) -> int:
        if not self._use_transactions:
            return (await coll.delete_many(query)).deleted_count

        # In transactions, so a write conflict with another transaction (a commit in
        # flight, or one a killed writer left open) is an error the retry loop redoes,
        # and each chunk is all-or-nothing. A plain delete_many would instead wait
        # inside the server: on mongod until that transaction ends (at most
        # transactionLifetimeLimitSeconds), on SecantusDB 0.7.0b3 until some other
        # transaction command makes it reap the dead one, which may be never.
        async def chunk(session: AsyncClientSession) -> tuple[tuple[int, bool], bool]:
            cursor = coll.find(query, {"_id": 1}, session=session).limit(_CHUNK)
            ids = [doc["_id"] async for doc in cursor]
            if not ids:
                return (0, True), False
            result = await coll.delete_many({"_id": {"$in": ids}}, session=session)
            return (result.deleted_count, len(ids) < _CHUNK), True

        total = 0
        while True:
            deleted, done = await self._transaction(coll, chunk)
            total += deleted
            if done:
                return total

    async def expire_prefix(self, thread_id: str, prefix: str, ttl_seconds: float) -> int:
        """Set ``expires_at`` (server clock + ``ttl_seconds``) on every key under ``prefix``.

        The TTL index then lets the server's TTL monitor delete them; it runs about
        once a minute, so keys stay readable until it has. Writing a key again
        (``put``, ``commit``) clears its expiry.
        """
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, (int, float)):
            raise TypeError(f"ttl_seconds must be a number, got {type(ttl_seconds).__name__}")
        if not math.isfinite(ttl_seconds) or ttl_seconds < 0:
            raise ValueError(f"ttl_seconds must be a finite number >= 0, got {ttl_seconds!r}")
        coll = await self._collection()
        expiry = [{"$set": {"expires_at": {"$add": ["$$NOW", round(ttl_seconds * 1000)]}}}]
        with self._translate("expire_prefix"):
            if not self._use_transactions:
                result = await coll.update_many(_thread_filter(thread_id, prefix), expiry)
                return result.matched_count
            # Chunks in transactions, for the reason given in _delete_where; paged by key,
            # since updated documents still match.
            total, after = 0, None
            while True:
                condition: Document = _key_range(prefix) if prefix else {}
                if after is not None:
                    condition["$gt"] = after
                query = {"thread": thread_id, **({"key": condition} if condition else {})}

                async def chunk(
                    session: AsyncClientSession, query: Document = query
                ) -> tuple[tuple[int, str | None], bool]:
                    cursor = coll.find(query, {"_id": 1, "key": 1}, session=session)
                    docs = [d async for d in cursor.sort([("thread", 1), ("key", 1)]).limit(_CHUNK)]
                    if not docs:
                        return (0, None), False
                    ids = [d["_id"] for d in docs]
                    result = await coll.update_many({"_id": {"$in": ids}}, expiry, session=session)
                    last = docs[-1]["key"] if len(docs) == _CHUNK else None
                    return (result.matched_count, last), True

                matched, after = await self._transaction(coll, chunk)
                total += matched
                if after is None:
                    return total
