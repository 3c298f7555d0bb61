"""Every judge prompt, in one versioned place.

Prompts are split into a *prefix* (instructions + the conversation) and a
per-question *suffix*, so a local judge can encode the prefix once and reuse
its KV cache for every question. The multi-question prompt starts with the
same prefix and puts its question list last, so a server-side prompt cache
(llama.cpp slot reuse, vLLM prefix caching, OpenAI prompt caching) shares the
transcript between a one-pass call and the single-question calls that follow
it (fallbacks, other batches).

The multi-question prompt is compact, so that asking every question of a
conversation costs little more than one transcript pass: questions sharing a
stem and options (every Likert rubric) are grouped, the stem and the options
are stated once per group, and each question adds one numbered line (its
item). The questions are numbered in that grouped order (`numbered_order`);
answers are read by number, so the judge must use the same order.

Bump `PROMPT_VERSION` whenever the prefix or the single-question text changes,
`MULTI_PROMPT_VERSION` whenever the multi-question text changes: they are
recorded with every score and key the score cache. The single-question prompt
must stay byte-identical for cached scores to stay valid. A multi-question
prompt asks for its reply as ``lines`` (``<i>: <answer>``) or as ``json`` (one
object); which one was used follows from the judge's ``answer_format``, which
is recorded with the scores and part of the score cache's judge identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from scorers.conversation import neutralise_control_tokens
from scorers.questions import Question

# v2: turn texts escaped (`scorers.conversation.escape_text`); v3: control tokens neutralised in turn and question
# texts (`scorers.conversation.neutralise_control_tokens`)
PROMPT_VERSION = "judge-v3"
MULTI_PROMPT_VERSION = "multi-v3"
ReplyForm = Literal["lines", "json", "sequence"]

INSTRUCTIONS = (
    "You are given a conversation between a user and an intelligent assistant. "
    "Your job is to evaluate the quality of the conversation based on a criterion. "
    "Read the conversation, then answer the question by selecting only one of the choices."
)


def prefix(transcript: str) -> str:
    """Instructions and the conversation: shared by all questions about it."""
    return f"{INSTRUCTIONS}\n\nConversation:\n{transcript}\n\n"


def _choices(question: Question) -> str:
    keys = question.option_keys
    return ", ".join(f"'{k}'" for k in keys[:-1]) + f" or '{keys[-1]}'"


def question_suffix(question: Question) -> str:
    """One question, ending where the judge's answer token must come next."""
    block, choices = neutralise_control_tokens(question.prompt_block()), neutralise_control_tokens(_choices(question))
    return f"Question: {block}\n\nOnly print {choices}.\nAnswer: "


def single_question_prompt(transcript: str, question: Question) -> str:
    """The full prompt for asking one question in one call."""
    return prefix(transcript) + question_suffix(question)


def numbered_order(questions: Sequence[Question]) -> tuple[Question, ...]:
    """The questions in the order a multi-question prompt numbers them: grouped by stem and options, each group
    where its first question stands, questions in their own order inside a group (a stable sort)."""
    first: dict[tuple[str, ...], int] = {}
    for i, q in enumerate(questions):
        first.setdefault(_group_key(q), i)
    return tuple(sorted(questions, key=lambda q: first[_group_key(q)]))


def multi_question_prompt(transcript: str, questions: Sequence[Question], reply: ReplyForm = "lines") -> str:
    """Several questions in one call, numbered 1..n in `numbered_order` (the caller passes them in that order),
    answered as one line ``<i>: <answer>`` per question (``reply="lines"``), one JSON object
    ``{"<i>": "<answer>", ...}`` (``reply="json"``) or the answers alone in order (``reply="sequence"``)."""
    if tuple(questions) != numbered_order(questions):
        raise ValueError("multi_question_prompt: questions must come in numbered_order")
    blocks: list[str] = []
    for number, q in enumerate(questions, start=1):
        if not q.stem:
            blocks.append(f"{number}. {q.text}\nOptions: {_options(q)}.")
        elif number > 1 and _group_key(q) == _group_key(questions[number - 2]):
            blocks[-1] += f"\n{number}. {q.item}"
        else:
            blocks.append(f"{q.stem} Options: {_options(q)}.\n{number}. {q.item}")
    intro = "Answer every numbered question below with one of its options.\n\n"
    asked = neutralise_control_tokens("\n\n".join(blocks))  # question texts may be learned from conversations
    return prefix(transcript) + intro + asked + _reply_instructions(questions, reply)


def _group_key(q: Question) -> tuple[str, ...]:
    """Questions with equal keys are stated under one stem and options line (a question without a stem: alone)."""
    return (q.stem, *q.option_keys, "\x00", *q.option_labels) if q.stem else ("\x01", q.id)


def _options(q: Question) -> str:
    return ", ".join(k if label == k else f"{k} = {label}" for k, label in zip(q.option_keys, q.option_labels))


def _reply_instructions(questions: Sequence[Question], reply: ReplyForm) -> str:
    n, key = len(questions), questions[0].option_keys[0]
    if reply == "sequence":
        return f"\n\nReply with only the {n} answers, one option each, in question order (1 to {n}), with nothing between them.\n"
    if reply == "json":
        return (
            f"\n\nReply with one JSON object mapping each question number, 1 to {n}, to its answer "
            f'(for example {{"1": "{key}", ...}}) and nothing else.\n'
        )
    return f"\n\nReply with {n} lines, one per question in order, each '<number>: <answer>' (for example '1: {key}'), and nothing else.\n"
