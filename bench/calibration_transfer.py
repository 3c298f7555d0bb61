"""Calibration that transfers: candidate calibrators trained on synthetic, scored once on real (``make bench``).

The question (issue "Calibration that transfers"): LLM-Rubric's network learns
the synthetic conversations (CV Pearson 0.46) but not the real ones (0.17,
below each judge's synthetic mean Q0 as the prediction, 0.19). Do models with
fewer degrees of freedom carry over better?

Protocol, fixed before any real figure was looked at:

* Every choice is made on the synthetic conversations: for each seed s in
  0–4, each candidate's two penalties (``weight_decay`` × ``judge_shrinkage``,
  `GRID`) are chosen by 5-fold CV by conversation with fold seed s, criterion
  pooled out-of-fold Q0 RMSE (as for the network), then the candidate is
  refitted on all synthetic judgments. The fit itself is convex and has no
  seed: the spread over seeds is the spread of that choice.
* The real 223 are touched once: each real judge's Q0 (and Q1–Q7) predicted,
  scored with Pearson, Spearman, Kendall, RMSE beside its bound SD·√(1−r²),
  and smECE; 95 % percentile-bootstrap CIs over the real conversations for
  seed 0's predictions. The synthetic folds cannot imitate the real shift
  (the synthetic texts are not published; nothing but ids and judge answers
  is known of them), so folds are random by conversation.
* Candidates (`CANDIDATES`): the cumulative-link model of
  `scorers.ordinal_calibration` with all nine questions or Q0 alone as input,
  each with the features standardised on the training (synthetic) judge
  answers or, adapted, on the *unlabelled* real judge answers (no real label
  is used). The network's figures come from ``bench/results/llm_rubric_table1.json``
  (same protocol, `bench/llm_rubric_table1.py`).
* Which candidate becomes the default is decided by synthetic CV RMSE among
  the unadapted candidates (CV cannot see a domain shift, so it cannot choose
  adaptation); the adapted variants are reported beside it as measured options.

Few-shot adaptation (``OrdinalCalibrator.adapt``, ``convowatch calibrate adapt``):
the default adapted to k = 25, 50, 100 real conversations, its strength chosen
by CV on those k alone, tested on the real conversations outside every k of
the split; 20 random splits.

Beside the table: how well the worker's P(dissatisfied) (the default as
``convowatch calibrate train`` fits it, the average judge) separates the real
conversations humans rate Q0 ≤ 2, as an AUROC with its bootstrap CI.

Run: ``.venv/bin/python bench/calibration_transfer.py`` (a few minutes);
writes ``bench/results/calibration_transfer.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import llm_rubric_table1 as table1  # noqa: E402

from scorers import statistics  # noqa: E402
from scorers.calibration_selection import (  # noqa: E402
    predict_labels,
    select_adaptation_strength,
    select_hyperparameters,
)
from scorers.datasets.llm_rubric import MAIN_QUESTION, QUESTION_IDS, RubricData, load_split  # noqa: E402
from scorers.ordinal_calibration import PENALTY_GRID, OrdinalCalibrator  # noqa: E402

OUTPUT = ROOT / "bench" / "results" / "calibration_transfer.json"
NETWORK_RESULTS = ROOT / "bench" / "results" / "llm_rubric_table1.json"
SEEDS = (0, 1, 2, 3, 4)
CV_FOLDS = 5
CV_CRITERION = "rmse"
GRID = PENALTY_GRID
# name -> (input questions, features standardised on the unlabelled real judge answers)
CANDIDATES: dict[str, tuple[tuple[str, ...], bool]] = {
    "ordinal": (QUESTION_IDS, False),
    "ordinal_q0_only": ((MAIN_QUESTION,), False),
    "ordinal_adapted": (QUESTION_IDS, True),
    "ordinal_q0_only_adapted": ((MAIN_QUESTION,), True),
}
ADAPTATION_SIZES = (0, 25, 50, 100)  # real conversations a team labels
ADAPTATION_SPLITS = 20
DISSATISFIED_MAX = 2  # Q0 ≤ 2 is dissatisfied, as the worker's scoring.dissatisfied_max_value
PER_DIMENSION_QUESTIONS = ("Q0", "Q1", "Q2", "Q3", "Q4", "Q5", "Q6", "Q7")  # Q8 is not ordinal
CI_METRICS = ("pearson", "spearman", "kendall", "rmse")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def choose(inputs: tuple[str, ...], synth: RubricData, seed: int) -> tuple[dict[str, Any], float]:
    """The penalties synthetic CV prefers with fold seed ``seed``, and that CV's RMSE."""
    base = OrdinalCalibrator(input_questions=inputs)
    search = select_hyperparameters(synth, GRID, base=base, k=CV_FOLDS, seed=seed, criterion=CV_CRITERION)
    return search.best_params, search.best_scores[CV_CRITERION]


def fitted(params: dict[str, Any], synth: RubricData, real: RubricData, adapted: bool) -> OrdinalCalibrator:
    model = OrdinalCalibrator(**{**params, "questions": PER_DIMENSION_QUESTIONS}).fit(synth)
    if adapted:
        model.adapt_features(np.stack([real.features[t] for t in sorted(real.features)]))
    return model


def bootstrap(y: np.ndarray, yhat: np.ndarray) -> dict[str, Any]:
    return {
        m: statistics.bootstrap_ci(getattr(statistics, m), y, yhat, n_samples=table1.BOOTSTRAP_SAMPLES, seed=0).as_dict()
        for m in CI_METRICS
    }


def run(synth: RubricData, real: RubricData) -> dict[str, Any]:
    results: dict[str, Any] = {"candidates": {}, "per_dimension": {}}
    chosen: dict[tuple[tuple[str, ...], int], tuple[dict[str, Any], float]] = {}
    for name, (inputs, adapted) in CANDIDATES.items():
        runs, params_per_seed, cv_rmse = [], [], []
        per_dimension: dict[str, list[dict[str, float]]] = {q: [] for q in PER_DIMENSION_QUESTIONS}
        for seed in SEEDS:
            if (inputs, seed) not in chosen:
                chosen[(inputs, seed)] = choose(inputs, synth, seed)
            params, cv = chosen[(inputs, seed)]
            params_per_seed.append({k: params[k] for k in GRID})
            cv_rmse.append(cv)
            model = fitted(params, synth, real, adapted)
            held = {q: predict_labels(model, real, q) for q in PER_DIMENSION_QUESTIONS}
            for q in PER_DIMENSION_QUESTIONS:
                per_dimension[q].append(held[q].scores())
            scores = per_dimension[MAIN_QUESTION][-1]
            runs.append(scores)
            if seed == SEEDS[0]:
                ci = bootstrap(held[MAIN_QUESTION].answers.astype(float), held[MAIN_QUESTION].expected_value)
            log(f"{name} seed {seed}: {params_per_seed[-1]} synthetic CV RMSE {cv:.4f}; real Pearson {scores['pearson']:.3f}")
        results["candidates"][name] = {
            "inputs": list(inputs),
            "adapted_to_unlabelled_real": adapted,
            "chosen": params_per_seed,
            "synthetic_cv_rmse": float(np.mean(cv_rmse)),
            "real_q0": table1.summarise(runs),
            "real_q0_bootstrap_ci_seed0": ci,
        }
        results["per_dimension"][name] = {q: table1.summarise(v) for q, v in per_dimension.items()}
    unadapted = [n for n, (_, adapted) in CANDIDATES.items() if not adapted]
    results["default"] = min(unadapted, key=lambda n: results["candidates"][n]["synthetic_cv_rmse"])
    return results


def separation(synth: RubricData, real: RubricData) -> dict[str, Any]:
    """What the worker reports: the default calibrator as `convowatch calibrate train` fits it (CV seed 0),
    the average judge's P(Q0 ≤ 2) per real conversation, against the humans' Q0 ≤ 2."""
    params, _ = choose(QUESTION_IDS, synth, SEEDS[0])
    model = OrdinalCalibrator(**params).fit(synth)
    labels = real.labels_for(MAIN_QUESTION)
    x = np.stack([real.features[lab.text_id] for lab in labels])
    p_dsat = model.predict_proba(x, MAIN_QUESTION).prob_at_most(DISSATISFIED_MAX)
    humans_dsat = np.array([lab.answer <= DISSATISFIED_MAX for lab in labels])
    return {
        "n": len(labels),
        "n_humans_dissatisfied": int(humans_dsat.sum()),
        "mean_p_dsat_humans_dissatisfied": float(p_dsat[humans_dsat].mean()),
        "mean_p_dsat_others": float(p_dsat[~humans_dsat].mean()),
        "mean_p_dsat": float(p_dsat.mean()),
        "auroc": statistics.bootstrap_ci(
            lambda p, h: statistics.auroc(p, h.astype(bool)), p_dsat, humans_dsat, n_samples=table1.BOOTSTRAP_SAMPLES, seed=0
        ).as_dict(),
    }


def adaptation_curve(synth: RubricData, real: RubricData) -> dict[str, Any]:
    """Few-shot adaptation: the default adapted to k real conversations, tested on real ones it never saw.

    Each of `ADAPTATION_SPLITS` random orders of the real conversations puts the last
    ``n − max(k)`` aside as the test set (the same for every k of that split); the first k adapt the
    model, with the strength chosen by 5-fold CV on those k alone.
    """
    params, _ = choose(QUESTION_IDS, synth, SEEDS[0])
    base = OrdinalCalibrator(**params).fit(synth)
    ids = sorted({lab.text_id for lab in real.labels_for(MAIN_QUESTION)})
    runs: dict[int, list[dict[str, float]]] = {k: [] for k in ADAPTATION_SIZES}
    strengths: dict[int, list[float]] = {k: [] for k in ADAPTATION_SIZES if k}
    for split in range(ADAPTATION_SPLITS):
        order = [ids[i] for i in np.random.default_rng(split).permutation(len(ids))]
        test = real.subset(order[max(ADAPTATION_SIZES) :])
        for k in ADAPTATION_SIZES:
            model = base
            if k:
                shots = real.subset(order[:k])
                strength, _ = select_adaptation_strength(base, shots, seed=split)
                strengths[k].append(strength)
                model = base.adapt(shots, strength)
            runs[k].append(predict_labels(model, test, MAIN_QUESTION).scores())
        log(f"adaptation split {split}: " + ", ".join(f"k={k} r={runs[k][-1]['pearson']:.3f}" for k in ADAPTATION_SIZES))
    out: dict[str, Any] = {"splits": ADAPTATION_SPLITS, "test_conversations": len(ids) - max(ADAPTATION_SIZES)}
    for k in ADAPTATION_SIZES:
        summary = table1.summarise(runs[k])
        for metric in ("pearson", "spearman", "rmse", "smece"):
            values = summary[metric + "_per_seed"]
            summary[metric + "_range95"] = [float(np.quantile(values, 0.025)), float(np.quantile(values, 0.975))]
        summary["strengths_chosen"] = strengths.get(k, [])
        out[f"k={k}"] = summary
    return out


def baselines(synth: RubricData, real: RubricData) -> dict[str, Any]:
    """Judge mean, expected LLM answer and constant on real Q0 (and the judge mean per dimension)."""
    labels = real.labels_for(MAIN_QUESTION)
    y = np.array([lab.answer for lab in labels], dtype=float)
    predictions = table1.baseline_predictions(synth, real, MAIN_QUESTION, seed=0)
    out: dict[str, Any] = {name: table1.score(y, predictions[name]) for name in ("constant", "expected_llm_q0", "judge_mean")}
    out["judge_mean_bootstrap_ci"] = bootstrap(y, predictions["judge_mean"])
    out["judge_mean_per_dimension"] = {}
    for q in PER_DIMENSION_QUESTIONS:
        y_q = np.array([lab.answer for lab in real.labels_for(q)], dtype=float)
        out["judge_mean_per_dimension"][q] = table1.score(y_q, table1.baseline_predictions(synth, real, q, seed=0)["judge_mean"])
    return out


def network_figures() -> dict[str, Any]:
    """The network's real Q0 figures as `bench/llm_rubric_table1.py` measured them (same protocol)."""
    table = json.loads(NETWORK_RESULTS.read_text(encoding="utf-8"))
    real = table["real"]
    return {
        "source": str(NETWORK_RESULTS.relative_to(ROOT)),
        "real_q0": real["llm_rubric"],
        "real_q0_bootstrap_ci_seed0": real["bootstrap_ci"]["llm_rubric"],
        "per_dimension": {q: v["llm_rubric"] for q, v in table["per_dimension"].items() if isinstance(v, dict)},
    }


def _cell(summary: dict[str, Any], metric: str) -> str:
    return f"{summary[metric]:.3f} ± {summary[metric + '_sd']:.3f}"


def print_report(results: dict[str, Any]) -> None:
    base = results["baselines"]
    print("\nreal Q0, trained on synthetic only (mean ± sd over seeds; seed 0's 95 % bootstrap CI of Pearson)")
    print(f"{'candidate':26} {'Pearson':>15} {'CI':>15} {'Spearman':>15} {'RMSE':>15} {'smECE':>15}")
    rows = [(n, c["real_q0"], c["real_q0_bootstrap_ci_seed0"]) for n, c in results["candidates"].items()]
    rows.append(("network (llm_rubric_table1)", results["network"]["real_q0"], results["network"]["real_q0_bootstrap_ci_seed0"]))
    for name, summary, ci in rows:
        smece = _cell(summary, "smece") if "smece" in summary else "—"
        interval = f"{ci['pearson']['low']:.3f}–{ci['pearson']['high']:.3f}"
        print(
            f"{name:26} {_cell(summary, 'pearson'):>15} {interval:>15} {_cell(summary, 'spearman'):>15} "
            f"{_cell(summary, 'rmse'):>15} {smece:>15}"
        )
    jm = base["judge_mean"]
    ci = base["judge_mean_bootstrap_ci"]["pearson"]
    print(
        f"{'judge mean (baseline)':26} {jm['pearson']:>15.3f} {ci['low']:.3f}–{ci['high']:.3f} {jm['spearman']:>15.3f} {jm['rmse']:>15.3f}"
    )
    print(f"default (lowest synthetic CV RMSE, unadapted): {results['default']}")
    adaptation = results["adaptation"]
    print(
        f"\nadaptation to k real conversations ({adaptation['splits']} random splits, tested on {adaptation['test_conversations']} others)"
    )
    for k in ADAPTATION_SIZES:
        a = adaptation[f"k={k}"]
        low, high = a["pearson_range95"]
        print(
            f"  k={k:<4} Pearson {_cell(a, 'pearson')} (2.5-97.5 %: {low:.3f}-{high:.3f})  Spearman {_cell(a, 'spearman')}  "
            f"RMSE {_cell(a, 'rmse')}  smECE {_cell(a, 'smece')}"
        )
    sep = results["separation"]
    print(
        f"worker's P(dsat) (default, average judge): {sep['mean_p_dsat_humans_dissatisfied']:.3f} on the "
        f"{sep['n_humans_dissatisfied']} conversations humans rate Q0 <= 2, {sep['mean_p_dsat_others']:.3f} on the rest; "
        f"AUROC {sep['auroc']['estimate']:.3f} ({sep['auroc']['low']:.3f}-{sep['auroc']['high']:.3f})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=table1.DEFAULT_DATA_DIR)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    synth, real = load_split(args.data_dir, "synth"), load_split(args.data_dir, "real")
    results = run(synth, real)
    results["baselines"] = baselines(synth, real)
    results["separation"] = separation(synth, real)
    results["adaptation"] = adaptation_curve(synth, real)
    results["network"] = network_figures()
    results["run"] = {
        "command": table1.command_line(),
        "seeds": list(SEEDS),
        "grid": GRID,
        "cv": f"{CV_FOLDS}-fold by conversation on synthetic, criterion {CV_CRITERION}",
        "bootstrap": f"percentile, {table1.BOOTSTRAP_SAMPLES} resamples of the real conversations, 95%",
        "elapsed_s": round(time.perf_counter() - started, 1),
        "python": platform.python_version(),
        "synthetic_hash": synth.content_hash(),
        "real_hash": real.content_hash(),
    }
    print_report(results)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(table1._jsonable(results), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
