"""``redis://``, ``rediss://``, ``unix://`` and ``redis+cluster://``: Redis and Redis Cluster.

Built on redis-py's asyncio client (``pip install "checkpoint-stores[redis]"``).

Key layout (``P`` is the ``key_prefix`` option, default ``cs:``; ``T`` is the
thread id as unpadded base64url of its UTF-8, so it never holds ``{`` or ``}``)::

    P{T}:i            sorted set: every key of the thread, score 0, member = key (UTF-8)
    P{T}:s            hash: key -> seq, for heads written by ``commit``
    P{T}:v:<key>      string: the value of one key (key bytes verbatim)
    Pthreads          sorted set: thread ids (UTF-8), for ``list_threads``

Why this layout:

* Every key of a thread shares the hash tag ``{T}``, so each Lua script
  touches one slot and runs unchanged on Redis Cluster. ``T`` is an injective
  encoding without braces, so ids containing ``{``, ``}``, ``*``, ``:`` or NUL
  can neither move a key to another slot nor collide with another thread.
* One string per (thread, key) rather than one hash per thread: Redis 7.0 has
  no per-field expiry (``HEXPIRE`` came in 7.4), and finished runs must expire
  natively (``ttl`` option, :meth:`RedisBackend.expire_prefix`). ``get`` is one
  ``GET``; ``get_many`` one ``MGET`` (one slot, one round trip).
* ``list`` reads the index with ``ZRANGEBYLEX [prefix (bound``: members with
  equal scores sort by ``memcmp``, which is UTF-8 byte order, which is Python
  string order; the range is exact for any characters (no glob).
* A head's seq lives in ``P{T}:s`` beside the value, never parsed from it. It
  counts only while the head's value key exists, so an expired head leaves no
  stale fence behind. The index and the seq hash are kept alive at least as
  long as the longest-living key they describe (``PEXPIRE``/``PERSIST`` in the
  same scripts), so a head's seq cannot expire before the head.

``commit`` is one Lua script (compare seq, then write records, head, seq and
index entries): Redis runs it atomically, and an out-of-memory refusal hits its
first write, so it happens whole or not at all. ``create`` is one script
around ``SET NX``. Seqs are compared as decimal strings in Lua (any Python
int, beyond 2**53 and negative ones included).

The thread registry (``Pthreads``) sits in its own slot on Cluster, so it is
maintained outside the scripts, best effort and ordered: the write that
creates a thread's index registers it right after (a process killed in
between leaves that thread unlisted); ``delete_thread`` and ``list_threads``
remove entries whose index is gone, then re-check, so a racing writer that
recreated the thread is never lost from the registry.

Errors: connection refused, reset, timeouts and cluster failovers are retried
with exponential backoff and jitter (``retries``, ``retry_backoff``), then
raise :class:`~checkpoint_stores.errors.StoreUnavailableError` with the URL
redacted. A reply lost after the server applied a script is resent; a
``commit`` or ``create`` whose resend finds its own first attempt in place (the
head at our seq with our bytes; the key holding our bytes) reports success.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import functools
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final, NamedTuple, TypeVar, cast
from urllib.parse import parse_qsl, urlencode

import redis.asyncio as aioredis
from redis import exceptions as rexc
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection, ConnectionPool, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript

from checkpoint_stores.errors import AgentCheckpointCorruptionError, StoreUnavailableError
from checkpoint_stores.keys import prefix_upper_bound
from checkpoint_stores.options import (
    option_bool,
    option_int,
    option_optional_seconds,
    option_seconds,
)
from checkpoint_stores.spi import Capabilities
from checkpoint_stores.urls import redact_url

__all__ = ["LUA_COMMIT", "RedisBackend", "ThreadKeys"]

T = TypeVar("T")

DEFAULT_PREFIX: Final = "cs:"
# Values travel as one Lua argument each; a commit carries the record twice (record
# and head), three times for runtime snapshots. 64 MiB keeps that far below the
# server's 512 MiB proto-max-bulk-len and 1 GiB client query buffer.
MAX_VALUE_BYTES: Final = 64 * 1024 * 1024
MAX_KEY_BYTES: Final = 64 * 1024
# A list page reads this many index entries, then their values with one MGET; the
# page starts small and adapts so that one reply carries about _PAGE_BYTES.
_PAGE: Final = 256
_FIRST_PAGE: Final = 32
_PAGE_BYTES: Final = 16 * 1024 * 1024
_THREAD_PAGE: Final = 500

# -- Lua ------------------------------------------------------------------------------
# Shared helpers, prepended to every writing script.
_LUA_HELPERS: Final = r"""
local function seq_lt(a, b)
  -- a < b for canonical decimal integers of any size (Lua numbers stop at 2^53)
  local an, bn = a:byte(1) == 45, b:byte(1) == 45
  if an ~= bn then return an end
  if an then a, b = b:sub(2), a:sub(2) end
  if #a ~= #b then return #a < #b end
  for i = 1, #a, 15 do
    local x, y = tonumber(a:sub(i, i + 14)), tonumber(b:sub(i, i + 14))
    if x ~= y then return x < y end
  end
  return false
end

local function put_value(key, value, ttl)
  if ttl > 0 then
    redis.call('SET', key, value, 'PX', ttl)
  else
    redis.call('SET', key, value)
  end
end

-- `before` is the PTTL of an index/seq container before this write (-2 absent,
-- -1 persistent): it must live at least as long as the keys it describes.
local function keep_alive(key, before, ttl)
  if ttl > 0 then
    if before == -2 or (before >= 0 and before < ttl) then
      redis.call('PEXPIRE', key, ttl)
    end
  elseif before >= 0 then
    redis.call('PERSIST', key)
  end
end

local function each_chunk(items, fn)
  for i = 1, #items, 500 do
    fn(i, math.min(i + 499, #items))
  end
end

local function index_add(idx, members)
  each_chunk(members, function(first, last)
    local args = {}
    for j = first, last do
      args[#args + 1] = 0
      args[#args + 1] = members[j]
    end
    redis.call('ZADD', idx, unpack(args))
  end)
end

local function forget(idx, seqh, members, base)
  -- drop index entries and seqs; with `base`, delete the value keys too
  local removed = 0
  each_chunk(members, function(first, last)
    if base then
      local keys = {}
      for j = first, last do keys[#keys + 1] = base .. members[j] end
      removed = removed + redis.call('DEL', unpack(keys))
    end
    redis.call('ZREM', idx, unpack(members, first, last))
    redis.call('HDEL', seqh, unpack(members, first, last))
  end)
  return removed
end
"""

LUA_COMMIT: Final = (
    _LUA_HELPERS
    + r"""
-- KEYS: index, seqs, head value key, write value keys...
-- ARGV: seq, ttl_ms, head key, head value, then (key, value) per write
local idx, seqh, head = KEYS[1], KEYS[2], KEYS[3]
local idx_before = redis.call('PTTL', idx)
if redis.call('EXISTS', head) == 1 then
  local stored = redis.call('HGET', seqh, ARGV[3])
  if stored and not seq_lt(stored, ARGV[1]) then return 0 end
end
local ttl = tonumber(ARGV[2])
local seqh_before = redis.call('PTTL', seqh)
local members = {}
for i = 4, #KEYS do
  local at = 2 * i - 3
  members[#members + 1] = ARGV[at]
  put_value(KEYS[i], ARGV[at + 1], ttl)
end
if #members > 0 then
  each_chunk(members, function(first, last)
    redis.call('HDEL', seqh, unpack(members, first, last))
  end)
end
members[#members + 1] = ARGV[3]
put_value(head, ARGV[4], ttl)
redis.call('HSET', seqh, ARGV[3], ARGV[1])
index_add(idx, members)
keep_alive(idx, idx_before, ttl)
keep_alive(seqh, seqh_before, ttl)
if idx_before == -2 then return 2 end
return 1
"""
)
"""The commit script (public so the benchmark can run the very same script raw).

Returns 0 when the stored head seq is at or above ``seq`` (nothing written), 1
when the head moved, 2 when it moved and the write created the thread's index.
"""

_LUA_PUT: Final = (
    _LUA_HELPERS
    + r"""
-- KEYS: index, seqs, value key   ARGV: ttl_ms, key, value
local idx_before = redis.call('PTTL', KEYS[1])
local ttl = tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], 0, ARGV[2])
put_value(KEYS[3], ARGV[3], ttl)
redis.call('HDEL', KEYS[2], ARGV[2])
keep_alive(KEYS[1], idx_before, ttl)
if idx_before == -2 then return 1 end
return 0
"""
)

_LUA_CREATE: Final = (
    _LUA_HELPERS
    + r"""
-- KEYS: index, seqs, value key   ARGV: ttl_ms, key, value
local idx_before = redis.call('PTTL', KEYS[1])
local ttl = tonumber(ARGV[1])
local ok
if ttl > 0 then
  ok = redis.call('SET', KEYS[3], ARGV[3], 'NX', 'PX', ttl)
else
  ok = redis.call('SET', KEYS[3], ARGV[3], 'NX')
end
if not ok then return 0 end
redis.call('ZADD', KEYS[1], 0, ARGV[2])
redis.call('HDEL', KEYS[2], ARGV[2])
keep_alive(KEYS[1], idx_before, ttl)
if idx_before == -2 then return 2 end
return 1
"""
)

_LUA_DELETE: Final = r"""
-- KEYS: index, seqs, value key   ARGV: key
local n = redis.call('DEL', KEYS[3])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return n
"""

# Value keys are derived inside the script from index members: they share the
# thread's hash tag, so they hash to the slot of the declared keys.
_LUA_DELETE_RANGE: Final = (
    _LUA_HELPERS
    + r"""
-- KEYS: index, seqs   ARGV: value key base, lex min, lex max
local members = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[2], ARGV[3])
return forget(KEYS[1], KEYS[2], members, ARGV[1])
"""
)

_LUA_EXPIRE: Final = (
    _LUA_HELPERS
    + r"""
-- KEYS: index, seqs   ARGV: value key base, lex min, lex max, ttl_ms
local base, ttl = ARGV[1], tonumber(ARGV[4])
local count = 0
for _, m in ipairs(redis.call('ZRANGEBYLEX', KEYS[1], ARGV[2], ARGV[3])) do
  count = count + redis.call('PEXPIRE', base .. m, ttl)
end
-- The index and the seqs must outlive every key they describe, and no more.
local longest, persistent, gone = 0, false, {}
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local t = redis.call('PTTL', base .. m)
  if t == -2 then
    gone[#gone + 1] = m
  elseif t == -1 then
    persistent = true
  elseif t > longest then
    longest = t
  end
end
forget(KEYS[1], KEYS[2], gone, nil)
if persistent then
  redis.call('PERSIST', KEYS[1])
  redis.call('PERSIST', KEYS[2])
elseif longest > 0 then
  redis.call('PEXPIRE', KEYS[1], longest)
  redis.call('PEXPIRE', KEYS[2], longest)
else
  redis.call('DEL', KEYS[1], KEYS[2])
end
return count
"""
)

_LUA_PRUNE_INDEX: Final = (
    _LUA_HELPERS
    + r"""
-- KEYS: index, seqs   ARGV: value key base, keys whose value was missing...
local gone = {}
for i = 2, #ARGV do
  if redis.call('EXISTS', ARGV[1] .. ARGV[i]) == 0 then gone[#gone + 1] = ARGV[i] end
end
forget(KEYS[1], KEYS[2], gone, nil)
return #gone
"""
)


# -- names ------------------------------------------------------------------------------
class ThreadKeys(NamedTuple):
    """The Redis key names of one thread (all in the thread's hash slot)."""

    index_key: bytes
    """Sorted set of the thread's keys."""
    seqs_key: bytes
    """Hash of head seqs."""
    value_prefix: bytes
    """Prefix of the value keys: ``value_prefix + key.encode()`` holds a key's value."""


@functools.lru_cache(maxsize=4096)
def _thread_keys(prefix: str, thread_id: str) -> ThreadKeys:
    tag = base64.urlsafe_b64encode(thread_id.encode("utf-8")).rstrip(b"=")
    base = prefix.encode("utf-8") + b"{" + tag + b"}"
    return ThreadKeys(base + b":i", base + b":s", base + b":v:")


def _lex_range(prefix: str) -> tuple[bytes, bytes]:
    """``ZRANGEBYLEX`` bounds selecting exactly the members that start with ``prefix``."""
    if not prefix:
        return b"-", b"+"
    upper = prefix_upper_bound(prefix)
    return b"[" + prefix.encode("utf-8"), b"+" if upper is None else b"(" + upper.encode("utf-8")


# -- options ----------------------------------------------------------------------------


_OWN_OPTIONS: Final = frozenset(
    {
        "key_prefix",
        "ttl",
        "retries",
        "retry_backoff",
        "retry_backoff_cap",
        "max_connections",
        "pool_timeout",
        "socket_timeout",
        "socket_connect_timeout",
        "health_check_interval",
    }
)
# Handed to redis-py as they are (TLS, auth, naming).
_DRIVER_OPTIONS: Final = frozenset(
    {
        "username",
        "password",
        "client_name",
        "db",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_ca_data",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_password",
        "ssl_cert_reqs",
        "ssl_check_hostname",
    }
)

# Failures after which a retry can succeed: the server is (re)starting, failing
# over, unreachable for a moment, or the pool is momentarily exhausted.
_TRANSIENT: Final = (
    rexc.ConnectionError,
    rexc.TimeoutError,
    rexc.ClusterDownError,
    rexc.TryAgainError,
    rexc.ReadOnlyError,
    rexc.SlotNotCoveredError,
    rexc.RedisClusterException,
    OSError,
)
# Not worth retrying: wrong credentials or missing ACL rights (AuthorizationError
# is missing from older redis-py releases, hence the lookup).
_FATAL_AUTH: Final[tuple[type[Exception], ...]] = tuple(
    getattr(rexc, name)
    for name in ("AuthenticationError", "AuthorizationError", "NoPermissionError")
    if hasattr(rexc, name)
)


class RedisBackend:
    """Redis (standalone, TLS, Unix socket) or Redis Cluster, through redis-py asyncio.

    URLs::

        redis://[[user]:password@]host[:port][/db][?options]
        rediss://...                                   TLS
        unix:///path/to/redis.sock[?db=0&options]
        redis+cluster://host:port[,host:port...][?options]   (rediss+cluster for TLS)

    Options (keyword arguments or URL query; keywords win): ``key_prefix``
    (default ``"cs:"``; no braces), ``ttl`` (seconds; every key written expires
    that long after its last write; default none), ``retries`` (5),
    ``retry_backoff`` (0.05 s, doubled per retry, with jitter) and
    ``retry_backoff_cap`` (2 s), ``max_connections`` (operations in flight at
    once, and the pool size per node; 50), ``pool_timeout`` (seconds an
    operation waits for a free connection; 10), ``socket_timeout`` (10 s),
    ``socket_connect_timeout`` (5 s), ``health_check_interval`` (0: off), and
    redis-py's ``username``, ``password``, ``client_name``, ``db`` and
    ``ssl_*`` options.

    Example::

        store = open_store("redis://localhost:6379/0", key_prefix="myapp:")
    """

    capabilities = Capabilities(
        atomic_commit=True,
        fenced_commit=True,
        cross_process=True,
        durable=True,
        ttl=True,
        max_value_bytes=MAX_VALUE_BYTES,
        max_key_bytes=MAX_KEY_BYTES,
        notes=(
            "durable across client restarts; across server restarts only as the server's "
            "persistence allows (RDB snapshots can lose minutes, AOF everysec about a second, "
            "appendfsync always loses nothing acknowledged); list_threads is best-effort (see docs)"
        ),
    )

    def __init__(self, url: str, **options: Any) -> None:
        scheme, sep, rest = url.partition("://")
        scheme = scheme.strip().lower()
        if not sep or scheme not in {"redis", "rediss", "unix", "redis+cluster", "rediss+cluster"}:
            raise ValueError(
                f"{redact_url(url)!r} is not a Redis URL; write redis://host:6379/0, "
                "rediss://..., unix:///path/redis.sock or redis+cluster://host:port,host:port"
            )
        self.url = url
        self._redacted = redact_url(url)
        self.cluster = scheme.endswith("+cluster")
        self._tls = scheme.startswith("rediss")
        location, _, query = rest.partition("?")
        from_query = dict(parse_qsl(query, keep_blank_values=True))
        opts: dict[str, Any] = {**from_query, **options}
        unknown = set(opts) - _OWN_OPTIONS - _DRIVER_OPTIONS
        if unknown:
            raise TypeError(
                f"redis backend does not take options {sorted(unknown)}; it takes "
                f"{sorted(_OWN_OPTIONS | _DRIVER_OPTIONS)}"
            )

        prefix = opts.get("key_prefix", DEFAULT_PREFIX)
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
            raise ValueError(
                f"redis option key_prefix={prefix!r} must be a string without '{{' or '}}' "
                "(braces would change the hash slot on Redis Cluster); e.g. 'myapp:'"
            )
        self.key_prefix: str = prefix
        ttl = option_optional_seconds(opts.get("ttl"), "ttl", scheme="redis://")
        self.ttl: float | None = ttl or None
        self._ttl_ms = 0 if not ttl else max(1, math.ceil(ttl * 1000))
        self._retries = option_int(opts.get("retries", 5), "retries", scheme="redis://")
        self._backoff = option_seconds(
            opts.get("retry_backoff", 0.05), "retry_backoff", scheme="redis://"
        )
        self._backoff_cap = option_seconds(
            opts.get("retry_backoff_cap", 2.0), "retry_backoff_cap", scheme="redis://"
        )
        self._max_connections = option_int(
            opts.get("max_connections", 50), "max_connections", scheme="redis://", minimum=1
        )
        self._pool_timeout = option_seconds(
            opts.get("pool_timeout", 10.0), "pool_timeout", scheme="redis://"
        )
        self._socket_timeout = option_optional_seconds(
            opts.get("socket_timeout", 10.0), "socket_timeout", scheme="redis://"
        )
        self._connect_timeout = option_optional_seconds(
            opts.get("socket_connect_timeout", 5.0), "socket_connect_timeout", scheme="redis://"
        )
        self._health_check = option_seconds(
            opts.get("health_check_interval", 0.0), "health_check_interval", scheme="redis://"
        )
        # Driver options from the query go through redis-py's URL parser (it types
        # them); keyword ones are passed as given.
        self._driver_query = urlencode(
            [(k, v) for k, v in from_query.items() if k in _DRIVER_OPTIONS and k not in options]
        )
        self._driver_options = {k: v for k, v in options.items() if k in _DRIVER_OPTIONS}
        # Options can arrive as strings (CLI ``-o key=value``): type the non-string ones.
        if isinstance(self._driver_options.get("ssl_check_hostname"), str):
            self._driver_options["ssl_check_hostname"] = option_bool(
                self._driver_options["ssl_check_hostname"], "ssl_check_hostname", scheme="redis://"
            )
        if isinstance(self._driver_options.get("db"), str):
            self._driver_options["db"] = option_int(
                self._driver_options["db"], "db", scheme="redis://"
            )
        self._password = opts.get("password")
        self._location = location
        if self.cluster:
            self._cluster_seeds()  # fail on a malformed node list now, not at first use
        self._registry = self.key_prefix.encode("utf-8") + b"threads"
        self._client: aioredis.Redis | RedisCluster | None = None
        self._gate = asyncio.Semaphore(self._max_connections)
        self._scripts: dict[str, AsyncScript] = {}

    def __repr__(self) -> str:
        return f"RedisBackend({self._redacted!r}, key_prefix={self.key_prefix!r})"

    # -- lifecycle ---------------------------------------------------------------

    async def setup(self) -> None:
        """Connect and check the server answers (idempotent; nothing to create server-side)."""
        client = self._connect()
        if isinstance(client, RedisCluster):
            await self._run("connect", client.initialize)
        await self._run("connect", client.ping)

    async def close(self) -> None:
        """Close the connection pool(s). A later call reconnects."""
        client, self._client = self._client, None
        self._scripts = {}
        if client is not None:
            await client.aclose()

    # -- connection, names, errors --------------------------------------------------

    def _connect(self) -> aioredis.Redis | RedisCluster:
        if self._client is not None:
            return self._client
        common: dict[str, Any] = {
            "socket_timeout": self._socket_timeout,
            "socket_connect_timeout": self._connect_timeout,
            "health_check_interval": self._health_check,
            # Retries happen in _run, per operation, where create and commit know
            # how to treat a resend whose first attempt may have landed.
            "retry": Retry(NoBackoff(), 0),
            "decode_responses": False,
        }
        client: aioredis.Redis | RedisCluster
        if self.cluster:
            client = self._cluster_client(common)
        else:
            kwargs = self._parse(self._location, self.url.partition("://")[0].strip().lower())
            connection_class = kwargs.pop("connection_class", Connection)
            # A plain pool: the gate in _run_counted keeps it within max_connections
            # more cheaply than redis-py's BlockingConnectionPool (a condition and
            # a timeout per command).
            pool = ConnectionPool(
                connection_class=connection_class,
                max_connections=self._max_connections,
                **kwargs,
                **common,
            )
            client = aioredis.Redis.from_pool(pool)
        self._client = client
        self._gate = asyncio.Semaphore(self._max_connections)
        self._scripts = {
            "commit": client.register_script(LUA_COMMIT),
            "put": client.register_script(_LUA_PUT),
            "create": client.register_script(_LUA_CREATE),
            "delete": client.register_script(_LUA_DELETE),
            "delete_range": client.register_script(_LUA_DELETE_RANGE),
            "expire": client.register_script(_LUA_EXPIRE),
            "prune_index": client.register_script(_LUA_PRUNE_INDEX),
        }
        return client

    def _parse(self, location: str, scheme: str) -> dict[str, Any]:
        """redis-py connection kwargs for ``scheme://location`` plus the driver options."""
        query = f"?{self._driver_query}" if self._driver_query else ""
        try:
            kwargs = dict(parse_url(f"{scheme}://{location}{query}"))
        except ValueError as exc:
            raise ValueError(f"cannot parse Redis URL {self._redacted!r}: {exc}") from None
        kwargs.update(self._driver_options)
        return kwargs

    def _cluster_seeds(self) -> tuple[str, builtins.list[tuple[str, int]]]:
        """``(userinfo@, [(host, port), ...])`` of a ``redis+cluster://`` URL, checked."""
        netloc, _, path = self._location.partition("/")
        userinfo, at, hosts = netloc.rpartition("@")
        if path.strip("/") not in {"", "0"}:
            raise ValueError(
                f"{self._redacted!r} names database {path.strip('/')!r}; Redis Cluster has only "
                "database 0: drop the /db from the URL"
            )
        seeds: builtins.list[tuple[str, int]] = []
        for seed in (h.strip() for h in hosts.split(",")):
            if not seed:
                continue
            host, colon, port = seed.rpartition(":")
            if not colon or host.endswith(":") or not port.isdigit():  # no port, or bare IPv6
                host, port = seed, "6379"
            seeds.append((host.strip("[]"), int(port)))
        if not seeds:
            raise ValueError(
                f"{self._redacted!r} names no node; write redis+cluster://host:port[,host:port]"
            )
        return f"{userinfo}{at}", seeds

    def _cluster_client(self, common: dict[str, Any]) -> RedisCluster:
        userinfo, seeds = self._cluster_seeds()
        host, port = seeds[0]
        bracketed = f"[{host}]" if ":" in host else host
        kwargs = self._parse(f"{userinfo}{bracketed}:{port}", "rediss" if self._tls else "redis")
        for name in ("host", "port", "connection_class", "path", "db"):
            kwargs.pop(name, None)
        return RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in seeds],
            ssl=self._tls,
            max_connections=self._max_connections,
            **kwargs,
            **common,
        )

    def key_names(self, thread_id: str) -> ThreadKeys:
        """The Redis keys that hold ``thread_id`` (for operators, tests and benchmarks)."""
        return _thread_keys(self.key_prefix, thread_id)

    def _script(self, name: str) -> AsyncScript:
        if self._client is None:
            self._connect()
        return self._scripts[name]

    def _scrub(self, text: str) -> str:
        if self._password:
            text = text.replace(str(self._password), "***")
        return text

    def _unavailable(self, what: str, exc: BaseException) -> StoreUnavailableError:
        reason = self._scrub(f"{type(exc).__name__}: {exc}")
        if isinstance(exc, _FATAL_AUTH):
            hint = "check the user name, password and ACL permissions in the URL or options"
        elif isinstance(exc, rexc.OutOfMemoryError):
            hint = "the server is at maxmemory and refused the write (nothing was written)"
        else:
            hint = (
                "check that the server is running and reachable, then retry "
                "(a commit either happened whole or not at all)"
            )
        return StoreUnavailableError(
            f"Redis store {self._redacted}: {what} failed ({reason}); {hint}"
        )

    async def _run(self, what: str, op: Callable[[], Awaitable[T]]) -> T:
        return (await self._run_counted(what, op))[0]

    async def _run_counted(self, what: str, op: Callable[[], Awaitable[T]]) -> tuple[T, int]:
        """Run ``op`` with retries on transient failures; return its result and the failures."""
        failures = 0
        gate = self._gate
        while True:
            try:
                if gate.locked():
                    await self._wait_for_connection(gate, what)
                else:
                    await gate.acquire()  # free slot: returns without suspending
                try:
                    return await op(), failures
                finally:
                    gate.release()
            except _FATAL_AUTH as exc:
                raise self._unavailable(what, exc) from None
            except _TRANSIENT as exc:
                if failures >= self._retries:
                    raise self._unavailable(what, exc) from None
                delay = min(self._backoff_cap, self._backoff * (2**failures))
                failures += 1
                # Full jitter keeps many clients from reconnecting in lockstep.
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
            except rexc.ResponseError as exc:
                if str(exc).startswith("WRONGTYPE"):
                    raise AgentCheckpointCorruptionError(
                        f"Redis store {self._redacted}: {what}: a key under key_prefix "
                        f"{self.key_prefix!r} holds another kind of data (WRONGTYPE); another "
                        "application writes under this prefix: give this store a key_prefix "
                        "of its own"
                    ) from None
                raise self._unavailable(what, exc) from None
            except rexc.RedisError as exc:
                raise self._unavailable(what, exc) from None

    async def _wait_for_connection(self, gate: asyncio.Semaphore, what: str) -> None:
        try:
            await asyncio.wait_for(gate.acquire(), self._pool_timeout)
        except asyncio.TimeoutError:
            raise StoreUnavailableError(
                f"Redis store {self._redacted}: {what} waited {self._pool_timeout} s for one of "
                f"its {self._max_connections} connections; raise max_connections or "
                "pool_timeout, or send fewer operations at once"
            ) from None

    async def _eval(
        self, what: str, script: str, keys: list[bytes], args: list[Any]
    ) -> tuple[int, int]:
        """Run one of the scripts; return its integer result and how many attempts failed."""
        call = self._script(script)
        result, failures = await self._run_counted(what, lambda: call(keys=keys, args=args))
        return int(result), failures

    async def _register(self, thread_id: str) -> None:
        client = self._connect()
        await self._run("register thread", lambda: client.zadd(self._registry, {thread_id: 0}))

    async def _unregister(self, thread_ids: builtins.list[str]) -> None:
        """Drop registry entries of threads without an index; re-add any recreated meanwhile."""
        if not thread_ids:
            return
        client = self._connect()
        await self._run("unregister threads", lambda: client.zrem(self._registry, *thread_ids))
        alive = await self._existing(thread_ids)
        if alive:
            await self._run(
                "register threads", lambda: client.zadd(self._registry, dict.fromkeys(alive, 0))
            )

    async def _existing(self, thread_ids: builtins.list[str]) -> builtins.list[str]:
        """The thread ids whose index exists (one pipelined round trip per node)."""
        client = self._connect()

        async def check() -> builtins.list[Any]:
            pipe = client.pipeline(transaction=False)
            for thread_id in thread_ids:
                pipe.exists(self.key_names(thread_id).index_key)
            return await pipe.execute()

        found = await self._run("list threads", check)
        return [t for t, n in zip(thread_ids, found, strict=True) if n]

    # -- SPI -------------------------------------------------------------------------

    async def get(self, thread_id: str, key: str) -> bytes | None:
        """One ``GET``."""
        client = self._connect()
        name = self.key_names(thread_id).value_prefix + key.encode("utf-8")
        return cast("bytes | None", await self._run("get", lambda: client.get(name)))

    async def get_many(self, thread_id: str, keys: Sequence[str]) -> builtins.list[bytes | None]:
        """One ``MGET`` (every key of a thread is in one slot)."""
        if not keys:
            return []
        client = self._connect()
        base = self.key_names(thread_id).value_prefix
        names = [base + k.encode("utf-8") for k in keys]
        return cast(
            "builtins.list[bytes | None]", await self._run("get_many", lambda: client.mget(names))
        )

    async def put(self, thread_id: str, key: str, value: bytes) -> None:
        """Upsert the value and its index entry in one script."""
        names = self.key_names(thread_id)
        raw = key.encode("utf-8")
        fresh, failures = await self._eval(
            "put",
            "put",
            [names.index_key, names.seqs_key, names.value_prefix + raw],
            [self._ttl_ms, raw, bytes(value)],
        )
        if fresh or failures:
            await self._register(thread_id)

    async def create(self, thread_id: str, key: str, value: bytes) -> bool:
        """``SET NX`` plus the index entry, in one script."""
        names = self.key_names(thread_id)
        raw = key.encode("utf-8")
        data = bytes(value)
        result, failures = await self._eval(
            "create",
            "create",
            [names.index_key, names.seqs_key, names.value_prefix + raw],
            [self._ttl_ms, raw, data],
        )
        if result == 2 or failures:
            await self._register(thread_id)
        if result == 0 and failures:
            # A failed attempt may have landed before the connection broke: the key
            # holding exactly our bytes means that attempt was ours.
            return await self.get(thread_id, key) == data
        return result != 0

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        """The commit script: compare the head's seq, then write everything, atomically."""
        names = self.key_names(thread_id)
        base = names.value_prefix
        head = head_key.encode("utf-8")
        keys = [names.index_key, names.seqs_key, base + head]
        args: builtins.list[Any] = [str(int(seq)), self._ttl_ms, head, bytes(head_value)]
        for key, value in writes:
            raw = key.encode("utf-8")
            keys.append(base + raw)
            args.append(raw)
            args.append(bytes(value))
        result, failures = await self._eval("commit", "commit", keys, args)
        if result == 2 or failures:
            await self._register(thread_id)
        if result == 0 and failures:
            # A failed attempt may have landed before the connection broke: the head
            # at our seq with our bytes means that attempt was ours.
            client = self._connect()
            stored = await self._run("commit", lambda: client.hget(names.seqs_key, head))
            if stored == args[0].encode() and await self.get(thread_id, head_key) == args[3]:
                return True
        return result != 0

    async def list(self, thread_id: str, prefix: str = "") -> AsyncIterator[tuple[str, bytes]]:
        """Page through the index by lex range, values by ``MGET``; sorted and prefix-exact."""
        client = self._connect()
        names = self.key_names(thread_id)
        low, high = _lex_range(prefix)
        page = _FIRST_PAGE
        while True:
            members = cast(
                "builtins.list[bytes]",
                await self._run(
                    "list",
                    functools.partial(
                        client.zrangebylex, names.index_key, low, high, start=0, num=page
                    ),
                ),
            )
            if not members:
                return
            keys = [names.value_prefix + m for m in members]
            values = cast(
                "builtins.list[bytes | None]",
                await self._run("list", functools.partial(client.mget, keys)),
            )
            missing = [m for m, v in zip(members, values, strict=True) if v is None]
            if missing:  # expired or deleted since the index was read
                await self._eval(
                    "list",
                    "prune_index",
                    [names.index_key, names.seqs_key],
                    [names.value_prefix, *missing],
                )
            for member, value in zip(members, values, strict=True):
                if value is not None:
                    yield self._decode(member, f"the index of thread {thread_id!r}"), value
            if len(members) < page:
                return
            low = b"(" + members[-1]
            # Small values: grow the page (fewer round trips); large ones: shrink it,
            # so one MGET reply stays near _PAGE_BYTES.
            size = sum(len(v) for v in values if v is not None)
            page = max(1, min(_PAGE, page * 2, page * _PAGE_BYTES // max(size, 1)))

    def _decode(self, member: bytes, where: str) -> str:
        try:
            return member.decode("utf-8")
        except UnicodeDecodeError:
            raise AgentCheckpointCorruptionError(
                f"Redis store {self._redacted}: {where} holds a name that is not UTF-8 "
                f"({member[:40]!r}); something else wrote under key_prefix {self.key_prefix!r}"
            ) from None

    async def list_threads(self, prefix: str = "") -> AsyncIterator[str]:
        """Thread ids from the registry that still hold keys, sorted (see the module notes)."""
        client = self._connect()
        low, high = _lex_range(prefix)
        while True:
            members = cast(
                "builtins.list[bytes]",
                await self._run(
                    "list threads",
                    functools.partial(
                        client.zrangebylex, self._registry, low, high, start=0, num=_THREAD_PAGE
                    ),
                ),
            )
            if not members:
                return
            ids = [self._decode(m, "the thread registry") for m in members]
            alive = set(await self._existing(ids))
            await self._unregister([t for t in ids if t not in alive])
            for thread_id in ids:
                if thread_id in alive:
                    yield thread_id
            if len(members) < _THREAD_PAGE:
                return
            low = b"(" + members[-1]

    async def delete(self, thread_id: str, key: str) -> bool:
        """Delete the value, its seq and its index entry in one script."""
        names = self.key_names(thread_id)
        raw = key.encode("utf-8")
        result, _ = await self._eval(
            "delete", "delete", [names.index_key, names.seqs_key, names.value_prefix + raw], [raw]
        )
        return result > 0

    async def delete_prefix(self, thread_id: str, prefix: str) -> int:
        """Delete the keys in the prefix's lex range, in one script."""
        names = self.key_names(thread_id)
        low, high = _lex_range(prefix)
        result, _ = await self._eval(
            "delete_prefix",
            "delete_range",
            [names.index_key, names.seqs_key],
            [names.value_prefix, low, high],
        )
        return result

    async def delete_thread(self, thread_id: str) -> int:
        """Delete every key of the thread in one script, then its registry entry."""
        names = self.key_names(thread_id)
        result, _ = await self._eval(
            "delete_thread",
            "delete_range",
            [names.index_key, names.seqs_key],
            [names.value_prefix, b"-", b"+"],
        )
        await self._unregister([thread_id])
        return result

    async def expire_prefix(self, thread_id: str, prefix: str, ttl_seconds: float) -> int:
        """Make every key under ``prefix`` expire in ``ttl_seconds`` (``PEXPIRE``).

        The thread's index and seqs are re-timed to outlive its longest-living
        key. A ``ttl_seconds`` of zero or less deletes the keys now.
        """
        ttl = float(ttl_seconds)
        if not math.isfinite(ttl):
            raise ValueError(f"ttl_seconds must be a finite number of seconds, got {ttl_seconds!r}")
        if ttl <= 0:
            return await self.delete_prefix(thread_id, prefix)
        names = self.key_names(thread_id)
        low, high = _lex_range(prefix)
        ms = max(1, math.ceil(ttl * 1000))
        result, _ = await self._eval(
            "expire_prefix",
            "expire",
            [names.index_key, names.seqs_key],
            [names.value_prefix, low, high, ms],
        )
        return result
