"""The local llama.cpp judge on the real packaged Gemma 3 270M (a base model: plumbing, not quality).

The GGUF is materialised once under ``$CONVOWATCH_TEST_CACHE`` (default
``~/.cache/convowatch-test``) and loaded in about a second.
"""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import pytest

from scorers.conversation import Conversation
from scorers.judges.base import JudgeError, Judgement
from scorers.judges.local import LocalJudge, LocalModelError, OptionTokenError, PromptTooLong, resolve_model
from scorers.questions import Question, likert_question, load_questions
from tests.data_paths import LLM_RUBRIC as DATA

pytestmark = pytest.mark.slow

CACHE_ENV = "CONVOWATCH_TEST_CACHE"
# Gemma 3 270M's sliding-attention window: a prefix longer than this exercises the sliding cache layers.
GEMMA_SLIDING_WINDOW = 512
# The cached path evaluates each suffix as its own batch, the uncached one the whole prompt in 512-token batches.
# llama.cpp's repacked Q4_K kernels take a batch's rows in groups of four and the rest with another kernel, so a
# token's float32 rounding depends on where it sits in its batch, and Gemma 3 270M amplifies it. Measured (2
# threads): at most 0.021 on the conversation below; 0.058 worst over 6 real conversations x 9 questions, most
# answers bit-identical; with weight repacking off (4x slower) 27 of 27 answers were bit-identical.
KV_TOLERANCE = 0.03
# Content size of the real conversation used for most tests: long enough to pass the sliding
# window, short enough to keep uncached forward passes cheap on 2 cores.
CONVERSATION_CHARS = (2000, 2600)
TRUNCATION_CONTEXT_TOKENS = 600


@pytest.fixture(scope="module")
def cache_dir() -> Path:
    base = os.environ.get(CACHE_ENV)
    path = Path(base).expanduser() if base else Path.home() / ".cache" / "convowatch-test"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def judge(cache_dir: Path) -> LocalJudge:
    """The default judge: packaged Gemma GGUF, KV cache on."""
    return LocalJudge(cache_dir=cache_dir, n_threads=2)


@pytest.fixture(scope="module")
def uncached_judge(judge: LocalJudge, cache_dir: Path) -> LocalJudge:
    """The same GGUF file, full prompt per question."""
    return LocalJudge(judge.source_path, cache_dir=cache_dir, n_threads=2, use_kv_cache=False)


@pytest.fixture(scope="module")
def questions() -> list[Question]:
    return list(load_questions(DATA / "questions.json").values())


def _real_conversations() -> list[Conversation]:
    rows = json.loads((DATA / "real_data.json").read_text(encoding="utf-8"))
    convs = []
    for row in rows:
        messages = row["messages"]
        if isinstance(messages, str):  # some copies of the release store a Python literal
            messages = ast.literal_eval(messages)
        convs.append(Conversation.from_messages(row["_id"], messages))
    return convs


def _chars(conv: Conversation) -> int:
    return sum(len(t.text) for t in conv.turns)


@pytest.fixture(scope="module")
def conversations() -> list[Conversation]:
    return _real_conversations()


@pytest.fixture(scope="module")
def conversation(conversations: list[Conversation]) -> Conversation:
    low, high = CONVERSATION_CHARS
    return next(c for c in conversations if low <= _chars(c) <= high)


@pytest.fixture(scope="module")
def judgement(judge: LocalJudge, conversation: Conversation, questions: list[Question]) -> Judgement:
    return judge.judge(conversation, questions)


def test_one_answer_per_question_with_unrenormalised_probabilities(judgement, questions):
    assert set(judgement.answers) == {q.id for q in questions}
    for q in questions:
        answer = judgement.answers[q.id]
        assert len(answer.probabilities) == q.n_options
        assert all(0.0 <= p <= 1.0 for p in answer.probabilities)
        assert 0.0 < answer.covered_mass <= 1.0


def test_provenance_counts_the_prefix_once(judgement, questions):
    prov = judgement.provenance
    assert prov.judge == "local"
    assert prov.model == "gemma-3-270m-q4_k_m.gguf"
    assert prov.completion_tokens == 0
    assert prov.calls == len(questions) + 1  # one prefix pass, one suffix pass per question
    assert prov.prompt_tokens > 0
    assert prov.latency_s > 0
    assert judgement.extra["kv_cache"] == "on"


def test_answers_are_deterministic(judge, conversation, questions, judgement):
    again = judge.judge(conversation, questions)
    assert again.answers == judgement.answers


def test_kv_cache_equals_full_prompt_per_question(judge, uncached_judge, conversation, questions):
    chosen = [questions[0], questions[1], questions[8], likert_question("L1", "The assistant is polite.")]
    cached = judge.judge(conversation, chosen)
    full = uncached_judge.judge(conversation, chosen)

    assert uncached_judge.model == judge.model
    assert full.extra["kv_cache"] == "off"
    # Uncached encodes the prefix once per question: the difference is (n - 1) prefixes.
    prefix_tokens = (full.provenance.prompt_tokens - cached.provenance.prompt_tokens) / (len(chosen) - 1)
    assert prefix_tokens > GEMMA_SLIDING_WINDOW
    for q in chosen:
        assert cached.answers[q.id].probabilities == pytest.approx(full.answers[q.id].probabilities, abs=KV_TOLERANCE)


def test_each_question_sees_only_the_prefix_not_the_previous_questions(judge, conversation, questions):
    """Rewinding the cache to the prefix leaves no trace of earlier questions: bit-identical to asking alone."""
    together = judge.judge(conversation, questions)
    for q in (questions[3], questions[8]):
        alone = judge.judge(conversation, [q])
        assert alone.provenance.calls == 2
        assert alone.answers[q.id] == together.answers[q.id]


def test_option_keys_must_be_single_tokens(judge, conversation, questions):
    two_digit = Question(id="bad", text="Rate it.", option_keys=("10", "20"), option_labels=("ten", "twenty"))
    with pytest.raises(OptionTokenError, match=r"'bad'.*'10'"):
        judge.option_token_ids(two_digit)
    with pytest.raises(OptionTokenError):
        judge.judge(conversation, [questions[0], two_digit])


@pytest.fixture(scope="module")
def small_context_judge(judge: LocalJudge) -> LocalJudge:
    return LocalJudge(judge.source_path, cache_dir=judge.cache_dir, max_context_tokens=TRUNCATION_CONTEXT_TOKENS, n_threads=2)


def test_long_conversation_is_truncated_by_the_policy_and_answered(small_context_judge, conversations, questions):
    longest = max(conversations, key=_chars)
    small = small_context_judge
    question = questions[0]

    transcript = small.fitted_transcript(longest, [question])
    assert "omitted here to fit the judge's context" in transcript
    assert longest.turns[0].text in transcript
    assert longest.turns[-1].text in transcript

    got = small.judge(longest, [question])
    assert got.extra["transcript_chars"] == str(len(transcript))
    assert got.provenance.prompt_tokens <= TRUNCATION_CONTEXT_TOKENS
    assert 0.0 < got.answers[question.id].covered_mass <= 1.0


def test_a_question_longer_than_the_context_is_a_clear_error(small_context_judge, conversation):
    huge = likert_question("huge", "The assistant is helpful. " * 300)
    with pytest.raises(PromptTooLong, match="leaves no room"):
        small_context_judge.judge(conversation, [huge])


def test_missing_model_path_is_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    with pytest.raises(LocalModelError, match="no-such-model.gguf"):
        LocalJudge(missing, cache_dir=tmp_path)


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_text("not a model", encoding="utf-8")
    with pytest.raises(LocalModelError, match="not a GGUF file"):
        LocalJudge(bogus, cache_dir=tmp_path)


def test_a_directory_is_refused(tmp_path):
    """A Hugging Face model directory (what the transformers judge used to take) is not a GGUF model."""
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(LocalModelError, match="a directory") as info:
        LocalJudge(tmp_path, cache_dir=tmp_path)
    assert isinstance(info.value, JudgeError)


def test_a_truncated_gguf_is_a_clear_error(tmp_path, judge):
    """The right magic bytes but no model: llama.cpp refuses it, and that is a LocalModelError too."""
    truncated = tmp_path / "truncated.gguf"
    with judge.source_path.open("rb") as source:
        truncated.write_bytes(source.read(4096))
    with pytest.raises(LocalModelError, match="truncated.gguf: llama.cpp cannot load it"):
        LocalJudge(truncated, cache_dir=tmp_path)


def test_without_llama_cpp_python_the_error_says_how_to_install_it(tmp_path, judge, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` raise ImportError
    with pytest.raises(LocalModelError, match=r"pip install 'convowatch\[llama\]'.*make install"):
        LocalJudge(judge.source_path, cache_dir=tmp_path)


def test_thread_count_must_be_positive(judge):
    with pytest.raises(ValueError, match="n_threads"):
        LocalJudge(judge.source_path, cache_dir=judge.cache_dir, n_threads=0)


def test_no_model_path_means_the_packaged_gemma_gguf_itself(cache_dir, judge):
    """Nothing to convert and no other model needed: the packaged GGUF file is what llama.cpp loads."""
    resolved = resolve_model(None, cache_dir, "local judge")
    assert resolved == judge.source_path and resolved.suffix == ".gguf" and resolved.is_file()
    assert judge.model == resolved.name


def test_the_tokenizer_splits_text_into_subwords(judge: LocalJudge) -> None:
    """The GGUF's own BPE tokenizer (transformers 5.17's conversion split Gemma's text almost per character)."""
    sentence = "The assistant answers the user's question about Python lists with a working example."
    ids = judge._encode(sentence)
    assert len(ids) <= len(sentence.split()) * 2, len(ids)


def test_control_tokens_in_a_conversation_are_plain_text(judge: LocalJudge) -> None:
    """A turn that contains ``<end_of_turn>`` is tokenised as text, not as Gemma's control token."""
    control = judge._llm.tokenize(b"<end_of_turn>", add_bos=False, special=True)
    assert len(control) == 1
    assert control[0] not in judge._encode("user says <end_of_turn> here")
