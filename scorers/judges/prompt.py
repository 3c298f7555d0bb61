"""Every judge prompt, in one versioned place.

Prompts are split into a *prefix* (instructions + the conversation) and a
per-question *suffix*, so a local judge can encode the prefix once and reuse
its KV cache for every question. The multi-question prompt starts with the
same prefix and puts its question list last, so a server-side prompt cache
(llama.cpp slot reuse, vLLM prefix caching, OpenAI prompt caching) shares the
transcript between a one-pass call and the single-question calls that follow
it (fallbacks, other batches).

Bump `PROMPT_VERSION` whenever any text here changes: it is recorded with
every score and keys the score cache. The single-question prompt must stay
byte-identical for cached scores to stay valid. A multi-question prompt asks
for its reply as ``lines`` (``<i>: <answer>``) or as ``json`` (one object);
which one was used follows from the judge's ``answer_format``, which is
recorded with the scores and part of the score cache's judge identity.
"""

from __future__ import annotations

from typing import Literal, Sequence

from scorers.questions import Question

PROMPT_VERSION = "judge-v1"
ReplyForm = Literal["lines", "json"]

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
    return f"Question: {question.prompt_block()}\n\nOnly print {_choices(question)}.\nAnswer: "


def single_question_prompt(transcript: str, question: Question) -> str:
    """The full prompt for asking one question in one call."""
    return prefix(transcript) + question_suffix(question)


def multi_question_prompt(transcript: str, questions: Sequence[Question], reply: ReplyForm = "lines") -> str:
    """Several questions in one call, answered as one line ``<i>: <answer>`` per question (``reply="lines"``)
    or as one JSON object ``{"<i>": "<answer>", ...}`` (``reply="json"``)."""
    blocks = [f"Question {i + 1}: {q.prompt_block()}\n(Only print {_choices(q)}.)" for i, q in enumerate(questions)]
    return prefix(transcript) + "\n\n".join(blocks) + _reply_instructions(len(questions), reply)


def _reply_instructions(n: int, reply: ReplyForm) -> str:
    if reply == "json":
        fields = ", ".join(f'"{i}": "<answer>"' for i in range(1, n + 1))
        return f"\n\nReply with exactly one JSON object and nothing else, in this form:\n{{{fields}}}\n"
    lines = "\n".join(f"{i}: <answer>" for i in range(1, n + 1))
    return f"\n\nReply with exactly {n} lines and nothing else, in this form:\n{lines}\n"
