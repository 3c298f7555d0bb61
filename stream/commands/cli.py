"""The `convowatch` command line: the one place that wires scorers, stream and dashboards.

Run ``convowatch --help`` (or ``convowatch COMMAND --help``) for a tour.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from scorers.conversation import Conversation
from scorers.datasets.answer_labels import AnswerLabels, load_answer_labels
from scorers.datasets.labelled import (
    LabelledConversation,
    load_labelled_jsonl,
    require_both_classes,
    write_labelled_jsonl,
)
from scorers.datasets.llm_rubric import (
    NEGATIVE_MAX_MEAN_Q0,
    OPTIONAL_QUESTIONS,
    QUESTIONS_FILE,
    REAL_CONVERSATIONS_FILE,
    RubricData,
    RubricDataError,
    build_data,
    dimension_rubric_set,
    load_features,
    load_labels,
    load_real_conversations,
    load_split,
    satisfaction_labels,
)
from scorers.early_stopping import MOMENTS_KEY, EarlyStoppingScorer, ScoreMoments
from scorers.errors import ConvowatchError
from scorers.evaluation import (
    BootstrapSettings,
    Evaluation,
    Figure,
    compare_rubric_sets,
    conversation_rows,
    evaluate_rubric_set,
    group_values,
)
from scorers.json_file import write_json
from scorers.judges.base import Judge
from scorers.questions import Question, load_questions
from scorers.redaction import RedactingJudge
from scorers.rubrics import DEFAULT_PRECISION, RubricSet
from stream.budget import BudgetedJudge
from stream.commands.dashboards import dashboards
from stream.commands.judge import judge
from stream.commands.learn import (
    SCORE_CACHE_FILE,
    _say,
    answer_cache_option,
    learn,
    store_window,
    store_window_options,
    uss_command,
)
from stream.commands.scorers import scorers
from stream.commands.terminal import shown
from stream.judge_factory import judge_from_settings
from stream.log_privacy import keep_conversation_text_out_of_logs
from stream.settings import Settings, load_settings
from stream.topics import ensure_topics

if TYPE_CHECKING:
    from scorers.calibrators import Calibrator
    from stream.feedback_labels import StoreAnswers


class _Context:
    """Settings, loaded on first use and then kept for the invocation."""

    def __init__(self) -> None:
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings()
            keep_conversation_text_out_of_logs(self._settings.log_conversation_text)
        return self._settings

    def judge(self) -> Judge:
        """The configured judge, within ``scoring.budget`` when a limit is set, reading conversations redacted when
        ``redaction.kinds`` are set (as the worker's judge does)."""
        s = self.settings
        budgeted = BudgetedJudge.wrap(judge_from_settings(s.judge, s.cache_dir), s.scoring.budget)
        return RedactingJudge.wrap(budgeted, s.redaction.redactor())


def _fail(message: str) -> None:
    click.echo(f"convowatch: error: {message}", err=True)
    sys.exit(2)


def _progress(iterable, label: str, length: int | None = None):
    return click.progressbar(iterable, label=label, length=length, file=sys.stderr, show_pos=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log debug detail to stderr.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """convowatch: a streaming quality monitor for chat conversations.

    \b
    Settings come from CONVOWATCH_* environment variables (nested with "__",
    e.g. CONVOWATCH_JUDGE__BACKEND=openai) and an optional YAML/TOML file named
    by CONVOWATCH_CONFIG. See `convowatch config` for the values in effect.
    """
    # Before anything logs: client libraries print payloads at DEBUG (-v); the settings may turn it off once loaded.
    keep_conversation_text_out_of_logs(False)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not verbose:
        # kafka-python narrates every connection attempt; failures reach the user as one convowatch error instead.
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per judge request otherwise
    ctx.obj = _Context()


@cli.command("config")
@click.pass_obj
def config_cmd(obj: _Context) -> None:
    """Print the settings in effect (secrets masked)."""
    click.echo(json.dumps(obj.settings.redacted(), indent=2))


# ------------------------------------------------------------------ rubrics


@cli.group()
def rubrics() -> None:
    """Rubric sets (RUBICON): score conversations, fit thresholds and windows, evaluate."""


_labelled_option = click.option(
    "--labelled",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="Labelled conversations (JSONL: conversation_id, label positive/negative, turns).",
)


def _rubric_scores(rubric_set: RubricSet, items: Sequence[LabelledConversation], judge: Judge) -> np.ndarray:
    """`RubricSet.rubric_scores` of the labelled conversations, with a progress bar."""
    with _progress(items, "judging") as bar:
        return rubric_set.rubric_scores(judge, (item.conversation for item in bar))


@rubrics.command("fit")
@click.option(
    "--rubric-set",
    "rubric_set_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="Rubric-set JSON whose rubrics to keep (its threshold and windows are replaced).",
)
@_labelled_option
@click.option(
    "--precision",
    type=click.FloatRange(0.5, 1.0, max_open=True),
    default=DEFAULT_PRECISION,
    show_default=True,
    help="Target precision P of the confidence windows.",
)
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Where to write the fitted rubric set."
)
@answer_cache_option()
@click.pass_obj
def rubrics_fit(
    obj: _Context, rubric_set_path: Path, labelled: Path, precision: float, out: Path, cache_path: Path | None
) -> None:
    """Fit the threshold θ and the confidence windows of a rubric set on labelled conversations.

    Every conversation is scored with the configured judge; θ is the midpoint
    of the two class means, and the windows are the NetSAT ranges where
    precision on this data reaches P. The rubric scores' mean and covariance go
    into the set's metadata (``score_moments``), for approximate early stopping.
    """
    judge = obj.judge()  # configuration errors first, before any work
    _check_output_path(out, "--out")
    rubric_set = RubricSet.load(rubric_set_path)
    items = load_labelled_jsonl(labelled)
    require_both_classes(items, str(labelled))
    (scores,) = _cached_scores(judge, [rubric_set], items, _cache_file(obj, cache_path))
    labels = np.array([i.positive for i in items])
    fitted = rubric_set.fit_windows(scores.sum(axis=1), labels, precision=precision)
    moments = ScoreMoments.fit([r.id for r in rubric_set.rubrics], scores)
    fitted = dataclasses.replace(fitted, metadata={**fitted.metadata, MOMENTS_KEY: moments.to_dict()})
    fitted.save(out)
    w = fitted.windows
    click.echo(
        f"wrote {out} (version {fitted.version}): θ={w.threshold:.2f}, "
        f"dsat window ≤ {_edge(w.dsat_upper)}, sat window ≥ {_edge(w.sat_lower)} at P={precision}"
    )


def _edge(value: float | None) -> str:
    return "none (no NetSAT reaches the precision)" if value is None else f"{value:.2f}"


def _evaluation_options(fn):
    """Options `rubrics evaluate` and `rubrics compare` share: output, grouping, intervals, the answer cache."""
    fn = answer_cache_option()(fn)
    fn = click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bootstrap resamples.")(fn)
    fn = click.option(
        "--bootstrap",
        "resamples",
        type=click.IntRange(min=100),
        default=BootstrapSettings().samples,
        show_default=True,
        help="Bootstrap resamples for the 95 % intervals (stratified by class, and by --by's attribute).",
    )(fn)
    fn = click.option(
        "--by",
        "by",
        default=None,
        help="Also report the figures per value of this conversation attribute (e.g. product); resamples keep "
        "each value's share.",
    )(fn)
    fn = click.option(
        "--per-conversation",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Write one row per conversation (and rubric set): NetSAT, labels, rubric scores. .csv for CSV, else JSONL.",
    )(fn)
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print the results as JSON (null and a reason for figures that cannot be computed).",
    )(fn)


def _cached_scores(
    judge: Judge, rubric_sets: Sequence[RubricSet], items: Sequence[LabelledConversation], cache_file: Path
) -> list[np.ndarray]:
    """Each set's signed rubric scores (conversations × rubrics), the judge asked only what the answer cache lacks."""
    from scorers.learning.score_cache import ScoreCache, rate

    conversations = [i.conversation for i in items]
    if any(not c.turns for c in conversations):  # e.g. LLM-Rubric's synthetic split: ids and recorded answers only
        _say("some conversations have no turns: the answer cache (keyed by content) is not used")
        return [_rubric_scores(rs, items, judge) for rs in rubric_sets]
    scores, hits, misses, requests = [], 0, 0, 0
    with ScoreCache(cache_file) as cache:
        for rs in rubric_sets:  # a question two sets share is asked for the first and read from the cache for the next
            with click.progressbar(length=len(conversations), label="judging", file=sys.stderr, show_pos=True) as bar:
                ratings = rate(judge, rs.rubrics, conversations, cache, progress=lambda done, total: bar.update(1))
            scores.append(np.stack([r.polarity.sign * ratings.matrix[:, j] for j, r in enumerate(rs.rubrics)], axis=1))
            hits, misses = hits + ratings.stats.cache_hits, misses + ratings.stats.cache_misses
            requests += ratings.stats.judge_requests
    _say(f"judge: {hits} answers from the cache, {misses} asked ({requests} requests)")
    return scores


def _cache_file(obj: _Context, cache_path: Path | None) -> Path:
    return cache_path or obj.settings.cache_dir / SCORE_CACHE_FILE


def _check_output_path(path: Path | None, option: str) -> None:
    """Refuse, before any judging, an output path that cannot be written: a directory, or in a missing directory."""
    if path is None:
        return
    if path.is_dir():
        raise click.UsageError(f"{option} {path}: a directory; give a file name")
    if not path.parent.is_dir():
        raise click.UsageError(f"{option} {path}: the directory {path.parent} does not exist")


def _groups(items: Sequence[LabelledConversation], by: str | None) -> list[str] | None:
    return None if by is None else group_values([i.conversation.attributes for i in items], by)


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """JSONL, or CSV (rubric scores as one column each) when the name ends in .csv."""
    if path.suffix.lower() != ".csv":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return
    flat = [
        {**{k: v for k, v in r.items() if k != "rubric_scores"}, **{f"rubric:{k}": v for k, v in r["rubric_scores"].items()}}
        for r in rows
    ]
    columns = list(dict.fromkeys(k for r in flat for k in r))
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)


_FIGURE_NAMES = {
    "delta_netsat": "ΔNetSAT",
    "yield_rate": "YR@P",
    "accuracy": "accuracy",
    "precision": "precision (sat)",
    "recall": "recall (sat)",
    "f1": "F1 (sat)",
    "confident_accuracy": "confident accuracy",
    "auroc": "AUROC",
    "average_precision": "average precision (sat)",
}


def _figure_text(f: Figure, digits: int = 3) -> str:
    if f.value is None:
        return f"— ({f.reason})"
    interval = f" ({f.low:.{digits}f}–{f.high:.{digits}f})" if f.low is not None else ""
    return f"{f.value:.{digits}f}{interval}"


def _echo_evaluation(e: Evaluation, rubric_set: RubricSet, settings: BootstrapSettings, by: str | None) -> None:
    strata = "class" + (f" and {by}" if by else "")
    click.echo(
        f"rubric set {e.rubric_set}: {e.n} conversations ({e.n_positive} positive); 95 % intervals from "
        f"{settings.samples} bootstrap resamples stratified by {strata}"
    )
    for key, f in e.figures.items():
        name = _FIGURE_NAMES[key].replace("YR@P", f"YR@{rubric_set.precision:.0%}")
        click.echo(f"  {name:<26}{_figure_text(f)}")
    for g, ge in e.groups.items():
        figures = "  ".join(f"{k} {_figure_text(ge.figures[k], 2)}" for k in ("accuracy", "auroc", "yield_rate"))
        click.echo(f"  {shown(by or '')}={shown(g)}: {ge.n} conversations ({ge.n_positive} positive)  {figures}")


@rubrics.command("evaluate")
@click.option(
    "--rubric-set",
    "rubric_set_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="A fitted rubric-set JSON (threshold and windows).",
)
@_labelled_option
@_evaluation_options
@click.option(
    "--rubrics-per-round",
    type=click.IntRange(min=1),
    default=None,
    help="Early stopping: ask this many rubrics per round and stop once the labels are settled (the labels, "
    "hence A/P/R/F1 and YR, are those of asking all; ΔNetSAT is then not reported; the answer cache is not used).",
)
@click.option(
    "--max-label-change-probability",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.0,
    show_default=True,
    help="Approximate early stopping (with --rubrics-per-round): also stop once the chance that the rest would change "
    "a label is at most this; needs the score moments `rubrics fit` records. Labels may then differ from asking all.",
)
@click.pass_obj
def rubrics_evaluate(
    obj: _Context,
    rubric_set_path: Path,
    labelled: Path,
    as_json: bool,
    per_conversation: Path | None,
    by: str | None,
    resamples: int,
    seed: int,
    cache_path: Path | None,
    rubrics_per_round: int | None,
    max_label_change_probability: float,
) -> None:
    """Score labelled conversations with a rubric set and report its figures with 95 % bootstrap intervals.

    \b
    ΔNetSAT   mean NetSAT of positives minus mean of negatives (separation)
    YR@P      share of conversations outside the uncertainty window
    A/P/R/F1  of the threshold classifier; P/R/F1 are for the satisfied class
    confident accuracy   accuracy of the window labels outside the uncertainty window
    AUROC, average precision   of NetSAT for the satisfied class (no threshold)

    Judge answers go through the answer cache `learn` uses, so a second
    evaluation of the same conversations asks the judge nothing.
    """
    judge = obj.judge()  # configuration errors first, before any work
    rubric_set = RubricSet.load(rubric_set_path)
    if max_label_change_probability > 0 and rubrics_per_round is None:
        raise click.UsageError("--max-label-change-probability needs --rubrics-per-round")
    if rubrics_per_round is not None and per_conversation is not None:
        raise click.UsageError("--per-conversation needs every rubric's score: it cannot go with --rubrics-per-round")
    _check_output_path(per_conversation, "--per-conversation")
    scorer = _early_stopping_scorer(rubric_set, judge, rubrics_per_round, max_label_change_probability)
    items = load_labelled_jsonl(labelled)
    require_both_classes(items, str(labelled))
    positive = np.array([i.positive for i in items])
    groups = _groups(items, by)
    extra: dict[str, Any] = {}
    if scorer is None:
        (scores,) = _cached_scores(judge, [rubric_set], items, _cache_file(obj, cache_path))
        netsats = scores.sum(axis=1)
    else:
        netsats, n_asked = _early_stopped_netsats(scorer, items)
        extra = {"rubric_questions_asked": n_asked, "rubric_questions_of_all": len(items) * len(rubric_set.rubrics)}
        if max_label_change_probability:
            extra["max_label_change_probability"] = max_label_change_probability
    settings = BootstrapSettings(samples=resamples, seed=seed)
    result = evaluate_rubric_set(rubric_set, netsats, positive, groups, settings, exact_netsats=scorer is None)
    if per_conversation is not None:
        _write_rows(per_conversation, conversation_rows(rubric_set, [i.conversation.id for i in items], positive, scores, groups))
        _say(f"wrote {per_conversation}")
    if as_json:
        doc = {
            **result.to_dict(),
            "bootstrap": {"samples": resamples, "seed": seed, "stratified_by": ["class", *([by] if by else [])]},
        }
        click.echo(json.dumps({**doc, **extra}, indent=2, allow_nan=False))
        return
    _echo_evaluation(result, rubric_set, settings, by)
    if extra:
        click.echo(
            f"early stopping asked {extra['rubric_questions_asked']} of {extra['rubric_questions_of_all']} rubric questions"
            + (
                f" (approximate: labels may differ from asking all, P(change) ≤ {max_label_change_probability})"
                if max_label_change_probability
                else ""
            )
        )


@rubrics.command("compare")
@click.argument("rubric_set_paths", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_labelled_option
@_evaluation_options
@click.pass_obj
def rubrics_compare(
    obj: _Context,
    rubric_set_paths: tuple[Path, ...],
    labelled: Path,
    as_json: bool,
    per_conversation: Path | None,
    by: str | None,
    resamples: int,
    seed: int,
    cache_path: Path | None,
) -> None:
    """Compare rubric sets on the same labelled conversations: each one's figures, and each against the first.

    The differences come from a paired bootstrap (the same resampled
    conversations for both sets) with 95 % intervals and two-sided p-values:
    an interval that contains 0 means this sample cannot tell the two apart.
    Rubrics the sets share are judged once; answers go through the cache.
    """
    if len(rubric_set_paths) < 2:
        raise click.UsageError("compare needs two or more rubric-set files (the first is the reference)")
    judge = obj.judge()  # configuration errors first, before any work
    _check_output_path(per_conversation, "--per-conversation")
    rubric_sets = [RubricSet.load(p) for p in rubric_set_paths]
    versions = [r.version for r in rubric_sets]
    if len(set(versions)) < len(versions):
        raise click.UsageError(f"the same rubric set is given twice (versions {versions})")
    items = load_labelled_jsonl(labelled)
    require_both_classes(items, str(labelled))
    positive = np.array([i.positive for i in items])
    groups = _groups(items, by)
    scores = _cached_scores(judge, rubric_sets, items, _cache_file(obj, cache_path))
    settings = BootstrapSettings(samples=resamples, seed=seed)
    netsats = [s.sum(axis=1) for s in scores]
    evaluations = [evaluate_rubric_set(r, n, positive, groups, settings) for r, n in zip(rubric_sets, netsats)]
    differences = compare_rubric_sets(rubric_sets, netsats, positive, groups, settings)
    if per_conversation is not None:
        ids = [i.conversation.id for i in items]
        _write_rows(
            per_conversation, [row for r, s in zip(rubric_sets, scores) for row in conversation_rows(r, ids, positive, s, groups)]
        )
        _say(f"wrote {per_conversation}")
    if as_json:
        doc = {
            "reference": versions[0],
            "rubric_sets": [{"path": str(p), **e.to_dict()} for p, e in zip(rubric_set_paths, evaluations)],
            "differences_from_reference": {v: {k: d.to_dict() for k, d in ds.items()} for v, ds in differences.items()},
            "bootstrap": {"samples": resamples, "seed": seed, "stratified_by": ["class", *([by] if by else [])], "paired": True},
        }
        click.echo(json.dumps(doc, indent=2, allow_nan=False))
        return
    for r, e in zip(rubric_sets, evaluations):
        _echo_evaluation(e, r, settings, by)
    for version, ds in differences.items():
        click.echo(f"{version} minus {versions[0]} (paired bootstrap):")
        for key, d in ds.items():
            if d.value is None:
                click.echo(f"  {_FIGURE_NAMES[key]:<26}— ({d.reason})")
                continue
            if d.low is None or d.high is None or d.p_value is None:
                click.echo(f"  {_FIGURE_NAMES[key]:<26}{d.value:+.3f} ({d.reason})")
                continue
            within = "  within noise" if d.low <= 0 <= d.high else ""
            click.echo(f"  {_FIGURE_NAMES[key]:<26}{d.value:+.3f} ({d.low:+.3f} to {d.high:+.3f}), p = {d.p_value:.3f}{within}")


def _early_stopping_scorer(
    rubric_set: RubricSet, judge: Judge, rubrics_per_round: int | None, max_change_probability: float
) -> EarlyStoppingScorer | None:
    if rubrics_per_round is None:
        return None
    moments = ScoreMoments.required_by(rubric_set) if max_change_probability > 0 else None
    return EarlyStoppingScorer(
        rubric_set, judge, round_size=rubrics_per_round, max_change_probability=max_change_probability, moments=moments
    )


def _early_stopped_netsats(scorer: EarlyStoppingScorer, items: Sequence[LabelledConversation]) -> tuple[np.ndarray, int]:
    """A NetSAT per conversation that carries its early-stopped labels (`EarlyStoppedScore.predicted_netsat`), and the
    rubric questions asked."""
    netsats, asked = [], 0
    with _progress(items, "judging") as bar:
        for item in bar:
            score = scorer.score(item.conversation)
            netsats.append(score.predicted_netsat)
            asked += len(score.rubric_scores)
    return np.array(netsats), asked


# ------------------------------------------------------------------ calibrate

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


_FROM_STORE_OPTION = click.option(
    "--from-store",
    is_flag=True,
    help="Learn from the scores users gave whole conversations (rating events, stored in conversation_ratings) on a "
    "1..K scale, as answers to one question; the judge is asked about those conversations (cached). Needs --since.",
)


def _calibration_options(instead_of: str = ""):
    """Options shared by the `calibrate` commands: the recorded judge answers and human labels (files), required
    unless the command has another source of labels (``instead_of``)."""
    required = not instead_of
    also = f" (together, instead of {instead_of})" if instead_of else ""

    def add(fn):
        fn = click.option(
            "--optional-questions",
            default=",".join(sorted(OPTIONAL_QUESTIONS)),
            show_default=True,
            help="Questions the judge may not have been asked (their input is then all zeros), comma-separated.",
        )(fn)
        fn = click.option(
            "--human-labels",
            type=_FILE,
            required=required,
            help="Human judgments TSV: text_id, annotator_id and one column per question (answers 1..K, 0 = n/a)." + also,
        )(fn)
        fn = click.option(
            "--judge-answers",
            type=_FILE,
            required=required,
            help="The judge's answer distributions TSV: text_id, criterion, answer1_prob..answerK_prob." + also,
        )(fn)
        return fn

    return add


def _load_calibration_data(
    judge_answers: Path, human_labels: Path, n_options: dict[str, int], optional_questions: str
) -> RubricData:
    question_ids = tuple(n_options)
    optional = [q.strip() for q in optional_questions.split(",") if q.strip()]
    features = load_features(judge_answers, n_options, question_ids, optional_questions=optional)
    labels = load_labels(human_labels, n_options, question_ids)
    data = build_data(features, labels, n_options, question_ids)
    if not data.labels:
        raise RubricDataError(f"no human label in {human_labels} belongs to a conversation in {judge_answers}")
    click.echo(
        f"{len(data.features)} conversations, {len(data.labels)} labels from {len(data.judges)} human judges"
        + (f" ({data.dropped_labels} labels dropped: conversation has no judge answers)" if data.dropped_labels else ""),
        err=True,
    )
    return data


def _score_line(scores: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.3f}" for k, v in scores.items())


@cli.group()
def calibrate() -> None:
    """Calibrators (LLM-Rubric's task): turn judge answer distributions into calibrated
    predictions of what human judges would answer."""


_CALIBRATOR_OPTION = click.option(
    "--calibrator",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="Directory written by `calibrate train` (or `calibrate adapt`).",
)


@calibrate.command("train")
@_calibration_options(instead_of="--from-store")
@_FROM_STORE_OPTION
@store_window_options
@answer_cache_option("With --from-store: the ")
@click.option(
    "--questions",
    type=_FILE,
    required=True,
    help="questions.json: every question's options (the calibrator's inputs and outputs) and, with --from-store, "
    "the texts the judge is asked.",
)
@click.option("--main-question", default="Q0", show_default=True, help="The question that matters most (overall satisfaction).")
@click.option(
    "--model",
    "kind",
    type=click.Choice(["ordinal", "network"]),
    default="ordinal",
    show_default=True,
    help="ordinal: a cumulative-link model per ordinal question (transfers best, docs/calibration.md); "
    "network: LLM-Rubric's calibration network.",
)
@click.option(
    "--grid",
    type=click.Choice(["default", "paper", "small", "none"]),
    default="default",
    show_default=True,
    help="Hyperparameters searched by k-fold CV. ordinal: default (its two penalties, 25 candidates) or none; "
    "network: default = small (6 candidates), paper (64), none.",
)
@click.option(
    "--folds", type=click.IntRange(2, 20), default=5, show_default=True, help="Cross-validation folds (split by conversation)."
)
@click.option(
    "--cv-groups",
    "cv_groups",
    default=None,
    metavar="REGEX",
    help="Hold out whole groups in CV instead of --folds random folds: a conversation's group is the first capture "
    "group of REGEX on its id (LLM-Rubric's synthetic data: '^(V[0-9]+)_', its dialogue systems). Penalties that "
    "predict a held-out assistant variant suit a new domain (docs/calibration.md).",
)
@click.option(
    "--members",
    type=click.IntRange(1, 50),
    default=1,
    show_default=True,
    help="network only: networks trained from different seeds and averaged (an ensemble).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Fold split (and the network's initialisation).")
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Directory to write the calibrator to."
)
@click.pass_obj
def calibrate_train(
    ctx: _Context,
    judge_answers: Path | None,
    human_labels: Path | None,
    from_store: bool,
    since: str | None,
    until: str | None,
    where_items: tuple[str, ...],
    cache_path: Path | None,
    questions: Path,
    main_question: str,
    optional_questions: str,
    kind: str,
    grid: str,
    folds: int,
    cv_groups: str | None,
    members: int,
    seed: int,
    out: Path,
) -> None:
    """Train a calibrator on judge answers paired with human labels.

    The labels come as recorded files (--judge-answers, --human-labels) or, with --from-store --since 30d, as
    the scores users gave whole conversations (rating events on --main-question's scale; the configured judge
    is asked --questions about those conversations, cached): an ordinal model of --main-question alone.

    \b
    1. choose hyperparameters by k-fold cross-validation on --main-question (--grid),
    2. fit (ordinal: one model per ordinal question; network: pre-train on
       every question, then fine-tune on --main-question),
    3. save it with its metadata (questions, judges, data hash) to --out.

    \b
    Example (LLM-Rubric's synthetic data):
      convowatch calibrate train \\
        --judge-answers gpt-3.5-turbo-16k_synth_evaluations_FIXED.tsv \\
        --human-labels human_judges_synth_all_FIXED_ANON.tsv \\
        --questions questions.json --out calibrator/
    """
    from scorers.calibration import CalibrationNetwork
    from scorers.calibration_selection import NAMED_GRIDS, group_folds, parameter_grid, select_hyperparameters
    from scorers.ordinal_calibration import PENALTY_GRID, OrdinalCalibrator

    defined = load_questions(questions)
    n_options = {q.id: q.n_options for q in defined.values()}
    if main_question not in n_options:
        raise RubricDataError(f"--main-question {main_question!r} is not in {questions} ({', '.join(n_options)})")
    if kind == "ordinal" and (grid in ("paper", "small") or members != 1):
        raise click.UsageError("--grid paper/small and --members are options of --model network")
    _check_label_source(
        judge_answers, human_labels, from_store, since, until, where_items, None, cache_path, None, takes_labels_file=False
    )
    provenance: dict[str, Any] | None = None
    if from_store:
        if kind != "ordinal":
            raise click.UsageError("--from-store trains --model ordinal: users' scores label the main question only")
        found = _stored_answers(ctx, n_options, main_question, since, until, where_items)
        provenance = found.metadata()
        data = _judged_calibration_data(ctx, list(defined.values()), n_options, found.labels, cache_path)
    else:
        assert judge_answers is not None and human_labels is not None
        data = _load_calibration_data(judge_answers, human_labels, n_options, optional_questions)
    base: CalibrationNetwork | OrdinalCalibrator
    if kind == "ordinal":
        base = OrdinalCalibrator(main_question=main_question)
        candidates = PENALTY_GRID
    else:
        base = CalibrationNetwork(main_question=main_question, seed=seed)
        candidates = NAMED_GRIDS["small" if grid == "default" else grid] if grid != "none" else {}
    params: dict = {}
    held_out = None if cv_groups is None else group_folds(data.text_ids, _id_group(cv_groups))
    if grid != "none":
        scheme = f"{folds}-fold CV" if held_out is None else f"CV holding out each of {len(held_out)} groups"
        with _progress(None, f"choosing by {scheme}", length=len(parameter_grid(candidates))) as bar:
            search = select_hyperparameters(
                data, candidates, base=base, k=folds, seed=seed, on_candidate=lambda i, n, p, s: bar.update(1), folds=held_out
            )
        params = dict(search.best_params)
        chosen = {k: params[k] for k in candidates}
        click.echo(f"chosen by {scheme}: {chosen}; CV {_score_line(search.best_scores)}", err=True)
    model: CalibrationNetwork | OrdinalCalibrator
    if isinstance(base, OrdinalCalibrator):
        ordinal = [q for q in data.question_ids if q not in base.nominal_inputs and data.labels_for(q)]
        model = base.clone(**{**params, "questions": ordinal}).fit(data)
        click.echo(
            f"fitted questions {', '.join(ordinal)} (not ordinal, not predicted: {', '.join(base.nominal_inputs)})", err=True
        )
    else:
        network = base.clone(**{**params, "n_members": members})
        with _progress(None, "training", length=network.n_members * (network.pretrain_epochs + network.finetune_epochs)) as bar:
            network.fit(data, progress=lambda p: bar.update(1))
        model = network
    model.save(out)
    if provenance is not None:
        _write_provenance(out, {"labels": provenance})
    click.echo(f"wrote calibrator {model.version_} to {out}")


def _id_group(pattern: str) -> Callable[[str], str]:
    """A conversation id's group: the first capture group of ``pattern`` (``--cv-groups``); no match is an error."""
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise click.BadParameter(f"not a regular expression: {e}", param_hint="--cv-groups") from e
    if compiled.groups < 1:
        raise click.BadParameter("needs a capture group naming the group, e.g. '^(V[0-9]+)_'", param_hint="--cv-groups")

    def group(text_id: str) -> str:
        match = compiled.search(text_id)
        if match is None or match.group(1) is None:
            raise click.BadParameter(f"conversation {text_id!r} does not match {pattern!r}", param_hint="--cv-groups")
        return match.group(1)

    return group


@calibrate.command("adapt")
@_CALIBRATOR_OPTION
@click.option(
    "--labels",
    "labels_path",
    type=_FILE,
    default=None,
    help="Your labelled conversations (JSONL: turns and each person's answers to the calibrator's questions, "
    "docs/calibration.md); the configured judge answers the questions about them (cached).",
)
@click.option(
    "--questions",
    "questions_path",
    type=_FILE,
    default=None,
    help="With --labels: the questions file with the calibrator's question texts [default: scoring.questions].",
)
@_FROM_STORE_OPTION
@store_window_options
@click.option(
    "--question",
    "store_question",
    default=None,
    help="With --from-store: the calibrator question the users' scores answer [default: its main question]; scores on "
    "a scale other than its number of options are left out.",
)
@answer_cache_option("With --labels or --from-store: the ")
@_calibration_options(instead_of="--labels or --from-store")
@click.option(
    "--strength",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="How strongly the adapted model is held to the calibrator (per parameter, against the labels' "
    "log-likelihood). Default: chosen by k-fold CV on these labels alone.",
)
@click.option("--folds", type=click.IntRange(2, 20), default=5, show_default=True, help="CV folds choosing --strength.")
@click.option("--seed", type=int, default=0, show_default=True, help="Fold split.")
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Directory to write the adapted calibrator to."
)
@click.pass_obj
def calibrate_adapt(
    ctx: _Context,
    calibrator: Path,
    labels_path: Path | None,
    questions_path: Path | None,
    from_store: bool,
    since: str | None,
    until: str | None,
    where_items: tuple[str, ...],
    store_question: str | None,
    cache_path: Path | None,
    judge_answers: Path | None,
    human_labels: Path | None,
    optional_questions: str,
    strength: float | None,
    folds: int,
    seed: int,
    out: Path,
) -> None:
    """Adapt a calibrator to a team's own labelled conversations (few-shot).

    Refits every question that has labels, each parameter pulled towards the
    calibrator's, so a few labels move it a little and many move it far; the
    people who labelled get offsets of their own. Needs at least 10
    conversations labelled on the main question (13 to choose --strength by
    CV). The labels come as --labels FILE (the judge is asked about those
    conversations), as the scores users gave whole conversations in the store
    (--from-store --since 30d: rating events, as one annotator "users"), or as
    recorded judge answers with human labels (--judge-answers, --human-labels).
    docs/calibration.md shows the measured learning curve.
    """
    from scorers.calibration_selection import select_adaptation_strength
    from scorers.calibrators import load_calibrator
    from scorers.ordinal_calibration import OrdinalCalibrator

    _check_label_source(
        judge_answers,
        human_labels,
        from_store,
        since,
        until,
        where_items,
        labels_path,
        cache_path,
        questions_path,
        store_question,
    )
    model = load_calibrator(calibrator)
    if not isinstance(model, OrdinalCalibrator):
        raise click.UsageError(
            f"{calibrator} holds a calibration network; only an ordinal calibrator can be adapted (retrain instead)"
        )
    provenance: dict[str, Any] | None = None
    if labels_path is not None or from_store:
        questions = _calibrator_questions(ctx, model, questions_path)
        if labels_path is not None:
            labelled = load_answer_labels(labels_path, model.n_options_)
        else:
            found = _stored_answers(ctx, model.n_options_, store_question or model.main_question, since, until, where_items)
            labelled, provenance = found.labels, found.metadata()
        data = _judged_calibration_data(ctx, questions, model.n_options_, labelled, cache_path)
    else:
        assert judge_answers is not None and human_labels is not None
        data = _load_calibration_data(judge_answers, human_labels, dict(model.n_options_), optional_questions)
    if strength is None:
        strength, scores = select_adaptation_strength(model, data, k=folds, seed=seed)
        click.echo(f"chosen by {folds}-fold CV on these labels: strength {strength:g}; RMSE by strength {scores}", err=True)
    adapted = model.adapt(data, strength)
    adapted.save(out)
    if provenance is not None:
        _write_provenance(out, {"adapted_from": model.version_, "strength": strength, "labels": provenance})
    click.echo(f"wrote calibrator {adapted.version_} (adapted from {model.version_}) to {out}")


def _check_label_source(
    judge_answers: Path | None,
    human_labels: Path | None,
    from_store: bool,
    since: str | None,
    until: str | None,
    where_items: tuple[str, ...],
    labels_path: Path | None,
    cache_path: Path | None,
    questions_path: Path | None,
    store_question: str | None = None,
    takes_labels_file: bool = True,
) -> None:
    """One source of labels, and only the options that go with it (`UsageError` otherwise)."""
    files = judge_answers is not None or human_labels is not None
    if (labels_path is not None) + files + from_store != 1 or (files and (judge_answers is None or human_labels is None)):
        names = "--labels FILE, --from-store" if takes_labels_file else "--from-store"
        raise click.UsageError(f"give one of {names}, or both --judge-answers and --human-labels")
    if files and (questions_path is not None or cache_path is not None):
        raise click.UsageError("--questions and --cache go with --labels or --from-store")
    if not from_store and (since is not None or until is not None or where_items or store_question is not None):
        raise click.UsageError("--since, --until, --where and --question select stored ratings: use them with --from-store")


def _write_provenance(out: Path, provenance: dict[str, Any]) -> None:
    """Where a calibrator's labels came from, beside it (not part of the calibrator: its version hashes the model)."""
    from scorers.calibrators import PROVENANCE_FILE

    write_json(out / PROVENANCE_FILE, provenance)


def _stored_answers(
    ctx: _Context,
    n_options: Mapping[str, int],
    question: str,
    since: str | None,
    until: str | None,
    where_items: tuple[str, ...],
) -> StoreAnswers:
    """The users' stored scores of whole conversations as answers to ``question`` (of the questions ``n_options``
    lists); refuses a window without two different scores (nothing to tell apart)."""
    from stream.feedback_labels import answers_from_store
    from stream.store import ClickHouseStore

    if question not in n_options:
        raise click.BadParameter(f"{question!r} is not one of the calibrator's questions: {', '.join(n_options)}")
    k = n_options[question]
    window, where, span = store_window(since, until, where_items)
    with ClickHouseStore.open(ctx.settings.store) as store:
        found = answers_from_store(store, window.since, window.until, question, k, where)
    scores = sorted({label.answer for label in found.labels.labels})
    click.echo(
        f"from the store: {len(found.labels.conversations)} conversations {span} scored on 1..{k} (scores {scores}); "
        f"{found.other_scale} scored on another scale, left out",
        err=True,
    )
    if len(scores) < 2:
        what = "no conversation" if not scores else f"every conversation scored {scores[0]}"
        raise RubricDataError(
            f"{what} on a 1..{k} scale in the store ({span}): adapting {question} needs at least two different scores"
        )
    return found


def _calibrator_questions(ctx: _Context, model: Calibrator, questions_path: Path | None) -> list[Question]:
    """The calibrator's questions with their texts (--questions or scoring.questions), checked against it."""
    source = questions_path or ctx.settings.scoring.questions
    if source is None:
        raise click.UsageError("the judge needs the calibrator's question texts: --questions FILE or scoring.questions")
    defined = load_questions(source)
    missing = [q for q in model.question_ids_ if q not in defined]
    if missing:
        raise RubricDataError(f"{source} does not define {missing}, which the calibrator reads")
    questions = [defined[q] for q in model.question_ids_]
    wrong = [
        f"{q.id} ({q.n_options}, calibrator {model.n_options_[q.id]})" for q in questions if q.n_options != model.n_options_[q.id]
    ]
    if wrong:
        raise RubricDataError(f"{source}: option counts differ from the calibrator's: {', '.join(wrong)}")
    return questions


def _judged_calibration_data(
    ctx: _Context, questions: list[Question], n_options: Mapping[str, int], labelled: AnswerLabels, cache_path: Path | None
) -> RubricData:
    """People's answers with the configured judge's answers to the calibrator's questions about the same
    conversations (asked once: the answer cache `learn` uses)."""
    from scorers.datasets.answer_labels import calibration_data
    from scorers.learning.score_cache import ScoreCache, answer_all

    settings = ctx.settings
    judge = ctx.judge()
    with ScoreCache(cache_path or settings.cache_dir / SCORE_CACHE_FILE) as cache:
        with _progress(None, "judging", length=len(labelled.conversations)) as bar:
            answers = answer_all(judge, questions, labelled.conversations, cache, progress=lambda done, total: bar.update(1))
    stats = answers.stats
    data = calibration_data(labelled, answers.by_conversation, n_options, [q.id for q in questions])
    click.echo(
        f"{len(data.features)} conversations, {len(data.labels)} labels from {len(data.judges)} annotators; judge: "
        f"{stats.cache_misses} answers asked ({stats.judge_calls} calls), {stats.cache_hits} from the cache",
        err=True,
    )
    return data


@calibrate.command("evaluate")
@_CALIBRATOR_OPTION
@_calibration_options()
@click.option("--question", default=None, help="Question to evaluate (default: the calibrator's main question).")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
def calibrate_evaluate(
    calibrator: Path, judge_answers: Path, human_labels: Path, optional_questions: str, question: str | None, as_json: bool
) -> None:
    """Compare a calibrator's predictions with held-out human labels.

    Each label is predicted with its own human judge's weights (an unknown
    judge gets the judge-independent weights). Reports RMSE of the expected
    answer, Pearson, Spearman, Kendall, NLL and smECE, and the smallest RMSE
    any predictor with that Pearson could reach on these labels.
    """
    from scorers import statistics
    from scorers.calibration_selection import predict_labels
    from scorers.calibrators import load_calibrator

    model = load_calibrator(calibrator)
    data = _load_calibration_data(judge_answers, human_labels, dict(model.n_options_), optional_questions)
    held = predict_labels(model, data, question)
    scores = held.scores()
    scores["rmse_bound"] = statistics.rmse_lower_bound(held.answers, scores["pearson"])
    if as_json:
        click.echo(
            json.dumps({"calibrator": model.version_, "question": held.question, "n": len(held.answers), **scores}, indent=2)
        )
        return
    click.echo(f"calibrator {model.version_}, {held.question}, {len(held.answers)} labels")
    click.echo(_score_line(scores))


# ------------------------------------------------------------------ data


@cli.group()
def data() -> None:
    """Convert public data sets into convowatch's input formats."""


@data.command("llm-rubric")
@click.option(
    "--data-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="The LLM-Rubric release directory (questions.json, *_FIXED*.tsv, real_data.json).",
)
@click.option("--split", type=click.Choice(["real", "synth"]), required=True)
@click.option(
    "--negative-max-q0",
    type=float,
    default=NEGATIVE_MAX_MEAN_Q0,
    show_default=True,
    help="A conversation is negative when its human judges' mean Q0 is at most this.",
)
@click.option(
    "--labelled-out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Where to write labelled conversations (JSONL).",
)
@click.option(
    "--rubric-set-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write an unfitted rubric set with Q1-Q8 as SAT rubrics.",
)
def data_llm_rubric(data_dir: Path, split: str, negative_max_q0: float, labelled_out: Path, rubric_set_out: Path | None) -> None:
    """Labelled conversations (and a Q1-Q8 rubric set) from the LLM-Rubric release.

    Real conversations carry their turns; synthetic ones are published without
    text, so they can only be judged by the recorded judge (which answers by id).
    """
    split_data = load_split(data_dir, split)
    labels = satisfaction_labels(split_data, negative_max_q0)
    texts = load_real_conversations(data_dir / REAL_CONVERSATIONS_FILE) if split == "real" else {}
    items = [LabelledConversation(texts.get(tid) or Conversation(tid, ()), positive) for tid, positive in sorted(labels.items())]
    n = write_labelled_jsonl(labelled_out, items)
    click.echo(f"wrote {n} labelled conversations ({sum(labels.values())} positive) to {labelled_out}")
    if rubric_set_out is not None:
        rubric_set = dimension_rubric_set(data_dir / QUESTIONS_FILE)
        rubric_set.save(rubric_set_out)
        click.echo(f"wrote rubric set {rubric_set.version} to {rubric_set_out}")


cli.add_command(learn)
cli.add_command(dashboards)
cli.add_command(judge)
cli.add_command(scorers)
data.add_command(uss_command)


# ------------------------------------------------------------------ service


@cli.command("run")
@click.pass_obj
def run_cmd(obj: _Context) -> None:
    """Run a worker: consume conversation events, assemble, score, publish scores.

    \b
    Start as many workers as there are partitions (kafka.partitions); they
    share the work as consumer groups named after kafka.app_id. Scores go to the
    scores topic; run `convowatch sink` to write them to ClickHouse.
    Metrics: http://METRICS_HOST:METRICS_PORT/metrics.
    """
    from stream.service import run_worker

    run_worker(obj.settings, loglevel=obj.settings.log_level.lower())


@cli.command("sink")
@click.pass_obj
def sink_cmd(obj: _Context) -> None:
    """Run the sink: write the scores topic and feedback events to ClickHouse (store.dsn).

    One sink per embedded (chdb://) store: only one process may open it.
    Offsets are committed after each batch is written; restarts lose nothing.
    """
    from stream.service import run_sink

    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("kafka").setLevel(logging.WARNING)  # a long-running sink should show broker trouble
    run_sink(obj.settings)


def _replay_path(source: str, path: Path | None) -> Path:
    if path is None:
        raise click.UsageError(f"replay {source} needs a PATH")
    return path


@cli.command("replay")
@click.argument("source", type=click.Choice(["jsonl", "llm-rubric", "uss", "synthetic"]))
@click.argument("path", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--speed",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Play event time this many times faster than real time; 0 = as fast as possible.",
)
@click.option(
    "--skip-invalid",
    is_flag=True,
    help="Send the valid events of a JSONL file and report the invalid ones (default: refuse the file).",
)
@click.option(
    "--turn-gap",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds between turns for corpora without turn times (llm-rubric, uss).",
)
@click.option(
    "--conversations", type=click.IntRange(min=1), default=2000, show_default=True, help="synthetic: number of conversations."
)
@click.option("--turns", type=click.IntRange(min=1), default=10, show_default=True, help="synthetic: turns per conversation.")
@click.option("--seed", type=int, default=0, show_default=True, help="synthetic: random seed.")
@click.pass_obj
def replay_cmd(
    obj: _Context,
    source: str,
    path: Path | None,
    speed: float,
    skip_invalid: bool,
    turn_gap: float,
    conversations: int,
    turns: int,
    seed: int,
) -> None:
    """Publish events to the events topic: a JSONL file of contract events, or a corpus.

    \b
    jsonl PATH     one event per line (docs/event-contract.md); validated first
    llm-rubric     the 223 real LLM-Rubric conversations (data/llm-rubric), timed by their ObjectIds
    uss PATH       a USS MWOZ/SGD file (../shared/data/uss/MWOZ.txt)
    synthetic      a generated workload (--conversations x --turns)
    """
    from stream.replay import sources as replay
    from stream.replay.publisher import invalid_items, publish

    a = obj.settings.assembly
    if source == "jsonl":
        items = list(
            replay.jsonl_events(_replay_path(source, path), max_text_bytes=a.max_text_bytes, max_event_bytes=a.max_event_bytes)
        )
        bad = invalid_items(items)
        if bad and not skip_invalid:
            problems = "; ".join(f"{i.where}: {i.error.reason}" for i in bad[:5] if i.error is not None)
            _fail(
                f"{len(bad)} of {len(items)} lines break the event contract ({problems}{' ...' if len(bad) > 5 else ''}); "
                "fix them or pass --skip-invalid"
            )
    elif source == "llm-rubric":
        items = list(replay.llm_rubric_events(path or replay.LLM_RUBRIC_REAL_DATA, turn_gap_s=turn_gap))
    elif source == "uss":
        items = list(replay.uss_events(_replay_path(source, path), turn_gap_s=turn_gap))
    else:
        items = list(replay.synthetic_events(conversations, turns, seed))
    ensure_topics(obj.settings.kafka)
    with click.progressbar(length=len(items), label="publishing", file=sys.stderr, show_pos=True) as bar:
        report = publish(items, obj.settings.kafka, speed, on_sent=lambda _item: bar.update(1))
    click.echo(
        f"sent {report.sent} events to {obj.settings.kafka.events_topic}"
        + (f", skipped {report.skipped} invalid" if report.skipped else "")
    )
    for line in report.skipped_where[:20]:
        click.echo(f"  skipped {line}", err=True)


@cli.command("summary")
@click.option("--group-by", default="dialogue_version", show_default=True, help="Conversation attribute to break rates down by.")
@click.option("--worst", type=click.IntRange(0, 100), default=5, show_default=True, help="How many worst conversations to list.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_obj
def summary_cmd(obj: _Context, group_by: str, worst: int, as_json: bool) -> None:
    """Summarise the scores in the store: labels, rates per attribute value, the worst conversations, behaviour rates.

    With the embedded store, stop the sink first (only one process may open it).
    """
    from stream.report.summary import summarize
    from stream.store import ClickHouseStore

    with ClickHouseStore.open(obj.settings.store) as store:
        summary = summarize(store, worst=worst, group_by=group_by)
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(summary), indent=2, default=str))
        return
    total = sum(summary.by_label.values())
    click.echo(f"{total} conversations: " + ", ".join(f"{label} {n}" for label, n in summary.by_label.items()))
    click.echo(f"\nby {shown(group_by)}:")
    click.echo(f"  {'value':<12}{'n':>6}{'dsat':>8}{'uncertain':>11}{'calibrated sat':>16}{'calibrated P(dsat)':>20}")
    for v in summary.variants:
        click.echo(
            f"  {shown(v.variant) or '(none)':<12}{v.n:>6}{_pct(v.dsat_rate):>8}{_pct(v.uncertain_rate):>11}"
            f"{_num(v.calibrated_satisfaction):>16}{_pct(v.calibrated_dissatisfaction):>20}"
        )
    click.echo(
        "  (dsat/uncertain: shares of scored conversations by rubric-set label; calibrated: the calibrator's"
        " expected main answer and P(dissatisfied); n counts unsampled conversations, rates weight by 1/π)"
    )
    if summary.worst:
        click.echo("\nworst conversations (highest calibrated P(dsat), then lowest NetSAT):")
        for w in summary.worst:
            hits = "; ".join(f"{shown(h.rubric_id)} {h.score:+.1f}" for h in w.dsat_hits) or "-"
            click.echo(
                f"  {shown(w.conversation_id)}  NetSAT {_num(w.netsat)}  {shown(w.label):<9}  P(dsat) {_pct(w.dissatisfaction_probability)}  [{hits}]"
            )
    if summary.behaviours:
        click.echo("\nbehaviours per assistant turn (scoring.behaviours; 95 % Wilson interval of the judged turns):")
        click.echo(f"  {'behaviour':<28}{'rate':>8}{'95 % interval':>18}{'hits':>7}{'turns':>7}")
        for b in summary.behaviours:
            ci = b.interval()
            interval = f"{_pct(ci.low)} .. {_pct(ci.high)}"
            click.echo(f"  {shown(b.behaviour):<28}{_pct(b.rate):>8}{interval:>18}{b.hits:>7}{b.turns:>7}")


@cli.command("report")
@click.option(
    "--since", required=True, help="Start of the window: a duration back from now (30m, 6h, 7d, 2w) or an ISO 8601 time."
)
@click.option("--until", default=None, help="End of the window (same forms; default: now).")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for index.html and the PNGs.",
)
@click.option("--product", default=None, help="Only this product.")
@click.option("--model-version", default=None, help="Only this model version.")
@click.pass_obj
def report_cmd(
    obj: _Context, since: str, until: str | None, out_dir: Path, product: str | None, model_version: str | None
) -> None:
    """Render the Overview and Quality views from ClickHouse as PNG images and one HTML page (no Grafana needed).

    Conversations count by when they closed (since <= closed_at < until). With the embedded store, stop the
    sink first (only one process may open it).
    """
    from stream.report.data import load_report, question_names, resolve_window
    from stream.report.render import write_report
    from stream.store import ClickHouseStore

    window = resolve_window(since, until)
    questions = obj.settings.scoring.questions
    names = question_names(questions) if questions is not None else {}
    with ClickHouseStore.open(obj.settings.store) as store:
        data = load_report(store, window, product, model_version, dimension_names=names, price=obj.settings.judge.price)
    page = write_report(data, out_dir)
    if data.empty:
        click.echo(f"no conversations closed in the window; wrote {page}")
    else:
        t = data.totals
        click.echo(f"{t.conversations} conversations ({t.scored} scored, {t.unscored} unscored); wrote {page}")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point, and the one place errors are mapped to exit codes.

    Any `ConvowatchError` (bad input, files or configuration; a judge, store,
    broker or Grafana that failed) and a missing file become one
    ``convowatch: error: <message>`` line and exit code 2; anything else is a
    bug and keeps its traceback.
    """
    try:
        cli.main(args=argv, prog_name="convowatch", standalone_mode=False)
    except click.exceptions.Abort:
        _fail("aborted")
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (ConvowatchError, FileNotFoundError) as e:
        _fail(str(e))


if __name__ == "__main__":
    main()
