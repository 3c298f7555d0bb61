"""How a multi-question reply is constrained and how each answer's position is read from its tokens.

A judge that asks n questions in one call reads each answer's option
probabilities at that answer's *position*: the index of the reply token that
holds it. This module finds those positions in the reply's tokens and builds
the server-side constraints that make the reply well formed. It knows nothing
about HTTP or logprobs (`scorers.judges.openai_http` does).

Formats (``answer_format``):

* ``"lines"``: free text, asked for as one line ``<i>: <answer>`` per question
  (`read_answer_lines`). Nothing holds the model to it.
* ``"grammar"``: the same lines, held to exactly one line per question, in
  order, each answer one of that question's option keys, by a llama.cpp GBNF
  grammar sent as the request's ``grammar`` field (`answer_grammar`;
  llama.cpp server, llama-cpp-python's server).
* ``"sequence"``: the answers alone, one option key per question in question
  order with nothing between them (``"4251"``), held to exactly that by a
  llama.cpp grammar (`sequence_grammar`). One generated token per answer
  instead of about five for a line, so the reply costs little to decode; it
  needs a server that enforces the grammar, since the order is the only
  number an answer carries (`read_answer_sequence`).
* ``"json_schema"``: one JSON object ``{"1": "<answer>", ...}`` (read by
  `read_answer_json`), held to the schema of `answer_json_schema` (one required
  property per question, an enum of its option keys, no other property) by an
  OpenAI structured-outputs ``response_format`` (`json_schema_response_format`;
  OpenAI, vLLM, llama.cpp's own server). llama-cpp-python's server rejects that
  shape (with a 500) and takes ``{"type": "json_object", "schema": ...}``
  instead: send that through the judge's ``extra_body``, which wins.

Reading rule for lines and JSON: an answer is assigned only by the number it
carries (line number or JSON key), never by its place in the reply.
A question is *unreadable* when its number is missing, appears twice, has an
empty answer, or its answer does not start at a token boundary (a token that
starts mid-answer, or holds more than padding before it, has no distribution
of its own); numbers outside ``1..n`` and other keys are ignored. The judge
asks unreadable questions again alone. Sequence replies carry no numbers: the
grammar makes token i the answer to question i, and the reader checks that,
token by token: answer i is read only while every token up to it is exactly
one option key of its own question; from the first token that is not (a
server that ignored the grammar, a token holding two answers) every later
question is unreadable, never shifted onto a neighbour.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from scorers.questions import Question

AnswerFormat = Literal["lines", "grammar", "sequence", "json_schema"]
ANSWER_FORMATS: tuple[str, ...] = ("lines", "grammar", "sequence", "json_schema")
JSON_PADDING = ' \t\r\n"'  # what may surround a JSON answer inside its token ('"4' or ' "a')
SCHEMA_NAME = "answers"

# Why a question's answer cannot be read.
MISSING = "no answer"
DUPLICATE = "its number appears more than once"
EMPTY = "its answer is empty"
OFF_BOUNDARY = "its answer is not one token starting at a token boundary"
OUT_OF_STEP = "the sequence reply broke off before it (a token that is not one option key of its question)"

_ANSWER_LINE = re.compile(r"^[ \t]*(\d+)[ \t]*:[ \t]*", re.MULTILINE)
# One JSON lexeme: a string literal, a structural character, a bare scalar, or a lone quote (an unterminated string).
_JSON_LEXEME = re.compile(r'"(?:[^"\\\n]|\\.)*"|[{}\[\]:,]|[^\s"{}\[\]:,]+|"')


@dataclass(frozen=True)
class ReplyReading:
    """Where each numbered answer starts in a multi-question reply, and why the others cannot be read."""

    positions: dict[int, int]  # question number (1-based) -> index of its answer token
    unreadable: dict[int, str]  # question number -> reason


def answer_padding(answer_format: AnswerFormat) -> str | None:
    """Characters stripped from a token before comparing it with an option key (None: whitespace)."""
    return JSON_PADDING if answer_format == "json_schema" else None


def read_reply(answer_format: AnswerFormat, tokens: Sequence[str], questions: Sequence[Question]) -> ReplyReading:
    """The positions of the answers to ``questions`` (numbered 1..n in order) in a reply asked for in ``answer_format``."""
    if answer_format == "sequence":
        return read_answer_sequence(tokens, questions)
    reader = read_answer_json if answer_format == "json_schema" else read_answer_lines
    return reader(tokens, len(questions))


def read_answer_sequence(tokens: Sequence[str], questions: Sequence[Question]) -> ReplyReading:
    """Token i answers question i+1 while every token up to it is exactly one of its question's option keys."""
    found: dict[int, int] = {}
    for i, q in enumerate(questions):
        if i >= len(tokens) or tokens[i] not in q.option_keys:
            break
        found[i + 1] = i
    reason = {n: (MISSING if n > len(tokens) else OUT_OF_STEP) for n in range(len(found) + 1, len(questions) + 1)}
    return ReplyReading(found, reason)


def read_answer_lines(tokens: Sequence[str], n_questions: int) -> ReplyReading:
    """Find the token that starts each answer line ``<i>: <answer>`` for i in ``1..n_questions`` (module rule)."""
    text, starts = _joined(tokens)
    answers: list[tuple[int, int | str]] = []
    for m in _ANSWER_LINE.finditer(text):
        at = m.end()
        if at >= len(text) or text[at] == "\n":
            answers.append((int(m.group(1)), EMPTY))
        else:
            index = _token_at(starts, tokens, at, None)
            answers.append((int(m.group(1)), OFF_BOUNDARY if index is None else index))
    return _assign(answers, n_questions)


def read_answer_json(tokens: Sequence[str], n_questions: int) -> ReplyReading:
    """Find the token holding each answer of a flat JSON object ``{"<i>": "<answer>", ...}`` (module rule).

    The answer token must hold the whole answer, up to quotes and spaces
    (``4``, ``"4"``, ``' "4'``). The object is read up to the first thing that
    does not fit its shape, so a truncated or malformed rest leaves only those
    questions unread.
    """
    text, starts = _joined(tokens)
    answers: list[tuple[int, int | str]] = []
    for key, value, at in _json_pairs(text):
        if not (key.isascii() and key.isdigit()):
            continue
        if not value.strip():
            answers.append((int(key), EMPTY))
            continue
        index = _token_at(starts, tokens, at, JSON_PADDING)
        if index is None or tokens[index].strip(JSON_PADDING) != value.strip():
            answers.append((int(key), OFF_BOUNDARY))
        else:
            answers.append((int(key), index))
    return _assign(answers, n_questions)


def constraint_fields(answer_format: AnswerFormat, questions: Sequence[Question]) -> dict[str, Any]:
    """The request-body fields that hold a reply about ``questions`` to ``answer_format`` (none for free lines)."""
    if answer_format == "grammar":
        return {"grammar": answer_grammar(questions)}
    if answer_format == "sequence":
        return {"grammar": sequence_grammar(questions)}
    if answer_format == "json_schema":
        return {"response_format": json_schema_response_format(questions)}
    return {}


def answer_grammar(questions: Sequence[Question]) -> str:
    """A llama.cpp GBNF grammar that admits exactly one line ``<i>: <option key of question i>`` per question."""

    def literal(s: str) -> str:
        return json.dumps(s)  # GBNF string literals use JSON escapes

    lines = [
        f"{literal(f'{i}: ')} ({' | '.join(literal(k) for k in q.option_keys)}) {literal(chr(10))}"
        for i, q in enumerate(questions, start=1)
    ]
    return "root ::= " + " ".join(lines)


def sequence_grammar(questions: Sequence[Question]) -> str:
    """A llama.cpp GBNF grammar that admits exactly one option key per question, in order, with nothing else."""
    return "root ::= " + " ".join(f"({' | '.join(json.dumps(k) for k in q.option_keys)})" for q in questions)


def answer_json_schema(questions: Sequence[Question]) -> dict[str, Any]:
    """JSON schema of the reply: property ``"<i>"`` (required) is one of question i's option keys; nothing else."""
    keys = [str(i) for i in range(1, len(questions) + 1)]
    return {
        "type": "object",
        "properties": {k: {"type": "string", "enum": list(q.option_keys)} for k, q in zip(keys, questions)},
        "required": keys,
        "additionalProperties": False,
    }


def json_schema_response_format(questions: Sequence[Question]) -> dict[str, Any]:
    """OpenAI structured outputs: ``response_format`` of type ``json_schema``, strict, from `answer_json_schema`."""
    return {
        "type": "json_schema",
        "json_schema": {"name": SCHEMA_NAME, "strict": True, "schema": answer_json_schema(questions)},
    }


def _assign(answers: Sequence[tuple[int, int | str]], n_questions: int) -> ReplyReading:
    """Apply the reading rule to (number, answer token index or why it has none) pairs in reply order."""
    found: dict[int, int] = {}
    unreadable: dict[int, str] = {}
    for number, answer in answers:
        if not 1 <= number <= n_questions:
            continue
        if number in found or number in unreadable:
            found.pop(number, None)
            unreadable[number] = DUPLICATE
        elif isinstance(answer, str):
            unreadable[number] = answer
        else:
            found[number] = answer
    for i in range(1, n_questions + 1):
        if i not in found:
            unreadable.setdefault(i, MISSING)
    return ReplyReading(found, dict(sorted(unreadable.items())))


def _json_pairs(text: str) -> list[tuple[str, str, int]]:
    """(key, value, index of the value's first character) of a flat JSON object, read until it stops fitting."""
    lexemes = [(m.group(), m.start()) for m in _JSON_LEXEME.finditer(text)]
    if not lexemes or lexemes[0][0] != "{":
        return []
    pairs: list[tuple[str, str, int]] = []
    i = 1
    while i + 3 <= len(lexemes):
        (key, _), (colon, _), (value, at) = lexemes[i : i + 3]
        name, content = _string(key), _scalar(value)
        if name is None or colon != ":" or content is None:
            break
        pairs.append((name, content, at + int(value.startswith('"'))))
        if i + 3 == len(lexemes) or lexemes[i + 3][0] != ",":
            break
        i += 4
    return pairs


def _scalar(lexeme: str) -> str | None:
    """The text of a JSON string or bare scalar (``4``, ``null``); None for structure or a broken string."""
    if lexeme.startswith('"'):
        return _string(lexeme)
    return None if lexeme in "{}[]:," else lexeme


def _string(lexeme: str) -> str | None:
    """The text of a JSON string literal; None if it is not one (unterminated, or an invalid escape)."""
    if len(lexeme) < 2 or not lexeme[0] == lexeme[-1] == '"':
        return None
    try:
        return str(json.loads(lexeme))
    except json.JSONDecodeError:
        return None


def _joined(tokens: Sequence[str]) -> tuple[str, list[int]]:
    """The reply text and the character offset where each token starts."""
    starts, offset = [], 0
    for tok in tokens:
        starts.append(offset)
        offset += len(tok)
    return "".join(tokens), starts


def _token_at(starts: Sequence[int], tokens: Sequence[str], char: int, pad: str | None) -> int | None:
    """The token holding character ``char``, if everything before it in that token is padding (None: whitespace)."""
    for i, (start, tok) in enumerate(zip(starts, tokens)):
        if start > char:
            return None
        if start + len(tok) > char:
            return i if tok[: char - start].strip(pad) == "" else None
    return None
