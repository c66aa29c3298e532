"""Backend discovery: the pluggy hook spec, the registry, and entry-point loading.

A plugin is any object with a ``checkpoint_stores_register_backends`` hook,
published under the ``checkpoint_stores`` entry-point group::

    # pyproject.toml of a third-party package
    [project.entry-points.checkpoint_stores]
    mydb = "mydb_store:plugin"

    # mydb_store/__init__.py
    from checkpoint_stores import hookimpl

    class plugin:
        @staticmethod
        @hookimpl
        def checkpoint_stores_register_backends(registry):
            registry.add("mydb", "mydb_store.backend:MyDbBackend")

The target is a lazy ``"module:attr"`` string (the driver is imported only
when that scheme is opened) or a callable; it is called as
``target(url, **options)`` and returns a :class:`StorageBackend`.

Loading goes plugin by plugin: a broken plugin is reported (a warning, and
``checkpoint-stores plugins`` shows the error) while the others still load.
Set ``CHECKPOINT_STORES_STRICT_PLUGINS=1`` to make a broken plugin raise.
"""

from __future__ import annotations

import importlib
import os
import threading
import traceback
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Final

import pluggy

from checkpoint_stores.errors import BackendNotFoundError, MissingDependencyError, PluginLoadError
from checkpoint_stores.spi import StorageBackend
from checkpoint_stores.urls import redact_url, scheme_of

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendEntry",
    "BackendRegistry",
    "PluginFailure",
    "get_registry",
    "hookimpl",
    "hookspec",
    "open_backend",
]

ENTRY_POINT_GROUP: Final = "checkpoint_stores"
STRICT_ENV: Final = "CHECKPOINT_STORES_STRICT_PLUGINS"

hookspec = pluggy.HookspecMarker("checkpoint_stores")
hookimpl = pluggy.HookimplMarker("checkpoint_stores")

# Which extra installs the backend behind a scheme this project ships: used to
# say what to install when a driver is missing or a scheme is unknown.
KNOWN_EXTRAS: Final[dict[str, str]] = {
    "redis": "redis",
    "rediss": "redis",
    "redis+cluster": "redis",
    "rediss+cluster": "redis",
    "redis+unix": "redis",
    "unix": "redis",
    "postgresql": "postgres",
    "postgres": "postgres",
    "postgresql+asyncpg": "postgres",
    "postgresql+psycopg": "psycopg",
    "sqlite": "sqlite",
    "sqlite+aiosqlite": "sqlite",
    "mysql": "mysql",
    "mysql+aiomysql": "mysql",
    "mysql+asyncmy": "mysql",
    "mariadb": "mysql",
    "mariadb+aiomysql": "mysql",
    "mongodb": "mongodb",
    "mongodb+srv": "mongodb",
    "s3": "s3",
}


class HookSpecs:
    """The hooks a plugin can implement."""

    @hookspec
    def checkpoint_stores_register_backends(self, registry: BackendRegistry) -> None:
        """Register backends: ``registry.add(scheme, "module:Class", extra="...")``."""


@dataclass(frozen=True)
class BackendEntry:
    """One scheme a plugin registered."""

    scheme: str
    target: str | Callable[..., StorageBackend]
    plugin: str
    distribution: str | None = None
    version: str | None = None
    extra: str | None = None
    description: str = ""
    alias_of: str | None = None

    @property
    def target_name(self) -> str:
        """The target as text (``module:attr`` or the callable's qualified name)."""
        if isinstance(self.target, str):
            return self.target
        return f"{self.target.__module__}:{getattr(self.target, '__qualname__', self.target)}"


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that failed to load or register."""

    plugin: str
    distribution: str | None
    version: str | None
    error: str
    detail: str = ""


@dataclass
class _Origin:
    plugin: str = "<direct>"
    distribution: str | None = None
    version: str | None = None


@dataclass
class BackendRegistry:
    """Schemes and the backends behind them.

    Plugins receive it in ``checkpoint_stores_register_backends(registry)`` and
    call :meth:`add`. Applications can call :meth:`add` too, for a backend that
    is not packaged as a plugin.
    """

    entries: dict[str, BackendEntry] = field(default_factory=dict)
    failures: list[PluginFailure] = field(default_factory=list)
    _origin: _Origin = field(default_factory=_Origin, repr=False)

    def add(
        self,
        scheme: str,
        target: str | Callable[..., StorageBackend],
        *,
        aliases: Iterable[str] = (),
        extra: str | None = None,
        description: str = "",
        replace: bool = False,
    ) -> None:
        """Register ``target`` for ``scheme`` (and each alias).

        Args:
            scheme: URL scheme, e.g. ``"redis"`` (case-insensitive).
            target: ``"module:attr"`` (imported lazily) or a callable taking
                ``(url, **options)`` and returning a :class:`StorageBackend`.
            aliases: more schemes for the same target (``"rediss"``).
            extra: the pip extra that installs the driver, for error messages.
            description: one line for ``checkpoint-stores plugins``.
            replace: allow replacing a scheme another plugin registered.
        """
        if isinstance(target, str) and ":" not in target:
            raise ValueError(f"backend target {target!r} must look like 'package.module:Class'")
        names = [scheme, *aliases]
        for name in names:
            key = name.strip().lower()
            current = self.entries.get(key)
            if current is not None and not replace and current.plugin != self._origin.plugin:
                raise ValueError(
                    f"scheme {key!r} is already registered by plugin {current.plugin!r}; "
                    "pass replace=True to override it"
                )
            self.entries[key] = BackendEntry(
                scheme=key,
                target=target,
                plugin=self._origin.plugin,
                distribution=self._origin.distribution,
                version=self._origin.version,
                extra=extra,
                description=description,
                alias_of=None if name == scheme else scheme.strip().lower(),
            )

    def schemes(self) -> list[str]:
        """Registered schemes, sorted."""
        return sorted(self.entries)

    def entry(self, scheme: str) -> BackendEntry:
        """The entry for ``scheme``, or :class:`BackendNotFoundError` saying what to install."""
        key = scheme.lower()
        found = self.entries.get(key)
        if found is not None:
            return found
        installed = ", ".join(self.schemes()) or "none"
        hint = ""
        if key in KNOWN_EXTRAS:
            hint = f' Install it with: pip install "checkpoint-stores[{KNOWN_EXTRAS[key]}]".'
        broken = [f.plugin for f in self.failures]
        if broken:
            hint += (
                f" Plugins that failed to load: {', '.join(broken)} "
                "(see `checkpoint-stores plugins`)."
            )
        raise BackendNotFoundError(
            f"no checkpoint-stores backend for scheme {key!r}. "
            f"Installed schemes: {installed}.{hint}"
        )

    def factory(self, scheme: str) -> Callable[..., StorageBackend]:
        """Import and return the callable behind ``scheme``."""
        entry = self.entry(scheme)
        if not isinstance(entry.target, str):
            return entry.target
        module_name, _, attr = entry.target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            extra = entry.extra or KNOWN_EXTRAS.get(entry.scheme)
            how = (
                f'pip install "checkpoint-stores[{extra}]"'
                if extra
                else f"install the package that provides {module_name!r}"
            )
            raise MissingDependencyError(
                f"backend {entry.scheme!r} (plugin {entry.plugin!r}) could not be imported: "
                f"{exc}. Install its driver: {how}"
            ) from exc
        try:
            found: Callable[..., StorageBackend] = getattr(module, attr)
        except AttributeError:
            raise BackendNotFoundError(
                f"plugin {entry.plugin!r} registered {entry.target!r} for {entry.scheme!r}, "
                f"but {module_name!r} has no attribute {attr!r}; report it to the plugin's authors"
            ) from None
        return found

    # -- loading ---------------------------------------------------------------

    def _report(self, failure: PluginFailure, strict: bool) -> None:
        self.failures.append(failure)
        message = (
            f"checkpoint-stores plugin {failure.plugin!r}"
            f"{f' from {failure.distribution}' if failure.distribution else ''} "
            f"failed to load: {failure.error}. Its schemes are unavailable; the other "
            f"plugins still work. Set {STRICT_ENV}=1 to make this an error."
        )
        if strict:
            raise PluginLoadError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)

    def load_entry_points(self, *, strict: bool | None = None) -> None:
        """Load every plugin of the ``checkpoint_stores`` entry-point group, one by one."""
        if strict is None:
            strict = os.environ.get(STRICT_ENV, "").strip().lower() in {"1", "true", "yes", "on"}
        manager = pluggy.PluginManager("checkpoint_stores")
        manager.add_hookspecs(HookSpecs)
        seen: set[tuple[str, str]] = set()
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=_builtin_first):
            dist = getattr(ep, "dist", None)
            origin = _Origin(
                plugin=ep.name,
                distribution=dist.name if dist is not None else None,
                version=dist.version if dist is not None else None,
            )
            # The same entry point seen twice (one distribution twice on sys.path) loads
            # once. Another plugin reusing a taken name is not skipped silently: pluggy
            # refuses the name below, and that is reported like any other failure.
            if (ep.name, ep.value) in seen:
                continue
            seen.add((ep.name, ep.value))
            before = dict(self.entries)
            try:
                plugin = ep.load()
                manager.register(plugin, name=ep.name)
                impls = [
                    impl
                    for impl in manager.hook.checkpoint_stores_register_backends.get_hookimpls()
                    if impl.plugin_name == ep.name
                ]
                if not impls:
                    raise TypeError(
                        f"{ep.value} has no checkpoint_stores_register_backends hook "
                        "(decorate it with checkpoint_stores.hookimpl)"
                    )
                self._origin = origin
                for impl in impls:
                    impl.function(registry=self)
            except Exception as exc:  # a broken plugin must not take the others down
                self.entries.clear()  # drop what its hook added before failing
                self.entries.update(before)
                self._report(
                    PluginFailure(
                        plugin=ep.name,
                        distribution=origin.distribution,
                        version=origin.version,
                        error=f"{type(exc).__name__}: {exc}",
                        detail=traceback.format_exc(),
                    ),
                    strict,
                )
            finally:
                self._origin = _Origin()


def _builtin_first(ep: EntryPoint) -> tuple[int, str]:
    return (0 if ep.value.startswith("checkpoint_stores.") else 1, ep.name)


_registry: BackendRegistry | None = None
_lock = threading.Lock()


def get_registry(*, reload: bool = False) -> BackendRegistry:
    """The process-wide registry, loading entry points on first use."""
    global _registry
    with _lock:
        if _registry is None or reload:
            registry = BackendRegistry()
            registry.load_entry_points()
            _registry = registry
        return _registry


def open_backend(url: str, **options: Any) -> StorageBackend:
    """Build the backend for ``url``'s scheme (not yet set up).

    >>> backend = open_backend("memory://")
    >>> backend.capabilities.durable
    False
    """
    factory = get_registry().factory(scheme_of(url))
    backend = factory(url, **options)
    if not isinstance(backend, StorageBackend):
        raise BackendNotFoundError(
            f"the backend for {redact_url(url)!r} returned {type(backend).__name__}, "
            "which does not implement the StorageBackend SPI"
        )
    return backend
