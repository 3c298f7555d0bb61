"""Rates a team can trust from a biased judge: PPI++ on ABC-Eval's real human labels and GPT-3.5's real answers.

Data: ``../shared/data/abc-eval`` (108 conversations of 4 bots, 1,634 bot turns; per bot turn and behaviour two
human labels and GPT-3.5's). The human rate of a behaviour is the mean of the two annotators over every bot turn
(of all bots, or of one); the judge is GPT-3.5 on every turn; a team labels a random few.

For each of the 9 behaviours, overall and per bot, each labelled size n and ``--draws`` random draws per seed:

* design ``turns``: n bot turns drawn uniformly (the labelled units are turns);
* design ``conversations``: k = n / (mean turns per conversation) conversations drawn uniformly, every bot turn of
  them labelled (conversations as clusters; k is at least 2);

the 95 % intervals of PPI++ (`scorers.prediction_powered`) and of the labels alone (λ = 0) on the same draw:
coverage of the human rate, mean width, bias; beside them the judge's raw rate and the coverage of its binomial
95 % interval. Per behaviour, the bots ranked by each estimate against the humans' ranking (Kendall τ), and the
pairwise differences called significant (two-sided 5 %) by each estimate against those the full human labels
call significant (share of the 6 pairs classed alike: higher, lower or not different). Nothing is fitted: PPI has
no hyper-parameter but its λ, estimated on each draw.

Run: ``.venv/bin/python bench/rates.py`` (about 2 min on 2 cores); writes bench/results/rates.json.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

from results_file import write_results  # noqa: E402

from scorers.datasets.abc_eval import BEHAVIOURS, load_abc_eval  # noqa: E402
from scorers.prediction_powered import Conversations, Labelled, RateEstimate, prediction_powered_rate  # noqa: E402
from scorers.statistics import clustered_rate, kendall  # noqa: E402

ABC_EVAL = ROOT.parent / "shared" / "data" / "abc-eval"
RESULTS = ROOT / "bench" / "results" / "rates.json"
SIZES = (25, 50, 100, 200)
DESIGNS = ("turns", "conversations")
Z95 = NormalDist().inv_cdf(0.975)


@dataclass(frozen=True)
class Population:
    """One behaviour on a set of conversations: per bot turn the human label (mean of two) and the judge's, and
    which conversation and bot each turn belongs to."""

    human: np.ndarray
    judge: np.ndarray
    conversation: np.ndarray  # index of the turn's conversation
    bot: np.ndarray

    def per_conversation(self, values: np.ndarray) -> np.ndarray:
        return np.bincount(self.conversation, weights=values, minlength=self.conversation.max() + 1)

    @cached_property
    def conversation_sums(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per conversation: its bot turns, the humans' sum and the judge's."""
        return (
            self.per_conversation(np.ones_like(self.human)),
            self.per_conversation(self.human),
            self.per_conversation(self.judge),
        )

    def truth(self) -> float:
        return float(self.human.mean())


def load_populations(path: Path) -> dict[str, Population]:
    """Each behaviour's population of every bot turn in the file."""
    dialogues = load_abc_eval(path)
    conversation = np.array([i for i, d in enumerate(dialogues) for _ in d.turns])
    bot = np.array([d.bot for d in dialogues for _ in d.turns])
    out = {}
    for b in BEHAVIOURS:
        human = np.array([sum(t.human[b]) / 2 for d in dialogues for t in d.turns])
        judge = np.array([float(t.gpt[b]) for d in dialogues for t in d.turns])
        out[b] = Population(human, judge, conversation, bot)
    return out


def _subset(p: Population, mask: np.ndarray) -> Population:
    _, conversation = np.unique(p.conversation[mask], return_inverse=True)
    return Population(p.human[mask], p.judge[mask], conversation, p.bot[mask])


def draw(p: Population, design: str, n: int, rng: np.random.Generator) -> tuple[RateEstimate, RateEstimate]:
    """One random labelled sample of ``p``: its PPI++ and labels-only estimates."""
    if design == "turns":
        picked = rng.choice(p.human.size, min(n, p.human.size), replace=False)
        judged = Conversations.of(p.judge)
        labelled = Labelled.of(p.human[picked], p.judge[picked], np.full(picked.size, p.human.size / picked.size))
    else:
        units, human, judge = p.conversation_sums
        k = min(units.size, max(2, round(n / float(units.mean()))))
        picked = rng.choice(units.size, k, replace=False)
        judged = Conversations.of(judge, units)
        labelled = Labelled.of(human[picked], judge[picked], np.full(k, units.size / k), units[picked])
    return prediction_powered_rate(judged, labelled), prediction_powered_rate(judged, labelled, tune=False)


def _classes(rates: Sequence[float], errors: Sequence[float]) -> list[int]:
    """Per pair of bots (a, b): +1 if a is significantly higher (two-sided 5 %), -1 lower, 0 not different."""
    out = []
    for i, j in itertools.combinations(range(len(rates)), 2):
        se = math.hypot(errors[i], errors[j])
        z = (rates[i] - rates[j]) / se if se > 0 else 0.0
        out.append(0 if abs(z) < Z95 else int(np.sign(z)))
    return out


def measure(populations: dict[str, Population], draws: int, seeds: int) -> dict[str, Any]:
    """The figures of the module docstring."""
    bots = sorted(set(next(iter(populations.values())).bot))
    figures: dict[str, Any] = {"behaviours": {}}
    for behaviour, whole in populations.items():
        scopes = {"all bots": whole} | {bot: _subset(whole, whole.bot == bot) for bot in bots}
        row: dict[str, Any] = {}
        for scope, p in scopes.items():
            truth, raw = p.truth(), float(p.judge.mean())
            raw_half = Z95 * math.sqrt(raw * (1 - raw) / p.judge.size)
            row[scope] = {
                "human_rate": truth,
                "judge_rate": raw,
                "judge_interval_covers": abs(raw - truth) <= raw_half,
                "by_design": {},
            }
            for design, n in itertools.product(DESIGNS, SIZES):
                per_seed = []
                for seed in range(seeds):
                    rng = np.random.default_rng([seed, n, DESIGNS.index(design)])
                    results = [draw(p, design, n, rng) for _ in range(draws)]
                    per_seed.append({
                        method: {
                            "coverage": float(np.mean([r[i].low <= truth <= r[i].high for r in results])),
                            "width": float(np.mean([r[i].high - r[i].low for r in results])),
                            "bias": float(np.mean([r[i].estimate for r in results]) - truth),
                        }
                        for i, method in enumerate(("ppi", "labels"))
                    })  # fmt: skip
                row[scope]["by_design"][f"{design} n={n}"] = {
                    method: {
                        key: {"mean": float(np.mean([s[method][key] for s in per_seed])), "min": float(min(s[method][key] for s in per_seed)), "max": float(max(s[method][key] for s in per_seed))}
                        for key in ("coverage", "width", "bias")
                    }
                    for method in ("ppi", "labels")
                }  # fmt: skip
        row["ranking"] = ranking(whole, bots, draws, seeds)
        figures["behaviours"][behaviour] = row
    return figures


def ranking(p: Population, bots: list[str], draws: int, seeds: int) -> dict[str, Any]:
    """Bots ranked and pairs told apart by each estimate, against the humans on every turn (turn design, labelled
    turns drawn from all bots, each bot's rate from its own)."""
    human_rates, human_errors = [], []
    for bot in bots:
        sub = _subset(p, p.bot == bot)
        units, human, _ = sub.conversation_sums
        rate, variance = clustered_rate(human, units)
        human_rates.append(rate)
        human_errors.append(math.sqrt(variance))
    truth_classes = _classes(human_rates, human_errors)
    raw = [float(p.judge[p.bot == bot].mean()) for bot in bots]
    out: dict[str, Any] = {
        "human_rates": dict(zip(bots, human_rates, strict=True)),
        "human_significant_pairs": int(np.count_nonzero(truth_classes)),
        "judge_kendall_tau": _tau(human_rates, raw),
    }
    for n in SIZES:
        taus: dict[str, list[float]] = {"ppi": [], "labels": []}
        alike: dict[str, list[float]] = {"ppi": [], "labels": []}
        for seed in range(seeds):
            rng = np.random.default_rng([seed, n, 99])
            for _ in range(draws):
                picked = rng.choice(p.human.size, n, replace=False)
                estimates: dict[str, list[RateEstimate]] = {"ppi": [], "labels": []}
                for bot in bots:
                    mine = picked[p.bot[picked] == bot]
                    mask = p.bot == bot
                    if mine.size < 2:
                        break
                    judged = Conversations.of(p.judge[mask])
                    labelled = Labelled.of(p.human[mine], p.judge[mine], np.full(mine.size, p.human.size / n))
                    estimates["ppi"].append(prediction_powered_rate(judged, labelled))
                    estimates["labels"].append(prediction_powered_rate(judged, labelled, tune=False))
                else:
                    for method, rs in estimates.items():
                        taus[method].append(_tau(human_rates, [r.estimate for r in rs]))
                        classes = _classes([r.estimate for r in rs], [r.standard_error for r in rs])
                        alike[method].append(float(np.mean([a == b for a, b in zip(classes, truth_classes, strict=True)])))
        out[f"n={n}"] = {
            method: {"kendall_tau": float(np.nanmean(taus[method])), "pairs_classed_alike": float(np.mean(alike[method])), "draws": len(taus[method])}
            for method in ("ppi", "labels")
        }  # fmt: skip
    return out


def _tau(a: Sequence[float], b: Sequence[float]) -> float:
    return float(kendall(a, b)) if len(set(b)) > 1 else float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=500, help="random labelled samples per seed (default: %(default)s)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds (default: %(default)s)")
    parser.add_argument("--data", type=Path, default=ABC_EVAL, help="the abc-eval folder (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results file (default: %(default)s)")
    args = parser.parse_args(argv)
    figures = measure(load_populations(args.data), args.draws, args.seeds)
    write_results(
        args.out,
        {"command": " ".join(["bench/rates.py", *(argv or sys.argv[1:])]), "draws": args.draws, "seeds": args.seeds, **figures},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
