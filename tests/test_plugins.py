"""Plugin discovery through entry points: found, broken ones reported, the rest still loading.

Fake third-party distributions are built in a temp directory (``<name>-1.0.dist-info``
with ``METADATA`` and ``entry_points.txt``, plus a module) and put on ``sys.path``,
which is exactly how ``importlib.metadata`` finds an installed package.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from checkpoint_stores import (
    BackendNotFoundError,
    BackendRegistry,
    Checkpoint,
    MissingDependencyError,
    Phase,
    PluginLoadError,
    get_registry,
    open_store,
)
from checkpoint_stores.backends.memory import MemoryBackend
from checkpoint_stores.cli import main as cli_main

GOOD_MODULE = """
from checkpoint_stores import hookimpl
from checkpoint_stores.backends.memory import MemoryBackend


class GoodBackend(MemoryBackend):
    def __init__(self, url, **options):
        super().__init__("memory://")
        self.options = options


class plugin:
    @staticmethod
    @hookimpl
    def checkpoint_stores_register_backends(registry):
        registry.add("goodfake", "{module}:GoodBackend", aliases=["goodfake+tls"],
                     extra="goodfake", description="a test plugin")
"""

RAISING_MODULE = """
from checkpoint_stores import hookimpl


class plugin:
    @staticmethod
    @hookimpl
    def checkpoint_stores_register_backends(registry):
        registry.add("halfway", "{module}:Nothing")
        raise RuntimeError("database driver refused to initialize")
"""

NO_HOOK_MODULE = """
class plugin:
    def register(self, registry):
        registry.add("nohook", "x:y")
"""

BAD_SIGNATURE_MODULE = """
from checkpoint_stores import hookimpl


class plugin:
    @staticmethod
    @hookimpl
    def checkpoint_stores_register_backends(reg, extra_argument):
        reg.add("badsig", "x:y")
"""

CONFLICT_MODULE = """
from checkpoint_stores import hookimpl


class plugin:
    @staticmethod
    @hookimpl
    def checkpoint_stores_register_backends(registry):
        registry.add("file", "{module}:Whatever")
"""

DRIVERLESS_MODULE = """
import checkpoint_stores_test_no_such_driver  # the driver this backend needs is missing


class Backend:
    pass
"""

DRIVERLESS_PLUGIN_MODULE = """
from checkpoint_stores import hookimpl


class plugin:
    @staticmethod
    @hookimpl
    def checkpoint_stores_register_backends(registry):
        registry.add("driverless", "{prefix}_driverless_backend:Backend", extra="driverless")
"""


@dataclass
class FakeSite:
    """A directory of fake installed distributions, on sys.path while the test runs."""

    path: Path
    prefix: str
    modules: list[str] = field(default_factory=list)

    def add(self, dist: str, entry_points: dict[str, str], sources: dict[str, str]) -> None:
        """Install distribution ``dist`` (version 1.0) with entry points and modules."""
        info = self.path / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        lines = [f"{name} = {target}" for name, target in entry_points.items()]
        (info / "entry_points.txt").write_text("[checkpoint_stores]\n" + "\n".join(lines) + "\n")
        for module, source in sources.items():
            text = source.replace("{module}", module).replace("{prefix}", self.prefix)
            (self.path / f"{module}.py").write_text(textwrap.dedent(text))
            self.modules.append(module)

    def module(self, suffix: str) -> str:
        return f"{self.prefix}_{suffix}"


@pytest.fixture
def site(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[FakeSite]:
    """Fake distributions on sys.path; afterwards sys.path, modules and the registry restored."""
    prefix = f"cs_fake_{request.node.name.split('[')[0][-20:]}_{os.getpid()}".replace("-", "_")
    fake = FakeSite(tmp_path / "site", prefix)
    fake.path.mkdir()
    sys.path.insert(0, str(fake.path))
    importlib.invalidate_caches()
    try:
        yield fake
    finally:
        sys.path.remove(str(fake.path))
        for module in fake.modules:
            sys.modules.pop(module, None)
        importlib.invalidate_caches()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            get_registry(reload=True)
    assert "goodfake" not in get_registry().schemes()  # really restored


def add_good(site: FakeSite) -> str:
    module = site.module("good")
    site.add("good-store-plugin", {"goodfake": f"{module}:plugin"}, {module: GOOD_MODULE})
    return module


def add_broken(site: FakeSite) -> None:
    site.add("broken-import-plugin", {"brokenimport": f"{site.prefix}_not_there:plugin"}, {})
    raising = site.module("raising")
    site.add("raising-plugin", {"raising": f"{raising}:plugin"}, {raising: RAISING_MODULE})
    nohook = site.module("nohook")
    site.add("nohook-plugin", {"nohook": f"{nohook}:plugin"}, {nohook: NO_HOOK_MODULE})
    badsig = site.module("badsig")
    site.add("badsig-plugin", {"badsig": f"{badsig}:plugin"}, {badsig: BAD_SIGNATURE_MODULE})
    conflict = site.module("conflict")
    site.add("conflict-plugin", {"conflict": f"{conflict}:plugin"}, {conflict: CONFLICT_MODULE})
    # Another distribution reusing a built-in entry-point name must not vanish silently.
    site.add("squatter-plugin", {"memory": f"{site.module('good')}:plugin"}, {})


def reload_with_warnings() -> tuple[BackendRegistry, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry = get_registry(reload=True)
    return registry, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


# -- discovery -----------------------------------------------------------------------------------


async def test_entry_point_plugin_is_found_and_opens(site: FakeSite) -> None:
    module = add_good(site)
    registry, warned = reload_with_warnings()
    assert warned == []
    assert registry.failures == []
    entry = registry.entry("goodfake")
    assert (entry.plugin, entry.distribution, entry.version) == (
        "goodfake",
        "good-store-plugin",
        "1.0",
    )
    assert entry.target_name == f"{module}:GoodBackend"
    assert entry.extra == "goodfake"
    assert registry.entry("goodfake+tls").alias_of == "goodfake"
    assert registry.entry("GoodFake").scheme == "goodfake"  # schemes are case-insensitive
    async with open_store("goodfake://anything?x=1", pool=3) as store:
        assert type(store.backend).__name__ == "GoodBackend"
        assert store.backend.options == {"pool": 3}  # type: ignore[attr-defined]
        await store.append(
            Checkpoint(thread_id="t", run_id="r", seq=1, phase=Phase.RUN_STARTED, payload={})
        )
        assert (await store.latest("t", "r")).seq == 1


def test_builtins_come_through_the_same_entry_point_group() -> None:
    registry = get_registry()
    for scheme in ["memory", "file", "redis", "postgresql+asyncpg", "mongodb", "s3"]:
        entry = registry.entry(scheme)
        assert entry.distribution == "checkpoint-stores"
        assert entry.target_name.startswith("checkpoint_stores.backends.")


def test_broken_plugins_are_reported_and_the_others_still_load(site: FakeSite) -> None:
    add_good(site)
    add_broken(site)
    registry, warned = reload_with_warnings()
    ours = {"broken-import-plugin", "raising-plugin", "nohook-plugin", "badsig-plugin"}
    ours |= {"conflict-plugin", "squatter-plugin"}
    failures = {f.plugin: f for f in registry.failures if f.distribution in ours}
    assert set(failures) == {"brokenimport", "raising", "nohook", "badsig", "conflict", "memory"}
    assert "ModuleNotFoundError" in failures["brokenimport"].error
    assert failures["brokenimport"].distribution == "broken-import-plugin"
    assert failures["brokenimport"].version == "1.0"
    assert "database driver refused to initialize" in failures["raising"].error
    assert "no checkpoint_stores_register_backends hook" in failures["nohook"].error
    assert "badsig" in failures["badsig"].error or "extra_argument" in failures["badsig"].error
    assert "already registered" in failures["conflict"].error
    assert failures["memory"].distribution == "squatter-plugin"
    assert "Traceback" in failures["raising"].detail
    # Each failure is a warning naming the plugin and how to make it an error.
    assert len(warned) == len(registry.failures)
    assert any("'raising' from raising-plugin failed to load" in w for w in warned)
    assert all("CHECKPOINT_STORES_STRICT_PLUGINS=1" in w for w in warned)
    # Everything else still loads; the built-in schemes are untouched.
    assert "goodfake" in registry.schemes()
    assert registry.entry("file").target_name == "checkpoint_stores.backends.file:FileBackend"
    assert registry.entry("memory").distribution == "checkpoint-stores"
    # A hook that registered a scheme and then raised leaves nothing behind.
    assert "halfway" not in registry.schemes()
    assert "nohook" not in registry.schemes()


def test_unknown_scheme_mentions_broken_plugins(site: FakeSite) -> None:
    add_broken(site)
    registry, _ = reload_with_warnings()
    with pytest.raises(BackendNotFoundError) as info:
        registry.entry("raisingdb")
    assert "Plugins that failed to load: " in str(info.value)
    assert "raising" in str(info.value)
    assert "checkpoint-stores plugins" in str(info.value)


def test_strict_mode_raises(site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> None:
    add_good(site)
    add_broken(site)
    before = get_registry()
    monkeypatch.setenv("CHECKPOINT_STORES_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError) as info:
        get_registry(reload=True)
    assert "failed to load" in str(info.value)
    assert get_registry() is before  # a failed strict load does not replace the registry
    monkeypatch.setenv("CHECKPOINT_STORES_STRICT_PLUGINS", "0")
    registry, warned = reload_with_warnings()
    assert warned
    assert registry.failures


def test_strict_mode_passes_when_nothing_is_broken(
    site: FakeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_good(site)
    monkeypatch.setenv("CHECKPOINT_STORES_STRICT_PLUGINS", "true")
    assert "goodfake" in get_registry(reload=True).schemes()


def test_missing_driver_inside_a_plugin_backend_names_the_extra(site: FakeSite) -> None:
    plugin_module, backend_module = (
        site.module("driverless_plugin"),
        site.module("driverless_backend"),
    )
    site.add(
        "driverless-plugin",
        {"driverless": f"{plugin_module}:plugin"},
        {plugin_module: DRIVERLESS_PLUGIN_MODULE, backend_module: DRIVERLESS_MODULE},
    )
    registry, warned = reload_with_warnings()
    assert warned == []  # registering is lazy: the missing driver is not touched yet
    assert "driverless" in registry.schemes()
    with pytest.raises(MissingDependencyError) as info:
        open_store("driverless://host/db")
    message = str(info.value)
    assert "checkpoint_stores_test_no_such_driver" in message
    assert 'pip install "checkpoint-stores[driverless]"' in message
    assert isinstance(info.value, BackendNotFoundError)


def test_cli_plugins_shows_failures_in_a_fresh_process(site: FakeSite) -> None:
    add_good(site)
    add_broken(site)
    script = Path(sys.executable).parent / "checkpoint-stores"
    env = {**os.environ, "PYTHONPATH": str(site.path), "COLUMNS": "250"}
    result = subprocess.run(
        [str(script), "plugins", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert "goodfake" in {s["scheme"] for s in data["schemes"]}
    assert {f["plugin"] for f in data["failures"]} >= {"brokenimport", "raising", "nohook"}
    table = subprocess.run(
        [str(script), "plugins"], env=env, capture_output=True, text=True, timeout=120
    )
    assert table.returncode == 0
    assert "plugins that failed to load" in table.stdout
    assert "database driver refused to initialize" in table.stdout
    assert "good-store-plugin 1.0" in table.stdout


def test_cli_plugins_verbose_shows_tracebacks(site: FakeSite) -> None:
    add_broken(site)
    reload_with_warnings()
    result = CliRunner().invoke(cli_main, ["plugins", "--verbose"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "Traceback" in result.output
    assert "RuntimeError: database driver refused to initialize" in result.output


# -- the registry on its own -----------------------------------------------------------------------


def test_unknown_scheme_lists_installed_schemes_and_the_extra() -> None:
    registry = BackendRegistry()
    registry.add("memory", "checkpoint_stores.backends.memory:MemoryBackend")
    registry.add("file", "checkpoint_stores.backends.file:FileBackend")
    with pytest.raises(BackendNotFoundError) as info:
        registry.entry("s3")
    message = str(info.value)
    assert "no checkpoint-stores backend for scheme 's3'" in message
    assert "Installed schemes: file, memory." in message
    assert 'pip install "checkpoint-stores[s3]"' in message
    with pytest.raises(BackendNotFoundError) as unknown:
        registry.entry("mydb")
    assert "Installed schemes: file, memory." in str(unknown.value)
    assert "pip install" not in str(unknown.value)  # no extra is known for it
    with pytest.raises(BackendNotFoundError, match="Installed schemes: none"):
        BackendRegistry().entry("memory")


@pytest.mark.parametrize(
    ("scheme", "extra", "expected"),
    [
        ("fakedb", "fake-extra", 'pip install "checkpoint-stores[fake-extra]"'),
        ("redis", None, 'pip install "checkpoint-stores[redis]"'),  # the known extra
        ("mydb", None, "install the package that provides 'cs_test_missing_module'"),
    ],
)
def test_missing_driver_names_what_to_install(
    scheme: str, extra: str | None, expected: str
) -> None:
    registry = BackendRegistry()
    registry.add(scheme, "cs_test_missing_module:Backend", extra=extra)
    with pytest.raises(MissingDependencyError) as info:
        registry.factory(scheme)
    assert expected in str(info.value)
    assert "cs_test_missing_module" in str(info.value)


def test_missing_attribute_is_reported_to_the_plugin_authors() -> None:
    registry = BackendRegistry()
    registry.add("oops", "checkpoint_stores.backends.memory:NoSuchClass")
    with pytest.raises(BackendNotFoundError, match="has no attribute 'NoSuchClass'"):
        registry.factory("oops")


def test_add_checks_targets_and_conflicts() -> None:
    registry = BackendRegistry()
    with pytest.raises(ValueError, match=r"must look like 'package\.module:Class'"):
        registry.add("x", "package.module.Class")
    registry.add("Mem", MemoryBackend, aliases=["MEM2"])
    assert registry.schemes() == ["mem", "mem2"]
    assert registry.factory("mem") is MemoryBackend
    assert registry.entry("mem").target_name.endswith(":MemoryBackend")
    registry.add("mem", MemoryBackend)  # the same plugin may re-register
    registry._origin.plugin = "another-plugin"
    with pytest.raises(ValueError, match="already registered by plugin '<direct>'"):
        registry.add("mem", "a.b:C")
    registry.add("mem", "a.b:C", replace=True)
    assert registry.entry("mem").target_name == "a.b:C"
