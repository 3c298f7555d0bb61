"""Every prompt of RUBICON rubric learning, in one versioned place.

Two prompts (Biyani et al. 2024, §3):

- `EXTRACTION_PROMPT` — supervised extraction: shown one conversation whose
  label is known, the generator names the top-k reasons the user was
  satisfied (SAT, positive conversations) or dissatisfied (DSAT, negative
  ones). It carries the *domain description* (domain sensitisation: what the
  assistant is for, what success means) and the *conversation-design
  principles*: the Gricean maxims (quantity, quality, relevance, manner) and
  the fact that the user's behaviour shapes the outcome as much as the
  assistant's.
- `SUMMARISATION_PROMPT` — a mini-batch of reasons of one polarity becomes
  fresh rubrics: short assertions with one main verb that cover the batch's
  reasons and differ from the rubrics already in the pool (listed in the
  prompt), so each batch grows the pool instead of repeating it.

Reply format (both prompts): numbered lines ``1. <text>``, nothing else; the
summarisation prompt also allows the single word ``NONE`` (every reason is
already covered). `scorers.learning.generation` parses it strictly. When a reply
could not be used, the same prompt is sent again with `RETRY_NOTE` appended,
naming the problem.

Bump the version in `PROMPT_VERSIONS` whenever the text of a prompt changes:
rubric pools record the versions that produced them.
"""

from __future__ import annotations

from collections.abc import Sequence

from scorers.conversation import neutralise_control_tokens
from scorers.rubrics import Polarity

PROMPT_VERSIONS: dict[str, str] = {"extraction": "extract-v1", "summarisation": "summarise-v2"}

# The acceptance rule for rubric assertions (enforced by `scorers.learning.generation`)
# is stated in the summarisation prompt from these same values.
ASSERTION_SUBJECTS: tuple[str, ...] = ("The assistant", "The user", "The conversation")
MAX_ASSERTION_WORDS = 20
NONE_REPLY = "NONE"

_FEELING = {Polarity.SAT: "satisfied", Polarity.DSAT: "dissatisfied"}
_REASON_EXAMPLE = {
    Polarity.SAT: "The assistant gave the departure times the user asked for, without being asked twice.",
    Polarity.DSAT: "The assistant ignored the user's request for a cheaper option and repeated the first offer.",
}
_RUBRIC_EXAMPLES = {
    Polarity.SAT: ("The assistant gives a working solution.", "The user gets the information they asked for."),
    Polarity.DSAT: ("The assistant repeats generic advice.", "The user has to restate the request."),
}

PRINCIPLES = """\
Principles of good conversation design. A cooperative conversation follows the Gricean maxims:
- Quantity: each turn says as much as the exchange needs, and no more.
- Quality: each turn says only what is true and supported.
- Relevance: each turn serves the user's goal and answers the turn before it.
- Manner: each turn is clear, brief, orderly and unambiguous.
A conversation is a joint effort: its outcome depends on the user's behaviour (how clearly they state \
their goal, whether they cooperate, change their mind or give up) as well as on the assistant's."""

EXTRACTION_PROMPT = """\
You are an expert in conversation design, reviewing conversations between a user and an AI assistant.

What the assistant is for:
{domain}

{principles}

The user was {feeling} with the following conversation.

Conversation:
{transcript}

Task: give the top {k} reasons why the user was {feeling}, most important first. Each reason is one \
sentence saying what the assistant or the user did in this conversation, for example: "{example}"

Reply with {k} numbered lines and nothing else, in this form:
{form}"""

SUMMARISATION_PROMPT = """\
You are an expert in conversation design, writing rubrics for judging conversations between a user and \
an AI assistant.

What the assistant is for:
{domain}

Reasons why users were {feeling} with their conversations:
{reasons}

Rubrics already written:
{existing}

Task: write at most {max_new} new rubrics that together cover the reasons above. A rubric is an \
assertion about a conversation; agreeing with it means the user was {feeling}. Each rubric:
- is one short sentence of at most {max_words} words with one main verb;
- starts with {subjects};
- is general: it names a behaviour that other conversations can show too, without names, places or numbers;
- says something different from every rubric already written.
Examples: "{example_1}" "{example_2}"

Reply with numbered lines and nothing else, in this form:
1. <rubric>
2. <rubric>{none_clause}"""

# Offered only when rubrics exist: with an empty pool, small models answered NONE to every batch (summarise-v1).
NONE_CLAUSE = "\nIf the rubrics already written cover every reason, reply with the single word {none}."

RETRY_NOTE = """

Note: your previous reply could not be used ({problem}). Reply again, following the reply form exactly."""


def _polarity(polarity: Polarity | str) -> Polarity:
    try:
        return Polarity(polarity)
    except ValueError:
        raise ValueError(f"polarity must be one of {[p.value for p in Polarity]}, got {polarity!r}") from None


def _retry(problem: str | None) -> str:
    return RETRY_NOTE.format(problem=neutralise_control_tokens(problem)) if problem else ""  # it quotes a reply


def _subjects() -> str:
    quoted = [f'"{s}"' for s in ASSERTION_SUBJECTS]
    return ", ".join(quoted[:-1]) + f" or {quoted[-1]}"


def extraction_prompt(domain: str, transcript: str, polarity: Polarity | str, k: int, *, problem: str | None = None) -> str:
    """The extraction prompt for one conversation; ``problem`` (why the last reply failed) adds `RETRY_NOTE`."""
    polarity = _polarity(polarity)
    if not domain.strip():
        raise ValueError("the domain description must not be empty")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    form = "\n".join(f"{i}. <reason>" for i in range(1, k + 1))
    return EXTRACTION_PROMPT.format(
        domain=domain.strip(),
        principles=PRINCIPLES,
        feeling=_FEELING[polarity],
        transcript=transcript,
        k=k,
        example=_REASON_EXAMPLE[polarity],
        form=form,
    ) + _retry(problem)


def summarisation_prompt(
    domain: str,
    reasons: Sequence[str],
    polarity: Polarity | str,
    existing: Sequence[str],
    max_new: int,
    *,
    problem: str | None = None,
) -> str:
    """The summarisation prompt for one mini-batch of reasons of one polarity (rubrics ``existing`` listed)."""
    polarity = _polarity(polarity)
    if not domain.strip():
        raise ValueError("the domain description must not be empty")
    if not reasons:
        raise ValueError("a summarisation batch needs at least one reason")
    if max_new < 1:
        raise ValueError(f"max_new must be >= 1, got {max_new}")
    example_1, example_2 = _RUBRIC_EXAMPLES[polarity]
    return SUMMARISATION_PROMPT.format(
        domain=domain.strip(),
        feeling=_FEELING[polarity],
        reasons="\n".join(f"- {neutralise_control_tokens(r)}" for r in reasons),  # read from conversations
        existing="\n".join(f"- {neutralise_control_tokens(r)}" for r in existing) if existing else "(none yet)",
        max_new=max_new,
        max_words=MAX_ASSERTION_WORDS,
        subjects=_subjects(),
        example_1=example_1,
        example_2=example_2,
        none_clause=NONE_CLAUSE.format(none=NONE_REPLY) if existing else "",
    ) + _retry(problem)
