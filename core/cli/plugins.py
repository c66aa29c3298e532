"""``checkpoint-stores plugins``: what is installed, from where, and what failed."""

from __future__ import annotations

import json

import click
from rich.table import Table

from checkpoint_stores.cli._common import console
from checkpoint_stores.plugins import get_registry


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks of plugins that failed.")
def plugins(as_json: bool, verbose: bool) -> None:
    """List backend schemes, the distribution providing each, and plugin load errors."""
    registry = get_registry()
    entries = [registry.entries[s] for s in registry.schemes()]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "schemes": [
                        {
                            "scheme": e.scheme,
                            "plugin": e.plugin,
                            "distribution": e.distribution,
                            "version": e.version,
                            "target": e.target_name,
                            "extra": e.extra,
                            "description": e.description,
                        }
                        for e in entries
                    ],
                    "failures": [
                        {
                            "plugin": f.plugin,
                            "distribution": f.distribution,
                            "version": f.version,
                            "error": f.error,
                        }
                        for f in registry.failures
                    ],
                },
                indent=2,
            )
        )
        return
    table = Table(title="checkpoint-stores backends", title_justify="left")
    for column in ("scheme", "plugin", "distribution", "target", "extra"):
        table.add_column(column)
    for e in entries:
        dist = f"{e.distribution} {e.version}" if e.distribution else "-"
        table.add_row(e.scheme, e.plugin, dist, e.target_name, e.extra or "-")
    console.print(table)
    if registry.failures:
        failed = Table(title="plugins that failed to load", title_justify="left", style="red")
        for column in ("plugin", "distribution", "error"):
            failed.add_column(column)
        for f in registry.failures:
            dist = f"{f.distribution} {f.version}" if f.distribution else "-"
            failed.add_row(f.plugin, dist, f.error)
        console.print(failed)
        if verbose:
            for f in registry.failures:
                console.print(f"[bold]{f.plugin}[/]\n{f.detail}", highlight=False)
