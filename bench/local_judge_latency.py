"""Local judge cost on this machine: model load times and seconds per conversation, KV cache on/off.

Judges real LLM-Rubric conversations of median length with the 9 LLM-Rubric
questions, using the packaged Gemma 3 270M (a plumbing-grade judge: its
answers carry no signal; this measures cost only). Prints the figures and
writes ``bench/results/local_judge_latency.json``.

Run: ``.venv/bin/python bench/local_judge_latency.py [--conversations N] [--threads T]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from scorers.datasets.llm_rubric import QUESTIONS_FILE, REAL_CONVERSATIONS_FILE, load_real_conversations  # noqa: E402
from scorers.judges.local import LocalJudge  # noqa: E402
from scorers.questions import load_questions  # noqa: E402

DATA_DIR = ROOT.parent / "shared" / "data" / "llm-rubric"
OUTPUT = ROOT / "bench" / "results" / "local_judge_latency.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads (1 = one worker process per core)")
    args = parser.parse_args(argv)

    questions = list(load_questions(DATA_DIR / QUESTIONS_FILE).values())
    conversations = sorted(
        load_real_conversations(DATA_DIR / REAL_CONVERSATIONS_FILE).values(), key=lambda c: sum(len(t.text) for t in c.turns)
    )
    mid = len(conversations) // 2 - args.conversations // 2
    picked = conversations[mid : mid + args.conversations]

    with tempfile.TemporaryDirectory(prefix="convowatch-bench-") as cache:
        t = time.perf_counter()
        cached = LocalJudge(cache_dir=Path(cache), n_threads=args.threads)
        first_load = time.perf_counter() - t
        t = time.perf_counter()
        uncached = LocalJudge(cached.source_path, cache_dir=Path(cache), use_kv_cache=False, n_threads=args.threads)
        second_load = time.perf_counter() - t
        cached.judge(picked[0], questions[:1])  # warm-up
        on, off, tokens = [], [], []
        for conv in picked:
            a, b = cached.judge(conv, questions), uncached.judge(conv, questions)
            on.append(a.provenance.latency_s)
            off.append(b.provenance.latency_s)
            tokens.append(b.provenance.prompt_tokens // len(questions))

    result = {
        "model": cached.model,
        "threads": args.threads,
        "conversations": len(picked),
        "questions": len(questions),
        "first_load_s": round(first_load, 1),
        "second_load_s": round(second_load, 1),
        "median_prompt_tokens": statistics.median(tokens),
        "kv_cache_s_per_conversation": round(statistics.median(on), 2),
        "no_cache_s_per_conversation": round(statistics.median(off), 2),
        "load_average_at_end": os.getloadavg()[0],
        "command": " ".join([".venv/bin/python", "bench/local_judge_latency.py", *sys.argv[1:]]),
    }
    print(
        f"Local judge ({result['model']}, llama.cpp, {args.threads} thread(s)), {len(picked)} median-length real conversations, "
        f"{len(questions)} questions, ~{result['median_prompt_tokens']:.0f} prompt tokens"
    )
    print(f"  load: first (assemble the packaged GGUF + load) {first_load:.1f} s; again {second_load:.1f} s")
    print(
        f"  per conversation (median): KV cache {result['kv_cache_s_per_conversation']} s, "
        f"no cache {result['no_cache_s_per_conversation']} s"
    )
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
