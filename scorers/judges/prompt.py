"""Every judge prompt, in one versioned place.

Prompts are split into a *prefix* (instructions + the conversation) and a
per-question *suffix*, so a local judge can encode the prefix once and reuse
its KV cache for every question. Bump `PROMPT_VERSION` whenever any text here
changes: it is recorded with every score.
"""

from __future__ import annotations

from typing import Sequence

from scorers.questions import Question

PROMPT_VERSION = "judge-v1"

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


def multi_question_prompt(transcript: str, questions: Sequence[Question]) -> str:
    """Several questions in one call: the judge must reply with one line ``<n>: <answer>`` per question."""
    blocks = [f"Question {i + 1}: {q.prompt_block()}\n(Only print {_choices(q)}.)" for i, q in enumerate(questions)]
    lines = "\n".join(f"{i + 1}: <answer>" for i in range(len(questions)))
    return (
        prefix(transcript)
        + "\n\n".join(blocks)
        + f"\n\nReply with exactly {len(questions)} lines and nothing else, in this form:\n{lines}\n"
    )
