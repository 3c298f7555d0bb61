"""Process entry points: build the worker or the sink from settings and run it until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

from scorers.behaviours import load_behaviour_set
from scorers.calibrators import Calibrator, load_calibrator
from scorers.rubrics import RubricSet, starter_rubric_set
from stream.judge_factory import judge_from_settings
from stream.log_privacy import keep_conversation_text_out_of_logs
from stream.metrics import ServiceMetrics
from stream.owner_only import make_owner_only_dir
from stream.registry import ScorerRegistry, ScorerVersion
from stream.rollout import ScorerRollout
from stream.scoring import ConversationScorer
from stream.settings import Settings, SettingsError
from stream.topics import ensure_topics

log = logging.getLogger(__name__)


def build_scorer(settings: Settings, metrics: ServiceMetrics) -> ConversationScorer:
    """Judge, rubric set, calibrator and behaviour set from settings; a missing file is a `SettingsError`."""
    if settings.rubric_set is None:
        rubric_set = starter_rubric_set()
        log.warning(
            "no rubric set configured (rubric_set, CONVOWATCH_RUBRIC_SET): scoring with the starter set %s, %s "
            "Its θ and windows were fitted for %s; refit them for your judge (`convowatch rubrics fit`) or learn a set "
            "(`convowatch learn`).",
            rubric_set.version,
            rubric_set.metadata.get("measured", ""),
            rubric_set.metadata.get("judge", "another judge"),
        )
    else:
        rubric_set = RubricSet.load(settings.rubric_set)
    calibrator = load_calibrator(settings.calibrator) if settings.calibrator is not None else None
    return _scorer(settings, metrics, rubric_set, calibrator)


def _scorer(
    settings: Settings, metrics: ServiceMetrics, rubric_set: RubricSet, calibrator: Calibrator | None, name: str = ""
) -> ConversationScorer:
    behaviours = settings.scoring.behaviours
    behaviour_set = load_behaviour_set(behaviours) if behaviours is not None else None
    judge = judge_from_settings(settings.judge, settings.cache_dir)
    behaviour_judge = None
    if behaviour_set is not None and settings.scoring.behaviour_judge == "local" and settings.judge.backend != "local":
        behaviour_judge = judge_from_settings(settings.judge.model_copy(update={"backend": "local"}), settings.cache_dir)
    return ConversationScorer(
        judge,
        rubric_set,
        calibrator,
        settings.scoring,
        metrics,
        price=settings.judge.price,
        behaviour_set=behaviour_set,
        name=name,
        redaction=settings.redaction,
        behaviour_judge=behaviour_judge,
    )


def build_rollout(settings: Settings, metrics: ServiceMetrics) -> ScorerRollout:
    """The worker's scorers: fixed from the ``rubric_set``/``calibrator`` settings, or following ``scoring.registry``
    (the first version built from settings, later ones sharing its judge, budget and sampling state)."""
    if settings.scoring.registry is None:
        return ScorerRollout.fixed(build_scorer(settings, metrics), metrics)
    if settings.rubric_set is not None or settings.calibrator is not None:
        raise SettingsError(
            "scoring.registry is set, so the rubric set and calibrator come from its active version: "
            "unset rubric_set and calibrator (CONVOWATCH_RUBRIC_SET, CONVOWATCH_CALIBRATOR)"
        )
    first: list[ConversationScorer] = []

    def build(version: ScorerVersion) -> ConversationScorer:
        if not first:
            first.append(_scorer(settings, metrics, version.rubric_set, version.calibrator, version.name))
            return first[0]
        return first[0].for_version(version.rubric_set, version.calibrator, version.name)

    return ScorerRollout.from_registry(ScorerRegistry(settings.scoring.registry), build, metrics)


def new_metrics(settings: Settings) -> ServiceMetrics:
    try:
        m = settings.metrics
        return ServiceMetrics(
            m.label_attributes,
            m.max_label_values,
            max_label_combinations=m.max_label_combinations,
            label_slot_window_s=m.label_slot_window_s,
        )
    except ValueError as e:
        raise SettingsError(str(e)) from e


def serve_metrics(settings: Settings, metrics: ServiceMetrics) -> int | None:
    if settings.metrics.port == 0:
        return None
    try:
        port = metrics.serve(settings.metrics.host, settings.metrics.port)
    except OSError as e:
        raise SettingsError(f"cannot serve metrics on {settings.metrics.host}:{settings.metrics.port}: {e}") from e
    log.info("metrics on http://%s:%d/metrics", settings.metrics.host, port)
    return port


def prepare_data_dir(path: Path) -> None:
    """Create the worker's local directory and its parents, owner-only (Faust creates only the last level, so a fresh
    checkout without ``.convowatch/`` could not start), and tighten an existing one (stream/owner_only.py); a
    `SettingsError` naming the setting if it cannot be made."""
    try:
        make_owner_only_dir(path)
    except OSError as e:
        raise SettingsError(f"kafka.data_dir: cannot create the worker's directory {str(path)!r}: {e.strerror}") from e


def run_worker(settings: Settings, loglevel: str = "info") -> None:
    """Create topics, then run the Faust worker (assemble + score agents) until stopped."""
    import faust

    from stream.app import create_app

    keep_conversation_text_out_of_logs(settings.log_conversation_text)
    metrics = new_metrics(settings)
    rollout = build_rollout(settings, metrics)
    ensure_topics(settings.kafka)
    prepare_data_dir(settings.kafka.data_dir)
    app = create_app(settings, rollout, metrics)
    serve_metrics(settings, metrics)
    scorer = rollout.current.active
    log.info(
        "worker: judge %s, rubric set %s, calibrator %s, scorer version %s%s",
        scorer.judge_name,
        scorer.rubric_set.version,
        scorer.calibrator_version,
        scorer.scorer_version,
        f" ({scorer.name} from {settings.scoring.registry})" if rollout.watches else "",
    )
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    worker.spinner = None  # Faust's terminal spinner would set the root logger to DEBUG (costly per event)
    worker.execute_from_commandline()


def run_sink(settings: Settings) -> None:
    """Run the ClickHouse sink until SIGTERM/SIGINT, then flush, commit and close the store."""
    from stream.sink import ScoreSink
    from stream.store import ClickHouseStore

    keep_conversation_text_out_of_logs(settings.log_conversation_text)
    metrics = new_metrics(settings)
    store = ClickHouseStore.open(settings.store)
    store.migrate()
    ensure_topics(settings.kafka)
    sink = ScoreSink(settings, store, metrics)
    serve_metrics(settings, metrics)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("sink: writing %s and feedback to %s", settings.kafka.scores_topic, settings.store.dsn)
    try:
        sink.run(stop)
    finally:
        sink.close()
