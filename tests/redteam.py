"""Issue 54's attacks end to end on a live pipeline, and what they achieved, counted (bench/redteam.py).

One real worker and one real sink (``convowatch -v run``, ``convowatch -v sink``: DEBUG logs everywhere) on Apache
Kafka, with the embedded ClickHouse, score through the OpenAI-compatible judge API. The judge is a `ScriptedServer`
standing in for an upstream gone wrong (no real judge answers hostile shapes or echoes its key on demand): it answers
most calls well, and the calls about some conversations (told by a marker in their text) with the replies of the
wrong shape of tests/integration/test_judge_hostile_replies.py, or with error bodies echoing the API key encoded or
cut (tests/integration/test_judge_secrets.py). Sent, between real LLM-Rubric conversations (`Attacks.events`):

- the poison pills of tests/integration/test_poison_pills.py;
- a conversation per hostile reply shape and per key echo;
- a conversation whose every role writes the chat-template tokens of tests/integration/test_control_tokens.py;
- a conversation holding canaries (user and assistant turns, a feedback comment);
- a conversation under each hostile id of tests/integration/test_dashboard_injection.py (quotes, backslashes,
  comments, UNION, 256 characters).

Then more real conversations, and the count (`measure`): worker crashes (the process exited and was started again,
"We experienced a crash" in a log), blocked partitions (a worker or sink group's partition whose lag is not 0 once the
later conversations are stored), canary lines in the logs, API-key fragments (tests/integration/test_judge_secrets.py's
search: any 8 characters of the key or of its echoed encodings) in the logs, every ClickHouse table and the scores and
dead-letter topics, rows a Rubrics-dashboard drill-down panel returns under a hostile id beyond those of the same
query with the id bound as a hex literal (which no value can leave), control tokens beyond the template's in the
prompts the judge received (tokenized with the real Gemma and Qwen vocabularies), and quarantined records. Each count
comes with the figure that shows its search could find something (canaries stored, echoes sent, the raw hostile
text's control tokens).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from dashboards import catalog
from stream.contract import EndEvent, FeedbackEvent, TurnEvent, encode_event
from stream.judge_server import JudgeServerError, packaged_qwen
from stream.records import ScoreRecord
from stream.replay.sources import llm_rubric_events
from tests.grafana_macros import ALL, expand_sql
from tests.infra import wait_for
from tests.integration.test_control_tokens import HOSTILE as CONTROL_TOKEN_TEXTS
from tests.integration.test_control_tokens import TEMPLATES, Vocabulary, _load, _template_tokens
from tests.integration.test_dashboard_injection import DRILL_DOWN_PANELS, HOSTILE_IDS
from tests.integration.test_judge_hostile_replies import HOSTILE_BODIES
from tests.integration.test_judge_secrets import ECHOES, KEY, _leaked
from tests.integration.test_pipeline import _completion
from tests.integration.test_poison_pills import poison_pills
from tests.pipeline import Pipeline
from tests.servers import Received, Reply, ScriptedServer, cache_dir, gemma_gguf_path

T = 1_707_480_000.0  # 2024-02-09 12:00 UTC
MARK = re.compile(r"RT-MARK-(\w+)-END")
CRASH = "We experienced a crash"
ID_BINDING = "decodeURLComponent('${conversation_id:percentencode}')"  # how the panels bind the id (checked)
N_REAL = 8  # real conversations before the attacks, and as many after
SETTLE_TIMEOUT_S = 300.0


def _marked(name: str) -> str:
    return f"RT-MARK-{name}-END"


@dataclass
class Attacks:
    """The attack conversations of one run and the judge's replies to them (see the module)."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex)
    hostile_shapes: tuple[str, ...] = ("choices are ints", "string logprob", "JSON list", "not JSON", "null logprob")
    received: list[Received] = field(default_factory=list)
    echoes_sent: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def canaries(self) -> dict[str, str]:
        return {role: f"{role} canary {self.tag} says" for role in ("user", "assistant", "feedback")}

    def conversation(self, cid: str, marker: str, texts: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
        """``texts`` (role, text) as the turns of ``cid``, the first carrying ``marker``, then its end."""
        events: list[TurnEvent | EndEvent] = [
            TurnEvent(cid, i, role, f"{_marked(marker)} {text}" if i == 0 else text, T + i, {"product": "redteam"})
            for i, (role, text) in enumerate(texts)
        ]
        events.append(EndEvent(cid, T + 100))
        return [(cid.encode(), encode_event(e)) for e in events]

    def events(self) -> list[tuple[bytes, bytes]]:
        """Every attack's records of the events topic, in the order sent."""
        out = list(poison_pills())
        for i in range(len(self.hostile_shapes)):
            out += self.conversation(f"rt-shape-{i}", f"shape{i}", [("user", "Is this thing on?"), ("assistant", "Yes.")])
        for i in range(len(ECHOES)):
            out += self.conversation(f"rt-echo-{i}", f"echo{i}", [("user", "Hello"), ("assistant", "Hi, how can I help?")])
        roles = ("user", "assistant", "tool", "user")
        out += self.conversation("rt-control", "control", [(roles[i % 4], t) for i, t in enumerate(CONTROL_TOKEN_TEXTS)])
        c = self.canaries
        out += self.conversation("rt-canary", "canary", [("user", c["user"]), ("assistant", c["assistant"])])
        out.append((b"rt-canary", encode_event(FeedbackEvent("rt-canary", 1, "down", T + 50, comment=c["feedback"]))))
        for i, cid in enumerate(HOSTILE_IDS):
            out += self.conversation(cid, f"sql{i}", [("user", f"question of sql-{i}"), ("assistant", f"answer of sql-{i}")])
        return out

    def respond(self, _: int, request: Received) -> Reply:
        """The scripted judge: a hostile shape or key echo for the marked conversations, else a well-formed answer."""
        with self._lock:
            self.received.append(request)
        prompt = json.loads(request.body)["messages"][0]["content"]
        mark = MARK.search(prompt)
        name = mark.group(1) if mark else ""
        if name.startswith("shape"):
            return Reply(200, HOSTILE_BODIES[self.hostile_shapes[int(name[5:])]])
        if name.startswith("echo"):
            status, said = list(ECHOES.values())[int(name[4:])]
            text = said(request.headers.get("authorization", ""))
            with self._lock:
                self.echoes_sent += bool(_leaked(text))
            return Reply(status, json.dumps({"error": {"message": text, "type": "server_error"}}).encode())
        return Reply(200, json.dumps(_completion()).encode())

    def prompts_about(self, marker: str) -> list[str]:
        """The prompts the judge received about the conversation marked ``marker``."""
        with self._lock:
            bodies = [json.loads(r.body)["messages"][0]["content"] for r in self.received]
        return [p for p in bodies if _marked(marker) in p]


def judge_env(url: str) -> dict[str, str]:
    """The worker's judge: the scripted server. Retries kept short (their timing is not under test; the slow-judge
    figure is measured at the defaults)."""
    return {
        "CONVOWATCH_JUDGE__BACKEND": "openai",
        "CONVOWATCH_JUDGE__BASE_URL": url + "/v1",
        "CONVOWATCH_JUDGE__MODEL": "stand-in",
        "CONVOWATCH_JUDGE__API_KEY": KEY,
        "CONVOWATCH_JUDGE__MAX_RETRIES": "1",
        "CONVOWATCH_JUDGE__BACKOFF_INITIAL_S": "0.05",
        "CONVOWATCH_JUDGE__BACKOFF_MAX_S": "0.1",
        "CONVOWATCH_SCORING__MAX_ATTEMPTS": "2",
        "CONVOWATCH_SCORING__RETRY_INITIAL_S": "0.1",
        "CONVOWATCH_SCORING__RETRY_MAX_S": "0.2",
        "CONVOWATCH_KAFKA__CONSUMER": "batch",
    }


class Watched:
    """The worker and sink processes of a run, started again (and counted) whenever one has exited. A process started
    again keeps its name (its static group membership, so it takes its partitions back at once) and its log file."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.restarts: Counter[str] = Counter()
        self.worker = pipeline.start_worker(cli_options=("-v",))
        self.sink = pipeline.start_sink(cli_options=("-v",))

    def check(self) -> None:
        """Start again whichever process has exited."""
        if self.worker.popen.poll() is not None:
            self.restarts["worker"] += 1
            self.worker = self.pipeline.start_worker(cli_options=("-v",))
        if self.sink.popen.poll() is not None:
            self.restarts["sink"] += 1
            self.sink = self.pipeline.start_sink(cli_options=("-v",))

    def log_text(self, role: str) -> str:
        return (self.worker if role == "worker" else self.sink).log.read_text(errors="replace")


def _scored(pipeline: Pipeline) -> dict[str, ScoreRecord]:
    return {r.conversation_id: r for r in (ScoreRecord.from_json(m.value) for m in pipeline.consume("scores", 10**9, timeout=3))}


def lags(pipeline: Pipeline) -> dict[str, int]:
    """Per ``group/topic/partition``: end offset minus committed offset, for the worker's two groups and the sink's."""
    groups = {
        "events": pipeline.worker_group("events"),
        "closed": pipeline.worker_group("closed"),
        "scores": pipeline.env["CONVOWATCH_KAFKA__SINK_GROUP"],
    }
    admin = KafkaAdminClient(bootstrap_servers=pipeline.bootstrap)
    consumer = KafkaConsumer(bootstrap_servers=pipeline.bootstrap)
    try:
        out = {}
        for topic, group in groups.items():
            tps = [TopicPartition(pipeline.topic(topic), p) for p in range(pipeline.partitions)]
            ends = consumer.end_offsets(tps)
            offsets = admin.list_group_offsets(group)[group]
            committed = {tp.partition: om.offset for tp, om in offsets.items() if tp.topic == pipeline.topic(topic)}
            for tp in tps:
                out[f"{group}/{topic}/{tp.partition}"] = ends[tp] - max(0, committed.get(tp.partition, 0))
        return out
    finally:
        consumer.close()
        admin.close()


def _real(items: list, ids: Iterable[str]) -> list[tuple[bytes, bytes]]:
    chosen = set(ids)
    return [(i.key, i.raw) for i in items if i.event is not None and i.event.conversation_id in chosen]


def run_attacks(pipeline: Pipeline) -> dict[str, Any]:
    """Every attack on ``pipeline`` (a fresh one), then the counts of what they achieved (see the module)."""
    attacks = Attacks()
    items = list(llm_rubric_events())
    real = sorted({i.event.conversation_id for i in items if i.event is not None})[: 2 * N_REAL]
    started = time.monotonic()
    with ScriptedServer(attacks.respond) as judge:
        pipeline.extra_env.update(judge_env(judge.url))
        processes = Watched(pipeline)
        pipeline.wait_assigned([processes.worker])
        pipeline.produce(_real(items, real[:N_REAL]) + attacks.events())
        later_sent = time.monotonic()
        pipeline.produce(_real(items, real[N_REAL:]))
        later = set(real[N_REAL:])

        def later_stored() -> bool:
            processes.check()
            return later <= set(_scored(pipeline))

        try:
            wait_for(later_stored, timeout=SETTLE_TIMEOUT_S, interval=2, what="the later real conversations scored")
        except TimeoutError:
            pass  # counted below: fewer later conversations scored than sent
        later_s = time.monotonic() - later_sent
        try:
            wait_for(lambda: not any(lags(pipeline).values()), timeout=60, interval=2, what="every group caught up")
        except TimeoutError:
            pass  # counted below as blocked partitions
        lag = lags(pipeline)
        processes.check()
        quarantined = processes.worker.metric_sum("convowatch_quarantined_records_total")
        for p in (processes.worker, processes.sink):
            p.terminate()
    scores = _scored(pipeline)
    letters = [m.value for m in pipeline.consume("dead_letter", 10**9, timeout=3)]
    logs = {role: processes.log_text(role) for role in ("worker", "sink")}
    result = {
        "worker_crashes": processes.restarts["worker"] + logs["worker"].count(CRASH),  # exits, and crashes Faust logs
        "worker_restarts": processes.restarts["worker"],
        "sink_restarts": processes.restarts["sink"],
        "crash_lines_in_logs": {role: text.count(CRASH) for role, text in logs.items()},
        "blocked_partitions": sum(1 for v in lag.values() if v > 0),
        "lag_after": {k: v for k, v in lag.items() if v},
        "later_real_conversations_scored": len(later & set(scores)),
        "later_real_conversations_sent": len(later),
        "later_real_scored_within_s": round(later_s, 1),
        "quarantined_records": quarantined,
        "quarantined_dead_letters": sum(json.loads(v).get("reason") == "quarantined" for v in letters),
        "dead_letters": len(letters),
        "conversations_scored": sum(r.status == "scored" for r in scores.values()),
        "conversations_unscored": sum(r.status == "unscored" for r in scores.values()),
        "attack_conversations_unscored": sorted(c for c, r in scores.items() if r.status == "unscored"),
    }
    result |= _leaks(pipeline, attacks, logs, [m.value for m in pipeline.consume("scores", 10**9, timeout=3)], letters)
    result |= _sql_injection(pipeline)
    result |= _control_tokens(attacks)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def _tables(pipeline: Pipeline) -> list[str]:
    rows = pipeline.query_store("SELECT name FROM system.tables WHERE database = 'convowatch' AND engine NOT LIKE '%View'")
    return sorted(r["name"] for r in rows)


def _leaks(pipeline: Pipeline, attacks: Attacks, logs: dict[str, str], scores: list[bytes], letters: list[bytes]) -> dict:
    """Canary lines in the logs, key fragments anywhere; and the canaries found in the store (the search works)."""
    tables = _tables(pipeline)
    dumps = dict(zip(tables, pipeline.query_store_many([f"SELECT * FROM convowatch.`{t}`" for t in tables])))
    store_text = {t: json.dumps(rows, ensure_ascii=False, default=str) for t, rows in dumps.items()}
    places = {
        **{f"{role} log": text for role, text in logs.items()},
        **{f"table {t}": text for t, text in store_text.items()},
        "scores topic": b"\n".join(scores).decode(errors="replace"),
        "dead-letter topic": b"\n".join(letters).decode(errors="replace"),
    }
    fragments = {place: len(_leaked(text)) for place, text in places.items()}
    return {
        "canary_log_lines": {role: sum(attacks.tag in line for line in text.splitlines()) for role, text in logs.items()},
        "canaries_stored": sum(text.count(attacks.tag) for text in store_text.values()),
        "key_fragments_found": sum(fragments.values()),
        "key_fragments_by_place": {p: n for p, n in fragments.items() if n},
        "key_echoes_sent_by_the_judge": attacks.echoes_sent,
        "clickhouse_tables_searched": len(tables),
    }


def _panel(name: str) -> str:
    (expr,) = {q.expr for q in catalog.queries() if q.kind == "clickhouse" and q.panel == name}
    assert ID_BINDING in expr, f"the {name} panel binds the conversation id another way now: update the count"
    return expr


def _sql_injection(pipeline: Pipeline) -> dict:
    """Rows each drill-down panel returns under each hostile id, beyond those of the panel's own query with the id
    bound as ``unhex('…')`` (no value can leave a hex literal)."""
    start, end = datetime.fromtimestamp(T - 86_400, tz=UTC), datetime.fromtimestamp(time.time() + 86_400, tz=UTC)
    queries, keys = [], []
    for cid in HOSTILE_IDS:
        for name in DRILL_DOWN_PANELS:
            expr = _panel(name)
            variables = {"product": ALL, "model_version": ALL, "conversation_id": cid}
            hostile = expand_sql(expr, start=start, end=end, variables=variables, interval_s=600)
            safe = expand_sql(
                expr.replace(ID_BINDING, f"unhex('{cid.encode().hex()}')"),
                start=start,
                end=end,
                variables={**variables, "conversation_id": ""},
                interval_s=600,
            )
            queries += [hostile, safe]
            keys.append((cid, name))
    results = pipeline.query_store_many(queries)
    injected, own = 0, 0
    for i, _ in enumerate(keys):
        got = Counter(json.dumps(r, sort_keys=True) for r in results[2 * i])
        expected = Counter(json.dumps(r, sort_keys=True) for r in results[2 * i + 1])
        injected += sum((got - expected).values())
        own += sum(expected.values())
    return {"injected_sql_rows": injected, "hostile_ids": len(HOSTILE_IDS), "panel_rows_of_the_ids_own_data": own}


def _vocabularies() -> dict[str, Vocabulary]:
    out = {"gemma": _load("gemma", gemma_gguf_path())}
    try:
        out["qwen"] = _load("qwen", packaged_qwen(cache_dir()))
    except JudgeServerError:
        pass  # not installed here: reported as not tokenized
    return out


def _control_tokens(attacks: Attacks) -> dict:
    """Control tokens beyond the template's in every prompt the judge received about the control-token conversation,
    and in the raw hostile texts (what the search finds without neutralising)."""
    prompts = attacks.prompts_about("control")
    extra, raw = {}, {}
    for name, vocabulary in _vocabularies().items():
        template = Counter(_template_tokens(vocabulary))
        extra[name] = sum(
            sum((Counter(vocabulary.control_tokens(TEMPLATES[name].format(prompt=p))) - template).values()) for p in prompts
        )
        raw[name] = sum(len(vocabulary.control_tokens(t)) for t in CONTROL_TOKEN_TEXTS)
    return {
        "extra_control_tokens": sum(extra.values()),
        "extra_control_tokens_by_vocabulary": extra,
        "control_token_prompts_tokenized": len(prompts),
        "raw_hostile_text_control_tokens": raw,
    }
