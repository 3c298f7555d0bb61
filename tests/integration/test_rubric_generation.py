"""RUBICON rubric generation: reply parsing, prompts, and whole runs with real models on real conversations.

The conversations are real MultiWOZ dialogues with their crowd satisfaction
ratings (``../shared/data/uss/MWOZ.txt``; the shortest ones, to keep prompts
small). The generators are the packaged Gemma 3 270M *base* model, run locally
and behind a real llama-cpp-python server. Left to itself it does not follow
the reply format (it echoes the prompt), which is what the retry/skip tests
need; held to the format by a llama.cpp grammar (a real deployment option for
weak models, sent through ``extra_body``), it yields parseable reasons and
rubrics whose content carries no signal: the tests check the pipeline, not
rubric quality.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from scorers.conversation import Conversation
from scorers.datasets.labelled import LabelledConversation
from scorers.datasets.uss import read_uss, uss_labelled
from scorers.learning.embeddings import SIMILARITY_CUT, SentenceEmbedder
from scorers.learning.generation import (
    GenerationReport,
    ItemRejected,
    Reason,
    ReplyFormatError,
    RubricGenerationError,
    check_assertion,
    check_reason,
    extract_reasons,
    generate_pool,
    normalise_item,
    parse_numbered_reply,
    summarise,
)
from scorers.learning.generators import Generation, LocalGenerator, OpenAIGenerator, TextGenerator
from scorers.learning.pool import RubricPool, seed_pool
from scorers.learning.prompts import PRINCIPLES, PROMPT_VERSIONS, extraction_prompt, summarisation_prompt
from scorers.rubrics import Polarity
from tests.data_paths import SHARED_DATA
from tests.servers import LlamaServer, cache_dir, free_port

MWOZ = SHARED_DATA / "uss" / "MWOZ.txt"
DOMAIN = (
    "A task-oriented assistant for visitors to Cambridge: it finds and books restaurants, hotels, trains, "
    "taxis and attractions. Success means the user gets the booking or information they asked for."
)
# Holds Gemma 270M base to the reply format: three numbered sentences "The assistant|user <words>."
THREE_LINES = {
    "grammar": 'root ::= "1. " s "\\n2. " s "\\n3. " s "\\n"\n'
    's ::= ("The assistant " | "The user ") w (" " w){2,10} "."\n'
    "w ::= [a-z]+",
    "repeat_penalty": 1.0,
}


# ---------------------------------------------------------------- real data and generators


def _shortest_labelled(path: Path, n_per_class: int) -> list[LabelledConversation]:
    """The ``n_per_class`` shortest positive and negative USS dialogues (positives first)."""
    labelled, _ = uss_labelled(read_uss(path))

    def size(item: LabelledConversation) -> int:
        return sum(len(t.text) for t in item.conversation.turns)

    positives = sorted((i for i in labelled if i.positive), key=size)[:n_per_class]
    negatives = sorted((i for i in labelled if not i.positive), key=size)[:n_per_class]
    return positives + negatives


@pytest.fixture(scope="module")
def labelled() -> list[LabelledConversation]:
    return _shortest_labelled(MWOZ, 2)


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    return SentenceEmbedder()


@dataclass
class Recording:
    """Delegates to a real generator and records the prompts it was given (a spy, not a stand-in)."""

    inner: TextGenerator
    prompts: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    def generate(self, prompt: str, *, max_tokens: int, temperature: float) -> Generation:
        self.prompts.append(prompt)
        return self.inner.generate(prompt, max_tokens=max_tokens, temperature=temperature)


def _server_generator(server: LlamaServer, **kwargs: object) -> OpenAIGenerator:
    options: dict[str, object] = {"api_key": server.api_key, "max_retries": 0, "name": "llama-gemma"}
    options.update(kwargs)
    return OpenAIGenerator(base_url=server.url, model=server.model, **options)  # type: ignore[arg-type]


# ---------------------------------------------------------------- parsing (pure functions)


@pytest.mark.parametrize(
    ("reply", "max_items", "expected"),
    [
        (
            "1. The assistant books the table.\n2. The user thanks the assistant.",
            3,
            ["The assistant books the table.", "The user thanks the assistant."],
        ),
        (
            "Here are the reasons:\n\n1) first reason here\n2) second reason here\n",
            3,
            ["first reason here", "second reason here"],
        ),
        ("  1.   spaced   out  \n", 1, ["spaced   out"]),
    ],
)
def test_well_formed_replies_parse(reply: str, max_items: int, expected: list[str]) -> None:
    assert parse_numbered_reply(reply, max_items) == expected


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ("", "empty"),
        ("   \n  ", "empty"),
        ("The assistant books the table.", "not a numbered item"),
        ("Sure! Here you go\n1. a reason", "before the list"),
        ("Intro:\nMore intro:\n1. a reason", "before the list"),
        ("1. a reason\nand its continuation", "after item 1"),
        ("1. a reason\n3. another reason", "numbered 3 where 2"),
        ("2. a reason", "numbered 2 where 1"),
        ("1. a\n2. b\n1. a\n2. b", "numbered 1 where 3"),
        ("1. a\n2. b\n3. c\n4. d", "4 items, at most 3"),
        ("Reasons:", "no numbered lines"),
        ("  <reason>\n  <reason>\n", "not a numbered item"),
        ("NONE", "not a numbered item"),  # only the summarisation reply may say NONE
    ],
)
def test_malformed_replies_are_refused_with_the_problem(reply: str, problem: str) -> None:
    with pytest.raises(ReplyFormatError, match=re.escape(problem)):
        parse_numbered_reply(reply, 3)


@pytest.mark.parametrize("reply", ["NONE", "none", "NONE.", "**None**", '"NONE"'])
def test_summarisation_reply_may_be_none(reply: str) -> None:
    assert parse_numbered_reply(reply, 5, allow_none=True) == []


def test_a_truncated_reply_loses_its_unfinished_last_line() -> None:
    reply = "1. The assistant books the table.\n2. The user thanks the assis"
    assert parse_numbered_reply(reply, 3, truncated=True) == ["The assistant books the table."]
    with pytest.raises(ReplyFormatError, match="cut off before its first item"):
        parse_numbered_reply("1. The assistant books the", 3, truncated=True)


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("The assistant gives a working fix", "The assistant gives a working fix."),
        ('"the user has to repeat the request."', "The user has to repeat the request."),
        ("**The assistant clearly explains the options.**", "The assistant clearly explains the options."),
        ("- `The conversation ends politely.`", "The conversation ends politely."),
        ("The assistant doesn't confirm the booking!", "The assistant doesn't confirm the booking."),
        ("The user   asks   for a cheaper option.", "The user asks for a cheaper option."),
    ],
)
def test_acceptable_assertions_are_normalised(item: str, expected: str) -> None:
    assert check_assertion(item) == expected
    assert check_assertion(expected) == expected  # idempotent


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ("The assistant gives a fix. It works.", "more than one sentence"),
        ("The assistant is helpful; the user is happy.", "more than one sentence"),
        ("Is the assistant helpful?", "question"),
        ("Assistant gives a fix.", "does not start with"),
        ("The assistant's answer is long.", "does not start with"),
        ("The bot answers quickly.", "does not start with"),
        ("The assistant 42 times.", "lower-case verb"),
        ("The assistant Books the table.", "lower-case verb"),
        ("The assistant <verb> something.", "template brackets"),
        ("The user [does something].", "template brackets"),
        ("The assistant " + "really " * 18 + "helps.", "21 words"),
    ],
)
def test_unacceptable_assertions_are_rejected_with_the_reason(item: str, problem: str) -> None:
    with pytest.raises(ItemRejected, match=re.escape(problem)):
        check_assertion(item)


def test_reasons_need_words_and_no_placeholders() -> None:
    assert (
        check_reason(' "The assistant found a cheap restaurant in the east." ')
        == "The assistant found a cheap restaurant in the east."
    )
    for bad in ["<reason>", "Booked.", "word " * 61]:
        with pytest.raises(ItemRejected):
            check_reason(bad)


def test_normalise_item_strips_wrappers_repeatedly() -> None:
    assert normalise_item('- "**The user thanks the assistant.**"') == "The user thanks the assistant."


# ---------------------------------------------------------------- prompts


def test_extraction_prompt_carries_domain_principles_conversation_and_form() -> None:
    transcript = "<<<user turn 0>>>\nI need a {cheap} hotel.\n<<<end user turn 0>>>"
    prompt = extraction_prompt(DOMAIN, transcript, Polarity.DSAT, 3)
    assert DOMAIN in prompt and transcript in prompt and PRINCIPLES in prompt
    for maxim in ("Quantity", "Quality", "Relevance", "Manner"):
        assert maxim in prompt
    assert "user's behaviour" in prompt and "dissatisfied" in prompt
    assert prompt.rstrip().endswith("1. <reason>\n2. <reason>\n3. <reason>")
    retry = extraction_prompt(DOMAIN, transcript, "dsat", 3, problem="the reply is empty")
    assert retry.startswith(prompt) and "could not be used (the reply is empty)" in retry


def test_summarisation_prompt_lists_reasons_and_existing_rubrics() -> None:
    reasons = ["The assistant booked the wrong day.", "The user had to ask twice."]
    first = summarisation_prompt(DOMAIN, reasons, "dsat", [], 5)
    assert "- The assistant booked the wrong day.\n- The user had to ask twice." in first
    # With nothing written yet there is nothing to be covered by: NONE is not offered (small models took it every time).
    assert "(none yet)" in first and "at most 5 new rubrics" in first and "NONE" not in first
    later = summarisation_prompt(DOMAIN, reasons, "dsat", ["The assistant books the wrong date."], 5)
    assert "- The assistant books the wrong date." in later and "(none yet)" not in later and "NONE" in later
    assert PROMPT_VERSIONS == {"extraction": "extract-v1", "summarisation": "summarise-v2"}
    with pytest.raises(ValueError, match="polarity"):
        summarisation_prompt(DOMAIN, reasons, "neutral", [], 5)
    with pytest.raises(ValueError, match="at least one reason"):
        summarisation_prompt(DOMAIN, [], "sat", [], 5)


# ---------------------------------------------------------------- whole runs, real models


@pytest.mark.slow
def test_local_base_model_replies_are_retried_then_skipped_and_logged(
    labelled: list[LabelledConversation], caplog: pytest.LogCaptureFixture
) -> None:
    """Gemma 270M base (local, greedy) does not produce the numbered list: each attempt is malformed."""
    caplog.set_level(logging.INFO, logger="scorers.learning.generation")
    generator = Recording(LocalGenerator(cache_dir=cache_dir()))
    report = GenerationReport(generator.name)
    progress: list[tuple[str, int, int]] = []
    reasons = extract_reasons(
        generator,
        labelled[:1],
        DOMAIN,
        k=3,
        max_attempts=2,
        max_tokens=24,
        report=report,
        progress=lambda *a: progress.append(a),
    )
    conversation_id = labelled[0].conversation.id
    assert reasons == []
    assert report.calls == 2 and report.malformed_replies == 2 and report.conversations_used == 0
    assert [(s.stage, s.item) for s in report.skipped] == [("extraction", conversation_id)]
    assert "malformed after 2 attempt(s)" in report.skipped[0].reason
    # The retry carries a note naming the first reply's problem.
    assert "could not be used" not in generator.prompts[0]
    assert generator.prompts[1].startswith(generator.prompts[0]) and "could not be used (" in generator.prompts[1]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("malformed reply" in w for w in warnings) and any(f"{conversation_id}: skipped after 2" in w for w in warnings)
    assert progress == [("extraction", 1, 1)]


@pytest.mark.slow
def test_generate_pool_with_a_format_held_model_builds_a_deduplicated_pool(
    llama_server: LlamaServer, labelled: list[LabelledConversation], embedder: SentenceEmbedder, tmp_path: Path
) -> None:
    pair = [labelled[0], labelled[2]]  # one positive, one negative: prompt evaluation is the cost here
    full_seed = seed_pool()
    seed = full_seed.subset([full_seed.index("generic.sat.resolves"), full_seed.index("generic.dsat.user-repeats")])
    generator = _server_generator(llama_server, extra_body=THREE_LINES)
    progress: list[tuple[str, int, int]] = []
    pool, report = generate_pool(
        generator,
        pair,
        DOMAIN,
        embedder,
        k=3,
        batch_size=4,
        max_new_per_batch=3,
        max_attempts=2,
        existing=seed,
        seed=7,
        extraction_max_tokens=96,
        summarisation_max_tokens=96,
        max_transcript_chars=2000,
        progress=lambda *a: progress.append(a),
    )
    assert isinstance(pool, RubricPool) and len(pool) >= 1
    assert pool.prompt_versions == PROMPT_VERSIONS
    assert pool.metadata["generator"] == "llama-gemma" and pool.metadata["embedder"] == "all-MiniLM-L6-v2"
    assert pool.metadata["seed"] == 7 and pool.metadata["similarity_cut"] == SIMILARITY_CUT
    for r in pool:
        assert r.source == "generated" and re.fullmatch(rf"gen\.{r.polarity.value}\.[0-9a-f]{{10}}", r.id)
        assert check_assertion(r.text) == r.text
    # No two rubrics of one polarity, nor a rubric and a seed rubric of its polarity, are near-duplicates.
    # This model copies the listed seed rubric and the prompt's example ("The user has to restate the
    # request."): both are removed, so here the DSAT side may end up empty.
    assert report.duplicates >= 1
    for polarity in Polarity:
        mine = [r.text for r in pool if r.polarity is polarity]
        seeds = [r.text for r in seed if r.polarity is polarity]
        v, s = embedder.encode(mine).astype(np.float64), embedder.encode(seeds).astype(np.float64)
        sims = v @ v.T
        np.fill_diagonal(sims, -1.0)
        assert not mine or (sims.max() < SIMILARITY_CUT and (v @ s.T).max() < SIMILARITY_CUT)
    # The report adds up.
    assert report.conversations == 2 and report.conversations_used == 2 and not report.skipped
    assert report.reasons["sat"] > 0 and report.reasons["dsat"] > 0
    assert report.calls == report.conversations + report.batches
    assert sum(report.candidates.values()) == len(pool) + report.duplicates
    assert report.rubrics == {p.value: sum(1 for r in pool if r.polarity is p) for p in Polarity}
    assert report.prompt_tokens > 0 and report.completion_tokens > 0
    assert progress == [("extraction", 1, 2), ("extraction", 2, 2), ("summarisation:sat", 1, 1), ("summarisation:dsat", 1, 1)]
    path = tmp_path / "generated.json"
    pool.save(path)
    assert RubricPool.load(path) == pool


@pytest.mark.slow
def test_summarise_batches_see_the_rubrics_of_earlier_batches(llama_server: LlamaServer) -> None:
    generator = Recording(_server_generator(llama_server, extra_body=THREE_LINES))
    reasons = [
        Reason("a", Polarity.DSAT, "The assistant booked a table on the wrong day."),
        Reason("a", Polarity.DSAT, "The user had to give the number of people twice."),
        Reason("b", Polarity.DSAT, "The assistant could not find any train and gave no alternative."),
        Reason("b", Polarity.DSAT, "The assistant ended the conversation before the user was done."),
    ]
    existing = ["The assistant ignores the user's request."]
    report = GenerationReport(generator.name)
    new = summarise(
        generator, reasons, Polarity.DSAT, domain=DOMAIN, batch_size=2, existing=existing, max_new=3, max_tokens=96, report=report
    )
    assert len(generator.prompts) == 2 and report.batches == report.batches_used == 2
    first_batch = [t for t in new if f"- {t}" in generator.prompts[1]]
    assert first_batch and all(f"- {t}" not in generator.prompts[0] for t in first_batch)
    assert "- The assistant ignores the user's request." in generator.prompts[0]
    assert "- The assistant booked a table on the wrong day." in generator.prompts[0]
    assert "- The assistant could not find any train" in generator.prompts[1]
    assert existing[0] not in new and len({t.lower() for t in new}) == len(new)
    with pytest.raises(ValueError, match="other polarity"):
        summarise(generator, reasons, Polarity.SAT, domain=DOMAIN)


@pytest.mark.slow
def test_generate_pool_without_usable_output_fails_with_its_report(
    llama_server: LlamaServer, labelled: list[LabelledConversation], embedder: SentenceEmbedder
) -> None:
    """The base model behind the server without a grammar: every reply malformed, the run ends with a clear error."""
    generator = _server_generator(llama_server)
    with pytest.raises(RubricGenerationError, match="produced no usable rubric") as err:
        generate_pool(generator, [labelled[0], labelled[-1]], DOMAIN, embedder, max_attempts=2, extraction_max_tokens=24)
    report = err.value.report
    assert report is not None and report.calls == 4 and report.malformed_replies == 4
    assert [s.item for s in report.skipped] == [labelled[0].conversation.id, labelled[-1].conversation.id]
    assert report.batches == 0


def test_unreachable_generator_skips_every_conversation_then_fails_clearly(
    labelled: list[LabelledConversation], embedder: SentenceEmbedder
) -> None:
    """Real fault: nothing listens on the port; each conversation is skipped, nothing crashes mid-run."""
    generator = OpenAIGenerator(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", max_retries=0)
    with pytest.raises(RubricGenerationError, match="produced no usable rubric") as err:
        generate_pool(generator, labelled, DOMAIN, embedder)
    report = err.value.report
    assert report is not None and len(report.skipped) == len(labelled)
    assert all("generator error" in s.reason and "connection error" in s.reason for s in report.skipped)


@pytest.mark.slow
def test_wrong_api_key_stops_the_run_at_once(llama_server: LlamaServer, labelled: list[LabelledConversation]) -> None:
    generator = _server_generator(llama_server, api_key="not-the-key")
    with pytest.raises(RubricGenerationError, match="cannot be used") as err:
        extract_reasons(generator, labelled, DOMAIN)
    assert err.value.report is not None and err.value.report.conversations == 1


def test_conversation_without_turns_is_refused_before_any_call(labelled: list[LabelledConversation]) -> None:
    generator = Recording(OpenAIGenerator(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", max_retries=0))
    empty = LabelledConversation(Conversation("no-text", ()), True)
    with pytest.raises(RubricGenerationError, match="'no-text' has no turns"):
        extract_reasons(generator, [*labelled, empty], DOMAIN)
    assert generator.prompts == []


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"k": 0}, "k"), ({"max_attempts": 0}, "max_attempts"), ({"domain": " "}, "domain")]
)
def test_bad_settings_are_refused(labelled: list[LabelledConversation], kwargs: dict[str, object], field: str) -> None:
    generator = OpenAIGenerator(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", max_retries=0)
    options: dict[str, object] = {"domain": DOMAIN}
    options.update(kwargs)
    with pytest.raises(ValueError, match=field):
        extract_reasons(generator, labelled, **options)  # type: ignore[arg-type]
