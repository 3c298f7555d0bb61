"""`convowatch scorers`: register scorer versions, shadow and compare a candidate, promote it (docs/rollout.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from scorers.statistics import ConfidenceInterval
from stream.commands.terminal import shown
from stream.registry import RegistryError, ScorerRegistry
from stream.settings import Settings


def _registry(settings: Settings) -> ScorerRegistry:
    if settings.scoring.registry is None:
        raise RegistryError(
            "no scorer registry is configured: set scoring.registry (CONVOWATCH_SCORING__REGISTRY) to a directory "
            "the workers can read"
        )
    return ScorerRegistry(settings.scoring.registry)


def _applies_within(settings: Settings) -> str:
    return f"workers switch within {settings.scoring.registry_poll_s:g} s plus the time to load it"


@click.group()
def scorers() -> None:
    """Scorer versions: rubric sets and calibrators rolled out to running workers without a restart.

    \b
    convowatch scorers register v2 --rubric-set v2.json --calibrator cal-v2/
    convowatch scorers shadow v2 --rate 0.2      # v2 scores 20 % beside the active version
    convowatch scorers compare --since 7d        # agreement, label shares, agreement with users, with CIs
    convowatch scorers promote v2                # v2 becomes the active version
    """


@scorers.command("register")
@click.argument("name")
@click.option("--rubric-set", "rubric_set", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--calibrator",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="A saved calibrator directory (convowatch calibrate train/adapt); none: labels and NetSAT only.",
)
@click.pass_obj
def register_cmd(obj: Any, name: str, rubric_set: Path, calibrator: Path | None) -> None:
    """Copy a rubric set (and calibrator) into the registry as version NAME; both are loaded first, names are final."""
    registry = _registry(obj.settings)
    version = registry.register(name, rubric_set, calibrator)
    cal = f", calibrator {version.calibrator_version}" if version.calibrator is not None else ", no calibrator"
    click.echo(f"registered {name}: rubric set {version.rubric_set.version}{cal} in {registry.root}")


@scorers.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the versions and the rollout as JSON.")
@click.pass_obj
def list_cmd(obj: Any, as_json: bool) -> None:
    """The registered versions, the active one and the shadow."""
    registry = _registry(obj.settings)
    rollout = registry.rollout()
    names = registry.names()
    if as_json:
        click.echo(json.dumps({"versions": names, **rollout.to_dict()}, indent=2))
        return
    if not names:
        click.echo(f"no versions in {registry.root}; register one with `convowatch scorers register`")
    for name in names:
        role = "active" if name == rollout.active else f"shadow on {rollout.shadow_rate:.0%}" if name == rollout.shadow else ""
        click.echo(f"{name:<32} {role}".rstrip())


@scorers.command("promote")
@click.argument("name")
@click.pass_obj
def promote_cmd(obj: Any, name: str) -> None:
    """Make NAME the active version (it is loaded and checked first); a shadow of that name stops shadowing."""
    registry = _registry(obj.settings)
    before = registry.rollout().active
    registry.promote(name)
    click.echo(f"{name} is now the active scorer version (was {before or 'none'}); {_applies_within(obj.settings)}")


@scorers.command("shadow")
@click.argument("name", required=False)
@click.option(
    "--rate",
    type=click.FloatRange(0, 1, min_open=True),
    default=None,
    help="Share of the conversations the active version judges that NAME scores too.",
)
@click.option("--off", is_flag=True, help="Stop shadowing.")
@click.pass_obj
def shadow_cmd(obj: Any, name: str | None, rate: float | None, off: bool) -> None:
    """Score a share of the judged conversations with NAME too, stored apart (shadow_scores) and feeding no alert."""
    registry = _registry(obj.settings)
    if off:
        if name is not None or rate is not None:
            raise click.UsageError("--off takes no NAME or --rate")
        registry.stop_shadow()
        click.echo(f"no shadow version; {_applies_within(obj.settings)}")
        return
    if name is None or rate is None:
        raise click.UsageError("give NAME and --rate (or --off)")
    rollout = registry.start_shadow(name, rate)
    click.echo(f"{name} shadows {rollout.active} on {rate:.0%} of judged conversations; {_applies_within(obj.settings)}")


@scorers.command("compare")
@click.option("--active", default=None, help="The active version's name (default: the registry's active version).")
@click.option("--candidate", default=None, help="The shadow version's name (default: the registry's shadow).")
@click.option(
    "--since", required=True, help="Start of the window: a duration back from now (30m, 6h, 7d, 2w) or an ISO 8601 time."
)
@click.option("--until", default=None, help="End of the window (same forms; default: now).")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.pass_obj
def compare_cmd(obj: Any, active: str | None, candidate: str | None, since: str, until: str | None, as_json: bool) -> None:
    """Compare a shadow version with the active one on the conversations both scored (closed in the window).

    With the embedded store, stop the sink first (only one process may open it).
    """
    from stream.report.comparison import load_comparison
    from stream.report.data import resolve_window
    from stream.store import ClickHouseStore

    if active is None or candidate is None:
        rollout = _registry(obj.settings).rollout()
        active, candidate = active or rollout.active, candidate or rollout.shadow
        if active is None or candidate is None:
            raise RegistryError("the registry has no active or no shadow version: name them with --active and --candidate")
    window = resolve_window(since, until)
    with ClickHouseStore.open(obj.settings.store) as store:
        c = load_comparison(store, active, candidate, window.since, window.until)
    if as_json:
        click.echo(json.dumps(c.as_dict(), indent=2))
        return
    click.echo(
        f"{candidate} (shadow) against {active} (active), conversations closed {c.since:%Y-%m-%d %H:%M} .. {c.until:%Y-%m-%d %H:%M} UTC"
    )
    if c.pairs == 0 or c.active is None or c.candidate is None or c.label_agreement is None:
        click.echo(f"no conversation was scored by both ({c.shadow_unscored} the shadow could not score)")
        return
    click.echo(f"{c.pairs} conversations scored by both; {c.shadow_unscored} the shadow could not score")
    click.echo(f"same label: {_ci(c.label_agreement, '.0%')}   Cohen's kappa: {_ci(c.kappa, '.2f')}")
    click.echo(f"{'labels (rows active, columns shadow)':<40}" + "".join(f"{label:>11}" for label in c.labels))
    for label, row in c.labels.items():
        click.echo(f"  {label:<38}" + "".join(f"{n:>11}" for n in row.values()))
    for v in (c.active, c.candidate):
        hashes = ", ".join(shown(h) for h in v.scorer_versions)
        mean_p = "-" if v.mean_dissatisfaction_probability is None else f"{v.mean_dissatisfaction_probability:.3f}"
        click.echo(
            f"{v.name} ({hashes}): dsat {_ci(v.dsat_share, '.0%')}, uncertain {_ci(v.uncertain_share, '.0%')}, mean P(dsat) {mean_p}"
        )
    click.echo(f"difference shadow - active: dsat share {_ci(c.dsat_share_difference, '+.1%')}, "
               f"mean P(dsat) {_ci(c.dissatisfaction_probability_difference, '+.3f')}")  # fmt: skip
    for v in (c.active, c.candidate):
        u = v.users
        if u is None:
            click.echo(f"{v.name} and users: no conversation scored by both has a user rating")
            continue
        click.echo(
            f"{v.name} and users: dsat when rated down {_ci(u.dsat_when_rated_down, '.0%')} of {u.rated_down}, "
            f"sat when rated up {_ci(u.sat_when_rated_up, '.0%')} of {u.rated_up}, AUROC NetSAT {_ci(u.auroc_netsat, '.2f')}, "
            f"AUROC P(sat) {_ci(u.auroc_calibrated, '.2f')}"
        )
    click.echo("95 % intervals: Wilson for shares, bootstrap (pairs resampled) for kappa and differences.")


def _ci(ci: ConfidenceInterval | None, spec: str) -> str:
    if ci is None:
        return "-"
    return f"{format(ci.estimate, spec)} ({format(ci.low, spec)} .. {format(ci.high, spec)})"
