"""How much does the same question about the same conversation move with the server's prompt cache? (`judge.prompt_reuse`)

llama.cpp keeps the last prompt's KV cache and evaluates only what a new
prompt does not share with it; where that split falls changes the last
decimals of the answer. This benchmark asks the same questions about the same
conversations twice, in two different orders (conversations and questions
forwards, then both reversed), in each `judge.prompt_reuse` mode, and reports
how far the two answers to each (conversation, question) lie apart: the
difference of the rubric rating (expected option score on 0..10) and whether
the probabilities are identical to the last bit.

Judge: Qwen2.5-Coder-1.5B-Instruct Q4_K_M served by `convowatch judge serve`'s
server (`stream.judge_server`), one question per call, the worker's default
concurrency (4) in mode ``any``. Conversations: `N_CONVERSATIONS` USS dialogues
(MWOZ, seed 0); questions: the first `N_RUBRICS` rubrics of the generic baseline set.

Run: ``.venv/bin/python bench/judge_jitter.py`` (about 35 min on 2 cores; needs
the qwen packages, as ``make bench`` installs them); ``--quick``: 2
conversations, 2 questions, results to /tmp.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Sequence
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

from scorers.conversation import Conversation  # noqa: E402
from scorers.datasets.uss import read_uss  # noqa: E402
from scorers.judges.base import Answer  # noqa: E402
from scorers.judges.openai_http import PROMPT_REUSE, OpenAIJudge  # noqa: E402
from scorers.learning.pool import generic_baseline_pool, to_rubric  # noqa: E402
from scorers.rubrics import Rubric  # noqa: E402
from stream.judge_server import ServedJudge, packaged_qwen  # noqa: E402

OUTPUT = ROOT / "bench" / "results" / "judge_jitter.json"
QUICK_OUTPUT = Path("/tmp/judge_jitter_quick.json")
N_CONVERSATIONS = 6
N_RUBRICS = 6  # the first six of the generic baseline set
WORKER_CONCURRENCY = 4  # judge.max_concurrency's default


def ask(judge: OpenAIJudge, conversations: Sequence[Conversation], rubrics: Sequence[Rubric], reverse: bool) -> dict[str, Any]:
    """Every rubric's answer about every conversation, in forward or reversed order; and the seconds it took."""
    order = list(reversed(conversations)) if reverse else list(conversations)
    questions = [r.question() for r in (reversed(rubrics) if reverse else rubrics)]
    answers: dict[tuple[str, str], tuple[float, ...]] = {}
    started = time.perf_counter()
    for conversation in order:
        judgement = judge.judge(conversation, questions)
        for q in questions:
            answers[(conversation.id, q.id)] = judgement.answers[q.id].probabilities
    return {"answers": answers, "seconds": time.perf_counter() - started}


def jitter(first: dict, second: dict, rubrics: Sequence[Rubric]) -> dict[str, Any]:
    """How far the two passes' answers lie apart, per (conversation, question)."""
    by_id = {r.id: r for r in rubrics}
    gaps, identical = [], 0
    for key, p in first.items():
        rubric = by_id[key[1]]
        gaps.append(abs(rubric.rating(Answer(rubric.id, p)) - rubric.rating(Answer(rubric.id, second[key]))))
        identical += p == second[key]
    g = np.array(gaps)
    return {
        "answers": len(g),
        "identical": identical,
        "rating_gap_mean": float(g.mean()),
        "rating_gap_p95": float(np.quantile(g, 0.95)),
        "rating_gap_max": float(g.max()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    n_conversations, n_questions = (2, 2) if args.quick else (N_CONVERSATIONS, N_RUBRICS)
    dialogues = read_uss(uss.USS_DIR / "MWOZ.txt")
    picked = np.random.default_rng(0).permutation(len(dialogues))[:n_conversations]
    conversations = [dialogues[int(i)].conversation for i in picked]
    rubrics = [to_rubric(r) for r in generic_baseline_pool().rubrics][:n_questions]
    gguf = packaged_qwen(uss.CACHE_ROOT)
    modes: dict[str, Any] = {}
    with ServedJudge.start(gguf, args.threads, Path("/tmp/judge-jitter-llama.log")) as server:
        for mode in PROMPT_REUSE:
            judge = OpenAIJudge(
                base_url=server.url, model=server.model, timeout_s=600, max_concurrency=WORKER_CONCURRENCY, prompt_reuse=mode
            )
            forward = ask(judge, conversations, rubrics, reverse=False)
            backward = ask(judge, conversations, rubrics, reverse=True)
            modes[mode] = {
                **jitter(forward["answers"], backward["answers"], rubrics),
                "seconds_per_conversation": (forward["seconds"] + backward["seconds"]) / (2 * len(conversations)),
            }
            judge_cost.log(f"{mode}: {modes[mode]}")
    result = {
        "benchmark": "judge_jitter",
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", "bench/judge_jitter.py", *(argv if argv is not None else sys.argv[1:])]),
        "judge": {"model": server.model, "server": "llama-cpp-python", "questions_per_call": 1},
        "machine": {"cpu": cpu_model(), "threads": args.threads},
        "conversations": [c.id for c in conversations],
        "rubrics": [r.id for r in rubrics],
        "modes": modes,
    }
    out = QUICK_OUTPUT if args.quick else OUTPUT
    out.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    print(f"{'prompt_reuse':<22}{'identical':>12}{'mean gap':>10}{'p95 gap':>10}{'max gap':>10}{'s/conversation':>16}")
    for name, m in modes.items():
        print(
            f"{name:<22}{m['identical']:>5}/{m['answers']:<6}{m['rating_gap_mean']:>10.4f}{m['rating_gap_p95']:>10.4f}"
            f"{m['rating_gap_max']:>10.4f}{m['seconds_per_conversation']:>16.1f}"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
