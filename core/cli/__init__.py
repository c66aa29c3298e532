"""The ``checkpoint-stores`` command line.

Each command lives in its own module and is imported only when it runs, so
``checkpoint-stores --help`` stays fast and a command's heavy imports (the
pytest kit, a driver) cost nothing to the others.
"""

from __future__ import annotations

import importlib
from typing import Any, Final

import click

from checkpoint_stores import __version__

__all__ = ["main"]

# command name -> "module:attribute" (a click.Command)
COMMANDS: Final[dict[str, str]] = {
    "conformance": "checkpoint_stores.cli.conformance:conformance",
    "copy": "checkpoint_stores.cli.copy:copy",
    "demo": "checkpoint_stores.cli.demo:demo",
    "inspect": "checkpoint_stores.cli.inspect:inspect",
    "plugins": "checkpoint_stores.cli.plugins:plugins",
    "prune": "checkpoint_stores.cli.prune:prune",
    "rotate": "checkpoint_stores.cli.rotate:rotate",
    "stats": "checkpoint_stores.cli.stats:stats",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if self._load(name) is not None)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    @staticmethod
    def _load(name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # the command is not part of this build
                return None
            raise
        command: Any = getattr(module, attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="checkpoint-stores")
def main() -> None:
    """Durable, resumable agent-run checkpoints: inspect, copy, prune and test stores."""
