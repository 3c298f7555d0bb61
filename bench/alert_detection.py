"""Does the dissatisfaction-spike alert fire when *humans'* dissatisfaction rises? Delay and false alarms vs separation.

The question (issue "Close the loop", part 4): a product's stream turns
dissatisfied *according to human labels*; does ``ConvowatchDissatisfactionSpike``
fire, how late, and how often does it fire on a calm stream? The answer depends
on how well the scorer's calibrated P(dissatisfied) separates the conversations
humans call dissatisfied from the rest, so it is measured for the scorers
available here and for a family of better ones, to say which scorer quality
the alert needs.

Data: the 223 real LLM-Rubric conversations, each with its human verdict
(mean Q0 ≤ 2: dissatisfied, 73 of them) and P(dsat) from the recorded
GPT-3.5 judge through a calibrator that never saw them. Scorers, fixed before
any stream was simulated:

* ``default``: the cumulative-link calibrator `convowatch calibrate train`
  fits on LLM-Rubric's synthetic conversations (penalties by synthetic CV,
  seed 0): the default ``bench/calibration_transfer.py`` chose (its results file);
* ``adapted_k100``: that calibrator adapted to 100 real conversations
  (`convowatch calibrate adapt`, strength by CV on the 100), streams drawn
  from the other 123 only; five random splits;
* ``binormal_A``: hypothetical *calibrated* scorers of AUROC A ∈
  `BINORMAL_AUROCS` (the binormal model: a latent score N(μ·[dissatisfied], 1),
  μ = √2·Φ⁻¹(A), turned into the exact posterior P(dissatisfied | score) at
  the pool's share), `SYNTHETIC_POOL` conversations each: a ruler for "how
  much separation does the alert need", not a judge.

Streams (`StreamShape`): conversations close at 10 or 50 a minute
(`RATES_PER_MINUTE`, Poisson), each human-dissatisfied with probability q, drawn with its P from
the scorer's pool of that class. q is the pool's share until the burst, then
q + `RISES` (15 and 30 points) for `BURST_MINUTES`. The alert is evaluated
every minute with the production `AlertWindows` (10 min against the 6 h
baseline, z = 3, lift ≥ 5 points, ≥ 50 conversations, for 10 min) by the same
arithmetic ``dashboards/alerts/tests/make_unit_tests.py`` models and promtool
holds to the committed rules (window sums of n, ΣP, ΣP²; judged with π = 1).

Figures per scorer: AUROC of P for the human verdict (bootstrap 95 % CI), the
mean P gap between the classes; per rise: the share of `DETECTION_RUNS` bursts
detected while the burst lasts (Wilson CI), the delay from the burst's start
(median, quartiles); false alarms per day on `CALM_DAYS` of calm stream.

Run: ``.venv/bin/python bench/alert_detection.py`` (about a minute);
``--quick`` for a smoke run (results to /tmp).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

import calibration_transfer as transfer  # noqa: E402

from dashboards.alert_windows import AlertWindows  # noqa: E402
from scorers import statistics  # noqa: E402
from scorers.calibration_selection import select_adaptation_strength  # noqa: E402
from scorers.datasets.llm_rubric import MAIN_QUESTION, RubricData, load_split  # noqa: E402
from scorers.ordinal_calibration import OrdinalCalibrator  # noqa: E402

OUTPUT = ROOT / "bench" / "results" / "alert_detection.json"
QUICK_OUTPUT = Path("/tmp/alert_detection_quick.json")
BINORMAL_AUROCS = (0.6, 0.7, 0.8, 0.9, 0.95)
SYNTHETIC_POOL = 5000
RISES = (0.15, 0.30)
ADAPTED_SPLITS = 5
ADAPTATION_K = 100
RATES_PER_MINUTE = (10.0, 50.0)  # conversations closing per minute for one product and model version
BURST_MINUTES = 60
DETECTION_RUNS = 400
CALM_DAYS = 28
BOOTSTRAP_SAMPLES = 2000


@dataclass(frozen=True)
class Pool:
    """A scorer's P(dsat) for conversations, and the humans' verdict on each."""

    p: np.ndarray
    humans_dsat: np.ndarray  # bool

    def separation(self) -> dict[str, Any]:
        return {
            "n": len(self.p),
            "humans_dissatisfied": int(self.humans_dsat.sum()),
            "mean_p_humans_dissatisfied": float(self.p[self.humans_dsat].mean()),
            "mean_p_others": float(self.p[~self.humans_dsat].mean()),
            "auroc": statistics.bootstrap_ci(
                lambda p, h: statistics.auroc(p, h.astype(bool)), self.p, self.humans_dsat, n_samples=BOOTSTRAP_SAMPLES, seed=0
            ).as_dict(),
        }


@dataclass(frozen=True)
class StreamShape:
    """Minutes of a simulated stream: baseline fill, calm, burst, and a little after (detection runs)."""

    warm_up: int  # the 6 h baseline fills
    calm: int
    burst: int
    after: int

    @property
    def burst_start(self) -> int:
        return self.warm_up + self.calm

    @property
    def minutes(self) -> int:
        return self.warm_up + self.calm + self.burst + self.after


def pools(synth: RubricData, real: RubricData) -> dict[str, list[Pool]]:
    """Each scorer's pools: one for default and the blends, one per split for the adapted calibrator."""
    default = json.loads(transfer.OUTPUT.read_text(encoding="utf-8"))["default"]  # as the transfer benchmark chose it
    base = transfer.default_model(synth, default)
    ids = sorted({lab.text_id for lab in real.labels_for(MAIN_QUESTION)})
    verdict = humans_dissatisfied(real, ids)

    def pool(model: OrdinalCalibrator, of: Sequence[str]) -> Pool:
        x = np.stack([real.features[t] for t in of])
        p = model.predict_proba(x, MAIN_QUESTION).prob_at_most(transfer.DISSATISFIED_MAX)
        return Pool(np.asarray(p, dtype=float), np.array([verdict[t] for t in of]))

    default = pool(base, ids)
    out: dict[str, list[Pool]] = {"default": [default]}
    adapted = []
    for split in range(ADAPTED_SPLITS):
        order = [ids[i] for i in np.random.default_rng(split).permutation(len(ids))]
        shots = real.subset(order[:ADAPTATION_K])
        strength, _ = select_adaptation_strength(base, shots, seed=split)
        adapted.append(pool(base.adapt(shots, strength), order[ADAPTATION_K:]))
    out[f"adapted_k{ADAPTATION_K}"] = adapted
    rng = np.random.default_rng(0)
    for a in BINORMAL_AUROCS:
        out[f"binormal_{a:g}"] = [binormal_pool(a, float(default.humans_dsat.mean()), rng)]
    return out


def binormal_pool(auroc: float, share: float, rng: np.random.Generator) -> Pool:
    """`SYNTHETIC_POOL` conversations of a calibrated scorer with this AUROC (module docstring), ``share`` dissatisfied."""
    mu = np.sqrt(2) * NormalDist().inv_cdf(auroc)
    humans_dsat = rng.random(SYNTHETIC_POOL) < share
    score = rng.normal(mu * humans_dsat, 1.0)
    odds = share / (1 - share) * np.exp(mu * score - mu * mu / 2)  # prior odds × likelihood ratio
    return Pool(odds / (1 + odds), humans_dsat)


def humans_dissatisfied(real: RubricData, ids: Sequence[str]) -> dict[str, bool]:
    """Mean human Q0 ≤ 2 per conversation (the worker's scoring.dissatisfied_max_value)."""
    answers: dict[str, list[int]] = {}
    for lab in real.labels_for(MAIN_QUESTION):
        answers.setdefault(lab.text_id, []).append(lab.answer)
    return {t: float(np.mean(answers[t])) <= transfer.DISSATISFIED_MAX for t in ids}


def simulate(
    pool: Pool, shape: StreamShape, rate: float, rise: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-minute n, ΣP, ΣP² of a stream whose human-dissatisfied share rises by ``rise`` during the burst."""
    q0 = float(pool.humans_dsat.mean())
    dsat_p, other_p = pool.p[pool.humans_dsat], pool.p[~pool.humans_dsat]
    n = rng.poisson(rate, shape.minutes)
    q = np.full(shape.minutes, q0)
    q[shape.burst_start : shape.burst_start + shape.burst] = min(q0 + rise, 1.0)
    k = rng.binomial(n, q)
    minutes = np.arange(shape.minutes)
    minute = np.concatenate([np.repeat(minutes, k), np.repeat(minutes, n - k)])
    p = np.concatenate([rng.choice(dsat_p, int(k.sum())), rng.choice(other_p, int((n - k).sum()))])
    s1 = np.bincount(minute, weights=p, minlength=shape.minutes)
    s2 = np.bincount(minute, weights=p * p, minlength=shape.minutes)
    return n.astype(float), s1, s2


def firing(n: np.ndarray, s1: np.ndarray, s2: np.ndarray, w: AlertWindows) -> np.ndarray:
    """Whether the spike alert fires at the end of each minute (the rule's arithmetic; π = 1)."""
    short, base, held = (int(w.seconds(name) // 60) for name in ("short", "baseline", "for_"))

    def window(x: np.ndarray, width: int) -> np.ndarray:
        c = np.concatenate([[0.0], np.cumsum(x)])
        t = np.arange(1, len(x) + 1)
        return c[t] - c[np.maximum(t - width, 0)]

    with np.errstate(divide="ignore", invalid="ignore"):
        n_short, n_base = window(n, short), window(n, base)
        rate = window(s1, short) / n_short
        baseline = window(s1, base) / n_base
        variance = np.maximum(window(s2, base) / n_base - baseline**2, 0)
        threshold = baseline + np.maximum(w.z * np.sqrt(variance / n_short), w.min_lift)
        condition = (rate > threshold) & (n_short >= w.min_conversations)
    # `for: 10m` at one evaluation a minute: true at every evaluation from t - 10 to t.
    run = np.zeros(len(condition), dtype=int)
    for t, holds in enumerate(condition):
        run[t] = run[t - 1] + 1 if holds and t else int(holds)
    return run > held


def episodes(fires: np.ndarray) -> int:
    """Separate firings: times the alert went from not firing to firing."""
    return int(np.sum(fires[1:] & ~fires[:-1]) + fires[0])


def measure(scorer_pools: list[Pool], w: AlertWindows, runs: int, calm_days: int, seed: int) -> dict[str, Any]:
    """Separation of each pool, and per traffic rate: detection of each rise and false alarms on a calm stream."""
    warm_up = int(w.seconds("baseline") // 60)
    shape = StreamShape(warm_up=warm_up, calm=60, burst=BURST_MINUTES, after=0)
    calm = StreamShape(warm_up=warm_up, calm=calm_days * 1440 // len(scorer_pools), burst=0, after=0)
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"separation": [pool.separation() for pool in scorer_pools], "rates": {}}
    for rate in RATES_PER_MINUTE:
        at_rate: dict[str, Any] = {"rises": {}}
        for rise in RISES:
            delays, early = [], 0
            for run in range(runs):
                fires = firing(*simulate(scorer_pools[run % len(scorer_pools)], shape, rate, rise, rng), w)
                early += int(episodes(fires[warm_up : shape.burst_start]) > 0)
                during = np.flatnonzero(fires[shape.burst_start :])
                if len(during):
                    delays.append(int(during[0]) + 1)  # minutes from the burst's start to the first firing evaluation
            at_rate["rises"][f"{rise:g}"] = {
                "detected": {"runs": runs, "detected": len(delays), **statistics.wilson_interval(len(delays), runs).as_dict()},
                "delay_minutes": {
                    "median": float(np.median(delays)) if delays else None,
                    "q1": float(np.quantile(delays, 0.25)) if delays else None,
                    "q3": float(np.quantile(delays, 0.75)) if delays else None,
                },
                "runs_firing_before_the_burst": early,
            }
        alarms = sum(episodes(firing(*simulate(pool, calm, rate, 0.0, rng), w)[warm_up:]) for pool in scorer_pools)
        days = calm.calm * len(scorer_pools) / 1440
        at_rate["false_alarms"] = {"episodes": alarms, "days": days, "per_day": alarms / days}
        out["rates"][f"{rate:g}"] = at_rate
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=ROOT / "data" / "llm-rubric")
    ap.add_argument("--quick", action="store_true", help="20 bursts and 2 calm days per scorer, results to /tmp")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    runs, calm_days = (20, 2) if args.quick else (DETECTION_RUNS, CALM_DAYS)
    started = time.perf_counter()
    synth, real = load_split(args.data_dir, "synth"), load_split(args.data_dir, "real")
    w = AlertWindows()
    scorers = {name: measure(p, w, runs, calm_days, args.seed) for name, p in pools(synth, real).items()}
    result = {
        "benchmark": "alert_detection",
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", "bench/alert_detection.py", *(argv if argv is not None else sys.argv[1:])]),
        "alert": {"name": "ConvowatchDissatisfactionSpike", "windows": asdict(w)},
        "stream": {"conversations_per_minute": RATES_PER_MINUTE, "burst_minutes": BURST_MINUTES, "rises": RISES},
        "runs": {"detection_runs": runs, "calm_days": calm_days, "seed": args.seed},
        "scorers": scorers,
        "elapsed_s": round(time.perf_counter() - started, 1),
        "python": platform.python_version(),
    }
    out = QUICK_OUTPUT if args.quick else OUTPUT
    out.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    report(result)
    print(f"wrote {out}")
    return 0


def report(result: dict[str, Any]) -> None:
    s = result["stream"]
    print(
        f"ConvowatchDissatisfactionSpike (production windows): bursts detected (Wilson 95 %), median delay, when the "
        f"human-dissatisfied share rises by {' / '.join(f'{r:g}' for r in s['rises'])} for {s['burst_minutes']} min; "
        "false alarms per day on calm streams"
    )
    for rate in s["conversations_per_minute"]:
        print(f"\n{rate:g} conversations/min")
        rises = " ".join(f"{'rise ' + format(r, 'g'):>28}" for r in s["rises"])
        print(f"{'scorer':14} {'AUROC':>18} {'P gap':>7} {rises}  false alarms/day")
        for name, m in result["scorers"].items():
            seps = m["separation"]
            auroc = np.mean([x["auroc"]["estimate"] for x in seps])
            ci = f"({min(x['auroc']['low'] for x in seps):.2f}–{max(x['auroc']['high'] for x in seps):.2f})"
            gap = np.mean([x["mean_p_humans_dissatisfied"] - x["mean_p_others"] for x in seps])
            at_rate = m["rates"][f"{rate:g}"]
            cells = []
            for rise in s["rises"]:
                r = at_rate["rises"][f"{rise:g}"]
                d, delay = r["detected"], r["delay_minutes"]
                when = f"{delay['median']:.0f} min" if delay["median"] is not None else "—"
                cells.append(f"{d['detected']:>3}/{d['runs']} ({d['low']:.2f}–{d['high']:.2f}) {when:>7}")
            fa = at_rate["false_alarms"]
            print(
                f"{name:14} {auroc:>6.2f} {ci:>11} {gap:>7.3f} " + " ".join(f"{c:>28}" for c in cells) + f"  {fa['per_day']:.2f}"
            )


if __name__ == "__main__":
    raise SystemExit(main())
