"""`convowatch learn` (RUBICON rubric learning) and `convowatch data uss` (USS files -> labelled JSONL).

Both are click commands registered on the CLI in `stream.commands.cli`: ``learn`` on the
top-level group, ``uss_command`` as ``data uss``. They read settings through
the CLI's context object (``obj.settings``) like every other command. Bad
input or configuration raises a `scorers.errors.UserError` (the CLI prints any
`ConvowatchError` as one ``convowatch: error: ...`` line, exit code 2).
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from scorers.datasets.labelled import LabelledConversation, load_labelled_jsonl, write_labelled_jsonl
from scorers.datasets.uss import read_uss, stratified_split, uss_labelled
from scorers.learning.learner import METHODS, RubricLearner, write_report
from scorers.learning.pool import RubricPool, merge, seed_pool
from scorers.learning.score_cache import ScoreCache
from scorers.learning.selection import DEFAULT_ALPHAS, LearningError
from scorers.rubrics import DEFAULT_PRECISION, RubricSet
from stream.settings import Settings, SettingsError

if TYPE_CHECKING:
    from stream.report.data import Window

SCORE_CACHE_FILE = "rubric-scores.sqlite"
PREFLIGHT_PROMPT = "Reply with the single word OK."

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


class _StageProgress:
    """A progress bar on stderr per stage of a ``progress(stage, done, total)`` callback."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._stage: str | None = None
        self._done = 0

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self._stage:
            self.close()
            self._stage, self._done = stage, 0
            self._bar = click.progressbar(length=total, label=stage, file=sys.stderr, show_pos=True)
            self._bar.__enter__()
        self._bar.update(done - self._done)
        self._done = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None
            self._stage = None


def _say(message: str) -> None:
    click.echo(message, err=True)


def _read_domain(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LearningError(f"{path}: cannot read the domain description: {e}") from e
    if not text.strip():
        raise LearningError(f"{path}: the domain description is empty (say what the assistant is for and what success means)")
    return text


def _generator(settings: Settings, base_url: str | None, model: str | None, seed: int) -> Any:
    """The generator named on the command line, else the judge's endpoint or local model from settings."""
    from scorers.learning.generators import LocalGenerator, OpenAIGenerator

    j = settings.judge
    if (base_url is None) != (model is None):
        raise click.UsageError("--generator-base-url and --generator-model go together")
    if base_url is not None and model is not None:
        # The judge's API key is only sent to the judge's own endpoint.
        key = j.api_key.get_secret_value() if j.api_key and base_url == j.base_url else None
        return OpenAIGenerator(
            base_url=base_url,
            model=model,
            api_key=key,
            seed=seed,
            max_retries=j.max_retries,
            backoff_initial_s=j.backoff_initial_s,
            backoff_max_s=j.backoff_max_s,
        )
    if j.backend == "openai":
        if j.base_url is None or j.model is None:
            raise SettingsError(
                "a generated pool needs a generator: --generator-base-url/--generator-model, or judge.base_url and judge.model"
            )
        key = j.api_key.get_secret_value() if j.api_key else None
        return OpenAIGenerator(
            base_url=j.base_url,
            model=j.model,
            api_key=key,
            seed=seed,
            max_retries=j.max_retries,
            backoff_initial_s=j.backoff_initial_s,
            backoff_max_s=j.backoff_max_s,
        )
    if j.backend == "local":
        return LocalGenerator(j.local_model, cache_dir=settings.cache_dir, seed=seed)
    raise SettingsError(
        "a generated pool needs a generator: pass --generator-base-url and --generator-model "
        "(the recorded judge cannot write text)"
    )


def _generated_pool(
    settings: Settings,
    labelled: list[LabelledConversation],
    domain: str,
    existing: RubricPool | None,
    base_url: str | None,
    model: str | None,
    seed: int,
    pool_out: Path,
    progress: _StageProgress,
) -> RubricPool:
    from scorers.learning.embeddings import EmbeddingModelError, SentenceEmbedder
    from scorers.learning.generation import RubricGenerationError, generate_pool
    from scorers.learning.generators import GeneratorError

    try:
        generator = _generator(settings, base_url, model, seed)
        # One tiny call first, so an unreachable generator fails in seconds, not after every conversation is skipped.
        generator.generate(PREFLIGHT_PROMPT, max_tokens=2, temperature=0.0)
    except GeneratorError as e:
        raise LearningError(f"cannot use the generator: {e}") from e
    _say(f"generating rubrics with {generator!r} from {len(labelled)} conversations")
    text_redactor = settings.redaction.redactor()
    if text_redactor is not None:  # the generator reads the conversations too, and may be a third party
        labelled = [dataclasses.replace(i, conversation=text_redactor.redact_conversation(i.conversation)[0]) for i in labelled]
    try:
        pool, report = generate_pool(
            generator, labelled, domain, SentenceEmbedder(), existing=existing, seed=seed, progress=progress
        )
    except (GeneratorError, RubricGenerationError, EmbeddingModelError) as e:
        raise LearningError(f"rubric generation failed: {e}") from e
    finally:
        progress.close()
    pool.save(pool_out)
    _say(
        f"generated {len(pool)} rubrics ({report.rubrics['sat']} SAT, {report.rubrics['dsat']} DSAT; "
        f"{report.duplicates} near-duplicates dropped, {len(report.skipped)} item(s) skipped) -> {pool_out}; "
        f"generator: {report.calls} calls, {report.prompt_tokens} prompt + {report.completion_tokens} completion tokens"
    )
    return pool


def answer_cache_option(condition: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--cache FILE``: the judge-answer cache (SQLite) that `learn` and `calibrate adapt --labels` share; its help
    starts with ``condition`` (e.g. "With --labels: the ")."""
    return click.option(
        "--cache",
        "cache_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help=(condition or "The ") + "judge-answer cache (SQLite), shared by `learn` and `calibrate adapt --labels` "
        f"[default: CACHE_DIR/{SCORE_CACHE_FILE}].",
    )


def store_window_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--since, --until and --where: which stored conversations a --from-store command reads."""
    for option in reversed(
        (
            click.option(
                "--since", default=None, help="With --from-store: conversations closed since (30m, 6h, 7d, 2w or ISO 8601)."
            ),
            click.option("--until", default=None, help="With --from-store: ... and before (same forms; default: now)."),
            click.option(
                "--where",
                "where_items",
                multiple=True,
                metavar="KEY=VALUE",
                help="With --from-store: only conversations with this attribute value (repeatable), e.g. product=help-bot.",
            ),
        )
    ):
        command = option(command)
    return command


def store_window(since: str | None, until: str | None, where_items: tuple[str, ...]) -> tuple[Window, dict[str, str], str]:
    """The window and attribute filter of --since/--until/--where, and how to say it; `UsageError` without --since."""
    from stream.report.data import resolve_window

    if since is None:
        raise click.UsageError("--from-store needs --since (e.g. --since 30d)")
    where: dict[str, str] = {}
    for item in where_items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--where")
        where[key] = value
    window = resolve_window(since, until)
    span = f"closed {window.since.isoformat()} .. {window.until.isoformat()}" + "".join(f", {k}={v}" for k, v in where.items())
    return window, where, span


@click.command("learn")
@click.option(
    "--data",
    "data_path",
    type=_FILE,
    default=None,
    help="Labelled conversations (JSONL: conversation_id, label positive/negative, turns). Or --from-store.",
)
@click.option(
    "--from-store",
    is_flag=True,
    help="Learn from the stored conversations users rated (thumbs up/down) instead of --data; needs --since.",
)
@store_window_options
@click.option(
    "--on-conflict",
    type=click.Choice(["exclude", "negative"]),
    default="exclude",
    show_default=True,
    help="With --from-store: a conversation rated both up and down is left out (and counted), or negative.",
)
@click.option(
    "--domain",
    "domain_path",
    type=_FILE,
    required=True,
    help="Domain description (text/Markdown): what the assistant is for and what success means.",
)
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Where to write the learned rubric set (JSON)."
)
@click.option(
    "--pool",
    "pool_kind",
    type=click.Choice(["seed", "generated", "both"]),
    default="seed",
    show_default=True,
    help="Candidate rubrics: the shipped seed pool, rubrics generated from --data, or both.",
)
@click.option(
    "--pool-file",
    type=_FILE,
    default=None,
    help="A rubric pool file to use as the generated pool (e.g. saved by an earlier run) instead of generating.",
)
@click.option(
    "--pool-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to save a newly generated pool [default: OUT with suffix .pool.json].",
)
@click.option(
    "--candidates",
    "candidates_path",
    type=_FILE,
    default=None,
    help="Select from the rubrics of this rubric-set file instead of a pool (any answer scales).",
)
@click.option("--generator-base-url", default=None, help="OpenAI-compatible endpoint that writes rubrics [default: the judge's].")
@click.option("--generator-model", default=None, help="Model name at --generator-base-url.")
@click.option("--n-sat", type=click.IntRange(min=0), default=10, show_default=True, help="SAT rubrics to select.")
@click.option("--n-dsat", type=click.IntRange(min=0), default=10, show_default=True, help="DSAT rubrics to select.")
@click.option(
    "--precision",
    type=click.FloatRange(0.5, 1.0, min_open=True),
    default=DEFAULT_PRECISION,
    show_default=True,
    help="Target precision P of the confidence windows.",
)
@click.option("--folds", type=click.IntRange(min=2), default=5, show_default=True, help="Cross-validation folds for α.")
@click.option(
    "--alphas",
    default=",".join(f"{a:g}" for a in DEFAULT_ALPHAS),
    show_default=True,
    help="Comma-separated α grid (weight of the sharpness loss).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the folds, UCB and generation batching.")
@click.option(
    "--method",
    type=click.Choice(list(METHODS)),
    default="greedy",
    show_default=True,
    help="greedy = RUBICON Algorithm 1; brute_force and ucb are the paper's baselines.",
)
@answer_cache_option()
@click.option(
    "--report-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also write report.json and precision_curves.png here.",
)
@click.pass_obj
def learn(
    obj: Any,
    data_path: Path | None,
    from_store: bool,
    since: str | None,
    until: str | None,
    where_items: tuple[str, ...],
    on_conflict: str,
    domain_path: Path,
    out: Path,
    pool_kind: str,
    pool_file: Path | None,
    pool_out: Path | None,
    candidates_path: Path | None,
    generator_base_url: str | None,
    generator_model: str | None,
    n_sat: int,
    n_dsat: int,
    precision: float,
    folds: int,
    alphas: str,
    seed: int,
    method: str,
    cache_path: Path | None,
    report_dir: Path | None,
) -> None:
    """Learn a rubric set (RUBICON) from labelled conversations with the configured judge.

    \b
    1. candidate rubrics: the seed pool, generated ones (--pool), or a pool/rubric-set file,
    2. the judge rates every candidate on every conversation once (cached in --cache),
    3. α by cross-validation, greedy selection of --n-sat SAT and --n-dsat DSAT rubrics,
    4. threshold θ and confidence windows at --precision on the same data.

    \b
    The output loads with `convowatch run` (settings rubric_set). Examples:
      convowatch data uss --file MWOZ.txt --labelled-out train.jsonl --n-per-class 20 --split-out-test test.jsonl
      convowatch learn --data train.jsonl --domain domain.md --out rubricset.json --report-dir report/
      convowatch learn --from-store --since 30d --where product=help-bot --domain domain.md --out rubricset.json
    """
    settings: Settings = obj.settings
    judge = obj.judge()  # configuration errors first, before any work
    try:
        alpha_grid = tuple(float(a) for a in alphas.split(",") if a.strip())
    except ValueError:
        raise click.BadParameter(f"{alphas!r} is not a comma-separated list of numbers", param_hint="--alphas") from None
    learner = RubricLearner(
        n_sat=n_sat, n_dsat=n_dsat, precision=precision, alphas=alpha_grid, folds=folds, seed=seed, method=method
    )
    labelled, source = _training_data(settings, data_path, from_store, since, until, where_items, on_conflict)
    learner.check_data(labelled, where=source["where"])  # no judge or generator call before the data are known usable
    domain = _read_domain(domain_path)
    if candidates_path is not None and (pool_file is not None or pool_kind != "seed"):
        raise click.UsageError("--candidates replaces the pool: do not combine it with --pool or --pool-file")
    if pool_file is not None and pool_kind == "seed":
        raise click.UsageError("--pool-file is the generated pool: use it with --pool generated or --pool both")

    progress = _StageProgress()
    if candidates_path is not None:
        pool: Any = RubricSet.load(candidates_path).rubrics
        pool_name = f"rubrics of {candidates_path.name}"
    else:
        seed_rubrics = seed_pool() if pool_kind in ("seed", "both") else None
        generated = None
        if pool_kind in ("generated", "both"):
            if pool_file is not None:
                generated = RubricPool.load(pool_file)
            else:
                target = pool_out or out.with_suffix(".pool.json")
                generated = _generated_pool(
                    settings, labelled, domain, seed_rubrics, generator_base_url, generator_model, seed, target, progress
                )
        parts = [p for p in (seed_rubrics, generated) if p is not None]
        pool = parts[0] if len(parts) == 1 else merge(*parts, metadata={"name": "seed+generated"})
        pool_name = str(pool.metadata.get("name") or pool_kind)
    _say(
        f"{len(labelled)} conversations ({sum(i.positive for i in labelled)} positive); {len(pool)} candidate rubrics ({pool_name}); "
        f"judge {getattr(judge, 'model', judge.name)}"
    )

    cache_file = cache_path or settings.cache_dir / SCORE_CACHE_FILE
    with ScoreCache(cache_file) as cache:
        try:
            learner.fit(pool, labelled, judge, cache, progress=progress)
        finally:
            progress.close()
    rubric_set = learner.rubric_set_
    extra = {
        "domain_sha256": hashlib.sha256(domain.strip().encode("utf-8")).hexdigest()[:16],
        **source["metadata"],
        "pool_kind": "candidates" if candidates_path is not None else pool_kind,
    }
    rubric_set = RubricSet(rubric_set.rubrics, rubric_set.windows, {**rubric_set.metadata, **extra})
    rubric_set.save(out)
    RubricSet.load(out)  # what `convowatch run` will do: refuse to report success on a file it cannot load
    report = learner.report_
    for warning in report.warnings:
        _say(f"warning: {warning}")
    if report_dir is not None:
        paths = write_report(report, rubric_set, learner.selected_ratings_, learner.labels_, report_dir)
        _say(f"report: {paths['report']}, {paths['plot']}")
    w = rubric_set.windows
    n_sat_chosen = sum(1 for s in report.selected if s.polarity == "sat")
    t = report.training
    click.echo(
        f"wrote {out} (version {rubric_set.version}): {n_sat_chosen} SAT + {len(report.selected) - n_sat_chosen} DSAT rubrics "
        f"({method}, α={report.alpha:g}); θ={w.threshold:.2f}, dsat window ≤ {_edge(w.dsat_upper)}, "
        f"sat window ≥ {_edge(w.sat_lower)} at P={w.precision:g}; training ΔNetSAT {t.delta_netsat:.2f}, "
        f"YR {t.yield_rate:.0%}, accuracy {t.accuracy:.2f}"
    )
    r = report.rating
    click.echo(
        f"judge: {r.judge_calls} calls in {r.judge_requests} requests, {r.prompt_tokens} prompt + {r.completion_tokens} "
        f"completion tokens; {r.cache_hits} answers from the cache, {r.cache_misses} asked; {report.wall_s:.1f}s"
    )


def _training_data(
    settings: Settings,
    data_path: Path | None,
    from_store: bool,
    since: str | None,
    until: str | None,
    where_items: tuple[str, ...],
    on_conflict: str,
) -> tuple[list[LabelledConversation], dict[str, Any]]:
    """The labelled conversations of --data or --from-store, and how to name and record their source."""
    store_options = since is not None or until is not None or where_items
    if (data_path is None) == (not from_store):
        raise click.UsageError("give either --data FILE or --from-store (with --since)")
    if data_path is not None:
        if store_options:
            raise click.UsageError("--since, --until and --where select stored conversations: use them with --from-store")
        return load_labelled_jsonl(data_path), {"where": str(data_path), "metadata": {"training_file": data_path.name}}
    from stream.feedback_labels import FeedbackLabelRules, OnConflict, labelled_from_store
    from stream.store import ClickHouseStore

    window, where, span = store_window(since, until, where_items)
    with ClickHouseStore.open(settings.store) as store:
        found = labelled_from_store(store, window.since, window.until, where, FeedbackLabelRules(cast(OnConflict, on_conflict)))
    _say(
        f"from the store: {len(found.conversations)} rated conversations {span} "
        f"({sum(c.positive for c in found.conversations)} positive; {found.conflicts} rated both up and down, excluded)"
    )
    if not found.conversations:
        raise click.ClickException(f"no rated conversations in the store {span}: nothing to learn from")
    return found.conversations, {"where": f"the store ({span})", "metadata": {"training_data": found.metadata()}}


def _edge(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f}"


@click.command("uss")
@click.option("--file", "uss_file", type=_FILE, required=True, help="A USS dialogue file (MWOZ.txt, SGD.txt, ...).")
@click.option(
    "--labelled-out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Where to write the labelled conversations (JSONL); the training part with --split-out-test.",
)
@click.option(
    "--n-per-class",
    type=click.IntRange(min=2),
    default=None,
    help="Draw this many positive and this many negative dialogues at random, before the split (default: all).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the draw and the split.")
@click.option(
    "--split-out-test",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Split each class 50/50 and write the test half here.",
)
def uss_command(uss_file: Path, labelled_out: Path, n_per_class: int | None, seed: int, split_out_test: Path | None) -> None:
    """Labelled conversations from a USS file (User Satisfaction Simulation, Sun et al. 2021).

    A dialogue is negative when its raters' mean OVERALL satisfaction is < 3,
    positive when it is >= 3.5; the ones in between are not written (their
    count is reported).
    """
    labelled, middle = uss_labelled(read_uss(uss_file))
    n_pos = sum(1 for i in labelled if i.positive)
    _say(
        f"{uss_file}: {len(labelled) + len(middle)} dialogues: {n_pos} positive (mean OVERALL >= 3.5), "
        f"{len(labelled) - n_pos} negative (< 3), {len(middle)} in between (not written)"
    )
    if split_out_test is not None:
        train, test = stratified_split(labelled, 0.5, n_per_class, seed)
        write_labelled_jsonl(split_out_test, test)
        click.echo(f"wrote {len(test)} test conversations ({sum(i.positive for i in test)} positive) to {split_out_test}")
    elif n_per_class is not None:
        train, test = stratified_split(labelled, 0.5, n_per_class, seed)
        order = {id(item): k for k, item in enumerate(labelled)}
        train = sorted(train + test, key=lambda item: order[id(item)])  # the draw only, in file order
    else:
        train = labelled
    write_labelled_jsonl(labelled_out, train)
    click.echo(f"wrote {len(train)} labelled conversations ({sum(i.positive for i in train)} positive) to {labelled_out}")
