"""`make demo`: the whole service on the embedded stack, replaying the 223 real LLM-Rubric conversations.

    python -m deploy.local.demo start   # stack + artifacts + worker + sink, the loop below, summary (leaves it running)
    python -m deploy.local.demo stop    # worker, sink and the stack

Steps: start Apache Kafka (deploy/local/kafka.py: one KRaft node; records, committed
offsets and the worker's changelog survive a broker restart), Prometheus
(scraping the worker and the sink, evaluating the production alert rules) and
Alertmanager; make a rubric set and a
calibrator with the scoring-core commands from LLM-Rubric's synthetic data and
register them as scorer version ``synthetic`` (docs/rollout.md); start a
worker and the sink with the **recorded** GPT-3.5 judge (its stored answers
for these conversations: no model runs for them) and ABC-Eval's behaviours
judged on 5 % of the conversations by the packaged local model (plumbing: it
says yes to nearly everything). Then the loop a team runs:

1. replay half of the conversations (a fixed split by id) with a thumbs up or
   down from their "users" — the human judges' own verdict (mean Q0 > 2: up),
   standing in for a product's thumbs;
2. learn a rubric set from those stored thumbs (``convowatch learn
   --from-store``) and roll it out as a shadow of ``synthetic``;
3. replay the other half, with its thumbs: both versions score it;
4. compare the two on that half (``convowatch scorers compare``), including
   their agreement with the users, and show the alert state.

Finally print ``convowatch summary`` (with the behaviour rates) next to the
human judges' ratings and leave the worker, sink and stack running with their URLs.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from deploy.local import processes, stack
from scorers.datasets.llm_rubric import load_split, satisfaction_labels
from stream.contract import EndEvent, FeedbackEvent, TurnEvent, encode_event
from stream.replay.sources import llm_rubric_events
from stream.sampling import unit_hash

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data" / "llm-rubric"
STATE = REPO / ".convowatch" / "demo"
RULES = REPO / "dashboards" / "alerts" / "convowatch.rules.yml"  # the production alert rules, evaluated by the demo's Prometheus
KAFKA_PORT, WORKER_PORT, SINK_PORT = 9092, 9464, 9465
PYTHONS = ("python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}")
N_CONVERSATIONS = 223
REGISTRY = STATE / "registry"
ACTIVE = "synthetic"  # the rubric set and calibrator made from synthetic data
SPLIT_SALT = "demo-split"  # which half is learned from, which half compares
# The calibrator's penalties are chosen holding out one synthetic dialogue system at a time (its id's prefix),
# the rule bench/calibration_transfer.py declared for its default.
SYNTHETIC_SYSTEM = "^(V[0-9]+)_"
BEHAVIOUR_RATE = 0.05  # 12 of the 223 conversations, 55 assistant turns: about 3 min of the local model on 2 cores
BEHAVIOUR_CAVEAT = f"""\
The behaviour rates above are plumbing, not a measurement of these assistants: the packaged Gemma 3 270M base
model answered them (scoring.behaviour_judge=local, on {BEHAVIOUR_RATE * 100:g} % of the conversations) and it says yes to nearly every
behaviour on every turn; the best judge here, Qwen2.5-Coder 1.5B, detects none of them either (AUROC 0.42 against
human proxy labels, docs/behaviours.md). Point scoring.behaviour_judge at a judge measured to discriminate."""
SCORING_TIMEOUT_S = 900.0  # the local model's behaviour questions take minutes on a small host


def _settings_env() -> dict[str, str]:
    """The demo's configuration, as the CONVOWATCH_* environment the service reads."""
    return {
        "CONVOWATCH_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{KAFKA_PORT}",
        "CONVOWATCH_JUDGE__BACKEND": "recorded",
        "CONVOWATCH_JUDGE__RECORDED_ANSWERS": str(DATA / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"),
        "CONVOWATCH_SCORING__REGISTRY": str(REGISTRY),
        "CONVOWATCH_SCORING__REGISTRY_POLL_S": "2",
        "CONVOWATCH_SCORING__QUESTIONS": str(DATA / "questions.json"),
        # ABC-Eval's behaviours on a share of the conversations, answered by the packaged local model (the recorded
        # judge has no behaviour answers). Plumbing: that model says yes to every behaviour (BEHAVIOUR_CAVEAT).
        "CONVOWATCH_SCORING__BEHAVIOURS": "abc-eval",
        "CONVOWATCH_SCORING__BEHAVIOUR_JUDGE": "local",
        "CONVOWATCH_SCORING__BEHAVIOUR_RATE": str(BEHAVIOUR_RATE),
        "CONVOWATCH_STORE__DSN": f"chdb://{STATE / 'clickhouse'}",
    }


def _cw(*args: str, env: dict[str, str] | None = None, quiet: bool = False) -> subprocess.CompletedProcess:
    """Run a `convowatch` command; on failure print its output and stop the demo."""
    done = subprocess.run(
        [sys.executable, "-m", "stream.commands.cli", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"demo: `convowatch {' '.join(args)}` failed (exit {done.returncode})")
    if not quiet:
        print("  " + done.stdout.strip().replace("\n", "\n  "))
    return done


def make_artifacts() -> None:
    """Rubric set (Q1-Q8, windows fitted on synthetic labels) and calibrator, by the scoring-core commands."""
    if (STATE / "rubricset.json").exists() and (STATE / "calibrator").exists():
        print("- rubric set and calibrator: already made (delete .convowatch/demo to rebuild)")
        return
    print("- making the rubric set and the calibrator from LLM-Rubric's synthetic data (recorded GPT-3.5 answers)")
    synth = DATA / "gpt-3.5-turbo-16k_synth_evaluations_FIXED.tsv"
    judge = {"CONVOWATCH_JUDGE__BACKEND": "recorded", "CONVOWATCH_JUDGE__RECORDED_ANSWERS": str(synth)}
    _cw(
        "data",
        "llm-rubric",
        "--data-dir",
        str(DATA),
        "--split",
        "synth",
        "--labelled-out",
        str(STATE / "synth.jsonl"),
        "--rubric-set-out",
        str(STATE / "unfitted-rubricset.json"),
    )
    _cw(
        "rubrics",
        "fit",
        "--rubric-set",
        str(STATE / "unfitted-rubricset.json"),
        "--labelled",
        str(STATE / "synth.jsonl"),
        "--out",
        str(STATE / "rubricset.json"),
        env=judge,
    )
    _cw(
        "calibrate",
        "train",
        "--judge-answers",
        str(synth),
        "--human-labels",
        str(DATA / "human_judges_synth_all_FIXED_ANON.tsv"),
        "--questions",
        str(DATA / "questions.json"),
        "--cv-groups",
        SYNTHETIC_SYSTEM,
        "--out",
        str(STATE / "calibrator"),
    )


def register_active() -> None:
    """Register the synthetic-data rubric set and calibrator (once) and make them the active scorer version."""
    if ACTIVE not in [p.name for p in (REGISTRY / "versions").glob("*")]:
        _cw(
            "scorers",
            "register",
            ACTIVE,
            "--rubric-set",
            str(STATE / "rubricset.json"),
            "--calibrator",
            str(STATE / "calibrator"),
            env=_settings_env(),
        )
    _cw("scorers", "shadow", "--off", env=_settings_env(), quiet=True)
    _cw("scorers", "promote", ACTIVE, env=_settings_env())


def write_half(path: Path, learning_half: bool) -> int:
    """One half of the real conversations as contract events (JSONL), each with its users' thumbs on the last
    assistant turn before it ends: up when the human judges' mean Q0 is above 2, down otherwise."""
    thumbs = satisfaction_labels(load_split(DATA, "real"))
    conversations: dict[str, list] = {}
    for item in llm_rubric_events(DATA / "real_data.json"):
        assert item.event is not None
        cid = item.event.conversation_id
        if (unit_hash(SPLIT_SALT, cid) < 0.5) == learning_half:
            conversations.setdefault(cid, []).append(item.event)
    with path.open("wb") as f:
        for cid, events in conversations.items():
            turns = [e for e in events if isinstance(e, TurnEvent) and e.role == "assistant"]
            end = next(e for e in events if isinstance(e, EndEvent))
            if cid in thumbs and turns:
                rating = "up" if thumbs[cid] else "down"
                events.insert(events.index(end), FeedbackEvent(cid, turns[-1].turn_index, rating, end.timestamp - 1))
            f.writelines(encode_event(e) + b"\n" for e in events)
    return len(conversations)


def replay_half(learning_half: bool) -> int:
    """Replay one half with its thumbs and wait until the sink has stored it; returns how many conversations."""
    path = STATE / ("learning-half.jsonl" if learning_half else "comparison-half.jsonl")
    n = write_half(path, learning_half)
    already = _metric(SINK_PORT, "convowatch_sink_rows_total", table="conversation_scores")
    _cw("replay", "jsonl", str(path), env=_settings_env(), quiet=True)
    _wait(
        "the sink to store the replayed conversations",
        lambda: _metric(SINK_PORT, "convowatch_sink_rows_total", table="conversation_scores") >= already + n,
        SCORING_TIMEOUT_S,
    )
    return n


def learn_from_feedback(since: str) -> str:
    """Learn a rubric set from the thumbs stored since ``since``, register it, and shadow the active version with it."""
    domain = STATE / "domain.md"
    domain.write_text("An assistant answers a user's questions in a conversation, citing web sources.\n", encoding="utf-8")
    learned = STATE / "from-feedback.json"
    _cw(
        "learn",
        "--from-store",
        "--since",
        since,
        "--candidates",
        str(STATE / "unfitted-rubricset.json"),
        "--n-sat",
        "4",
        "--n-dsat",
        "0",
        "--domain",
        str(domain),
        "--out",
        str(learned),
        "--cache",
        str(STATE / "rubric-scores.sqlite"),
        env=_settings_env(),
    )
    name = "from-feedback-" + json.loads(learned.read_text(encoding="utf-8"))["version"][:8]
    if not (REGISTRY / "versions" / name).exists():
        _cw(
            "scorers",
            "register",
            name,
            "--rubric-set",
            str(learned),
            "--calibrator",
            str(STATE / "calibrator"),
            env=_settings_env(),
        )
    _cw("scorers", "shadow", name, "--rate", "1", env=_settings_env())
    return name


def alert_state() -> str:
    """The alerts Prometheus has pending or firing now, one per line (or that none is)."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:9090/api/v1/alerts", timeout=5) as r:
            alerts = json.load(r)["data"]["alerts"]
    except (OSError, ValueError, KeyError) as e:
        return f"  (Prometheus did not answer: {e})"
    if not alerts:
        return "  none pending or firing"
    return "\n".join(f"  {a['labels'].get('alertname')} {a['state']} {a['labels']}" for a in alerts)


def _metric(port: int, name: str, **labels: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return -1.0
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _wait(what: str, ready, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out waiting for {what}; logs are in {STATE}")
        time.sleep(0.5)


def start_service(name: str, command: str, port: int) -> None:
    """Start `convowatch run|sink` in the background (pid and log in the state dir) unless it runs."""
    if processes.read_tracked(STATE, name, PYTHONS) is not None:
        print(f"- {name}: already running")
        return
    if processes.port_in_use(port):
        raise SystemExit(f"demo: port {port} (the {name}'s metrics) is already in use; stop what uses it or run `make demo-stop`")
    # Static group membership, as the production units set it: a worker started again takes its partitions back.
    env = {
        **os.environ,
        **_settings_env(),
        "CONVOWATCH_METRICS__PORT": str(port),
        "CONVOWATCH_KAFKA__GROUP_INSTANCE_ID": f"demo-{name}",
    }
    with processes.open_log(processes.log_path(STATE, name), append=True) as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "stream.commands.cli", command],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    processes.pid_path(STATE, name).write_text(f"{popen.pid}\n")
    _wait(f"the {name}'s metrics endpoint", lambda: popen.poll() is not None or _metric(port, "convowatch_") >= 0, 120)
    if popen.poll() is not None:
        raise SystemExit(
            f"demo: the {name} exited; last lines of its log:\n{processes.log_tail(processes.log_path(STATE, name))}"
        )
    print(f"- {name}: running (pid {popen.pid}, log {processes.log_path(STATE, name)})")


def stop_service(name: str) -> None:
    tracked = processes.read_tracked(STATE, name, PYTHONS)
    if tracked is not None:
        processes.terminate(tracked.pid)
    processes.forget(STATE, name)


def human_ratings() -> dict[str, tuple[int, float, float]]:
    """Per assistant variant: conversations, the human judges' mean Q0 (1-4) and share of Q0 ≤ 2 (for comparison only)."""
    variant = {c["_id"]: str(c["dialogue_version"]) for c in json.loads((DATA / "real_data.json").read_text())}
    by_variant: dict[str, list[int]] = {}
    with (DATA / "human_judges_real_convs_FIXED_ANON.tsv").open(newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            q0 = int(row["Q0"] or 0)
            if q0 > 0 and row["text_id"] in variant:
                by_variant.setdefault(variant[row["text_id"]], []).append(q0)
    return {v: (len(xs), sum(xs) / len(xs), sum(x <= 2 for x in xs) / len(xs)) for v, xs in sorted(by_variant.items())}


def stack_config() -> stack.StackConfig:
    """The demo's stack: Apache Kafka, Prometheus scraping the worker and the sink, Alertmanager."""
    return stack.StackConfig(
        state_dir=STATE / "stack",
        kafka_port=KAFKA_PORT,
        scrape_targets=[f"127.0.0.1:{WORKER_PORT}", f"127.0.0.1:{SINK_PORT}"],
        rule_files=[RULES],
    )


def start() -> None:
    STATE.mkdir(parents=True, exist_ok=True, mode=0o700)  # the store, logs and conversation files: owner only
    print("- starting the embedded stack (Apache Kafka, Prometheus, Alertmanager)")
    for service in stack.start_all(stack_config()).values():
        print(f"  {service.name:<13}{service.url}")
    make_artifacts()
    register_active()
    start_service("sink", "sink", SINK_PORT)
    start_service("worker", "run", WORKER_PORT)
    _wait("the worker to own its partitions", lambda: _metric(WORKER_PORT, "convowatch_assigned_partitions") > 0, 120)

    started = datetime.now(UTC).isoformat()
    n = replay_half(learning_half=True)
    print(f"- replayed {n} of the {N_CONVERSATIONS} real conversations with their users' thumbs (scored by {ACTIVE})")
    # The embedded ClickHouse opens in one process only: pause the sink while a command reads it.
    stop_service("sink")
    print("- learning a rubric set from the stored thumbs (convowatch learn --from-store) and shadowing with it")
    candidate = learn_from_feedback(started)
    start_service("sink", "sink", SINK_PORT)
    _wait(
        "the worker to take the shadow",
        lambda: _metric(WORKER_PORT, "convowatch_scorer_version_info", role="shadow", scorer_name=candidate) == 1,
        60,
    )
    second_half = datetime.now(UTC).isoformat()
    n = replay_half(learning_half=False)
    print(f"- replayed the other {n} conversations with their thumbs: scored by {ACTIVE} and, as its shadow, {candidate}")
    _wait(
        "the shadow's scores",
        lambda: _metric(SINK_PORT, "convowatch_sink_rows_total", table="shadow_scores") >= n,
        SCORING_TIMEOUT_S,
    )
    stop_service("sink")
    print("\n=== convowatch scorers compare (the half not learned from; users' thumbs = human judges' verdicts) ===")
    print(_cw("scorers", "compare", "--since", second_half, env=_settings_env(), quiet=True).stdout)
    print("alerts (Prometheus, dashboards/alerts/convowatch.rules.yml):")
    print(alert_state())
    print(f"promote it with: CONVOWATCH_SCORING__REGISTRY={REGISTRY} convowatch scorers promote {candidate}")

    print("\n=== convowatch summary (recorded GPT-3.5 judge; rubric set and calibrator trained on synthetic data) ===")
    print(_cw("summary", env=_settings_env(), quiet=True).stdout)
    print(BEHAVIOUR_CAVEAT + "\n")
    print("human judges on the same conversations (not used for scoring; for comparison):")
    print(f"  {'variant':<10}{'ratings':>8}{'mean Q0':>10}{'share Q0<=2':>13}")
    for v, (n, mean, low) in human_ratings().items():
        print(f"  {v:<10}{n:>8}{mean:>10.2f}{low:>13.1%}")
    report = STATE / "report"
    _cw("report", "--since", "1d", "--out", str(report), env=_settings_env(), quiet=True)
    start_service("sink", "sink", SINK_PORT)

    print(f"""
Running (stop with `make demo-stop`):
  worker metrics  http://127.0.0.1:{WORKER_PORT}/metrics
  sink metrics    http://127.0.0.1:{SINK_PORT}/metrics
  Prometheus      http://127.0.0.1:9090   e.g. sum by (model_version) (convowatch_conversations_scored_total)
  Alertmanager    http://127.0.0.1:9093   (Prometheus evaluates dashboards/alerts/convowatch.rules.yml)
  report          {report / "index.html"}   (`convowatch report --since 1d --out DIR`, sink stopped)
  dashboards      dashboards/json/*.json  (import into Grafana: docs/dashboards.md)
  Apache Kafka    127.0.0.1:{KAFKA_PORT}           topic convowatch.events (data under {STATE / "stack" / "kafka"})
  state and logs  {STATE}
The judge replays recorded answers; docs/service.md "Use a live judge" shows how to point the worker at an OpenAI-compatible one.""")


def stop() -> None:
    for name in ("worker", "sink"):
        stop_service(name)
    stack.stop(stack_config())
    print("demo stopped")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m deploy.local.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "stop"))
    args = parser.parse_args()
    try:
        start() if args.action == "start" else stop()
    except stack.StackError as e:
        raise SystemExit(f"demo: error: {e}") from None


if __name__ == "__main__":
    main()
