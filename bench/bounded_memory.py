"""Bounded memory and bounded metrics under hostile traffic (issue 14, ``make bench``).

One worker (``convowatch run``, the Kafka client defaults of stream/settings.py) on Apache Kafka (KRaft, one node: the
embedded stack's) started here reads
``--conversations`` (default 100,000) conversations of two turns that never
end (no ``end`` event; the idle timeout is the default 30 minutes), spread over
50 products × 50 model versions (2,500 attribute combinations), published at a
steady ``--rate`` (default 600 turn events/s, below the worker's capacity, as
live traffic comes). What must hold:

* **open conversations are capped**: at most ``--max-open`` stay open; the
  longest idle are closed with cause ``capacity`` and scored (here: sampled
  at 1 %, the rest stored unsampled, all counted);
* **closed conversations remembered are capped**: at most ``--max-closed``
  (``assembly.max_closed_conversations``; their turn fingerprints recognise
  redeliveries), the oldest forgotten early and counted;
* **the worker's memory is flat** once the caps are reached: its RSS
  (``/proc/<pid>/status``) is sampled every second against the events it has
  consumed;
* **``/metrics`` stays small**: the attribute labels' combination budget
  (``metrics.max_label_combinations``, default 200) holds the series count,
  whatever the producers send; its size, series count and scrape time are
  read at the end.

The workload is published at a steady rate, not pre-loaded: on the broker this
benchmark ran on before Apache Kafka, pre-loading it (a worker catching up on
200,000 events) stalled the worker: its score agent stopped receiving closed
conversations while the events backlog filled its buffers, the group evicted
it and it never finished rejoining. The same eviction and stall happened twice
at 600 events/s while other work shared the two cores; the run on an otherwise
idle machine finished (not understood, and not yet tried again on Apache
Kafka; the alert ConvowatchWorkerStuck shows it).

The judge is the recorded GPT-3.5 judge (answers re-keyed to the sampled
conversations' ids, as bench/pipeline_throughput.py does). Prints a table and
writes ``bench/results/bounded_memory.json`` (with the CPU model and the Kafka version).

Run from the repository root: ``.venv/bin/python bench/bounded_memory.py [--conversations 100000 --max-open 10000]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:  # run as a script from a checkout, or imported as bench.bounded_memory
        sys.path.insert(0, str(path))

import pipeline_throughput as pt  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from results_file import cpu_model  # noqa: E402

from deploy.local.kafka import kafka_version  # noqa: E402
from deploy.local.stack import stop  # noqa: E402
from stream.contract import TurnEvent  # noqa: E402
from stream.replay.publisher import publish  # noqa: E402
from stream.replay.sources import ReplayItem  # noqa: E402
from stream.sampling import unit_hash  # noqa: E402
from stream.topics import ensure_topics  # noqa: E402

OUTPUT = ROOT / "bench" / "results" / "bounded_memory.json"
PRODUCTS = 50
MODEL_VERSIONS = 50
SAMPLING_RATE = 0.01
TEXT = "the order has not arrived and nobody answers my messages, what should I do now " * 3  # ~240 bytes
START = 1_767_225_600.0  # 2026-01-01 UTC: event times only; the worker's clock decides idleness


def attributes(k: int) -> dict[str, str]:
    """Conversation k's product and model version: every one of the 50 × 50 combinations in turn."""
    return {"product": f"product-{k % PRODUCTS:02d}", "model_version": f"v{(k // PRODUCTS) % MODEL_VERSIONS:02d}"}


def never_ending(n: int, real_ids: Sequence[str]) -> tuple[list[ReplayItem], dict[str, str]]:
    """Two turns for each of ``n`` conversations, no end; and the sampled ones' ids → the real id whose answers they reuse."""
    items: list[ReplayItem] = []
    sampled: dict[str, str] = {}
    for k in range(n):
        real = real_ids[k % len(real_ids)]
        cid = f"{real}#m-{k}"
        for index, role in enumerate(("user", "assistant")):
            items.append(ReplayItem.of(TurnEvent(cid, index, role, TEXT, START + k + index / 2, attributes(k))))
        if unit_hash("", cid) < SAMPLING_RATE:
            sampled[cid] = real
    return items, sampled


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise pt.BenchError(f"no VmRSS for pid {pid}")


def scrape(port: int) -> dict[str, Any]:
    """One scrape of the worker's /metrics: bytes, series, seconds, attribute combinations in the scored counter."""
    t = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
        body = r.read()
    seconds = time.perf_counter() - t
    samples = [s for fam in text_string_to_metric_families(body.decode()) for s in fam.samples]
    combos = {
        (s.labels.get("product"), s.labels.get("model_version"))
        for s in samples
        if s.name == "convowatch_conversations_sampled_total"
    }
    return {"bytes": len(body), "series": len(samples), "seconds": round(seconds, 3), "attribute_combinations": len(combos)}


def watch(worker: pt.Service, events: int, n: int, max_open: int, timeout: float) -> Iterator[dict[str, float]]:
    """A sample per second until every event is consumed and every conversation past the cap is closed."""
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    while time.monotonic() < deadline:
        worker.check_alive()
        try:
            samples = worker.samples()  # one scrape for the three figures
        except OSError:
            samples = {}  # unreachable: zeros, as `Service.metric` reads it
        consumed = pt.metric_sum(samples, "convowatch_events_total", type="turn")
        open_ = pt.metric_sum(samples, "convowatch_open_conversations")
        closed = pt.metric_sum(samples, "convowatch_conversations_closed_total", cause="capacity")
        yield {
            "t_s": round(time.monotonic() - started, 1),
            "events": consumed,
            "open": open_,
            "closed_capacity": closed,
            "rss_mb": round(rss_mb(worker.popen.pid), 1),
            "series": len(samples),  # the /metrics page's samples: each one a metric child the worker keeps
        }
        if consumed >= events and closed >= n - max_open and open_ <= max_open:
            return
        time.sleep(1.0)
    raise pt.BenchError(f"not done in {timeout:.0f} s")


def run(n: int, max_open: int, max_closed: int, rate: float, root: Path) -> dict[str, Any]:
    rubric_set, calibrator = pt.scoring_artifacts(pt.CACHE)
    header, rows = pt.real_answer_rows()
    items, sampled = never_ending(n, list(rows))
    answers = root / "judge-answers.tsv"
    pt.write_judge_answers(answers, header, rows, sampled)
    stack = pt.start_broker(root)
    env = {
        **pt.base_env(rubric_set, calibrator, answers),
        "CONVOWATCH_ASSEMBLY__MAX_OPEN_CONVERSATIONS": str(max_open),
        "CONVOWATCH_ASSEMBLY__MAX_CLOSED_CONVERSATIONS": str(max_closed),
        "CONVOWATCH_ASSEMBLY__IDLE_CHECK_INTERVAL_S": "1",
        "CONVOWATCH_SCORING__SAMPLING__DEFAULT_RATE": str(SAMPLING_RATE),
    }
    pipeline = pt.Pipeline(root, "memory", stack.bootstrap, env, stack.broker_pid)
    try:
        ensure_topics(pipeline.kafka_settings())
        worker = pipeline.start("worker", "run")
        baseline = rss_mb(worker.popen.pid)
        # event times are 0.5 s apart: speed rate/2 sends `rate` events per second
        sender = threading.Thread(target=publish, args=(items, pipeline.kafka_settings(), rate / 2), daemon=True)
        sender.start()
        samples = []
        for s in watch(worker, len(items), n, max_open, timeout=3600):
            samples.append(s)
            if len(samples) % 30 == 0:
                print(f"  {s}", flush=True)
        metrics_page = scrape(worker.port)

        def decided() -> float:
            return worker.metric("convowatch_conversations_sampled_total")  # judged + unsampled

        # every event is processed; the score agent may still be behind on what capacity closed
        closed = worker.metric("convowatch_conversations_closed_total", cause="capacity")
        pt.wait_until(lambda: decided() >= closed, 1800, "every conversation closed by capacity to be scored", 1.0)
        scored = worker.metric("convowatch_conversations_sampled_total", decision="judged")
        unsampled = worker.metric("convowatch_conversations_sampled_total", decision="unsampled")
        forgotten = worker.metric("convowatch_closed_conversations_forgotten_early_total")
        worker.terminate()
    finally:
        for service in pipeline.services:
            service.terminate()
        stop(stack.cfg, ["kafka"])
    return {
        "rss_mb_at_start": round(baseline, 1),
        "samples": samples,
        "metrics_page": metrics_page,
        "judged": scored,
        "unsampled": unsampled,
        "closed_forgotten_early": forgotten,
        "flatness": flatness(samples, max_open, max_closed),
    }


def flatness(samples: Sequence[dict[str, float]], max_open: int, max_closed: int) -> dict[str, Any]:
    """RSS when the caps were first both reached, at the end, and its growth per 10,000 conversations since then: in
    all, and in each half of that stretch (a leak grows alike in both; an allocator filling its high-water mark slows);
    and the /metrics series over the same stretch (metric children, bounded by the label budget, each costing memory
    until every attribute combination has been seen with every label value)."""
    after = [s for s in samples if s["open"] >= max_open and s["closed_capacity"] >= max_closed]
    if not after:
        return {"cap_reached": False}
    at_cap, end = after[0], samples[-1]
    middle = min(after, key=lambda s: abs(s["events"] - (at_cap["events"] + end["events"]) / 2))

    def growth(a: dict[str, float], b: dict[str, float], key: str = "rss_mb") -> float:
        conversations = (b["events"] - a["events"]) / 2  # two turns per conversation
        return round((b[key] - a[key]) / conversations * 10_000, 2) if conversations else 0.0

    return {
        "cap_reached": True,
        "rss_mb_at_cap": at_cap["rss_mb"],
        "rss_mb_at_end": end["rss_mb"],
        "rss_mb_max": max(s["rss_mb"] for s in samples),
        "conversations_after_cap": int((end["events"] - at_cap["events"]) / 2),
        "rss_mb_growth_per_10k_conversations_after_cap": growth(at_cap, end),
        "rss_mb_growth_per_10k_conversations_first_half": growth(at_cap, middle),
        "rss_mb_growth_per_10k_conversations_second_half": growth(middle, end),
        "series_at_cap": at_cap["series"],
        "series_at_end": end["series"],
        "series_growth_per_10k_conversations_first_half": round(growth(at_cap, middle, "series")),
        "series_growth_per_10k_conversations_second_half": round(growth(middle, end, "series")),
        **rss_beside_series(after),
    }


def rss_beside_series(samples: Sequence[dict[str, float]]) -> dict[str, float]:
    """RSS against /metrics series by least squares over ``samples`` (KB per series, the correlation), and the growth
    per 10,000 conversations left once the series' share is taken out: what would be a leak."""
    if len(samples) < 3 or len({s["series"] for s in samples}) < 2:
        return {}
    series, rss, events = ([s[k] for s in samples] for k in ("series", "rss_mb", "events"))
    per_series = statistics.linear_regression(series, rss).slope
    residual = [r - per_series * x for r, x in zip(rss, series)]
    return {
        "rss_kb_per_series": round(per_series * 1024, 2),
        "rss_series_correlation": round(statistics.correlation(series, rss), 3),
        "rss_mb_growth_per_10k_conversations_besides_series": round(
            statistics.linear_regression(events, residual).slope * 2 * 10_000, 3
        ),
    }


def report(result: dict[str, Any]) -> None:
    f, m = result["flatness"], result["metrics_page"]
    print(
        f"\n{result['conversations']} never-ending conversations, at most {result['max_open']} open, {result['max_closed']} closed remembered; worker RSS (MB):"
    )
    print(
        f"  at start {result['rss_mb_at_start']}, when both caps were reached {f.get('rss_mb_at_cap')}, at the end {f.get('rss_mb_at_end')}"
    )
    print(
        f"  growth after the caps: {f.get('rss_mb_growth_per_10k_conversations_after_cap')} MB per 10,000 conversations "
        f"({f.get('rss_mb_growth_per_10k_conversations_first_half')} in the first half, "
        f"{f.get('rss_mb_growth_per_10k_conversations_second_half')} in the second)"
    )
    print(
        f"  /metrics series meanwhile: {f.get('series_at_cap')} -> {f.get('series_at_end')} "
        f"(+{f.get('series_growth_per_10k_conversations_first_half')} and +{f.get('series_growth_per_10k_conversations_second_half')} "
        "per 10,000 conversations in the two halves)"
    )
    if "rss_kb_per_series" in f:
        print(
            f"  RSS against series: {f['rss_kb_per_series']} KB per series (correlation {f['rss_series_correlation']}); "
            f"growth besides the series: {f['rss_mb_growth_per_10k_conversations_besides_series']} MB per 10,000 conversations"
        )
    print(f"/metrics with {PRODUCTS} x {MODEL_VERSIONS} attribute values: {m['bytes']} bytes, {m['series']} series,")
    print(f"  {m['attribute_combinations']} attribute combinations, scraped in {m['seconds']} s")
    print(f"closed by capacity and judged: {result['judged']:.0f}, stored unsampled: {result['unsampled']:.0f}")
    print(
        f"closed conversations forgotten early (at most {result['max_closed']} remembered): {result['closed_forgotten_early']:.0f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=100_000)
    ap.add_argument("--max-open", type=int, default=10_000, help="assembly.max_open_conversations")
    ap.add_argument("--max-closed", type=int, default=10_000, help="assembly.max_closed_conversations")
    ap.add_argument("--rate", type=float, default=600.0, help="turn events per second")
    ap.add_argument("--out", type=Path, default=OUTPUT)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="convowatch-memory-") as tmp:
        result = {
            "benchmark": "bounded_memory",
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": " ".join([".venv/bin/python", "bench/bounded_memory.py", *(argv if argv is not None else sys.argv[1:])]),
            "machine": {"cpu": cpu_model(), "kafka": kafka_version()},
            "conversations": args.conversations,
            "max_open": args.max_open,
            "max_closed": args.max_closed,
            "rate_events_per_s": args.rate,
            **run(args.conversations, args.max_open, args.max_closed, args.rate, Path(tmp)),
        }
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    report(result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
