"""RUBICON rubric generation: labelled conversations in, a pool of candidate rubrics out.

Steps (Biyani et al. 2024, §3; prompts in `scorers.learning.prompts`):

1. `extract_reasons` — for each labelled conversation, the generator names the
   top-k reasons the user was satisfied (positive conversation: SAT) or
   dissatisfied (negative: DSAT). The transcript is rendered by
   `scorers.conversation.render_transcript` with a character cap (its
   truncation policy keeps the first and the last turns).
2. `summarise` — per polarity, reasons are summarised in mini-batches into a
   growing list of rubrics: each batch's prompt lists the rubrics written so
   far (the most recent ``max_listed_existing`` of them, so the prompt stays
   inside the context) and asks for fresh ones.
3. `generate_pool` — both steps, then semantic de-duplication
   (`scorers.learning.embeddings.deduplicate`, per polarity: a claim and its opposite
   embed close), into a `RubricPool` of ``source="generated"`` rubrics that
   records the prompt versions, the generator and the settings.

Reply parsing (`parse_numbered_reply`), strict:

- the reply is numbered lines ``<n>. <text>`` (``<n>)`` also accepted),
  numbered 1, 2, 3, ... in order, blank lines ignored; at most one preamble
  line before the list, and only if it ends with ``:`` ("Here are the
  reasons:"); any other line is a format error;
- at most ``max_items`` items; the summarisation reply may instead be the
  single word ``NONE`` (no new rubric needed);
- a reply cut off by ``max_tokens`` (finish reason ``"length"``) loses its last,
  unfinished line.

Item acceptance. Each item is normalised (`normalise_item`: surrounding
quotes, markdown emphasis and a leading dash removed, whitespace collapsed).
A *reason* must then be 2..`MAX_REASON_WORDS` words without template
placeholders (``<reason>``). A rubric *assertion* (`check_assertion`) must be
one sentence of at most `MAX_ASSERTION_WORDS` words and at most
`scorers.learning.pool.MAX_TEXT_CHARS` characters that

- starts with one of `ASSERTION_SUBJECTS` ("The assistant", "The user",
  "The conversation"; a lower-case "the" is capitalised) followed by a space
  and a lower-case word — the verb, or an adverb before it ("The assistant
  clearly explains ...");
- contains no sentence break inside (``.``, ``!``, ``?`` or ``;`` followed by a
  space), no placeholder brackets (``<>{}[]``), and is not a question; a
  final period is added when missing.

"One verb" is asked for in the prompt but not checked: that would need a
part-of-speech tagger. Items that fail are dropped, logged and counted
(``rejected_items``); a reply with a format error, or without any acceptable
item, is *malformed*: the prompt is sent again with a note naming the problem,
up to ``max_attempts`` times in all, then the conversation or batch is skipped,
logged (``logging`` at WARNING) and listed in the report. Generator failures
after the generator's own retries (unreachable server, a prompt too long for
the context, a rejected request) skip the item the same way; only
authentication and unknown-model errors stop the run, since every later call
would fail too. Nothing here crashes on what a model writes.
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from scorers.conversation import render_transcript
from scorers.datasets.labelled import LabelledConversation
from scorers.errors import ModelReplyError, ServiceError
from scorers.learning.embeddings import SIMILARITY_CUT, SentenceEmbedder, deduplicate
from scorers.learning.generators import (
    Generation,
    GeneratorAuthError,
    GeneratorError,
    GeneratorModelNotFound,
    GeneratorReplyError,
    TextGenerator,
)
from scorers.learning.pool import MAX_TEXT_CHARS, PoolRubric, RubricPool, text_key
from scorers.learning.prompts import (
    ASSERTION_SUBJECTS,
    MAX_ASSERTION_WORDS,
    NONE_REPLY,
    PROMPT_VERSIONS,
    extraction_prompt,
    summarisation_prompt,
)
from scorers.rubrics import Polarity

log = logging.getLogger(__name__)

DEFAULT_K = 3
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_BATCH_SIZE = 20
DEFAULT_MAX_NEW_PER_BATCH = 10
DEFAULT_MAX_LISTED_EXISTING = 60
DEFAULT_MAX_TRANSCRIPT_CHARS = 6_000
DEFAULT_EXTRACTION_MAX_TOKENS = 300
DEFAULT_SUMMARISATION_MAX_TOKENS = 600
MAX_REASON_WORDS = 60
MIN_REASON_WORDS = 2
GENERATED_SOURCE = "generated"
EXCERPT_CHARS = 200

_NUMBERED = re.compile(r"^(\d+)[.)]\s+(\S.*)$")
_WRAPPERS = "\"'`“”‘’*_"
_SENTENCE_BREAK = re.compile(r"[.!?;]\s")
_PLACEHOLDER = re.compile(r"[<>{}\[\]]")
_VERB = re.compile(r"^[a-z][a-z'-]*$")

Progress = Callable[[str, int, int], None]
"""Called as ``progress(stage, done, total)`` after each conversation or batch."""


class ReplyFormatError(ModelReplyError, ValueError):
    """A generator reply that breaks the reply format; the message names the problem (it goes into the retry note)."""


class ItemRejected(ModelReplyError, ValueError):
    """One item of a well-formed reply that fails the acceptance rule."""


class RubricGenerationError(ServiceError, RuntimeError):
    """Rubric generation cannot go on, or produced nothing usable; ``report`` says what happened so far."""

    def __init__(self, message: str, report: GenerationReport | None = None) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class Reason:
    """One extracted reason why the user of a conversation was satisfied (SAT) or dissatisfied (DSAT)."""

    conversation_id: str
    polarity: Polarity
    text: str


@dataclass(frozen=True)
class SkippedItem:
    """A conversation or batch that produced nothing, and why."""

    stage: str  # "extraction" | "summarisation"
    item: str  # conversation id, or "sat batch 3"
    reason: str


@dataclass
class GenerationReport:
    """What a generation run did and cost; filled in as it goes."""

    generator: str
    conversations: int = 0
    conversations_used: int = 0
    reasons: dict[str, int] = field(default_factory=lambda: {p.value: 0 for p in Polarity})
    batches: int = 0
    batches_used: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    generation_s: float = 0.0
    malformed_replies: int = 0
    truncated_replies: int = 0
    rejected_items: int = 0
    candidates: dict[str, int] = field(default_factory=lambda: {p.value: 0 for p in Polarity})
    duplicates: int = 0
    rubrics: dict[str, int] = field(default_factory=lambda: {p.value: 0 for p in Polarity})
    skipped: list[SkippedItem] = field(default_factory=list)

    def record(self, generation: Generation) -> None:
        self.calls += 1
        self.prompt_tokens += generation.prompt_tokens
        self.completion_tokens += generation.completion_tokens
        self.generation_s += generation.latency_s
        if generation.finish_reason == "length":
            self.truncated_replies += 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------- parsing


def _excerpt(text: str) -> str:
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."


def parse_numbered_reply(text: str, max_items: int, *, allow_none: bool = False, truncated: bool = False) -> list[str]:
    """Item texts of a numbered-lines reply (module docstring rules); `ReplyFormatError` if it breaks them.

    ``truncated``: the reply was cut off by the token limit, so its last line is dropped as unfinished.
    """
    if max_items < 1:
        raise ValueError(f"max_items must be >= 1, got {max_items}")
    if truncated:
        text = text[: text.rfind("\n")] if "\n" in text.rstrip() else ""
        if not text.strip():
            raise ReplyFormatError("the reply was cut off before its first item was complete")
    stripped = text.strip()
    if not stripped:
        raise ReplyFormatError("the reply is empty")
    if allow_none and stripped.strip(_WRAPPERS + ".").upper() == NONE_REPLY:
        return []
    lines = [line.strip() for line in stripped.splitlines() if line.strip()]
    items: list[str] = []
    preamble = 0
    for line in lines:
        m = _NUMBERED.match(line)
        if m is None:
            if not items and preamble == 0 and line.endswith(":"):
                preamble += 1
                continue
            where = "before the list" if not items else f"after item {len(items)}"
            raise ReplyFormatError(f"a line {where} is not a numbered item: {_excerpt(line)!r}")
        number = int(m.group(1))
        if number != len(items) + 1:
            raise ReplyFormatError(f"item numbered {number} where {len(items) + 1} was expected")
        items.append(m.group(2))
    if not items:
        raise ReplyFormatError("the reply has no numbered lines")
    if len(items) > max_items:
        raise ReplyFormatError(f"the reply has {len(items)} items, at most {max_items} were asked for")
    return items


def normalise_item(text: str) -> str:
    """An item without surrounding quotes, markdown emphasis or a leading dash, whitespace collapsed."""
    text = " ".join(text.split())
    previous = None
    while previous != text:
        previous = text
        text = text.removeprefix("- ").strip().strip(_WRAPPERS).strip()
    return text


def check_reason(text: str) -> str:
    """A normalised reason, or `ItemRejected` (see the module docstring)."""
    reason = normalise_item(text)
    words = len(reason.split())
    if _PLACEHOLDER.search(reason):
        raise ItemRejected(f"reason contains template brackets: {reason!r}")
    if not MIN_REASON_WORDS <= words <= MAX_REASON_WORDS:
        raise ItemRejected(f"reason has {words} words, expected {MIN_REASON_WORDS}..{MAX_REASON_WORDS}: {_excerpt(reason)!r}")
    return reason


def check_assertion(text: str) -> str:
    """A normalised rubric assertion ending in a period, or `ItemRejected` (acceptance rule in the module docstring)."""
    assertion = normalise_item(text)
    if _PLACEHOLDER.search(assertion):
        raise ItemRejected(f"contains template brackets: {assertion!r}")
    if assertion.endswith("?"):
        raise ItemRejected(f"is a question, not an assertion: {assertion!r}")
    body = assertion.rstrip(".!").rstrip()
    if _SENTENCE_BREAK.search(body):
        raise ItemRejected(f"is more than one sentence: {assertion!r}")
    subject = next((s for s in ASSERTION_SUBJECTS if body.lower().startswith(s.lower() + " ")), None)
    if subject is None:
        raise ItemRejected(f"does not start with one of {list(ASSERTION_SUBJECTS)} and a verb: {assertion!r}")
    body = subject + body[len(subject) :]
    rest = body[len(subject) + 1 :].split()
    if not rest or not _VERB.match(rest[0]):
        raise ItemRejected(f"{subject!r} is not followed by a lower-case verb: {assertion!r}")
    words = len(body.split())
    if words > MAX_ASSERTION_WORDS:
        raise ItemRejected(f"has {words} words, at most {MAX_ASSERTION_WORDS}: {assertion!r}")
    result = body + "."
    if len(result) > MAX_TEXT_CHARS:
        raise ItemRejected(f"has {len(result)} characters, at most {MAX_TEXT_CHARS}: {_excerpt(result)!r}")
    return result


def accept_items(items: Sequence[str], check: Callable[[str], str]) -> tuple[list[str], list[str]]:
    """``(accepted, rejections)``: items passing ``check`` (exact duplicates dropped), and why others failed."""
    accepted: list[str] = []
    seen: set[str] = set()
    rejections: list[str] = []
    for item in items:
        try:
            text = check(item)
        except ItemRejected as e:
            rejections.append(str(e))
            continue
        if text_key(text) in seen:
            rejections.append(f"repeats an earlier item: {text!r}")
            continue
        seen.add(text_key(text))
        accepted.append(text)
    return accepted, rejections


# ---------------------------------------------------------------------------- asking


def _ask(
    generator: TextGenerator,
    make_prompt: Callable[[str | None], str],
    parse: Callable[[Generation], list[str]],
    *,
    stage: str,
    item: str,
    max_attempts: int,
    max_tokens: int,
    temperature: float,
    report: GenerationReport,
) -> list[str] | None:
    """Items of the first usable reply within ``max_attempts``, or None (the item is skipped and logged)."""
    problem: str | None = None
    for attempt in range(1, max_attempts + 1):
        try:
            generation = generator.generate(make_prompt(problem), max_tokens=max_tokens, temperature=temperature)
        except (GeneratorAuthError, GeneratorModelNotFound) as e:
            raise RubricGenerationError(f"{stage} of {item}: generator {generator.name!r} cannot be used: {e}", report) from e
        except GeneratorReplyError as e:
            report.malformed_replies += 1
            problem = str(e)
            log.warning("%s of %s: attempt %d/%d: unusable reply: %s", stage, item, attempt, max_attempts, e)
            continue
        except GeneratorError as e:
            log.warning("%s of %s: skipped: generator %r failed: %s", stage, item, generator.name, e)
            report.skipped.append(SkippedItem(stage, item, f"generator error: {e}"))
            return None
        report.record(generation)
        try:
            return parse(generation)
        except ReplyFormatError as e:
            report.malformed_replies += 1
            problem = str(e)
            log.warning(
                "%s of %s: attempt %d/%d: malformed reply (%s): %r",
                stage,
                item,
                attempt,
                max_attempts,
                e,
                _excerpt(generation.text),
            )
    log.warning("%s of %s: skipped after %d malformed repl(ies); last problem: %s", stage, item, max_attempts, problem)
    report.skipped.append(SkippedItem(stage, item, f"malformed after {max_attempts} attempt(s): {problem}"))
    return None


def _parser(
    max_items: int, check: Callable[[str], str], *, allow_none: bool, stage: str, item: str, report: GenerationReport
) -> Callable[[Generation], list[str]]:
    def parse(generation: Generation) -> list[str]:
        items = parse_numbered_reply(
            generation.text, max_items, allow_none=allow_none, truncated=generation.finish_reason == "length"
        )
        if not items:
            return []  # NONE
        accepted, rejections = accept_items(items, check)
        if not accepted:
            raise ReplyFormatError(f"no item is usable; first problem: {rejections[0]}")
        for why in rejections:
            report.rejected_items += 1
            log.info("%s of %s: item dropped: %s", stage, item, why)
        return accepted

    return parse


def _check_settings(k: int, max_attempts: int, max_tokens: int) -> None:
    for name, value in (("k", k), ("max_attempts", max_attempts), ("max_tokens", max_tokens)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def extract_reasons(
    generator: TextGenerator,
    labelled_conversations: Sequence[LabelledConversation],
    domain: str,
    k: int = DEFAULT_K,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    progress: Progress | None = None,
    *,
    max_tokens: int = DEFAULT_EXTRACTION_MAX_TOKENS,
    temperature: float = 0.0,
    max_transcript_chars: int | None = DEFAULT_MAX_TRANSCRIPT_CHARS,
    report: GenerationReport | None = None,
) -> list[Reason]:
    """Top-``k`` SAT reasons of each positive and DSAT reasons of each negative conversation, in input order.

    Conversations whose replies stay malformed are skipped (logged, listed in
    ``report``). A conversation without turns is refused up front: extraction
    needs its text.
    """
    _check_settings(k, max_attempts, max_tokens)
    if not domain.strip():
        raise ValueError("the domain description must not be empty")
    report = report if report is not None else GenerationReport(generator.name)
    for item in labelled_conversations:
        if not item.conversation.turns:
            raise RubricGenerationError(
                f"conversation {item.conversation.id!r} has no turns: reason extraction needs the conversation text"
            )
    reasons: list[Reason] = []
    total = len(labelled_conversations)
    for done, item in enumerate(labelled_conversations, start=1):
        conversation = item.conversation
        polarity = Polarity.SAT if item.positive else Polarity.DSAT
        transcript = render_transcript(conversation, max_chars=max_transcript_chars)
        report.conversations += 1
        texts = _ask(
            generator,
            lambda problem: extraction_prompt(domain, transcript, polarity, k, problem=problem),  # noqa: B023 (_ask calls it before the loop moves on)
            _parser(k, check_reason, allow_none=False, stage="extraction", item=conversation.id, report=report),
            stage="extraction",
            item=conversation.id,
            max_attempts=max_attempts,
            max_tokens=max_tokens,
            temperature=temperature,
            report=report,
        )
        if texts:
            report.conversations_used += 1
            report.reasons[polarity.value] += len(texts)
            reasons.extend(Reason(conversation.id, polarity, t) for t in texts)
        if progress is not None:
            progress("extraction", done, total)
    return reasons


def summarise(
    generator: TextGenerator,
    reasons: Sequence[Reason],
    polarity: Polarity | str,
    *,
    domain: str,
    batch_size: int = DEFAULT_BATCH_SIZE,
    existing: Sequence[str] = (),
    max_new: int = DEFAULT_MAX_NEW_PER_BATCH,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    max_tokens: int = DEFAULT_SUMMARISATION_MAX_TOKENS,
    temperature: float = 0.0,
    max_listed_existing: int = DEFAULT_MAX_LISTED_EXISTING,
    progress: Progress | None = None,
    report: GenerationReport | None = None,
) -> list[str]:
    """New rubric assertions of ``polarity`` summarising ``reasons`` in mini-batches, in order of generation.

    Every batch sees ``existing`` plus the rubrics of earlier batches (the most
    recent ``max_listed_existing``); a rubric equal to one already there (same
    `text_key`) is dropped and counted in ``report.duplicates``. ``reasons`` must
    all have ``polarity``.
    """
    polarity = Polarity(polarity)
    _check_settings(batch_size, max_attempts, max_tokens)
    if max_new < 1 or max_listed_existing < 0:
        raise ValueError(f"max_new must be >= 1 and max_listed_existing >= 0, got {max_new}, {max_listed_existing}")
    wrong = [r for r in reasons if r.polarity is not polarity]
    if wrong:
        raise ValueError(f"summarise({polarity.value}) got {len(wrong)} reason(s) of the other polarity, e.g. {wrong[0]}")
    report = report if report is not None else GenerationReport(generator.name)
    written = list(existing)
    seen = {text_key(t) for t in written}
    new: list[str] = []
    batches = [reasons[i : i + batch_size] for i in range(0, len(reasons), batch_size)]
    for number, batch in enumerate(batches, start=1):
        label = f"{polarity.value} batch {number}/{len(batches)}"
        listed = written[-max_listed_existing:] if max_listed_existing else []
        texts = [r.text for r in batch]
        report.batches += 1
        proposed = _ask(
            generator,
            lambda problem: summarisation_prompt(domain, texts, polarity, listed, max_new, problem=problem),  # noqa: B023 (as above)
            _parser(max_new, check_assertion, allow_none=True, stage="summarisation", item=label, report=report),
            stage="summarisation",
            item=label,
            max_attempts=max_attempts,
            max_tokens=max_tokens,
            temperature=temperature,
            report=report,
        )
        if proposed is not None:
            report.batches_used += 1
            for text in proposed:
                report.candidates[polarity.value] += 1
                if text_key(text) in seen:
                    report.duplicates += 1
                    log.info("summarisation of %s: %r is already in the pool", label, text)
                    continue
                seen.add(text_key(text))
                written.append(text)
                new.append(text)
        if progress is not None:
            progress(f"summarisation:{polarity.value}", number, len(batches))
    return new


def generated_id(text: str, polarity: Polarity) -> str:
    """A stable id for a generated rubric: ``gen.<polarity>.<sha256 of its text key, 10 hex>``."""
    digest = hashlib.sha256(text_key(text).encode("utf-8")).hexdigest()[:10]
    return f"gen.{polarity.value}.{digest}"


def generate_pool(
    generator: TextGenerator,
    labelled: Sequence[LabelledConversation],
    domain: str,
    embedder: SentenceEmbedder,
    *,
    k: int = DEFAULT_K,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_new_per_batch: int = DEFAULT_MAX_NEW_PER_BATCH,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    similarity_cut: float = SIMILARITY_CUT,
    existing: RubricPool | None = None,
    seed: int = 0,
    temperature: float = 0.0,
    extraction_max_tokens: int = DEFAULT_EXTRACTION_MAX_TOKENS,
    summarisation_max_tokens: int = DEFAULT_SUMMARISATION_MAX_TOKENS,
    max_transcript_chars: int | None = DEFAULT_MAX_TRANSCRIPT_CHARS,
    max_listed_existing: int = DEFAULT_MAX_LISTED_EXISTING,
    progress: Progress | None = None,
) -> tuple[RubricPool, GenerationReport]:
    """Extract, summarise (SAT and DSAT separately) and de-duplicate into a pool of generated rubrics.

    ``existing`` (e.g. the seed pool) is listed to the generator as rubrics
    already written and generated rubrics too similar to one of it are dropped;
    the returned pool holds only the new rubrics (merge them with
    `scorers.learning.pool.merge`). ``seed`` shuffles the reasons before batching,
    so a batch mixes conversations. Raises `RubricGenerationError` (with the
    report) when no rubric survives.
    """
    if not labelled:
        raise ValueError("generate_pool needs at least one labelled conversation")
    report = GenerationReport(generator.name)
    reasons = extract_reasons(
        generator,
        labelled,
        domain,
        k,
        max_attempts,
        progress,
        max_tokens=extraction_max_tokens,
        temperature=temperature,
        max_transcript_chars=max_transcript_chars,
        report=report,
    )
    rng = random.Random(seed)
    rubrics: list[PoolRubric] = []
    for polarity in Polarity:
        mine = [r for r in reasons if r.polarity is polarity]
        rng.shuffle(mine)
        already = [r.text for r in existing or () if r.polarity is polarity]
        texts = summarise(
            generator,
            mine,
            polarity,
            domain=domain,
            batch_size=batch_size,
            existing=already,
            max_new=max_new_per_batch,
            max_attempts=max_attempts,
            max_tokens=summarisation_max_tokens,
            temperature=temperature,
            max_listed_existing=max_listed_existing,
            progress=progress,
            report=report,
        )
        kept = deduplicate(texts, embedder, similarity_cut, already_kept=already)
        report.duplicates += len(texts) - len(kept)
        for i in kept:
            rubrics.append(PoolRubric(generated_id(texts[i], polarity), texts[i], polarity, GENERATED_SOURCE))
        report.rubrics[polarity.value] = len(kept)
    if not rubrics:
        raise RubricGenerationError(
            f"generator {generator.name!r} produced no usable rubric from {len(labelled)} conversation(s) "
            f"({report.calls} call(s), {report.malformed_replies} malformed repl(ies), {len(report.skipped)} skipped item(s))",
            report,
        )
    metadata = {
        "name": "generated",
        "generator": generator.name,
        "generator_model": str(getattr(generator, "model", "")),
        "embedder": embedder.name,
        "similarity_cut": similarity_cut,
        "domain_sha256": hashlib.sha256(domain.strip().encode("utf-8")).hexdigest()[:16],
        "conversations": len(labelled),
        "training_data_hash": _conversations_hash(labelled),
        "k": k,
        "batch_size": batch_size,
        "max_new_per_batch": max_new_per_batch,
        "seed": seed,
        "temperature": temperature,
        "report": {**{key: value for key, value in report.to_dict().items() if key != "skipped"}, "skipped": len(report.skipped)},
    }
    return RubricPool(tuple(rubrics), dict(PROMPT_VERSIONS), metadata), report


def _conversations_hash(labelled: Sequence[LabelledConversation]) -> str:
    """Names the training data: hash of each conversation's content hash and label, in order."""
    digest = hashlib.sha256()
    for item in labelled:
        digest.update(f"{item.conversation.content_hash()}:{int(item.positive)}\n".encode())
    return digest.hexdigest()[:16]
