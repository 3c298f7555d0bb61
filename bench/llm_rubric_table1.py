"""LLM-Rubric, Table 1 protocol, on the released data (``make bench``).

Protocol (Hashemi et al., ACL 2024, §4-5): choose the calibration network's
hyperparameters by 5-fold cross-validation on the *synthetic* conversations
only; train on all synthetic judgments; predict each real judge's Q0 answer
on the 223 real conversations. Nothing here looks at real labels except to
score the final predictions.

Sections (each a function of a `BenchContext`, run in order from `SECTIONS`;
a new section — e.g. RUBICON — is one more function appended there):

1. ``hyperparameters``: CV grid search on synthetic (LLM-Rubric with all 9
   questions as input; the "calibrated LLM Q0 only" network separately).
2. ``synthetic_cv``: 5-fold cross-evaluation on synthetic per seed, with the
   baselines and smECE of Q0 on the held-out folds.
3. ``real_table1``: train on all synthetic, test on real: random, constant,
   argmax / expected LLM Q0, judge-mean baseline, calibrated Q0 only,
   LLM-Rubric per seed (mean ± SD) and the seeds' ensemble, bootstrap CIs.
4. ``per_dimension``: Table 3 — fine-tune on each Qi, evaluate on real Qi.
5. ``rubicon``: RUBICON's threshold/window machinery on the same data: Q1–Q8
   as SAT rubrics scored by the recorded GPT-3.5 judge, a conversation
   negative when its judges' mean Q0 <= 2; θ and the 0.9-precision windows are
   fitted on synthetic and applied to real (ΔNetSAT, YR@90, A/P/R/F1).

Run: ``.venv/bin/python bench/llm_rubric_table1.py [--quick] [--jobs N]``;
writes ``bench/results/llm_rubric_table1.json`` and prints the table and the
exact command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from scorers import statistics  # noqa: E402
from scorers.calibration import CalibrationNetwork  # noqa: E402
from scorers.calibration_selection import (  # noqa: E402
    PAPER_GRID,
    HeldOutPredictions,
    conversation_folds,
    cross_validate,
    predict_labels,
    select_hyperparameters,
)
from scorers.conversation import Conversation  # noqa: E402
from scorers.datasets.llm_rubric import (  # noqa: E402
    MAIN_QUESTION,
    QUESTIONS_FILE,
    SPLIT_FILES,
    RubricData,
    dimension_rubric_set,
    load_split,
    satisfaction_labels,
)
from scorers.judges.recorded import RecordedJudge  # noqa: E402
from scorers.rubrics import RubricSet, evaluate  # noqa: E402

DEFAULT_DATA_DIR = ROOT.parent / "shared" / "data" / "llm-rubric"
DEFAULT_OUTPUT = ROOT / "bench" / "results" / "llm_rubric_table1.json"
CV_FOLDS = 5
CV_CRITERION = "rmse"

# The paper's grid is h1, h2 ∈ {10, 25, 50, 100} × batch size × Adam learning rate × epochs. The full
# grid keeps every (h1, h2) pair and varies batch size and learning rate (two values each; 20
# pre-training and 30 fine-tuning epochs: a 50-epoch pre-training variant never beat 20 in synthetic
# CV in an earlier full run and cost most of the time); a second family uses early stopping (epochs
# become maxima, the best held-out loss is restored). CV picks between them like any other setting.
_HIDDEN = {"h1": PAPER_GRID["h1"], "h2": PAPER_GRID["h2"]}
FULL_GRIDS: dict[str, list[dict[str, list[Any]]]] = {
    "llm_rubric": [
        PAPER_GRID,
        {**_HIDDEN, "early_stopping": [True], "pretrain_epochs": [100], "finetune_epochs": [100], "patience": [20]},
    ],
    # Q0-only input: 4 features instead of 35, so a smaller grid suffices.
    "calibrated_q0_only": [{**_HIDDEN, "learning_rate": [1e-3, 3e-3]}],
}
FULL_REPEATS = 2  # CV repeats (fold splits and model seeds) per candidate
FULL_SEEDS = (0, 1, 2, 3, 4)
# The CV surface is flat near the top (many candidates within CV noise of the best), so the
# benchmark also reports an ensemble of the top-k candidates × all seeds (mean predicted distribution).
FULL_TOP_K = 5
QUICK_TOP_K = 2
QUICK_GRIDS: dict[str, list[dict[str, list[Any]]]] = {
    "llm_rubric": [{"h1": [25, 50], "h2": [25, 50]}],
    "calibrated_q0_only": [{"h1": [25, 50], "h2": [25, 50]}],
}
QUICK_REPEATS = 1
QUICK_SEEDS = (0, 1, 2)
# Fixed for every candidate unless the grid says otherwise (the authors' released best setting).
BASE_PARAMS: dict[str, Any] = {
    "batch_size": 64,
    "learning_rate": 1e-3,
    "pretrain_epochs": 20,
    "finetune_epochs": 30,
    "main_question": MAIN_QUESTION,
}
BOOTSTRAP_SAMPLES = 2000
PER_DIMENSION_QUESTIONS = ("Q1", "Q2", "Q3", "Q4", "Q5", "Q6", "Q7", "Q8")
RANDOM_BASELINE_DRAWS = 20
METRIC_KEYS = ("rmse", "rmse_bound", "pearson", "spearman", "kendall")
PROGRESS_EVERY = 20  # candidates between progress lines during the grid search


# ---------------------------------------------------------------------------
# context and worker jobs


@dataclass
class BenchContext:
    """Everything a section needs; sections add their results to ``results``."""

    args: argparse.Namespace
    synth: RubricData
    real: RubricData
    seeds: tuple[int, ...]
    executor: Executor | None
    results: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def log(self, text: str = "") -> None:
        print(text, flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Submit to the executor (or run inline); returns something with ``.result()``."""
        if self.executor is None:
            value = fn(*args)
            return _Done(value)
        return self.executor.submit(fn, *args)


@dataclass
class _Done:
    value: Any

    def result(self) -> Any:
        return self.value


def _worker_init() -> None:
    torch.set_num_threads(1)


def _fit_predict(params: dict[str, Any], train: RubricData, test: RubricData, question: str) -> np.ndarray:
    model = CalibrationNetwork(**params).fit(train)
    return predict_labels(model, test, question).probabilities


def _cv(params: dict[str, Any], data: RubricData, fold_seed: int) -> HeldOutPredictions:
    return cross_validate(CalibrationNetwork(**params), data, k=CV_FOLDS, seed=fold_seed)


# ---------------------------------------------------------------------------
# baselines (no training on real labels: "training" means the synthetic labels)


def llm_expected(data: RubricData, question: str, text_ids: tuple[str, ...]) -> np.ndarray:
    """The LLM's expected answer (renormalised over the options) per conversation."""
    off, k = data.offsets()[question], data.n_options[question]
    p = np.stack([np.asarray(data.features[t])[off : off + k] for t in text_ids])
    return (p @ np.arange(1, k + 1)) / p.sum(axis=1)


def llm_argmax(data: RubricData, question: str, text_ids: tuple[str, ...]) -> np.ndarray:
    off, k = data.offsets()[question], data.n_options[question]
    p = np.stack([np.asarray(data.features[t])[off : off + k] for t in text_ids])
    return p.argmax(axis=1) + 1.0


def judge_means(train: RubricData, question: str) -> tuple[dict[str, float], float]:
    labels = train.labels_for(question)
    overall = float(np.mean([lab.answer for lab in labels]))
    per: dict[str, list[int]] = {}
    for lab in labels:
        per.setdefault(lab.judge, []).append(lab.answer)
    return {j: float(np.mean(v)) for j, v in per.items()}, overall


def baseline_predictions(train: RubricData, test: RubricData, question: str, seed: int) -> dict[str, np.ndarray]:
    """Predictions of every baseline for each of ``test``'s ``question`` labels."""
    labels = test.labels_for(question)
    tids = tuple(lab.text_id for lab in labels)
    means, overall = judge_means(train, question)
    k = test.n_options[question]
    rng = np.random.default_rng(seed)
    return {
        "random": rng.integers(1, k + 1, size=(RANDOM_BASELINE_DRAWS, len(labels))).astype(float),
        "constant": np.full(len(labels), overall),
        "argmax_llm_q0": llm_argmax(test, question, tids),
        "expected_llm_q0": llm_expected(test, question, tids),
        "judge_mean": np.array([means.get(lab.judge, overall) for lab in labels]),
    }


def score(y: np.ndarray, yhat: np.ndarray) -> dict[str, float]:
    """Agreement metrics; a 2-D ``yhat`` (several random draws) is scored per draw and averaged."""
    if yhat.ndim == 2:
        runs = [statistics.agreement(y, row) for row in yhat]
        return {k: float(np.mean([r[k] for r in runs])) for k in METRIC_KEYS}
    return statistics.agreement(y, yhat)


def summarise(runs: list[dict[str, float]]) -> dict[str, Any]:
    """Mean, SD (ddof=1) and per-seed values of each metric."""
    out: dict[str, Any] = {}
    for k in runs[0]:
        values = [r[k] for r in runs]
        out[k] = float(np.mean(values))
        out[k + "_sd"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        out[k + "_per_seed"] = values
    return out


def expected(probabilities: np.ndarray) -> np.ndarray:
    return probabilities @ np.arange(1, probabilities.shape[1] + 1)


# ---------------------------------------------------------------------------
# sections


def hyperparameters(ctx: BenchContext) -> None:
    """Grid search by 5-fold CV on synthetic data only (criterion: pooled out-of-fold Q0 RMSE)."""
    grids = QUICK_GRIDS if ctx.args.quick else FULL_GRIDS
    repeats = QUICK_REPEATS if ctx.args.quick else FULL_REPEATS
    out: dict[str, Any] = {"fixed": BASE_PARAMS, "folds": CV_FOLDS, "repeats": repeats, "criterion": CV_CRITERION}
    for name, input_questions in (("llm_rubric", None), ("calibrated_q0_only", [MAIN_QUESTION])):
        grid = grids[name]
        t0 = time.perf_counter()
        base = CalibrationNetwork(**BASE_PARAMS, input_questions=input_questions, seed=0)

        def on_candidate(i: int, n: int, params: dict[str, Any], scores: dict[str, float], name: str = name) -> None:
            if (i + 1) % PROGRESS_EVERY == 0 or i + 1 == n:
                ctx.log(f"[{ctx.elapsed():6.0f}s]   {name}: {i + 1}/{n} candidates cross-validated")

        search = select_hyperparameters(
            ctx.synth,
            grid,
            base=base,
            k=CV_FOLDS,
            seed=0,
            criterion=CV_CRITERION,
            repeats=repeats,
            executor=ctx.executor,
            on_candidate=on_candidate,
        )
        best = next(r for r in search.results if {**base.get_params(), **r["params"]} == search.best_params)
        ctx.log(
            f"[{ctx.elapsed():6.0f}s] CV selection for {name}: {len(search.results)} candidates x {repeats} repeats "
            f"in {time.perf_counter() - t0:.0f}s -> {best['params']} (CV Q0 RMSE {best['scores']['rmse']:.3f}, "
            f"Pearson {best['scores']['pearson']:.3f})"
        )
        ranked = sorted(search.results, key=lambda r: r["scores"][CV_CRITERION])
        top_k = QUICK_TOP_K if ctx.args.quick else FULL_TOP_K
        out[name] = {
            "grid": grid,
            "best_params": search.best_params,
            "best_scores": best["scores"],
            "top_k_params": [{**base.get_params(), **r["params"]} for r in ranked[:top_k]],
            "candidates": search.results,
        }
    ctx.results["hyperparameters"] = out


def _params(ctx: BenchContext, name: str, seed: int, **overrides: Any) -> dict[str, Any]:
    return {**ctx.results["hyperparameters"][name]["best_params"], "seed": seed, **overrides}


def _top_k_params(ctx: BenchContext, seed: int) -> list[dict[str, Any]]:
    return [{**p, "seed": seed} for p in ctx.results["hyperparameters"]["llm_rubric"]["top_k_params"]]


def synthetic_cv(ctx: BenchContext) -> None:
    """5-fold cross-evaluation on synthetic data (folds by conversation), per seed, with baselines."""
    jobs = {
        (name, s): ctx.run(_cv, _params(ctx, name, s), ctx.synth, s)
        for name in ("llm_rubric", "calibrated_q0_only")
        for s in ctx.seeds
    }
    top_jobs = {s: [ctx.run(_cv, p, ctx.synth, s) for p in _top_k_params(ctx, s)] for s in ctx.seeds}
    out: dict[str, Any] = {}
    smece_runs, smece_option_runs = [], []
    for name in ("llm_rubric", "calibrated_q0_only"):
        runs = []
        for s in ctx.seeds:
            held: HeldOutPredictions = jobs[(name, s)].result()
            runs.append(score(held.answers, held.expected_value))
            if name == "llm_rubric":
                per_option = statistics.smece_one_vs_rest(held.probabilities, held.answers)
                smece_option_runs.append(per_option)
                smece_runs.append(float(np.mean(per_option)))
        out[name] = summarise(runs)
    # Top-k ensemble: same folds for every member (same fold seed), so the held-out rows line up.
    # Optimistic on synthetic: the k were chosen with CV on these same conversations.
    runs = []
    for s in ctx.seeds:
        parts: list[HeldOutPredictions] = [j.result() for j in top_jobs[s]]
        assert all(p.text_ids == parts[0].text_ids and p.judges == parts[0].judges for p in parts)
        runs.append(score(parts[0].answers, expected(np.mean([p.probabilities for p in parts], axis=0))))
    out["llm_rubric_top_k"] = summarise(runs)
    # Baselines on the same kind of folds (training statistics from the training folds).
    base_runs: dict[str, list[dict[str, float]]] = {}
    for s in ctx.seeds:
        ys: list[np.ndarray] = []
        preds: dict[str, list[np.ndarray]] = {}
        for train_ids, test_ids in conversation_folds(ctx.synth.text_ids, CV_FOLDS, s):
            test = ctx.synth.subset(test_ids)
            ys.append(np.array([lab.answer for lab in test.labels_for(MAIN_QUESTION)]))
            for k, v in baseline_predictions(ctx.synth.subset(train_ids), test, MAIN_QUESTION, s).items():
                preds.setdefault(k, []).append(v)
        y = np.concatenate(ys)
        for k, folds in preds.items():
            base_runs.setdefault(k, []).append(score(y, np.concatenate(folds, axis=-1)))
    for k, runs in base_runs.items():
        out[k] = summarise(runs)
    # The constant's value differs between folds, so pooled correlations would only measure that: undefined.
    for k in ("pearson", "spearman", "kendall"):
        out["constant"][k] = out["constant"][k + "_sd"] = math.nan
    out["constant"]["rmse_bound"] = statistics.rmse_lower_bound([lab.answer for lab in ctx.synth.labels_for(MAIN_QUESTION)], 0.0)
    ctx.results["synthetic"] = {
        "cv": out,
        "smece_q0": float(np.mean(smece_runs)),
        "smece_q0_sd": float(np.std(smece_runs, ddof=1)) if len(smece_runs) > 1 else 0.0,
        "smece_q0_per_option": [float(v) for v in np.mean(smece_option_runs, axis=0)],
        "smece_reduction": "one-vs-rest per Q0 option (p̂(y=k) vs 1[y=k]), averaged over the 4 options; out-of-fold, mean over seeds",
    }
    ctx.log(f"[{ctx.elapsed():6.0f}s] synthetic 5-fold CV done")


def real_table1(ctx: BenchContext) -> None:
    """Train on all synthetic judgments, predict each real judge's Q0 (the paper's Table 1)."""
    q = MAIN_QUESTION
    labels = ctx.real.labels_for(q)
    y = np.array([lab.answer for lab in labels], dtype=float)
    jobs = {
        (name, s): ctx.run(_fit_predict, _params(ctx, name, s), ctx.synth, ctx.real, q)
        for name in ("llm_rubric", "calibrated_q0_only")
        for s in ctx.seeds
    }
    top_jobs = [ctx.run(_fit_predict, p, ctx.synth, ctx.real, q) for s in ctx.seeds for p in _top_k_params(ctx, s)]
    out: dict[str, Any] = {"n_labels": int(len(y)), "label_mean": float(y.mean()), "label_sd": float(y.std())}
    baselines = baseline_predictions(ctx.synth, ctx.real, q, seed=0)
    for k, yhat in baselines.items():
        out[k] = score(y, yhat)
    ensembles: dict[str, np.ndarray] = {}
    for name in ("calibrated_q0_only", "llm_rubric"):
        probs = [jobs[(name, s)].result() for s in ctx.seeds]
        out[name] = summarise([score(y, expected(p)) for p in probs])
        ensembles[name] = np.mean(probs, axis=0)
        out[name + "_ensemble"] = score(y, expected(ensembles[name]))
        out[name + "_ensemble"]["smece"] = statistics.smece_multiclass(ensembles[name], y.astype(int))
    ensembles["llm_rubric_top_k"] = np.mean([j.result() for j in top_jobs], axis=0)
    out["llm_rubric_top_k"] = score(y, expected(ensembles["llm_rubric_top_k"]))
    out["llm_rubric_top_k"]["smece"] = statistics.smece_multiclass(ensembles["llm_rubric_top_k"], y.astype(int))
    cis: dict[str, Any] = {}
    for name, yhat in (
        ("llm_rubric", expected(jobs[("llm_rubric", ctx.seeds[0])].result())),
        ("llm_rubric_ensemble", expected(ensembles["llm_rubric"])),
        ("llm_rubric_top_k", expected(ensembles["llm_rubric_top_k"])),
        ("expected_llm_q0", baselines["expected_llm_q0"]),
        ("judge_mean", baselines["judge_mean"]),
    ):
        cis[name] = {
            m: statistics.bootstrap_ci(getattr(statistics, m), y, yhat, n_samples=BOOTSTRAP_SAMPLES, seed=0).as_dict()
            for m in ("rmse", "pearson", "spearman", "kendall")
        }
    out["bootstrap_ci"] = cis
    out["bootstrap"] = f"percentile, {BOOTSTRAP_SAMPLES} resamples of the {len(y)} real conversations, 95%"
    ctx.results["real"] = out
    ctx.log(f"[{ctx.elapsed():6.0f}s] real-data evaluation done")


def per_dimension(ctx: BenchContext) -> None:
    """Table 3: the selected network fine-tuned on each Qi, evaluated on the real Qi labels."""
    jobs = {
        (q, s): ctx.run(_fit_predict, _params(ctx, "llm_rubric", s, main_question=q), ctx.synth, ctx.real, q)
        for q in PER_DIMENSION_QUESTIONS
        for s in ctx.seeds
    }
    out: dict[str, Any] = {}
    for q in PER_DIMENSION_QUESTIONS:
        labels = ctx.real.labels_for(q)
        y = np.array([lab.answer for lab in labels], dtype=float)
        tids = tuple(lab.text_id for lab in labels)
        probs = [jobs[(q, s)].result() for s in ctx.seeds]
        out[q] = {
            "n_labels": int(len(y)),
            "llm_rubric": summarise([score(y, expected(p)) for p in probs]),
            "llm_rubric_ensemble": score(y, expected(np.mean(probs, axis=0))),
            "expected_llm": score(y, llm_expected(ctx.real, q, tids)),
        }
    out["note"] = "Q8 is not ordinal (3 = appropriate length); its correlations are reported as the paper does, with that caveat."
    ctx.results["per_dimension"] = out
    ctx.log(f"[{ctx.elapsed():6.0f}s] per-dimension evaluation done")


RUBICON_PRECISION = 0.9


def _netsats(rubric_set: RubricSet, data_dir: Path, split: str, data: RubricData) -> tuple[np.ndarray, np.ndarray]:
    """NetSAT per labelled conversation from the recorded judge, and the satisfaction labels."""
    judge = RecordedJudge.from_tsv(data_dir / SPLIT_FILES[split][0])
    labels = satisfaction_labels(data)
    ids = sorted(labels)
    netsats = rubric_set.netsats(judge, (Conversation(t, ()) for t in ids))
    return netsats, np.array([labels[t] for t in ids])


def rubicon(ctx: BenchContext) -> None:
    data_dir = ctx.args.data_dir
    draft = dimension_rubric_set(data_dir / QUESTIONS_FILE)
    s_netsat, s_label = _netsats(draft, data_dir, "synth", ctx.synth)
    r_netsat, r_label = _netsats(draft, data_dir, "real", ctx.real)
    fitted = draft.fit_windows(s_netsat, s_label, precision=RUBICON_PRECISION)
    w = fitted.windows
    out: dict[str, Any] = {
        "rubric_set_version": fitted.version,
        "precision_target": RUBICON_PRECISION,
        "threshold": w.threshold,
        "dsat_upper": w.dsat_upper,
        "sat_lower": w.sat_lower,
    }
    for name, netsat, label in (("synthetic_fit", s_netsat, s_label), ("real", r_netsat, r_label)):
        m = evaluate(netsat, label, fitted)
        out[name] = {**m.__dict__, "netsat_min": float(netsat.min()), "netsat_max": float(netsat.max())}
    ctx.results["rubicon"] = out


SECTIONS: list[Callable[[BenchContext], None]] = [hyperparameters, synthetic_cv, real_table1, per_dimension, rubicon]


# ---------------------------------------------------------------------------
# report


def _fmt(v: float, sd: float | None = None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "     –      "
    return f"{v:6.3f}±{sd:.3f}" if sd is not None else f"{v:6.3f}      "


def _row(label: str, r: dict[str, Any], with_sd: bool) -> str:
    cells = []
    for k in ("rmse", "rmse_bound", "pearson", "spearman", "kendall"):
        sd = r.get(k + "_sd") if with_sd else None
        cells.append(_fmt(r.get(k, math.nan), sd))
    return f"  {label:<34}" + " ".join(cells)


def print_report(ctx: BenchContext) -> None:
    head = f"  {'method':<34}" + " ".join(f"{h:<12}" for h in ("RMSE", "RMSE bound", "Pearson", "Spearman", "Kendall"))
    rows = (
        ("random", "random", False),
        ("constant (training mean)", "constant", False),
        ("argmax LLM Q0", "argmax_llm_q0", False),
        ("expected LLM Q0", "expected_llm_q0", False),
        ("judge-mean baseline", "judge_mean", False),
        ("calibrated LLM Q0 only", "calibrated_q0_only", True),
        ("  (seed ensemble)", "calibrated_q0_only_ensemble", False),
        ("LLM-Rubric (9 questions)", "llm_rubric", True),
        ("  (seed ensemble)", "llm_rubric_ensemble", False),
        ("  (top-k CV configs x seeds)", "llm_rubric_top_k", False),
    )
    seeds = len(ctx.seeds)
    if "real" in ctx.results:
        real = ctx.results["real"]
        ctx.log(
            f"\nReal conversations, Q0 (n={real['n_labels']}, label SD {real['label_sd']:.3f}); "
            f"trained on all synthetic judgments; ± = SD over {seeds} seeds"
        )
        ctx.log(head)
        for label, key, sd in rows:
            if key in real:
                ctx.log(_row(label, real[key], sd))
        ctx.log("  95% bootstrap CIs (resampling conversations):")
        for name, ci in real["bootstrap_ci"].items():
            label = f"seed {ctx.seeds[0]}" if name == "llm_rubric" else name
            ctx.log(
                f"    {label:<28}"
                + ", ".join(f"{m} [{ci[m]['low']:.3f}, {ci[m]['high']:.3f}]" for m in ("rmse", "pearson", "spearman", "kendall"))
            )
    if "synthetic" in ctx.results:
        syn = ctx.results["synthetic"]
        ctx.log(f"\nSynthetic conversations, Q0, {CV_FOLDS}-fold CV by conversation; ± = SD over {seeds} seeds")
        ctx.log(head)
        for label, key, _ in rows:
            if key in syn["cv"]:
                ctx.log(_row(label, syn["cv"][key], True))
        ctx.log(
            f"  smECE of Q0 on held-out folds: {syn['smece_q0']:.3f} ± {syn['smece_q0_sd']:.3f} "
            f"(per option {', '.join(f'{v:.3f}' for v in syn['smece_q0_per_option'])})"
        )
    if "per_dimension" in ctx.results:
        ctx.log("\nPer dimension (Table 3): fine-tuned on Qi, real Qi labels; LLM-Rubric mean over seeds vs expected LLM")
        ctx.log(f"  {'question':<10}{'n':>5}  {'RMSE':>7} {'Pearson':>8} {'Spearman':>9} | {'LLM RMSE':>9} {'Pearson':>8}")
        for q in PER_DIMENSION_QUESTIONS:
            r = ctx.results["per_dimension"][q]
            a, b = r["llm_rubric"], r["expected_llm"]
            ctx.log(
                f"  {q:<10}{r['n_labels']:>5}  {a['rmse']:7.3f} {a['pearson']:8.3f} {a['spearman']:9.3f} | "
                f"{b['rmse']:9.3f} {b['pearson']:8.3f}"
            )
    if "rubicon" in ctx.results:
        _print_rubicon(ctx)


def _print_rubicon(ctx: BenchContext) -> None:
    r = ctx.results["rubicon"]

    def edge(v: float | None) -> str:
        return "none" if v is None else f"{v:.2f}"

    ctx.log(
        f"\nRUBICON on the same data: Q1-Q8 as SAT rubrics (recorded GPT-3.5), negative = judges' mean Q0 <= 2; "
        f"fitted on synthetic: θ={r['threshold']:.2f}, dsat window <= {edge(r['dsat_upper'])}, sat window >= {edge(r['sat_lower'])} "
        f"at P={r['precision_target']}"
    )
    ctx.log(
        f"  {'data':<16}{'n':>5}{'pos':>5}  {'NetSAT range':>15}  {'ΔNetSAT':>8} {'YR@90':>6} {'A':>6} {'P':>6} {'R':>6} {'F1':>6}"
    )
    for name in ("synthetic_fit", "real"):
        m = r[name]
        ctx.log(
            f"  {name:<16}{m['n']:>5}{m['n_positive']:>5}  {m['netsat_min']:6.1f}..{m['netsat_max']:6.1f}  "
            f"{m['delta_netsat']:8.2f} {m['yield_rate']:6.1%} {m['accuracy']:6.3f} {_fmt(m['precision']).strip():>6} "
            f"{m['recall']:6.3f} {_fmt(m['f1']).strip():>6}"
        )


def _jsonable(value: Any) -> Any:
    """NaN (an undefined correlation) becomes null, numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def command_line() -> str:
    exe = Path(sys.executable)
    try:
        exe_text = str(exe.relative_to(ROOT)) if exe.is_relative_to(ROOT) else str(exe)
    except ValueError:
        exe_text = str(exe)
    script = Path(sys.argv[0]).resolve()
    script_text = str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else str(script)
    return shlex.join([exe_text, script_text, *sys.argv[1:]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small grid, 3 seeds (minutes instead of tens of minutes)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (1 = run inline)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    synth = load_split(args.data_dir, "synth")
    real = load_split(args.data_dir, "real")
    seeds = QUICK_SEEDS if args.quick else FULL_SEEDS
    command = command_line()
    print(f"command: {command}", flush=True)
    print(
        f"synthetic: {len(synth.features)} conversations, {len(synth.labels)} labels "
        f"({len(synth.labels_for(MAIN_QUESTION))} Q0; {synth.dropped_labels} labels dropped: no LLM evaluation); "
        f"real: {len(real.features)} conversations, {len(real.labels_for(MAIN_QUESTION))} Q0 labels",
        flush=True,
    )
    executor = ProcessPoolExecutor(max_workers=args.jobs, initializer=_worker_init) if args.jobs > 1 else None
    ctx = BenchContext(args=args, synth=synth, real=real, seeds=seeds, executor=executor)
    try:
        for section in SECTIONS:
            section(ctx)
    finally:
        if executor is not None:
            executor.shutdown()
    elapsed = ctx.elapsed()
    ctx.results["run"] = {
        "command": command,
        "mode": "quick" if args.quick else "full",
        "seeds": list(seeds),
        "jobs": args.jobs,
        "elapsed_s": round(elapsed, 1),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "synthetic_hash": synth.content_hash(),
        "real_hash": real.content_hash(),
    }
    print_report(ctx)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(_jsonable(ctx.results), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    print(f"\nwrote {args.output} in {elapsed:.0f}s\ncommand: {command}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
