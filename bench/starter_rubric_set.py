"""The starter rubric set that ships with convowatch: generic rubrics with θ and windows fitted on real labels.

`convowatch run` uses it when no rubric set is configured (`stream.service`), so that a newcomer with a live
judge sees scores before learning a set. It is a starting point, not a tuned scorer: θ and windows belong to
the judge and the mode that produced the NetSATs they were fitted on.

* Rubrics: the generic SPUR/Bing-style set (4 SAT, 4 DSAT; `scorers/data/generic_baseline_pool.json`), as
  `bench/rubicon_uss.py` made it.
* Judge: Qwen2.5-Coder-1.5B-Instruct Q4_K_M on llama.cpp, one question per call with the prefix cache (mode b
  of `bench/judge_cost.py`): its recorded answers on the 100 held-out USS dialogues of the judge-cost draw
  (`bench/results/judge_cost_slices`), none of them used to make the set.
* Labels: the USS human labels of those dialogues (negative: mean OVERALL < 3, positive: ≥ 3.5).
* θ and the 0.9-precision windows are fitted on all 100 for the shipped file. The figures are what the same
  fit gives on data it did not see: fitted on a random half, measured on the other half, ``HALVES`` halves
  (mean ± sd), with the bootstrap 95 % CI of the first half's AUROC.

Run: ``.venv/bin/python bench/starter_rubric_set.py`` (seconds; no judge runs). Writes
``scorers/data/starter_rubric_set.json`` and ``bench/results/starter_rubric_set.json``.
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

import judge_cost  # noqa: E402
import judge_cost_join as join  # noqa: E402

from scorers.conversation import Conversation  # noqa: E402
from scorers.rubrics import STARTER_SET, evaluate  # noqa: E402
from scorers.statistics import auroc, bootstrap_ci  # noqa: E402

OUT_SET = ROOT / "scorers" / "data" / STARTER_SET
OUT_RESULTS = ROOT / "bench" / "results" / "starter_rubric_set.json"
HALVES = 20
PRECISION = 0.9
FIGURES = ("accuracy", "yield_rate", "confident_accuracy", "f1")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slices", type=Path, default=join.SLICES)
    ap.add_argument("--out-set", type=Path, default=OUT_SET)
    ap.add_argument("--out", type=Path, default=OUT_RESULTS)
    args = ap.parse_args(argv)

    docs = join.load_slices(args.slices)
    human, draw = join.human_labels(docs[0])
    join.check_positions(docs, draw)
    records = [r for d in docs for r in d["modes"]["b"]["per_conversation"]]
    generic = judge_cost.load_sets(judge_cost.LEARNING_RESULTS)["generic"]
    judge = join.AnswersJudge({r["id"]: r["answers"] for r in records})
    ids = [r["id"] for r in records]
    placeholders = [Conversation.from_messages(i, [{"role": "user", "content": "-"}]) for i in ids]  # answered by id
    netsats = generic.netsats(judge, placeholders)
    y = np.array([human[i] for i in ids], dtype=bool)

    halves: list[dict[str, float]] = []
    for seed in range(HALVES):
        order = np.random.default_rng(seed).permutation(len(ids))
        fit, test = order[: len(ids) // 2], order[len(ids) // 2 :]
        fitted = generic.fit_windows(netsats[fit], y[fit], PRECISION)
        m = evaluate(netsats[test], y[test], fitted)
        halves.append({k: float(getattr(m, k)) for k in FIGURES} | {"auroc": auroc(netsats[test], y[test])})
    first = np.random.default_rng(0).permutation(len(ids))[len(ids) // 2 :]
    measured: dict[str, Any] = {
        k: {"mean": float(np.nanmean([h[k] for h in halves])), "sd": float(np.nanstd([h[k] for h in halves], ddof=1))}
        for k in (*FIGURES, "auroc")
    }
    measured["auroc"]["ci_first_half"] = bootstrap_ci(
        lambda s, t: auroc(s, t.astype(bool)), netsats[first], y[first], seed=0
    ).as_dict()

    shipped = generic.fit_windows(netsats, y, PRECISION)
    shipped = replace(
        shipped,
        metadata={
            "name": "starter set",
            "note": "A starting point: generic rubrics whose θ and windows were fitted for one judge "
            "(below). Refit them for your judge and data with `convowatch rubrics fit`, or learn a set with "
            "`convowatch learn`.",
            "rubrics": "generic SPUR/Bing-style set (scorers/data/generic_baseline_pool.json)",
            "judge": f"{judge_cost.uss.QWEN_ALIAS} on llama.cpp, one question per call",
            "fitted_on": f"{len(ids)} held-out USS dialogues (MWOZ + SGD, {int(y.sum())} satisfied), human labels",
            "measured": f"fitted on half, measured on the other half, {HALVES} halves: "
            + ", ".join(f"{k} {v['mean']:.2f} ± {v['sd']:.2f}" for k, v in measured.items()),
            "made_by": "bench/starter_rubric_set.py",
        },
    )
    shipped.save(args.out_set)
    result = {
        "benchmark": "starter_rubric_set",
        "command": " ".join([".venv/bin/python", "bench/starter_rubric_set.py", *(argv if argv is not None else sys.argv[1:])]),
        "slices": [d["file"] for d in docs],
        "conversations": {"n": len(ids), "positive": int(y.sum())},
        "halves": HALVES,
        "measured": measured,
        "shipped": {
            "version": shipped.version,
            "threshold": shipped.threshold,
            "dsat_upper": shipped.windows.dsat_upper,
            "sat_lower": shipped.windows.sat_lower,
        },
    }
    args.out.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    print(f"{len(ids)} conversations ({int(y.sum())} satisfied); fitted on half, measured on the other half, {HALVES} halves:")
    for k, v in measured.items():
        print(f"  {k}: {v['mean']:.3f} ± {v['sd']:.3f}")
    ci = measured["auroc"]["ci_first_half"]
    print(f"  AUROC of the first half: {ci['estimate']:.2f} (95 % CI {ci['low']:.2f}–{ci['high']:.2f})")
    print(f"wrote {args.out_set} (version {shipped.version}) and {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
