"""Approximate early stopping: how often its labels agree with asking every rubric, and what it saves.

Real judge, real conversations: the recorded GPT-3.5 judge of the LLM-Rubric
release answers LLM-Rubric's Q1–Q8 (as SAT rubrics). Everything the mode uses
is fitted on the *synthetic* conversations only: θ, the 0.9-precision windows
and the rubric scores' mean and covariance (`ScoreMoments`), as `convowatch
rubrics fit` would. The 223 real conversations are touched once, to measure:

* agreement: the share of conversations whose confident label and binary
  label are both those of asking all eight rubrics (bootstrap 95 % CI, and the
  exact Clopper–Pearson interval, which stays informative at 100 %);
* the share of rubric questions asked, and the accuracy of the binary label
  against the human label (a conversation is negative when its judges' mean
  Q0 is <= 2) for asking all, exact early stopping and the approximate mode.

Fitted on synthetic data, θ puts every real conversation on the same side
(the synthetic → real shift the calibration issue describes), so agreement
there only shows that the mode keeps labels far from an edge. The second
protocol, ``real_split``, fits θ, windows and moments on a random half of the
real conversations and measures on the other half, where the labels vary.

The settings are declared here, not chosen on the data: rounds of
``--round-size`` rubrics (default 2, as the exact mode's real-data test) and
each of ``--max-change`` (default 0.01, 0.05, 0.10). The spread over seeds is
the spread over what the set is fitted on: bootstrap resamples of the synthetic
conversations (seed 0: all of them), or the random halves of the real ones.

Run: ``.venv/bin/python bench/early_stopping.py`` (a few seconds); writes
``bench/results/early_stopping.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.stats import binomtest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scorers.conversation import Conversation  # noqa: E402
from scorers.datasets.llm_rubric import (  # noqa: E402
    dimension_rubric_set,
    load_real_conversations,
    load_split,
    satisfaction_labels,
)
from scorers.early_stopping import MOMENTS_KEY, EarlyStoppingScorer, ScoreMoments  # noqa: E402
from scorers.judges.base import Judge  # noqa: E402
from scorers.judges.recorded import RecordedJudge  # noqa: E402
from scorers.rubrics import RubricSet  # noqa: E402
from scorers.statistics import bootstrap_ci  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "llm-rubric"
SYNTH_TSV = "gpt-3.5-turbo-16k_synth_evaluations_FIXED.tsv"
REAL_TSV = "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"
OUT = REPO / "bench" / "results" / "early_stopping.json"


def synthetic_scores(data_dir: Path, rubric_set: RubricSet) -> tuple[np.ndarray, np.ndarray]:
    """Signed rubric scores (conversations × rubrics) and human labels of the labelled synthetic conversations."""
    labels = satisfaction_labels(load_split(data_dir, "synth"))
    judge = RecordedJudge.from_tsv(data_dir / SYNTH_TSV)
    ids = sorted(labels)
    placeholders = (Conversation.from_messages(i, [{"role": "user", "content": "-"}]) for i in ids)
    return rubric_set.rubric_scores(judge, placeholders), np.array([labels[i] for i in ids])


def fitted_set(rubric_set: RubricSet, scores: np.ndarray, labels: np.ndarray) -> RubricSet:
    """θ, windows and moments fitted on these synthetic rows, as `rubrics fit` does."""
    fitted = rubric_set.fit_windows(scores.sum(axis=1), labels)
    moments = ScoreMoments.fit([r.id for r in rubric_set.rubrics], scores)
    return replace(fitted, metadata={**fitted.metadata, MOMENTS_KEY: moments.to_dict()})


def run_seed(
    fitted: RubricSet,
    conversations: list[Conversation],
    human: np.ndarray,
    judge: Judge,
    round_size: int,
    max_changes: list[float],
) -> dict:
    """Asking all, exact stopping and each approximate setting on the real conversations."""
    moments = ScoreMoments.of_rubric_set(fitted)
    full = [fitted.score(judge.judge(c, fitted.questions())) for c in conversations]
    full_labels = [(s.label, s.threshold_label) for s in full]
    n_questions = len(conversations) * len(fitted.rubrics)
    result: dict = {
        "threshold": fitted.threshold,
        "windows": [fitted.windows.dsat_upper, fitted.windows.sat_lower],
        "labels_asking_all": {f"{a}/{b}": full_labels.count((a, b)) for a, b in sorted(set(full_labels))},
        "all": {"accuracy": float(np.mean([(s.threshold_label == "sat") == h for s, h in zip(full, human)]))},
        "modes": {},
    }
    for p in [0.0, *max_changes]:
        scorer = EarlyStoppingScorer(
            fitted, judge, round_size=round_size, max_change_probability=p, moments=moments if p else None
        )
        stopped = [scorer.score(c) for c in conversations]
        same = np.array([(s.label, s.threshold_label) == f for s, f in zip(stopped, full_labels)], dtype=float)
        correct = np.array([(s.threshold_label == "sat") == h for s, h in zip(stopped, human)], dtype=float)
        result["modes"][str(p)] = {
            "agreement": float(same.mean()),
            "agreement_ci": bootstrap_ci(np.mean, same).as_dict(),
            # The percentile bootstrap collapses to [1, 1] when every label agrees; Clopper-Pearson does not.
            "agreement_exact_ci": list(binomtest(int(same.sum()), len(same)).proportion_ci(0.95, method="exact")),
            "questions_asked_share": sum(len(s.rubric_scores) for s in stopped) / n_questions,
            "accuracy": float(correct.mean()),
            "stopped_approximately": int(sum(s.change_probability > 0 for s in stopped)),
            "per_conversation_same": "".join(str(int(x)) for x in same),  # 1: labels equal to asking all
        }
    return result


def summarize(seeds: list[dict]) -> dict:
    """Mean ± sd over seeds of each mode's figures, and seed 0's agreement CI."""
    modes: dict = {}
    for mode in seeds[0]["modes"]:
        per_seed = [s["modes"][mode] for s in seeds]
        modes[mode] = {
            key: {"mean": float(np.mean([m[key] for m in per_seed])), "sd": float(np.std([m[key] for m in per_seed], ddof=1))}
            for key in ("agreement", "questions_asked_share", "accuracy")
        }
        modes[mode]["agreement_ci_seed0"] = per_seed[0]["agreement_ci"]
        modes[mode]["agreement_exact_ci_seed0"] = per_seed[0]["agreement_exact_ci"]
    all_accuracy = [s["all"]["accuracy"] for s in seeds]
    return {"modes": modes, "all_accuracy": {"mean": float(np.mean(all_accuracy)), "sd": float(np.std(all_accuracy, ddof=1))}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--round-size", type=int, default=2)
    ap.add_argument("--max-change", type=float, nargs="+", default=[0.01, 0.05, 0.10])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)

    base = dimension_rubric_set(args.data / "questions.json")
    scores, labels = synthetic_scores(args.data, base)
    real = load_split(args.data, "real")
    human_by_id = satisfaction_labels(real)
    conversations = [c for cid, c in sorted(load_real_conversations(args.data / "real_data.json").items()) if cid in human_by_id]
    human = np.array([human_by_id[c.id] for c in conversations])
    judge = RecordedJudge.from_tsv(args.data / REAL_TSV)

    real_scores = base.rubric_scores(judge, conversations)
    protocols: dict[str, dict] = {}
    for protocol in ("synthetic_fit", "real_split"):
        seeds = []
        for seed in range(args.seeds):
            rng = np.random.default_rng(seed)
            if protocol == "synthetic_fit":
                rows = np.arange(len(labels)) if seed == 0 else rng.integers(0, len(labels), len(labels))
                fitted, test = fitted_set(base, scores[rows], labels[rows]), np.arange(len(conversations))
            else:
                order = rng.permutation(len(conversations))
                fit, test = order[: len(order) // 2], np.sort(order[len(order) // 2 :])
                fitted = fitted_set(base, real_scores[fit], human[fit])
            seeds.append(run_seed(fitted, [conversations[i] for i in test], human[test], judge, args.round_size, args.max_change))
        protocols[protocol] = {
            "n_measured": len(seeds[0]["modes"]["0.0"]["per_conversation_same"]),
            "summary": summarize(seeds),
            "seeds": seeds,
        }
    doc = {
        "command": " ".join([".venv/bin/python", "bench/early_stopping.py", *(argv if argv is not None else sys.argv[1:])]),
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "judge": "recorded gpt-3.5-turbo-16k (LLM-Rubric release)",
        "rubric_set": "LLM-Rubric Q1-Q8 as SAT rubrics",
        "n_synthetic": int(len(labels)),
        "n_real": len(conversations),
        "round_size": args.round_size,
        "protocols": protocols,
    }
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")

    for protocol, p in protocols.items():
        print(
            f"{protocol}: {p['n_measured']} real conversations measured, rounds of {args.round_size}, {args.seeds} fits (mean ± sd)"
        )
        print(f"{'max P(change)':>14} | {'agreement with asking all':>52} | {'questions asked':>15} | {'accuracy':>13}")
        for mode, m in p["summary"]["modes"].items():
            ci = m["agreement_ci_seed0"]
            lo = m["agreement_exact_ci_seed0"][0]
            print(
                f"{'exact' if float(mode) == 0 else mode:>14} | {m['agreement']['mean']:.3f} ± {m['agreement']['sd']:.3f} "
                f"(seed 0 CI {ci['low']:.3f}–{ci['high']:.3f}, exact ≥ {lo:.3f}) | {m['questions_asked_share']['mean']:.3f} ± "
                f"{m['questions_asked_share']['sd']:.3f} | {m['accuracy']['mean']:.3f} ± {m['accuracy']['sd']:.3f}"
            )
        print(f"  asking all: accuracy {p['summary']['all_accuracy']['mean']:.3f} ± {p['summary']['all_accuracy']['sd']:.3f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
