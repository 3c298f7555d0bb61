"""`convowatch dashboards build | check | push`: the Grafana dashboards as code.

``build`` writes the generated JSON (one ``<uid>.json`` per dashboard) and
the alert files (Prometheus rules, Grafana-managed rules and their
provisioning file, `dashboards.alert_files`), ``check`` exits 1 listing the
files that differ from their generators (for CI),
``push`` saves them into a Grafana through its HTTP API with the token from
``CONVOWATCH_GRAFANA_TOKEN``. Registered on the CLI in `stream.commands.cli`, which
prints a `PushError`, `PushTargetError` or `CatalogError` (all `ConvowatchError`) as one ``convowatch: error: ...`` line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from dashboards import alert_files, catalog
from dashboards.push import DEFAULT_FOLDER, DEFAULT_TIMEOUT_S, TOKEN_ENV, push

_DIR = click.Path(file_okay=False, path_type=Path)


@click.group("dashboards")
def dashboards() -> None:
    """Grafana dashboards as code: build the JSON, check it is current, push it to a Grafana."""


@dashboards.command("build")
@click.option("--out", type=_DIR, default=catalog.DEFAULT_DIR, show_default=True, help="Directory to write <uid>.json files to.")
def build(out: Path) -> None:
    """Write every dashboard's JSON model, and the alert files into the repository checkout."""
    for path in [*catalog.write(out), *alert_files.write()]:
        click.echo(f"wrote {path}")


@dashboards.command("check")
@click.option(
    "--dir",
    "directory",
    type=_DIR,
    default=catalog.DEFAULT_DIR,
    show_default=True,
    help="Directory holding the committed <uid>.json files.",
)
def check(directory: Path) -> None:
    """Exit 1 when the dashboards in --dir or the alert files differ from what the generators make now."""
    problems = [*catalog.check(directory), *alert_files.check()]
    if problems:
        for problem in problems:
            click.echo(problem, err=True)
        sys.exit(1)
    click.echo(
        f"{len(catalog.dashboards())} dashboards in {directory} and {len(alert_files.generated())} alert files match the generators"
    )


@dashboards.command("push")
@click.option("--url", required=True, help="Grafana base URL, e.g. https://grafana.example.com (token from $" + TOKEN_ENV + ").")
@click.option(
    "--folder", default=DEFAULT_FOLDER, show_default=True, help="Grafana folder to save the dashboards in (created if missing)."
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.1),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for each Grafana request.",
)
def push_command(url: str, folder: str, timeout_s: float) -> None:
    """Save every dashboard into Grafana, overwriting by uid (idempotent)."""
    token = os.environ.get(TOKEN_ENV) or None
    for pushed in push(url, token, catalog.dashboards(), folder=folder, timeout_s=timeout_s):
        click.echo(f"pushed {pushed.uid} (version {pushed.version}) {pushed.url}")
