"""SQL databases through SQLAlchemy 2 async Core: PostgreSQL, SQLite and MySQL/MariaDB.

URLs (a plain scheme picks the default async driver; the extra installs it)::

    postgresql://user:pass@host/db       postgresql+asyncpg   checkpoint-stores[postgres]
    postgresql+psycopg://user@host/db    psycopg 3            checkpoint-stores[psycopg]
    sqlite:///relative.db                sqlite+aiosqlite     checkpoint-stores[sqlite]
    sqlite:////absolute/path.db
    mysql://root@host/db                 mysql+aiomysql       checkpoint-stores[mysql]
    mariadb://root@host/db               mariadb+aiomysql     (or +asyncmy)

One table per store (default ``checkpoint_stores``) plus ``<table>_migrations``::

    thread_id  BYTEA | VARBINARY(1024) | BLOB    the thread id's UTF-8 bytes
    state_key  BYTEA | VARBINARY(1024) | BLOB    the key's UTF-8 bytes
    seq        BIGINT NULL                       a head's seq; NULL for put/create values
    value      BYTEA | LONGBLOB | BLOB           the value, verbatim
    PRIMARY KEY (thread_id, state_key)

Why binary ids: binary columns compare byte by byte, which is UTF-8 byte order
and so the contract's order; PostgreSQL TEXT cannot hold NUL; MySQL's default
collations are case- and accent-insensitive and would merge distinct ids.
Prefix scans are ranges on those bytes (``prefix <= key < bound``, the bound
from :func:`checkpoint_stores.keys.prefix_upper_bound`), so ``%``, ``_`` and
``\\`` are ordinary bytes. Values are binary too: JSONB rejects ``\\u0000``.

``commit`` is one statement on PostgreSQL: a data-modifying CTE upserts the
head only where its stored seq is NULL or lower, and inserts the records only
if that upsert returned a row; the head's row lock serializes racing writers
and a stale commit changes nothing. SQLite and MySQL run one transaction:
lock the head (SQLite ``BEGIN IMMEDIATE``, MySQL ``SELECT ... FOR UPDATE``),
compare, write the head and the records, commit (MySQL retries deadlocks and
lost insert races from the start).

Execution: with asyncpg the backend keeps a few connections checked out of the
engine's pool and runs each statement -- compiled once by the engine's own
dialect -- on the driver connection, skipping SQLAlchemy's per-call machinery
(several hundred microseconds on a busy host, more than a local round trip).
Every other driver, and PgBouncer mode, goes through ``AsyncConnection.execute``.

``setup()`` applies versioned migrations recorded in ``<table>_migrations``
under a lock, so several processes may start at once: PostgreSQL
``pg_advisory_xact_lock`` (transaction-scoped, so PgBouncer transaction
pooling is fine), MySQL ``GET_LOCK``, SQLite ``BEGIN IMMEDIATE``. It always
runs on a connection and transaction of its own. To create the schema inside
a transaction of yours instead, call :meth:`SQLBackend.migrate` with your
connection (PostgreSQL, whose DDL is transactional; not MySQL).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import importlib
import os
import random
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple, cast

from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    any_,
    bindparam,
    column,
    delete,
    event,
    exists,
    func,
    literal_column,
    null,
    or_,
    select,
    table,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql as mysql_types
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.schema import CreateSchema

from checkpoint_stores.errors import (
    InvalidIdentifierError,
    StoreUnavailableError,
    ValueTooLargeError,
)
from checkpoint_stores.keys import prefix_upper_bound
from checkpoint_stores.options import option_bool, option_int, option_seconds
from checkpoint_stores.spi import Capabilities
from checkpoint_stores.urls import redact_url

if TYPE_CHECKING:
    from sqlalchemy.sql.expression import ClauseElement, Executable

__all__ = ["SCHEMA_VERSION", "SQLBackend"]

# Plain schemes get the async driver this project tests and ships an extra for.
_DEFAULT_DRIVERS: Final = {
    "postgresql": "postgresql+asyncpg",
    "sqlite": "sqlite+aiosqlite",
    "mysql": "mysql+aiomysql",
    "mariadb": "mariadb+aiomysql",
}
_FAMILIES: Final = {
    "postgresql": "postgresql",
    "sqlite": "sqlite",
    "mysql": "mysql",
    "mariadb": "mysql",
}
_ASYNC_DRIVERS: Final = {"asyncpg", "psycopg", "aiosqlite", "aiomysql", "asyncmy"}

_NAME: Final = re.compile(r"^[a-z_][a-z0-9_]*$")
_MAX_IDENTIFIER: Final = 63  # PostgreSQL truncates longer names (MySQL allows 64)
_MIGRATIONS_SUFFIX: Final = "_migrations"
_INT64: Final = (-(1 << 63), (1 << 63) - 1)
_LIST_BATCH: Final = 128  # rows per list() round trip: bounds memory when values are large
_THREAD_BATCH: Final = 1000
_MYSQL_RETRIES: Final = 20
_SNAPSHOT_RETRIES: Final = 20
_MYSQL_RETRY_CODES: Final = frozenset({1213, 1062, 1020})  # deadlock, lost insert race, changed
_MYSQL_DEFAULT_PACKET: Final = 16 * 1024 * 1024  # MariaDB's default max_allowed_packet

# Id columns: 1024 bytes each keeps (thread_id, state_key) inside PostgreSQL's
# btree row limit (~2.7 KB) and InnoDB's 3072-byte index key limit.
_ID_BYTES: Final = {"postgresql": 1024, "mysql": 1024, "sqlite": 64 * 1024}
# PostgreSQL bytea and SQLite blobs hold ~1 GB; the commit statement carries a
# value twice (record and head), so stay well below.
_VALUE_BYTES: Final = 256 * 1024 * 1024

# Schema versions this library knows: (version, description). Append, never edit.
_MIGRATIONS: Final = ((1, "create the state table (thread_id, state_key, seq, value)"),)
SCHEMA_VERSION: Final = _MIGRATIONS[-1][0]

_OPTIONS: Final = frozenset(
    {
        "table",
        "schema",
        "pool_size",
        "max_overflow",
        "pool_recycle",
        "pool_pre_ping",
        "timeout",
        "pgbouncer",
        "sqlite_synchronous",
        "sqlite_busy_timeout",
        "connect_args",
        "engine",
    }
)
# Execution option that makes the SQLite "begin" hook take the write lock at once.
_IMMEDIATE: Final = "checkpoint_stores_immediate"
_ROWCOUNT: Final = {"preserve_rowcount": True}
# Failures below the DBAPI: refused or reset sockets, driver timeouts (asyncio's
# TimeoutError is a distinct class before Python 3.11), pool checkout timeouts.
_OUTAGES: Final = (OSError, TimeoutError, asyncio.TimeoutError, sa_exc.TimeoutError)


def _identifier(value: Any, what: str, reserve: int = 0) -> str:
    text = str(value)
    if not _NAME.match(text) or len(text) + reserve > _MAX_IDENTIFIER:
        raise ValueError(
            f"{what} {text!r} is not accepted: use lower-case letters, digits and '_' "
            f"(starting with a letter or '_'), at most {_MAX_IDENTIFIER - reserve} characters"
        )
    return text


def _encode_id(text: str, what: str, limit: int) -> bytes:
    """UTF-8 bytes of a thread id or key, refusing what the columns cannot hold."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidIdentifierError(
            f"{what} {text!r} is not valid Unicode (it contains a lone surrogate); "
            "pass a string that encodes to UTF-8"
        ) from None
    if not raw:
        raise InvalidIdentifierError(f"{what} must not be empty")
    if len(raw) > limit:
        raise InvalidIdentifierError(
            f"{what} is {len(raw)} bytes in UTF-8; this SQL store accepts at most {limit}. "
            "Use a shorter id (hash long natural keys before using them as ids)"
        )
    return raw


def _prefix_range(prefix: str) -> tuple[bytes, bytes | None]:
    """``[low, high)`` on encoded keys holding exactly the keys that start with ``prefix``."""
    bound = prefix_upper_bound(prefix)
    return prefix.encode("utf-8"), None if bound is None else bound.encode("utf-8")


def _advisory_key(text: str) -> int:
    """A stable signed 64-bit lock id for ``pg_advisory_xact_lock``."""
    return int.from_bytes(
        hashlib.blake2b(text.encode(), digest_size=8).digest(), "big", signed=True
    )


def _mysql_code(exc: BaseException) -> int | None:
    orig = getattr(exc, "orig", None)
    args = getattr(orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


class _NeverRaised(Exception):
    """Placeholder for a driver exception class when that driver is not in use."""


class _Compiled(NamedTuple):
    """A statement compiled once by the engine's dialect, for the asyncpg fast path."""

    sql: str
    order: tuple[str, ...]  # parameter names in $1, $2, ... order
    defaults: dict[str, Any]  # values SQLAlchemy bound itself (LIMIT)


class _Lease(NamedTuple):
    """A connection kept checked out of the engine's pool between statements."""

    conn: AsyncConnection
    driver: Any  # the asyncpg connection
    born: float  # when it left the pool (time.monotonic), for pool_recycle


class SQLBackend:
    """Checkpoint storage in one SQL table, through SQLAlchemy 2 async Core.

    Atomic and fenced commits, shared safely by processes and hosts (SQLite:
    processes on one host, on a local filesystem), durable.

    Options (keyword arguments, or the URL's query string; other query
    parameters go to the driver):

    * ``table`` (``"checkpoint_stores"``): table name, ``^[a-z_][a-z0-9_]*$``;
      the migrations table is ``<table>_migrations``.
    * ``schema`` (PostgreSQL): schema for both tables, created if missing.
    * ``pool_size`` (5), ``max_overflow`` (10), ``pool_recycle`` (seconds,
      1800), ``pool_pre_ping`` (false; always on with asyncpg): the connection pool.
    * ``timeout`` (seconds, 30): connect timeout, and per-statement timeout with asyncpg.
    * ``pgbouncer`` (false): PgBouncer in transaction-pooling mode: every
      statement runs in an explicit transaction, asyncpg's and SQLAlchemy's
      statement caches are off and prepared statements get unique names
      (psycopg: ``prepare_threshold=None``).
    * ``sqlite_synchronous`` (``"full"``): ``"full"`` survives power loss;
      ``"normal"`` (with WAL) may lose the last commits on power loss, never
      on a process crash.
    * ``sqlite_busy_timeout`` (seconds, 30): how long a writer waits for another's lock.
    * ``connect_args``: extra driver ``connect()`` arguments (a dict).
    * ``engine``: an :class:`~sqlalchemy.ext.asyncio.AsyncEngine` you own, to
      share its pool (PostgreSQL and MySQL); ``close()`` leaves it open.
    """

    def __init__(self, url: str, **options: Any) -> None:
        self.url = url
        try:
            sa_url = make_url(url)
        except (ValueError, sa_exc.ArgumentError) as exc:
            raise ValueError(
                f"cannot parse the SQL URL {redact_url(url)!r} ({exc}); write it like "
                "postgresql://user:password@host:5432/database or sqlite:///path/to/file.db"
            ) from None
        merged: dict[str, Any] = {k: v for k, v in sa_url.query.items() if k in _OPTIONS}
        unknown = set(options) - _OPTIONS
        if unknown:
            raise TypeError(
                f"the SQL backend does not take options {sorted(unknown)}; it takes: "
                f"{', '.join(sorted(_OPTIONS))}"
            )
        merged.update(options)
        sa_url = sa_url.difference_update_query(list(_OPTIONS))
        backend_name, _, driver = sa_url.drivername.partition("+")
        if backend_name not in _FAMILIES:
            raise ValueError(
                f"{redact_url(url)!r} is not a SQL URL this backend serves; use postgresql://, "
                "postgresql+psycopg://, sqlite:///file.db or mysql:// (mariadb://)"
            )
        if not driver:
            sa_url = sa_url.set(drivername=_DEFAULT_DRIVERS[backend_name])
            driver = sa_url.drivername.partition("+")[2]
        if driver not in _ASYNC_DRIVERS:
            raise ValueError(
                f"driver {driver!r} in {redact_url(url)!r} is not an asyncio driver; use "
                "postgresql+asyncpg, postgresql+psycopg, sqlite+aiosqlite, mysql+aiomysql "
                "or mysql+asyncmy"
            )
        self.family: str = _FAMILIES[backend_name]
        self.driver: str = driver
        self._sa_url: URL = sa_url
        self._secret = sa_url.password if isinstance(sa_url.password, str) else None

        self.table_name = _identifier(
            merged.get("table", "checkpoint_stores"), "table name", len(_MIGRATIONS_SUFFIX)
        )
        schema = merged.get("schema")
        if schema is not None and self.family != "postgresql":
            raise ValueError(
                "option schema is for PostgreSQL; on MySQL name the database in the URL"
            )
        self.schema: str | None = None if schema is None else _identifier(schema, "schema name")
        self._pool_size = option_int(merged.get("pool_size", 5), "pool_size", scheme="sql")
        self._max_overflow = option_int(
            merged.get("max_overflow", 10), "max_overflow", scheme="sql"
        )
        self._pool_recycle = option_seconds(
            merged.get("pool_recycle", 1800), "pool_recycle", scheme="sql"
        )
        self._pre_ping = option_bool(
            merged.get("pool_pre_ping", False), "pool_pre_ping", scheme="sql"
        )
        self._timeout = option_seconds(merged.get("timeout", 30), "timeout", scheme="sql")
        self._pgbouncer = option_bool(merged.get("pgbouncer", False), "pgbouncer", scheme="sql")
        synchronous = str(merged.get("sqlite_synchronous", "full")).strip().upper()
        if synchronous not in {"FULL", "NORMAL", "EXTRA"}:
            raise ValueError("option sqlite_synchronous must be 'full', 'normal' or 'extra'")
        self._synchronous = synchronous
        self._busy_timeout = option_seconds(
            merged.get("sqlite_busy_timeout", 30), "sqlite_busy_timeout", scheme="sql"
        )
        extra_args = merged.get("connect_args") or {}
        if not isinstance(extra_args, Mapping):
            raise TypeError("option connect_args must be a dict of driver connect() arguments")
        self._extra_connect_args = dict(extra_args)
        engine = merged.get("engine")
        if engine is not None and not isinstance(engine, AsyncEngine):
            raise TypeError("option engine must be a sqlalchemy.ext.asyncio.AsyncEngine")
        if engine is not None and self.family == "sqlite":
            raise ValueError(
                "option engine is not accepted for SQLite: the backend configures SQLite's "
                "transactions (BEGIN IMMEDIATE, WAL) on engines it creates; pass the URL instead"
            )
        if self.family == "sqlite":
            database = sa_url.database or ""
            if database in {"", ":memory:"} or database.startswith("file::memory:"):
                raise ValueError(
                    "an in-memory SQLite database is private to one connection; use memory:// "
                    "for an in-process store or sqlite:///path/to/file.db for a file"
                )
        self._own_engine = engine is None
        self._engine: AsyncEngine | None = engine
        self._writer: AsyncEngine | None = None
        self._setup_lock = asyncio.Lock()
        self._ready = False
        self._max_value = _VALUE_BYTES
        if self.family == "mysql":
            # Until setup() reads max_allowed_packet: MariaDB's default packet, halved
            # because the driver escapes bytes (a value can double on the wire).
            self._max_value = (_MYSQL_DEFAULT_PACKET - 64 * 1024) // 2
        self._max_id = _ID_BYTES[self.family]
        # asyncpg fast path (see _on_driver); PgBouncer mode keeps SQLAlchemy's explicit
        # transactions, which keep a statement's prepare and execute on one server connection.
        self._fast = self.driver == "asyncpg" and not self._pgbouncer
        self._idle: builtins.list[_Lease] = []
        self._slots: asyncio.Semaphore | None = None
        self._compiled: dict[int, _Compiled] = {}
        self._driver_interface_error: type[Exception] = _NeverRaised
        self._driver_postgres_error: type[Exception] = _NeverRaised
        if self._fast:
            asyncpg = importlib.import_module("asyncpg")
            self._driver_interface_error = asyncpg.InterfaceError
            self._driver_postgres_error = asyncpg.PostgresError
        self._build_tables()
        self._build_statements()

    def __repr__(self) -> str:
        return f"SQLBackend({redact_url(self.url)!r}, table={self.table_name!r})"

    @property
    def capabilities(self) -> Capabilities:
        """Atomic, fenced, cross-process and durable on every dialect; limits per dialect."""
        notes = {
            "postgresql": "commit is one statement (data-modifying CTE)",
            "mysql": (
                "commit is one transaction (SELECT ... FOR UPDATE); max_value_bytes follows the "
                "server's max_allowed_packet (read at setup)"
            ),
            "sqlite": (
                "commit is one BEGIN IMMEDIATE transaction; WAL, synchronous="
                f"{self._synchronous.lower()}; processes must share one host and a local "
                "filesystem (WAL needs shared memory)"
            ),
        }[self.family]
        return Capabilities(
            atomic_commit=True,
            fenced_commit=True,
            cross_process=True,
            durable=True,
            ttl=False,
            max_value_bytes=self._max_value,
            max_key_bytes=self._max_id,
            notes=notes,
        )

    # -- schema and statements ---------------------------------------------------------

    def _build_tables(self) -> None:
        metadata = MetaData(schema=self.schema)
        id_type = LargeBinary().with_variant(
            mysql_types.VARBINARY(self._max_id), "mysql", "mariadb"
        )
        value_type = LargeBinary().with_variant(mysql_types.LONGBLOB(), "mysql", "mariadb")
        self.table = Table(
            self.table_name,
            metadata,
            Column("thread_id", id_type, primary_key=True),
            Column("state_key", id_type, primary_key=True),
            Column("seq", BigInteger, nullable=True),
            Column("value", value_type, nullable=False),
            mysql_engine="InnoDB",
            mysql_row_format="DYNAMIC",
        )
        self.migrations_table = Table(
            self.table_name + _MIGRATIONS_SUFFIX,
            metadata,
            Column("version", Integer, primary_key=True, autoincrement=False),
            Column("description", String(200), nullable=False),
            Column("applied_at_ms", BigInteger, nullable=False),
            mysql_engine="InnoDB",
        )

    def _build_statements(self) -> None:
        t = self.table
        tid, key = bindparam("p_tid", type_=LargeBinary), bindparam("p_key", type_=LargeBinary)
        value, seq = bindparam("p_value", type_=LargeBinary), bindparam("p_seq", type_=BigInteger)
        pk = (t.c.thread_id == tid, t.c.state_key == key)
        row = {"thread_id": tid, "state_key": key, "value": value}
        self._s_get = select(t.c.value).where(*pk)
        if self.family == "postgresql":
            # One fixed statement for any number of keys (a prepared statement).
            in_keys = t.c.state_key == any_(bindparam("p_keys", type_=ARRAY(LargeBinary)))
        else:
            in_keys = t.c.state_key.in_(bindparam("p_keys", type_=LargeBinary, expanding=True))
        self._s_get_many = select(t.c.state_key, t.c.value).where(t.c.thread_id == tid, in_keys)
        self._s_delete = delete(t).where(*pk)
        self._s_delete_thread = delete(t).where(t.c.thread_id == tid)
        # Prefix ranges: [p_low, p_high) on the id bytes; p_high is absent for an
        # empty prefix. Listing pages by keyset: the next page starts after p_low.
        low, high = bindparam("p_low", type_=LargeBinary), bindparam("p_high", type_=LargeBinary)
        self._s_delete_prefix = {
            bounded: delete(t).where(
                t.c.thread_id == tid,
                t.c.state_key >= low,
                *([t.c.state_key < high] if bounded else []),
            )
            for bounded in (False, True)
        }
        self._s_list = {
            (after, bounded): select(t.c.state_key, t.c.value)
            .where(
                t.c.thread_id == tid,
                t.c.state_key > low if after else t.c.state_key >= low,
                *([t.c.state_key < high] if bounded else []),
            )
            .order_by(t.c.state_key)
            .limit(_LIST_BATCH)
            for after in (False, True)
            for bounded in (False, True)
        }
        self._s_list_threads = {
            (after, bounded): select(t.c.thread_id)
            .distinct()
            .where(
                t.c.thread_id > low if after else t.c.thread_id >= low,
                *([t.c.thread_id < high] if bounded else []),
            )
            .order_by(t.c.thread_id)
            .limit(_THREAD_BATCH)
            for after in (False, True)
            for bounded in (False, True)
        }
        self._s_head_seq = select(t.c.seq).where(*pk)
        self._s_head_lock = self._s_head_seq.with_for_update()
        self._s_head_insert = t.insert().values(seq=seq, **row)
        self._s_head_update = t.update().where(*pk).values(value=value, seq=seq)
        self._s_put: Executable
        self._s_create: Executable
        if self.family == "mysql":
            my_upsert = mysql_insert(t).values(**row)
            self._s_put = my_upsert.on_duplicate_key_update(
                value=my_upsert.inserted.value, seq=null()
            )
            # IGNORE also downgrades other errors to warnings; none can occur here:
            # ids and values are checked against the column sizes before the insert.
            self._s_create = mysql_insert(t).values(**row).prefix_with("IGNORE")
        elif self.family == "postgresql":
            pg_upsert = pg_insert(t).values(**row)
            self._s_put = pg_upsert.on_conflict_do_update(
                index_elements=[t.c.thread_id, t.c.state_key],
                set_={"value": pg_upsert.excluded.value, "seq": null()},
            )
            self._s_create = pg_insert(t).values(**row).on_conflict_do_nothing()
        else:
            lite_upsert = sqlite_insert(t).values(**row)
            self._s_put = lite_upsert.on_conflict_do_update(
                index_elements=[t.c.thread_id, t.c.state_key],
                set_={"value": lite_upsert.excluded.value, "seq": null()},
            )
            self._s_create = sqlite_insert(t).values(**row).on_conflict_do_nothing()
        if self.family == "postgresql":
            self._s_commit = self._pg_commit_statement()

    def _pg_commit_statement(self) -> Executable:
        """One statement: move the head if its seq is NULL or lower; if it moved, upsert records.

        Data-modifying CTEs run exactly once; ``recs`` reads ``head``'s RETURNING
        rows, so it inserts nothing when the head's WHERE refused the update (a
        stale commit writes nothing). The head's row lock, taken first, orders
        racing committers; READ COMMITTED re-checks the WHERE on the newest row.
        """
        t = self.table
        tid = bindparam("p_tid", type_=LargeBinary)
        head_insert = pg_insert(t).values(
            thread_id=tid,
            state_key=bindparam("p_key", type_=LargeBinary),
            value=bindparam("p_value", type_=LargeBinary),
            seq=bindparam("p_seq", type_=BigInteger),
        )
        head = (
            head_insert.on_conflict_do_update(
                index_elements=[t.c.thread_id, t.c.state_key],
                set_={"value": head_insert.excluded.value, "seq": head_insert.excluded.seq},
                where=or_(t.c.seq.is_(None), t.c.seq < head_insert.excluded.seq),
            )
            .returning(t.c.seq)
            .cte("head")
        )
        writes = (
            func.unnest(
                bindparam("p_keys", type_=ARRAY(LargeBinary)),
                bindparam("p_values", type_=ARRAY(LargeBinary)),
            )
            .table_valued("k", "v")
            .render_derived()
            .alias("w")
        )
        records_insert = pg_insert(t).from_select(
            ["thread_id", "state_key", "value"],
            select(tid, writes.c.k, writes.c.v).where(
                exists(select(literal_column("1")).select_from(head))
            ),
        )
        records = (
            records_insert.on_conflict_do_update(
                index_elements=[t.c.thread_id, t.c.state_key],
                set_={"value": records_insert.excluded.value, "seq": null()},
            )
            .returning(literal_column("1"))
            .cte("recs")
        )
        return select(func.count()).select_from(head).add_cte(records)

    # -- lifecycle ---------------------------------------------------------------------

    def _connect_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {}
        if self.driver == "asyncpg":
            args = {
                "timeout": self._timeout,
                "command_timeout": self._timeout or None,
                "server_settings": {"application_name": "checkpoint-stores"},
            }
            if self._pgbouncer:
                args.update(
                    statement_cache_size=0,
                    prepared_statement_cache_size=0,
                    # Unique names: a pooler hands one server connection to many clients.
                    prepared_statement_name_func=lambda: f"__cs_{uuid.uuid4().hex}__",
                )
        elif self.driver == "psycopg":
            args = {"connect_timeout": max(1, int(self._timeout))}
            if self._pgbouncer:
                args["prepare_threshold"] = None
        elif self.driver in {"aiomysql", "asyncmy"}:
            args = {"connect_timeout": max(1, int(self._timeout))}
        elif self.driver == "aiosqlite":
            args = {"timeout": self._busy_timeout}
        args.update(self._extra_connect_args)
        return args

    def _create_engine(self) -> AsyncEngine:
        kwargs: dict[str, Any] = {
            "pool_size": self._pool_size,
            "max_overflow": self._max_overflow,
            "pool_recycle": self._pool_recycle,
            # The asyncpg fast path takes a connection from the pool only when its own
            # idle ones are used up or flushed after a disconnect: ping it then.
            "pool_pre_ping": self._pre_ping or self._fast,
            "pool_timeout": self._timeout or 30,
            # Values never appear in SQLAlchemy's error messages or logs.
            "hide_parameters": True,
            "connect_args": self._connect_args(),
        }
        if self.family == "postgresql" and not self._pgbouncer:
            # Every PostgreSQL operation is one statement, atomic by itself: no
            # BEGIN/COMMIT round trips. (PgBouncer needs explicit transactions so a
            # statement's prepare and execute reach the same server connection.)
            kwargs["isolation_level"] = "AUTOCOMMIT"
        engine = create_async_engine(self._sa_url, **kwargs)
        if self.family == "sqlite":
            self._configure_sqlite(engine)
        return engine

    def _configure_sqlite(self, engine: AsyncEngine) -> None:
        busy_ms = int(self._busy_timeout * 1000)
        synchronous = self._synchronous

        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            # SQLAlchemy emits BEGIN itself (below), so DDL is transactional and
            # writers can take the write lock up front.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
                cursor.execute("PRAGMA journal_mode = WAL")
                cursor.execute(f"PRAGMA synchronous = {synchronous}")
            finally:
                cursor.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(connection: Any) -> None:
            # Writers take the lock before reading the head: a deferred transaction
            # that reads then writes can fail at once instead of waiting.
            immediate = connection.get_execution_options().get(_IMMEDIATE, False)
            connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    async def setup(self) -> None:
        """Connect and apply migrations under a cross-process lock (idempotent).

        Runs on a connection and transaction of its own: it neither joins nor
        commits a transaction the application has open elsewhere.
        """
        if self._ready:
            return
        async with self._setup_lock:
            if not self._ready:
                await self._setup_locked()

    async def _setup_locked(self) -> None:
        if self.family == "sqlite":
            self._check_sqlite_directory()
        if self._engine is None:
            self._engine = self._create_engine()
        engine = self._engine
        if self.family == "mysql" and not self._own_engine:
            # A caller's engine may autocommit; commit() needs a real transaction.
            self._writer = engine.execution_options(isolation_level="REPEATABLE READ")
        else:
            self._writer = engine.execution_options(**{_IMMEDIATE: True})
        try:
            if self.family == "mysql":
                await self._setup_mysql(engine)
            else:
                async with engine.connect() as conn:
                    if self.family == "postgresql":
                        # Our engine autocommits (a caller's may too); migrations need one
                        # transaction, which also scopes the advisory lock.
                        conn = await conn.execution_options(isolation_level="READ COMMITTED")
                    elif self.family == "sqlite":
                        conn = await conn.execution_options(**{_IMMEDIATE: True})
                    async with conn.begin():
                        await self._migrate(conn)
        except (StoreUnavailableError, ValueError):
            raise
        except Exception as exc:
            raise self._unavailable("setup", exc) from exc
        self._ready = True

    def _check_sqlite_directory(self) -> None:
        # Said plainly here: sqlite3 only says "unable to open database file" (and
        # aiosqlite leaves the failed connection's thread behind).
        parent = os.path.dirname(os.path.abspath(self._sa_url.database or ""))
        if not os.path.isdir(parent):
            raise StoreUnavailableError(
                f"SQL store {redact_url(self.url)}: setup failed: the directory {parent} "
                "does not exist; create it (the store creates the database file, not its "
                "directory)"
            )

    async def _setup_mysql(self, engine: AsyncEngine) -> None:
        name = f"checkpoint_stores:{_advisory_key(f'{self._sa_url.database}.{self.table_name}'):x}"
        async with engine.connect() as conn:
            got = (
                await conn.execute(select(func.get_lock(name, int(self._timeout) or 30)))
            ).scalar()
            await conn.commit()
            if got != 1:
                raise StoreUnavailableError(
                    f"SQL store {redact_url(self.url)}: setup waited {self._timeout:g}s for the "
                    "migration lock another process holds; retry, or raise the timeout option"
                )
            try:
                async with conn.begin():
                    await self._migrate(conn)
                limits: Any = (
                    await conn.execute(
                        select(
                            literal_column("@@max_allowed_packet"),
                            literal_column("@@innodb_log_file_size"),
                        )
                    )
                ).one()
                packet, log_size = int(limits[0]), int(limits[1] or 0)
                await conn.commit()
            finally:
                # The lock also ends with the connection; never hide the real error.
                with contextlib.suppress(Exception):
                    await conn.execute(select(func.release_lock(name)))
                    await conn.commit()
        # The driver may double a value while escaping it; InnoDB refuses a row whose
        # blobs exceed 10% of the redo log.
        limit = (packet - 64 * 1024) // 2
        if log_size:
            limit = min(limit, log_size // 10 - 64 * 1024)
        self._max_value = max(limit, 0)

    async def migrate(self, connection: AsyncConnection) -> None:
        """Apply migrations on ``connection``, inside its current transaction; never commit.

        For applications that create their schema in a transaction of their own
        (PostgreSQL, whose DDL is transactional; SQLite only if your engine emits
        BEGIN itself): the tables appear when *you* commit, and vanish if you
        roll back. On PostgreSQL it takes
        the same transaction-scoped advisory lock as :meth:`setup`, so it is
        safe against processes starting at once. Not offered on MySQL, where
        DDL commits the open transaction implicitly; call :meth:`setup` there.
        """
        if self.family == "mysql":
            raise NotImplementedError(
                "MySQL/MariaDB commit DDL implicitly, which would commit your transaction; "
                "call setup() instead (it uses its own connection)"
            )
        if not connection.in_transaction():
            await connection.begin()
        await self._migrate(connection)

    async def _migrate(self, conn: AsyncConnection) -> None:
        if self.family == "postgresql":
            lock = _advisory_key(f"checkpoint_stores:{self.schema or ''}")
            await conn.execute(select(func.pg_advisory_xact_lock(lock)))
            if self.schema is not None:
                # Checked first: CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege on
                # the database even when the schema exists, and an application role that
                # only uses tables an administrator migrated should not need it.
                nspname = column("nspname", String)
                query = select(nspname).select_from(table("pg_namespace", nspname))
                found = await conn.execute(query.where(nspname == self.schema))
                if found.first() is None:
                    await conn.execute(CreateSchema(self.schema, if_not_exists=True))
        migrations = self.migrations_table
        await conn.run_sync(lambda sync: migrations.create(sync, checkfirst=True))
        applied = set((await conn.execute(select(migrations.c.version))).scalars())
        newest = max(applied, default=0)
        if newest > SCHEMA_VERSION:
            raise StoreUnavailableError(
                f"SQL store {redact_url(self.url)}: table {self.table_name!r} is at schema version "
                f"{newest}, this checkpoint-stores knows up to {SCHEMA_VERSION}; upgrade "
                "checkpoint-stores (pip install -U checkpoint-stores)"
            )
        for version, description in _MIGRATIONS:
            if version in applied:
                continue
            if version == 1:
                await conn.run_sync(self._create_state_table)
            await conn.execute(
                migrations.insert().values(
                    version=version,
                    description=description,
                    applied_at_ms=int(time.time() * 1000),
                )
            )

    def _create_state_table(self, sync_connection: Any) -> None:
        self.table.create(sync_connection, checkfirst=True)

    async def close(self) -> None:
        """Dispose of the pool (an engine passed in as an option stays open)."""
        self._ready = False
        idle, self._idle, self._slots = self._idle, [], None
        for lease in idle:
            await self._discard(lease, broken=False, slot=False)
        self._compiled.clear()
        if self._own_engine and self._engine is not None:
            engine, self._engine = self._engine, None
            await engine.dispose()

    # -- plumbing ----------------------------------------------------------------------

    def _unavailable(self, what: str, exc: BaseException) -> StoreUnavailableError:
        """A StoreUnavailableError naming the redacted URL and the driver's complaint."""
        orig = getattr(exc, "orig", None) or exc
        detail = str(orig).strip().splitlines()[0] if str(orig).strip() else ""
        if isinstance(orig, _OUTAGES[1:3]) and not detail:
            detail = f"no answer within {self._timeout:g}s (the timeout option)"
        if self._secret:
            detail = detail.replace(self._secret, "***")
        detail = detail[:300]
        return StoreUnavailableError(
            f"SQL store {redact_url(self.url)}: {what} failed: {type(orig).__name__}"
            f"{': ' + detail if detail else ''}. Check that the server is running and "
            "reachable and the credentials are right; retrying is safe (a commit happens "
            "whole or not at all)"
        )

    async def _engines(self) -> tuple[AsyncEngine, AsyncEngine]:
        if not self._ready:
            await self.setup()
        assert self._engine is not None
        assert self._writer is not None
        return self._engine, self._writer

    async def _rows(
        self, what: str, stmt: Executable, params: dict[str, Any]
    ) -> builtins.list[Any]:
        """Rows of one read; retried once when a pooled connection turned out to be dead."""
        if self._fast:
            return await self._on_driver(what, stmt, params, "rows", retry=True)  # type: ignore[no-any-return]
        engine, _ = await self._engines()
        for attempt in range(2):
            try:
                async with engine.connect() as conn:
                    return list((await conn.execute(stmt, params)).all())
            except sa_exc.DBAPIError as exc:
                if attempt == 0 and exc.connection_invalidated:
                    continue  # the pool was invalidated; the next checkout reconnects
                raise self._unavailable(what, exc) from exc
            except _OUTAGES as exc:
                raise self._unavailable(what, exc) from exc
        raise AssertionError("unreachable")

    async def _count(
        self, what: str, stmt: Executable, params: dict[str, Any], *, snapshot: bool = False
    ) -> int:
        """Run one writing statement (atomic by itself); return how many rows it changed.

        ``snapshot`` (PostgreSQL range deletes): run at REPEATABLE READ and retry on
        a serialization failure. At READ COMMITTED a DELETE that waited for a
        racing commit's lock on the head deletes the head but not the records
        that commit inserted (they were not in its snapshot), leaving records of
        a deleted run behind; the retry's fresh snapshot sees them.
        """
        snapshot = snapshot and self.family == "postgresql"
        mode = "count_snapshot" if snapshot else "count"
        for attempt in range(_SNAPSHOT_RETRIES):
            try:
                if self._fast:
                    return await self._on_driver(what, stmt, params, mode, retry=False)  # type: ignore[no-any-return]
                return await self._count_generic(stmt, params, snapshot)
            except (sa_exc.DBAPIError, self._driver_postgres_error) as exc:
                orig = getattr(exc, "orig", exc)
                serialization = getattr(orig, "sqlstate", None) == "40001"
                if snapshot and serialization and attempt + 1 < _SNAPSHOT_RETRIES:
                    await asyncio.sleep(random.uniform(0.001, 0.01))
                    continue
                raise self._unavailable(what, exc) from exc
            except _OUTAGES as exc:
                raise self._unavailable(what, exc) from exc
        raise AssertionError("unreachable")

    async def _count_generic(self, stmt: Executable, params: dict[str, Any], snapshot: bool) -> int:
        _, writer = await self._engines()
        if snapshot:
            writer = writer.execution_options(isolation_level="REPEATABLE READ")
        async with writer.begin() as conn:
            # preserve_rowcount: psycopg loses an INSERT's rowcount once the
            # statement's (empty) result is closed.
            result = await conn.execute(stmt, params, execution_options=_ROWCOUNT)
            return int(result.rowcount)

    async def _value(self, what: str, stmt: Executable, params: dict[str, Any]) -> Any:
        """The single value one statement returns (the PostgreSQL commit)."""
        if self._fast:
            return await self._on_driver(what, stmt, params, "value", retry=False)
        _, writer = await self._engines()
        try:
            async with writer.begin() as conn:
                return (await conn.execute(stmt, params)).scalar_one()
        except sa_exc.DBAPIError as exc:
            raise self._unavailable(what, exc) from exc
        except _OUTAGES as exc:
            raise self._unavailable(what, exc) from exc

    # -- asyncpg fast path ---------------------------------------------------------------
    #
    # SQLAlchemy's per-statement machinery (pool checkout and reset, execution
    # context, result objects) costs several hundred microseconds per call on a
    # busy host, more than the round trip itself. With asyncpg the backend keeps
    # a few connections checked out of the engine's pool and runs each statement
    # -- compiled once by the engine's own dialect, so the SQL text is exactly
    # what SQLAlchemy would send -- on the driver connection. Every statement is
    # atomic by itself (autocommit), as on the generic path.

    def _compiled_for(self, stmt: Executable) -> _Compiled:
        found = self._compiled.get(id(stmt))
        if found is None:
            assert self._engine is not None
            compiled = cast("ClauseElement", stmt).compile(dialect=self._engine.dialect)
            positions = getattr(compiled, "positiontup", None)
            assert positions is not None, "the asyncpg dialect compiles positional SQL"
            found = _Compiled(str(compiled), tuple(positions), dict(compiled.params))
            self._compiled[id(stmt)] = found
        return found

    async def _lease(self) -> tuple[_Lease, bool]:
        """A connection for one statement, and whether it was reused (it may have died).

        At most ``pool_size + max_overflow`` are in use at once; waiters get the
        next one released (idle connections stay checked out of the engine's
        pool, so waiting on the pool itself could starve).
        """
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._pool_size + self._max_overflow)
        if self._slots.locked():
            try:
                await asyncio.wait_for(self._slots.acquire(), self._timeout or None)
            except asyncio.TimeoutError:
                raise TimeoutError(
                    f"all {self._pool_size + self._max_overflow} connections stayed busy for "
                    f"{self._timeout:g}s (raise pool_size/max_overflow or the timeout option)"
                ) from None
        else:
            await self._slots.acquire()
        try:
            now = time.monotonic()
            while self._idle:
                lease = self._idle.pop()
                if now - lease.born < self._pool_recycle and not lease.driver.is_closed():
                    return lease, True
                await self._discard(lease, broken=lease.driver.is_closed(), slot=False)
            engine, _ = await self._engines()
            conn = await engine.connect()
            try:
                raw = await conn.get_raw_connection()
            except BaseException:
                await conn.close()
                raise
            return _Lease(conn, raw.driver_connection, now), False
        except BaseException:
            self._slots.release()
            raise

    async def _release(self, lease: _Lease) -> None:
        if len(self._idle) < self._pool_size:
            self._idle.append(lease)
            if self._slots is not None:
                self._slots.release()
        else:  # an overflow connection: back to the engine's pool, which closes it
            await self._discard(lease, broken=False)

    async def _discard(self, lease: _Lease, *, broken: bool, slot: bool = True) -> None:
        if slot and self._slots is not None:
            self._slots.release()
        with contextlib.suppress(Exception):
            if broken:
                await lease.conn.invalidate()
            await lease.conn.close()

    async def _on_driver(
        self, what: str, stmt: Executable, params: dict[str, Any], mode: str, *, retry: bool
    ) -> Any:
        if not self._ready:
            await self.setup()
        compiled = self._compiled_for(stmt)
        values = {**compiled.defaults, **params}
        args = [values[name] for name in compiled.order]
        for attempt in range(2):
            try:
                lease, reused = await self._lease()
            except sa_exc.DBAPIError as exc:
                raise self._unavailable(what, exc) from exc
            except _OUTAGES as exc:
                raise self._unavailable(what, exc) from exc
            driver = lease.driver
            try:
                if mode == "rows":
                    result: Any = await driver.fetch(compiled.sql, *args)
                elif mode == "value":
                    result = await driver.fetchval(compiled.sql, *args)
                elif mode == "count_snapshot":
                    async with driver.transaction(isolation="repeatable_read"):
                        status = await driver.execute(compiled.sql, *args)
                    result = int(status.rsplit(" ", 1)[-1])
                else:  # "count": the command tag ends with the row count ("INSERT 0 1")
                    result = int((await driver.execute(compiled.sql, *args)).rsplit(" ", 1)[-1])
            except BaseException as exc:
                dead = driver.is_closed() or isinstance(
                    exc, (OSError, self._driver_interface_error)
                )
                # A timed-out or cancelled statement may still be in flight: never reuse it.
                broken = dead or not isinstance(exc, Exception) or isinstance(exc, _OUTAGES)
                if broken:
                    await self._discard(lease, broken=True)
                else:
                    await self._release(lease)
                if dead:
                    # A server restart or network cut kills the idle ones too (as
                    # SQLAlchemy invalidates its whole pool on a disconnect).
                    idle, self._idle = self._idle, []
                    for stale in idle:
                        await self._discard(stale, broken=True, slot=False)
                if not isinstance(exc, Exception):
                    raise
                if broken and retry and reused and attempt == 0:
                    continue  # a pooled connection had died; the next one is fresh
                if getattr(exc, "sqlstate", None) == "40001":
                    raise  # a serialization failure: the caller retries
                raise self._unavailable(what, exc) from exc
            await self._release(lease)
            return result
        raise AssertionError("unreachable")

    def _tid(self, thread_id: str) -> bytes:
        return _encode_id(thread_id, "thread_id", self._max_id)

    def _key(self, key: str) -> bytes:
        return _encode_id(key, "key", self._max_id)

    def _checked_value(self, value: bytes, what: str) -> bytes:
        if len(value) > self._max_value:
            raise ValueTooLargeError(
                f"{what} is {len(value)} bytes; this SQL store accepts at most {self._max_value} "
                "(MySQL: raise max_allowed_packet). Nothing was written"
            )
        return bytes(value)

    # -- SPI ---------------------------------------------------------------------------

    async def get(self, thread_id: str, key: str) -> bytes | None:
        """The value under ``key``, or ``None``."""
        params = {"p_tid": self._tid(thread_id), "p_key": self._key(key)}
        if self._fast:  # the value column is NOT NULL: None means no row
            found = await self._on_driver("get", self._s_get, params, "value", retry=True)
            return None if found is None else bytes(found)
        rows = await self._rows("get", self._s_get, params)
        return bytes(rows[0][0]) if rows else None

    async def get_many(self, thread_id: str, keys: Sequence[str]) -> builtins.list[bytes | None]:
        """Values of ``keys``, in order, in one query."""
        if not keys:
            return []
        tid = self._tid(thread_id)
        encoded = [self._key(k) for k in keys]
        rows = await self._rows(
            "get_many", self._s_get_many, {"p_tid": tid, "p_keys": sorted(set(encoded))}
        )
        found = {bytes(k): bytes(v) for k, v in rows}
        return [found.get(k) for k in encoded]

    async def put(self, thread_id: str, key: str, value: bytes) -> None:
        """Upsert ``value``; a put clears the seq (a head written by put counts as lowest)."""
        tid, raw_key = self._tid(thread_id), self._key(key)
        data = self._checked_value(value, f"value of {key!r}")
        await self._count("put", self._s_put, {"p_tid": tid, "p_key": raw_key, "p_value": data})

    async def create(self, thread_id: str, key: str, value: bytes) -> bool:
        """Insert-ignore: stored only if absent; the database's unique key decides races."""
        tid, raw_key = self._tid(thread_id), self._key(key)
        data = self._checked_value(value, f"value of {key!r}")
        params = {"p_tid": tid, "p_key": raw_key, "p_value": data}
        return await self._count("create", self._s_create, params) == 1

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        """Store ``writes`` and move the head if its stored seq is absent or lower; atomic."""
        tid, raw_head = self._tid(thread_id), self._key(head_key)
        if not _INT64[0] <= seq <= _INT64[1]:
            raise ValueError(
                f"seq {seq} does not fit the SQL store's BIGINT column (signed 64-bit)"
            )
        head_data = self._checked_value(head_value, f"head {head_key!r}")
        # Later writes of a key win, and the head is written last: drop duplicates
        # (one statement cannot touch a row twice) and records aimed at the head.
        planned: dict[bytes, bytes] = {}
        for key, value in writes:
            raw = self._key(key)
            if raw != raw_head:
                planned[raw] = self._checked_value(value, f"value of {key!r}")
        if self.family == "postgresql":
            return await self._commit_postgresql(tid, raw_head, head_data, seq, planned)
        return await self._commit_transaction(tid, raw_head, head_data, seq, planned)

    async def _commit_postgresql(
        self, tid: bytes, head: bytes, head_value: bytes, seq: int, planned: dict[bytes, bytes]
    ) -> bool:
        params = {
            "p_tid": tid,
            "p_key": head,
            "p_value": head_value,
            "p_seq": seq,
            "p_keys": list(planned),
            "p_values": list(planned.values()),
        }
        return bool(await self._value("commit", self._s_commit, params))

    async def _commit_transaction(
        self, tid: bytes, head: bytes, head_value: bytes, seq: int, planned: dict[bytes, bytes]
    ) -> bool:
        """SQLite and MySQL: lock the head, compare, write; retry lost races (MySQL)."""
        _, writer = await self._engines()
        key_params = {"p_tid": tid, "p_key": head}
        head_params = {**key_params, "p_value": head_value, "p_seq": seq}
        records = [{"p_tid": tid, "p_key": k, "p_value": v} for k, v in planned.items()]
        lock = self._s_head_lock if self.family == "mysql" else self._s_head_seq
        for attempt in range(_MYSQL_RETRIES):
            try:
                async with writer.connect() as conn:
                    current = (await conn.execute(lock, key_params)).first()
                    if current is not None and current[0] is not None and current[0] >= seq:
                        await conn.rollback()
                        return False
                    if current is None:
                        # Absent head: a racing committer may insert it first; the
                        # unique key then fails this insert and the retry compares.
                        await conn.execute(self._s_head_insert, head_params)
                    else:
                        await conn.execute(self._s_head_update, head_params)
                    if records:
                        await conn.execute(self._s_put, records)
                    await conn.commit()
                    return True
            except sa_exc.DBAPIError as exc:
                retry = self.family == "mysql" and _mysql_code(exc) in _MYSQL_RETRY_CODES
                if retry and attempt + 1 < _MYSQL_RETRIES:
                    await asyncio.sleep(random.uniform(0.001, 0.005 * (attempt + 1)))
                    continue
                if isinstance(exc, sa_exc.IntegrityError) and self.family == "sqlite":
                    raise  # cannot happen under BEGIN IMMEDIATE: a bug, not an outage
                raise self._unavailable("commit", exc) from exc
            except _OUTAGES as exc:
                raise self._unavailable("commit", exc) from exc
        raise AssertionError("unreachable")

    async def list(self, thread_id: str, prefix: str = "") -> AsyncIterator[tuple[str, bytes]]:
        """Keys in ``[prefix, prefix_upper_bound(prefix))`` on their bytes, sorted, in batches.

        Each batch is one query (keyset pagination), so no connection is held
        while the caller consumes the iterator.
        """
        tid = self._tid(thread_id)
        low, high = _prefix_range(prefix)
        params: dict[str, Any] = {"p_tid": tid, "p_low": low, "p_high": high}
        after = False
        while True:
            rows = await self._rows("list", self._s_list[after, high is not None], params)
            for raw_key, value in rows:
                yield bytes(raw_key).decode("utf-8"), bytes(value)
            if len(rows) < _LIST_BATCH:
                return
            params["p_low"], after = bytes(rows[-1][0]), True

    async def list_threads(self, prefix: str = "") -> AsyncIterator[str]:
        """Thread ids holding at least one key, sorted (distinct ids, in batches)."""
        low, high = _prefix_range(prefix)
        params: dict[str, Any] = {"p_low": low, "p_high": high}
        after = False
        while True:
            stmt = self._s_list_threads[after, high is not None]
            rows = await self._rows("list_threads", stmt, params)
            for (raw,) in rows:
                yield bytes(raw).decode("utf-8")
            if len(rows) < _THREAD_BATCH:
                return
            params["p_low"], after = bytes(rows[-1][0]), True

    async def delete(self, thread_id: str, key: str) -> bool:
        """Delete one key."""
        tid, raw_key = self._tid(thread_id), self._key(key)
        return await self._count("delete", self._s_delete, {"p_tid": tid, "p_key": raw_key}) > 0

    async def delete_prefix(self, thread_id: str, prefix: str) -> int:
        """Delete the keys in the prefix's byte range."""
        tid = self._tid(thread_id)
        low, high = _prefix_range(prefix)
        params = {"p_tid": tid, "p_low": low, "p_high": high}
        stmt = self._s_delete_prefix[high is not None]
        return await self._count("delete_prefix", stmt, params, snapshot=True)

    async def delete_thread(self, thread_id: str) -> int:
        """Delete every row of the thread."""
        params = {"p_tid": self._tid(thread_id)}
        return await self._count("delete_thread", self._s_delete_thread, params, snapshot=True)
