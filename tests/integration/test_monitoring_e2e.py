"""Dashboards and alerts proven on the real components, after one replay.

One phased stream of the 223 real LLM-Rubric conversations (recorded GPT-3.5
judge, the scoring-core rubric set and calibrator) runs through a real worker
and sink on Apache Kafka; a real Prometheus scrapes both and evaluates the alert rules
(the production rules rendered with compressed windows); a real Alertmanager
delivers to a webhook receiver started here. Two products share the stream:

* ``spiky``: a calm phase, then a burst of the conversations the scorer finds
  most dissatisfied, then silence;
* ``calm``: the same length of ordinary conversations, start to end.

Why the burst is chosen by the scorer's P(dsat) and not by the human labels:
with this judge and the default calibrator, the mean P(dsat) of the
conversations humans rated dissatisfied (mean Q0 <= 2) is 0.298 and of the
others 0.280 (AUROC 0.59, `bench/calibration_transfer.py`; LLM-Rubric's
network gave 0.283 and 0.281), so a burst of human-dissatisfied conversations
would barely move this judge's rate: `bench/alert_detection.py` measures that
no human-labelled burst fires the alert with this judge, and which scorer
separation it needs. The test proves the alerting path, not the judge.

Then every PromQL expression of every dashboard, recording rule, alert rule and
Grafana-managed rule runs against that Prometheus, and every SQL panel against
the sink's ClickHouse through the store's client.
"""

from __future__ import annotations

import csv
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path

import pytest
import yaml

from dashboards import catalog, grafana_alerts
from dashboards.alert_rules import AlertWindows, rules_yaml
from scorers.calibrators import load_calibrator
from scorers.datasets.llm_rubric import load_real_conversations
from scorers.judges.recorded import RecordedJudge
from scorers.questions import load_questions
from stream.contract import EndEvent, TurnEvent, encode_event
from stream.settings import ScoringSettings
from tests import grafana_macros
from tests.infra import AlertmanagerFactory, PrometheusFactory, WebhookReceiver, prometheus_query, wait_for
from tests.pipeline import LLM_RUBRIC_DATA, RECORDED_REAL_ANSWERS, Pipeline

pytestmark = pytest.mark.slow

# The production rules with windows a test can wait for: 20 s against a 2 min baseline, firing after 5 s.
# min_lift is 0.02 (production: the AlertWindows default, 0.05) because this judge's P(dsat) barely varies across
# the 223 real conversations: its 40 most dissatisfied average only ~0.07 above its 70 calmest (asserted below).
TEST_WINDOWS = AlertWindows(short="20s", baseline="2m", for_="5s", min_conversations=10, z=3.0, min_lift=0.02)
CALM_S = 60.0  # the spiky product's calm phase
BURST_S = 30.0  # then its burst
BURST_SIZE = 40
CALM_SPIKY_SIZE = 70
SPIKE_ALERT = "ConvowatchDissatisfactionSpike"
TURN_GAP_S = 0.01


def dissatisfaction_probabilities(calibrator_dir: Path) -> dict[str, float]:
    """The calibrated P(dsat) the worker will compute for each real conversation (same judge, calibrator, cut)."""
    judge = RecordedJudge.from_tsv(RECORDED_REAL_ANSWERS)
    calibrator = load_calibrator(calibrator_dir)
    questions = list(load_questions(LLM_RUBRIC_DATA / "questions.json").values())
    cut = ScoringSettings().dissatisfied_max_value
    out = {}
    for cid, conversation in load_real_conversations(LLM_RUBRIC_DATA / "real_data.json").items():
        prediction = calibrator.predict_judgement(judge.judge(conversation, questions))[calibrator.main_question]
        out[cid] = float(prediction.prob_at_most(cut)[0])
    return out


def human_dissatisfied(max_mean_q0: float = 2.0) -> dict[str, bool]:
    """Human judges' verdict per real conversation: mean Q0 <= ``max_mean_q0``."""
    answers: dict[str, list[int]] = {}
    with open(LLM_RUBRIC_DATA / "human_judges_real_convs_FIXED_ANON.tsv", encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            if row["Q0"].isdigit() and int(row["Q0"]) > 0:
                answers.setdefault(row["text_id"], []).append(int(row["Q0"]))
    return {cid: statistics.mean(a) <= max_mean_q0 for cid, a in answers.items()}


@dataclass(frozen=True)
class PhasedStream:
    """Which conversation plays when, for which product."""

    starts: dict[str, tuple[str, float]]  # conversation id -> (product, start offset s)
    burst: frozenset[str]

    @classmethod
    def arrange(cls, p_dsat: dict[str, float]) -> PhasedStream:
        ranked = sorted(p_dsat, key=lambda cid: (p_dsat[cid], cid))
        burst, calm_spiky, calm = ranked[-BURST_SIZE:], ranked[:CALM_SPIKY_SIZE], ranked[CALM_SPIKY_SIZE:-BURST_SIZE]
        starts = {}
        for i, cid in enumerate(sorted(calm_spiky)):  # by id: the calm phase has no trend of its own
            starts[cid] = ("spiky", CALM_S * i / len(calm_spiky))
        for i, cid in enumerate(sorted(burst)):
            starts[cid] = ("spiky", CALM_S + BURST_S * i / len(burst))
        for i, cid in enumerate(sorted(calm)):  # by id: no trend in P(dsat) over time
            starts[cid] = ("calm", (CALM_S + BURST_S) * i / len(calm))
        return cls(starts, frozenset(burst))

    def write_jsonl(self, path: Path, t0: float) -> int:
        conversations = load_real_conversations(LLM_RUBRIC_DATA / "real_data.json")
        events = []
        for cid, (product, start) in self.starts.items():
            attrs = {"product": product, "model_version": "v1"}
            turns = conversations[cid].turns
            for i, turn in enumerate(turns):
                events.append(TurnEvent(cid, i, turn.role, turn.text, t0 + start + i * TURN_GAP_S, attrs))
            events.append(EndEvent(cid, t0 + start + len(turns) * TURN_GAP_S))
        events.sort(key=lambda e: e.timestamp)
        path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
        return len(events)


def alertmanager_config(webhook_url: str) -> str:
    return yaml.safe_dump(
        {
            "route": {
                "receiver": "webhook",
                "group_by": ["alertname", "product", "model_version"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [{"name": "webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
        }
    )


@dataclass
class Replayed:
    pipeline: Pipeline
    prometheus: str
    alertmanager: str
    webhook: WebhookReceiver
    stream: PhasedStream
    started: float
    burst_started: float
    finished: float


@pytest.fixture(scope="module")
def replayed(
    kafka_broker: str, scoring_artifacts: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replayed]:
    root = tmp_path_factory.mktemp("monitoring")
    rubric_set, calibrator = scoring_artifacts
    stream = PhasedStream.arrange(dissatisfaction_probabilities(calibrator))
    events = root / "phased.jsonl"
    stream.write_jsonl(events, t0=time.time())

    webhook = WebhookReceiver()
    am_config = root / "alertmanager.yml"
    am_config.write_text(alertmanager_config(webhook.url), encoding="utf-8")
    alertmanagers = AlertmanagerFactory(root / "alertmanager")
    prometheuses = PrometheusFactory(root / "prometheus")
    pipeline = Pipeline(root=root, bootstrap=kafka_broker, rubric_set=rubric_set, calibrator=calibrator)
    try:
        am_url = alertmanagers.start(am_config)
        worker, sink = pipeline.start_worker(), pipeline.start_sink()
        pipeline.wait_assigned([worker])
        rules = root / "convowatch.rules.yml"
        rules.write_text(rules_yaml(TEST_WINDOWS), encoding="utf-8")
        prom_url = prometheuses.start(
            [f"127.0.0.1:{worker.metrics_port}", f"127.0.0.1:{sink.metrics_port}"], rule_files=[rules], alertmanager_url=am_url
        )
        wait_for(lambda: prometheus_query(prom_url, 'up{job="convowatch"} == 1'), timeout=30, what="first scrape")
        # a few refused events too, so the dead-letter panels have data
        pipeline.produce([(b"bad-1", b"not json"), (b"bad-2", b'{"schema_version": 1}'), (None, b"\xff\xfe")])
        started = time.time()
        pipeline.replay("jsonl", str(events), "--speed", "1")
        finished = time.time()
        wait_for(
            lambda: sink.metric_sum("convowatch_sink_rows_total", table="conversation_scores") >= len(stream.starts),
            timeout=120,
            what="every conversation stored",
        )
        yield Replayed(pipeline, prom_url, am_url, webhook, stream, started, started + CALM_S, finished)
    finally:
        pipeline.stop_all()
        prometheuses.close()
        alertmanagers.close()
        webhook.close()


def spike_alerts(webhook: WebhookReceiver, status: str, product: str) -> list[dict]:
    return [
        a for a in webhook.alerts(status) if a["labels"].get("alertname") == SPIKE_ALERT and a["labels"].get("product") == product
    ]


# --- the spike ---------------------------------------------------------------------


def test_burst_is_dissatisfied_by_the_scorer_not_by_humans(scoring_artifacts: tuple[Path, Path]) -> None:
    """The measurement quoted in the module docstring, kept true."""
    p_dsat = dissatisfaction_probabilities(scoring_artifacts[1])
    human = human_dissatisfied()
    stream = PhasedStream.arrange(p_dsat)
    burst = statistics.mean(p_dsat[c] for c in stream.burst)
    calm = statistics.mean(p_dsat[c] for c, (product, _) in stream.starts.items() if product == "spiky" and c not in stream.burst)
    assert burst - calm > 0.05
    by_human = [statistics.mean(p_dsat[c] for c in human if human[c] == flag) for flag in (True, False)]
    assert 0 < by_human[0] - by_human[1] < 0.05  # the humans' direction, but a gap far smaller than the burst's


def test_the_dissatisfaction_spike_fires_reaches_alertmanager_and_resolves(replayed: Replayed) -> None:
    firing = wait_for(
        lambda: spike_alerts(replayed.webhook, "firing", "spiky"), timeout=60, what="spike delivered to the webhook"
    )
    alert = firing[0]
    assert alert["labels"]["model_version"] == "v1"
    assert alert["labels"]["severity"]
    assert alert["annotations"]["runbook_url"]
    fired_at = _timestamp(alert["startsAt"])
    assert replayed.burst_started < fired_at < replayed.finished + 30, (replayed.burst_started, fired_at, replayed.finished)
    resolved = wait_for(lambda: spike_alerts(replayed.webhook, "resolved", "spiky"), timeout=120, what="spike resolved")
    assert _timestamp(resolved[0]["endsAt"]) > fired_at


def test_the_calm_stream_of_the_same_length_fires_nothing(replayed: Replayed) -> None:
    wait_for(lambda: spike_alerts(replayed.webhook, "resolved", "spiky"), timeout=120, what="the spike run to finish")
    assert [a["labels"] for a in replayed.webhook.alerts() if a["labels"].get("product") == "calm"] == []
    assert [a["labels"] for a in replayed.webhook.alerts() if a["labels"].get("alertname") != SPIKE_ALERT] == []
    # Prometheus never had the calm product's spike pending, over the whole run
    ever = prometheus_query(replayed.prometheus, f'max_over_time(ALERTS{{alertname="{SPIKE_ALERT}", product="calm"}}[10m])')
    assert ever == []


# --- every query of every dashboard and rule ------------------------------------------

# Queries that must run but may return nothing after this replay, and why.
MAY_BE_EMPTY = {
    "convowatch_judge_errors_total": "the recorded judge never fails",
    "convowatch_conversations_unscored_total": "every conversation is scored",
    "convowatch_scoring_retries_total": "no judge failure, no retry",
    "convowatch_sink_errors_total": "no failed store write",
    'label="sat"': "the scoring-core rubric set labels no real conversation sat (all uncertain, see README)",
    'label="dsat"': "the scoring-core rubric set labels no real conversation dsat (all uncertain, see README)",
    'decision="unsampled"': "this replay judges every conversation (scoring.sampling at its default rate 1)",
    "convowatch_judge_budget": "this replay sets no judge budget (scoring.budget): no limit, no wait",
    "convowatch_judge_cost_total": "this replay sets no price table (judge.price)",
    "convowatch_partition_refetches_total": "a refetch repairs a passed-over record or a stalled partition: none needed here",
    "convowatch_user_feedback_conversations_total": "this replay sends no feedback events: no rated conversation",
    "convowatch_shadow_conversations_total": "no shadow version: this replay's worker takes its scorer from settings",
    "convowatch_scorer_rollout_changes_total": "no scorer registry: the worker's scorer is fixed, there is no rollout to read",
    "convowatch_injection_suspected": "the replayed research chats need not hold an injection attempt the detector finds",
    'reason="bad_closed_record"': "every closed record decodes: none is dead-lettered",
    "convowatch_behaviour_": "this replay judges no behaviours (scoring.behaviours is off: the recorded judge has no behaviour "
    "answers; tests/integration/test_behaviours_pipeline.py runs them with a real judge)",
}


def _range(replayed: Replayed) -> dict[str, float]:
    return {"start": replayed.started - 30, "end": time.time(), "step": 5}


def _run_promql(replayed: Replayed, exprs: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Run each expression as a range query over the replay: (errors by name, names with no result)."""
    errors, empty = {}, []
    for name, expr in exprs.items():
        try:
            if not prometheus_query(replayed.prometheus, expr, **_range(replayed)):
                empty.append(name)
        except ValueError as e:
            errors[name] = str(e)
    return errors, empty


def _unexplained(empty: list[str], exprs: dict[str, str]) -> list[str]:
    return [name for name in empty if not any(reason in exprs[name] for reason in MAY_BE_EMPTY)]


def test_every_dashboard_promql_runs_on_the_real_prometheus_with_data_where_data_must_exist(replayed: Replayed) -> None:
    span = time.time() - replayed.started + 30
    exprs = {
        f"{q.dashboard} / {q.panel} / {q.ref_id}": grafana_macros.expand_promql(
            q.expr, range_s=span, interval_s=5, scrape_interval_s=1
        )
        for q in catalog.queries()
        if q.kind == "prometheus"
    }
    assert len(exprs) >= 50
    errors, empty = _run_promql(replayed, exprs)
    assert errors == {}
    assert _unexplained(empty, exprs) == []


def test_every_recording_and_alert_rule_runs_and_every_recording_rule_has_data(replayed: Replayed) -> None:
    from dashboards.alert_rules import recording_names, rule_expressions

    exprs = {f"rule {i}": e for i, e in enumerate(rule_expressions(TEST_WINDOWS))}
    errors, _ = _run_promql(replayed, exprs)
    assert errors == {}
    # No data from yesterday or from before the short window; no budget wait without a budget, no behaviours, no
    # feedback (MAY_BE_EMPTY).
    recorded = {
        name: name
        for name in recording_names(TEST_WINDOWS)
        if "offset" not in name and "judge_budget" not in name and "behaviour" not in name and "user_" not in name
    }
    assert len(recorded) >= 10
    errors, empty = _run_promql(replayed, recorded)
    assert (errors, empty) == ({}, [])


def test_every_grafana_managed_alert_query_runs(replayed: Replayed) -> None:
    exprs = {f"grafana rule query {i}": e for i, e in enumerate(grafana_alerts.promql_expressions(TEST_WINDOWS))}
    assert exprs
    errors, _ = _run_promql(replayed, exprs)
    assert errors == {}


def test_every_sql_panel_runs_on_the_sinks_clickhouse(replayed: Replayed) -> None:
    """Through `ClickHouseStore.query`, the client the service writes with (the sink must stop first: chDB is one-process)."""
    from datetime import datetime

    for process in replayed.pipeline.processes:
        if process.name == "sink":
            process.terminate()
    burst_id = sorted(replayed.stream.burst)[0]
    start = datetime.fromtimestamp(replayed.started - 60, UTC)
    end = datetime.fromtimestamp(time.time() + 60, UTC)
    variables = {"product": grafana_macros.ALL, "model_version": grafana_macros.ALL, "conversation_id": burst_id}
    results = {}
    for q in catalog.queries():
        if q.kind == "clickhouse":
            sql = grafana_macros.expand_sql(q.expr, start=start, end=end, variables=variables)
            results[f"{q.panel} / {q.ref_id}"] = replayed.pipeline.query_store(sql)
    assert len(results) >= 8
    # the scoring-core rubric set (LLM-Rubric's Q1-Q8) has no DSAT rubric, and this replay judges no behaviours and
    # sends no feedback (MAY_BE_EMPTY): nothing else may be empty
    assert sorted(name for name, rows in results.items() if not rows) == [
        "AUROC of P(dissatisfied) against user feedback / A",
        "Behaviour rate over time / A",
        "Behaviour rates with 95 % Wilson intervals / A",
        "DSAT rubric hits over time / A",
        "Most-firing DSAT rubrics / A",
    ]
    # the drill-down panels show the chosen conversation: all its turns, its score, its rubric scores
    conversation = load_real_conversations(LLM_RUBRIC_DATA / "real_data.json")[burst_id]
    assert len(results["Turns / A"]) == len(conversation.turns)
    assert len(results["Scores / A"]) == 1
    worst = results["Worst recent conversations / A"]
    assert len(worst) >= 10 and {row["conversation_id"] for row in worst[:10]} <= replayed.stream.burst  # worst first


def _timestamp(rfc3339: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def test_convowatch_report_renders_the_replay(replayed: Replayed) -> None:
    """`convowatch report` on the sink's store (stopped: chDB is one-process) shows the whole replay and the burst."""
    import subprocess
    import sys

    from tests.pipeline import REPO

    for process in replayed.pipeline.processes:
        if process.name == "sink":
            process.terminate()
    out = replayed.pipeline.root / "report"
    done = subprocess.run(
        [sys.executable, "-m", "stream.commands.cli", "report", "--since", "1h", "--product", "spiky", "--out", str(out)],
        cwd=REPO,
        env={
            **__import__("os").environ,
            **replayed.pipeline.env,
            "CONVOWATCH_SCORING__QUESTIONS": str(LLM_RUBRIC_DATA / "questions.json"),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    spiky = sum(1 for product, _ in replayed.stream.starts.values() if product == "spiky")
    assert done.stdout.startswith(f"{spiky} conversations ({spiky} scored, 0 unscored)")
    assert (out / "overview.png").stat().st_size > 10_000 and (out / "quality.png").is_file()
