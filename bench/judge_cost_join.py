"""Judge cost over slices: one pass against one question per call on every conversation measured so far.

Mode b (one question per call) takes 80–200 s per conversation on these
hosts, so `bench/judge_cost.py --start N --limit M --modes c,b` measures it on
slices of one draw, each with per-conversation records (answers, labels,
NetSAT). This script joins the slices by conversation id, checks that they
are the same draw (same conversation at the same position, same rubric set
versions) and reports, per rubric set, with nothing chosen on these data:

* agreement of the one-pass label (mode c) with the one-question-per-call
  label (mode b): θ label and confident label, Wilson 95 % CI, and the spread
  over the slices (each slice is a disjoint random part of the draw);
* whether one pass keeps the order: Spearman of c's NetSAT against b's;
* each mode against the human labels: accuracy of the θ label and AUROC of
  NetSAT (bootstrap 95 % CIs), and the paired bootstrap difference of AUROC
  b − c on the same conversations;
* judge seconds per conversation per slice, with the host (load differs
  between slices, so no pooled figure);
* approximate early stopping on b's answers (the Qwen judge, a second judge
  and two more sets next to `bench/early_stopping.py`'s GPT-3.5 on
  LLM-Rubric): θ, windows and score moments fitted on a random half of the
  conversations, measured on the other half, 5 halves; rounds of 2 rubrics and
  P(change) ∈ {0.01, 0.05, 0.10}, as in that benchmark.

Run: ``.venv/bin/python bench/judge_cost_join.py`` (seconds; reads
``bench/results/judge_cost_slices/*.json``, writes
``bench/results/judge_cost_joined.json`` and prints the figures). Needs only
the `shared` data, not the judge.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

import early_stopping  # noqa: E402
import judge_cost  # noqa: E402

from scorers.conversation import Conversation  # noqa: E402
from scorers.early_stopping import MOMENTS_KEY, ScoreMoments  # noqa: E402
from scorers.judges.base import Answer, Judgement, Provenance  # noqa: E402
from scorers.questions import Question  # noqa: E402
from scorers.rubrics import RubricSet  # noqa: E402
from scorers.statistics import auroc, bootstrap_ci, spearman, wilson_interval  # noqa: E402
from stream.sampling import SamplingPolicy, horvitz_thompson_mean  # noqa: E402

SLICES = ROOT / "bench" / "results" / "judge_cost_slices"
# Per-conversation means of each slice's mode cost, pooled over the slices weighted by their conversations.
# Seconds are not pooled: load and host differ between slices.
POOLED_COST = (
    "prompt_tokens_per_conversation",
    "evaluated_prompt_tokens_per_conversation",
    "evaluated_prompt_tokens_in_one_transcript_passes",
    "calls_per_conversation",
)
OUT = ROOT / "bench" / "results" / "judge_cost_joined.json"
SAMPLING_RATES = (0.1, 0.25, 0.5)
SAMPLING_SALTS = 500
ROUND_SIZE = 2
MAX_CHANGES = (0.01, 0.05, 0.10)
HALVES = 5


class JoinError(RuntimeError):
    """The slices do not belong to one draw."""


class AnswersJudge:
    """Recorded per-conversation answers (one mode's), by conversation id and question id."""

    name = "recorded-slices"

    def __init__(self, answers: dict[str, dict[str, list[float]]]) -> None:
        self._answers = answers

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        recorded = self._answers[conversation.id]
        return Judgement(
            conversation_id=conversation.id,
            answers={q.id: Answer(q.id, tuple(recorded[q.id])) for q in questions},
            provenance=Provenance(judge=self.name, model="", calls=1),
        )


def load_slices(directory: Path) -> list[dict[str, Any]]:
    """Every slice file with per-conversation records for both modes, in draw order; one draw or an error."""
    docs = [json.loads(p.read_text(encoding="utf-8")) | {"file": p.name} for p in sorted(directory.glob("*.json"))]
    docs = [d for d in docs if all("per_conversation" in d["modes"].get(m, {}) for m in ("b", "c"))]
    if not docs:
        raise JoinError(f"{directory}: no slice with per-conversation records of modes b and c")
    keys = {(d["settings"]["n_per_class"], d["settings"]["seed"], json.dumps(d["sets"], sort_keys=True)) for d in docs}
    if len(keys) > 1:
        raise JoinError(f"{directory}: slices of different draws or rubric set versions: {sorted(keys)}")
    docs.sort(key=lambda d: d["settings"]["start"])
    seen: set[str] = set()
    for d in docs:
        ids = d["conversations"]["ids"]
        if seen & set(ids):
            raise JoinError(f"{d['file']}: conversations already in an earlier slice: {sorted(seen & set(ids))}")
        seen |= set(ids)
    return docs


def human_labels(doc: dict[str, Any]) -> tuple[dict[str, bool], list[str]]:
    """The draw's human labels by conversation id (positive: satisfied) and its order, as `bench/judge_cost.py` draws it."""
    learning = json.loads(judge_cost.LEARNING_RESULTS.read_text(encoding="utf-8"))["settings"]
    items = judge_cost.test_conversations(
        doc["settings"]["n_per_class"], doc["settings"]["seed"], learning["seed"], learning["n_per_class"]
    )
    return {i.conversation.id: bool(i.positive) for i in items}, [i.conversation.id for i in items]


def check_positions(docs: list[dict[str, Any]], draw: list[str]) -> None:
    for d in docs:
        start, ids = d["settings"]["start"], d["conversations"]["ids"]
        if draw[start : start + len(ids)] != ids:
            raise JoinError(f"{d['file']}: its conversations are not positions {start}.. of the draw")


def _rate(hits: int, n: int) -> dict[str, Any]:
    interval = wilson_interval(hits, n)
    return {"hits": hits, "n": n, "rate": hits / n, "low": interval.low, "high": interval.high}


def _ci(metric: Any, *arrays: np.ndarray) -> dict[str, float]:
    return bootstrap_ci(metric, *arrays, n_samples=judge_cost.BOOTSTRAP_SAMPLES, seed=0).as_dict()


def pooled_cost(docs: list[dict[str, Any]], mode: str) -> dict[str, float]:
    """A mode's token and call cost per conversation over every slice (each slice's mean weighted by its size)."""
    n = np.array([d["modes"][mode]["cost"]["conversations"] for d in docs], dtype=float)
    out = {"conversations": float(n.sum())}
    for key in POOLED_COST:
        out[key] = float(np.average([d["modes"][mode]["cost"][key] for d in docs], weights=n))
    return out


def set_figures(records: dict[str, list[dict[str, Any]]], key: str, human: dict[str, bool], docs: list[dict]) -> dict:
    """Agreement, order and quality against the humans of one rubric set, modes c and b on the same conversations."""
    b, c = records["b"], records["c"]
    y = np.array([human[r["id"]] for r in b])
    same_threshold = np.array([rb["sets"][key]["threshold_label"] == rc["sets"][key]["threshold_label"] for rb, rc in zip(b, c)])
    same_label = np.array([rb["sets"][key]["label"] == rc["sets"][key]["label"] for rb, rc in zip(b, c)])
    netsat = {m: np.array([r["sets"][key]["netsat"] for r in records[m]]) for m in ("b", "c")}
    correct = {
        m: np.array([(r["sets"][key]["threshold_label"] == "sat") == h for r, h in zip(records[m], y)]) for m in ("b", "c")
    }
    per_slice = []
    for d in docs:
        ids = set(d["conversations"]["ids"])
        rows = [i for i, r in enumerate(b) if r["id"] in ids]
        per_slice.append(
            {"start": d["settings"]["start"], "n": len(rows), "same_threshold_label": int(same_threshold[rows].sum())}
        )
    shares = [s["same_threshold_label"] / s["n"] for s in per_slice]
    return {
        "agreement": {
            "threshold_label": _rate(int(same_threshold.sum()), len(b)),
            "confident_label": _rate(int(same_label.sum()), len(b)),
            "per_slice": per_slice,
            "per_slice_share": {
                "min": min(shares),
                "max": max(shares),
                "sd": float(np.std(shares, ddof=1)) if len(shares) > 1 else None,
            },
        },
        "netsat_spearman_c_vs_b": _ci(spearman, netsat["b"], netsat["c"]),
        "quality": {
            m: {
                "accuracy": _ci(np.mean, correct[m].astype(float)),
                "auroc": _ci(lambda s, t: auroc(s, t.astype(bool)), netsat[m], y),
            }
            for m in ("b", "c")
        },
        "auroc_b_minus_c": _ci(
            lambda sb, sc, t: auroc(sb, t.astype(bool)) - auroc(sc, t.astype(bool)), netsat["b"], netsat["c"], y
        ),
    }


def sampling_on_b(records: list[dict[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """Mode e on b's labels, repeated: each set's dsat share (θ label) estimated by Horvitz–Thompson from the
    conversations a `SamplingPolicy` at each rate picks, over many salts (independent samples of the same
    conversations), against the share over all of them: bias, spread, the reported standard error, and how
    often the 95 % interval (±1.96 SE) covers the full share."""
    ids = [r["id"] for r in records]
    out: dict[str, Any] = {"salts": SAMPLING_SALTS, "sets": {}}
    for key in keys:
        y = np.array([r["sets"][key]["threshold_label"] == "dsat" for r in records], dtype=float)
        per_rate = {}
        for rate in SAMPLING_RATES:
            estimates, errors, covered, judged = [], [], [], []
            for salt in range(SAMPLING_SALTS):
                policy = SamplingPolicy(default_rate=rate, salt=str(salt))
                picked = np.array([policy.decide(i, {}).scored for i in ids])
                e = horvitz_thompson_mean(list(y[picked]), [rate] * int(picked.sum()), len(ids))
                estimates.append(e.mean)
                errors.append(e.standard_error)
                covered.append(abs(e.mean - y.mean()) <= 1.96 * e.standard_error)
                judged.append(int(picked.sum()))
            per_rate[str(rate)] = {
                "judged_mean": float(np.mean(judged)),
                "estimate_mean": float(np.mean(estimates)),
                "estimate_sd": float(np.std(estimates, ddof=1)),
                "standard_error_mean": float(np.mean(errors)),
                "coverage_95": float(np.mean(covered)),
            }
        out["sets"][key] = {"dsat_share_all": float(y.mean()), "rates": per_rate}
    return out


def approximate_stopping(rubric_set: RubricSet, answers: dict[str, dict[str, list[float]]], human: dict[str, bool]) -> dict:
    """`bench/early_stopping.py`'s real-split protocol on recorded answers: fit on a random half, measure on the rest."""
    judge = AnswersJudge(answers)
    ids = sorted(answers)
    conversations = [Conversation.from_messages(i, [{"role": "user", "content": "-"}]) for i in ids]
    y = np.array([human[i] for i in ids])
    scores = rubric_set.rubric_scores(judge, conversations)
    halves = []
    for seed in range(HALVES):
        order = np.random.default_rng(seed).permutation(len(ids))
        fit, test = order[: len(order) // 2], np.sort(order[len(order) // 2 :])
        fitted = rubric_set.fit_windows(scores[fit].sum(axis=1), y[fit])
        moments = ScoreMoments.fit([r.id for r in rubric_set.rubrics], scores[fit])
        fitted = replace(fitted, metadata={**fitted.metadata, MOMENTS_KEY: moments.to_dict()})
        halves.append(
            early_stopping.run_seed(fitted, [conversations[i] for i in test], y[test], judge, ROUND_SIZE, list(MAX_CHANGES))
        )
    return {"n_measured": len(ids) - len(ids) // 2, "summary": early_stopping.summarize(halves), "halves": halves}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slices", type=Path, default=SLICES)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)

    docs = load_slices(args.slices)
    human, draw = human_labels(docs[0])
    check_positions(docs, draw)
    sets = judge_cost.load_sets(judge_cost.LEARNING_RESULTS)
    records = {m: [r for d in docs for r in d["modes"][m]["per_conversation"]] for m in ("b", "c")}
    if [r["id"] for r in records["b"]] != [r["id"] for r in records["c"]]:
        raise JoinError("modes b and c judged different conversations")
    b_answers = {r["id"]: r["answers"] for r in records["b"]}
    result = {
        "benchmark": "judge_cost_join",
        "command": " ".join([".venv/bin/python", "bench/judge_cost_join.py", *(argv if argv is not None else sys.argv[1:])]),
        "slices": [d["file"] for d in docs],
        "conversations": {"n": len(records["b"]), "positive": int(sum(human[r["id"]] for r in records["b"]))},
        "cost": {m: pooled_cost(docs, m) for m in ("b", "c")},
        "seconds_per_conversation": [
            {
                "start": d["settings"]["start"],
                "n": d["conversations"]["n"],
                "cpu": d["machine"]["cpu"],
                **{m: d["modes"][m]["cost"]["judge_seconds_per_conversation"] for m in ("b", "c")},
            }
            for d in docs
        ],
        "sets": {key: set_figures(records, key, human, docs) for key in sets},
        "sampling_on_b": sampling_on_b(records["b"], list(sets)),
        "approximate_stopping_on_b": {key: approximate_stopping(s, b_answers, human) for key, s in sets.items()},
    }
    args.out.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    report(result)
    print(f"wrote {args.out}")
    return 0


def report(result: dict[str, Any]) -> None:
    n = result["conversations"]
    print(f"{n['n']} conversations ({n['positive']} satisfied) in {len(result['slices'])} slices")
    for key, f in result["sets"].items():
        a = f["agreement"]
        t, c = a["threshold_label"], a["confident_label"]
        print(
            f"{key}: c agrees with b on the θ label {t['hits']}/{t['n']} = {t['rate']:.2f} ({t['low']:.2f}–{t['high']:.2f}), "
            f"confident label {c['rate']:.2f} ({c['low']:.2f}–{c['high']:.2f}); per slice "
            f"{a['per_slice_share']['min']:.2f}–{a['per_slice_share']['max']:.2f}"
        )
        s = f["netsat_spearman_c_vs_b"]
        print(f"  NetSAT Spearman c vs b {s['estimate']:.2f} ({s['low']:.2f}–{s['high']:.2f})")
        for m, q in f["quality"].items():
            acc, roc = q["accuracy"], q["auroc"]
            print(
                f"  {m}: accuracy {acc['estimate']:.2f} ({acc['low']:.2f}–{acc['high']:.2f}), "
                f"AUROC {roc['estimate']:.2f} ({roc['low']:.2f}–{roc['high']:.2f})"
            )
        d = f["auroc_b_minus_c"]
        print(f"  AUROC b − c {d['estimate']:.2f} ({d['low']:.2f}–{d['high']:.2f})")
    for m, c in result["cost"].items():
        print(
            f"mode {m}: {c['prompt_tokens_per_conversation']:.0f} prompt tokens per conversation, "
            f"{c['evaluated_prompt_tokens_per_conversation']:.0f} evaluated "
            f"({c['evaluated_prompt_tokens_in_one_transcript_passes']:.2f} transcript passes), "
            f"{c['calls_per_conversation']:.0f} calls"
        )
    for s in result["seconds_per_conversation"]:
        print(f"slice {s['start']} ({s['n']}, {s['cpu']}): b {s['b']:.1f} s, c {s['c']:.1f} s per conversation")
    sampling = result["sampling_on_b"]
    for key, f in sampling["sets"].items():
        print(
            f"sampling on b's labels, {key} set: dsat share over all {f['dsat_share_all']:.3f}; over {sampling['salts']} salts:"
        )
        for rate, r in f["rates"].items():
            print(
                f"  rate {rate}: {r['judged_mean']:.1f} judged, estimate {r['estimate_mean']:.3f} ± {r['estimate_sd']:.3f} "
                f"(mean SE {r['standard_error_mean']:.3f}), 95 % interval covers {r['coverage_95']:.1%}"
            )
    for key, p in result["approximate_stopping_on_b"].items():
        print(f"approximate stopping on b's answers, {key} set, {p['n_measured']} measured per half, {HALVES} halves:")
        for mode, m in p["summary"]["modes"].items():
            lo = m["agreement_exact_ci_seed0"][0]
            print(
                f"  {'exact' if float(mode) == 0 else mode:>5}: agreement {m['agreement']['mean']:.3f} ± {m['agreement']['sd']:.3f} "
                f"(half 0 exact ≥ {lo:.3f}), questions asked {m['questions_asked_share']['mean']:.3f} ± "
                f"{m['questions_asked_share']['sd']:.3f}, accuracy {m['accuracy']['mean']:.3f} ± {m['accuracy']['sd']:.3f}"
            )


if __name__ == "__main__":
    raise SystemExit(main())
