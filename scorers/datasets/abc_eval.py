"""The reader of GPT-ABCEval's behaviour labels (``behavior-classification-results.json``; ``../shared/data/abc-eval``).

Finch, Finch & Choi (SIGDIAL 2023): 108 human–chatbot conversations of four bots (the dialogue id's suffix after
the first ``_``), 1,634 bot turns; per bot turn and each of nine ABC-Eval behaviours, two human annotators' binary
labels and GPT-3.5's (``gpt``, the paper's best prompt). The file is research data without a licence: it is read
from ``../shared``, never copied. Any deviation from the format is an `AbcEvalFormatError` naming the dialogue.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scorers.errors import UserError

RESULTS_FILE = "behavior-classification-results.json"
BEHAVIOURS = (
    "commonsense contradiction",
    "empathetic",
    "ignore",
    "incorrect fact",
    "irrelevant",
    "lack of empathy",
    "partner contradiction",
    "redundant",
    "self contradiction",
)


class AbcEvalFormatError(UserError, ValueError):
    """A GPT-ABCEval results file that does not follow the format."""


@dataclass(frozen=True)
class BotTurn:
    """One bot turn: the user turn it answered, its text, and per behaviour the humans' and GPT-3.5's labels."""

    user: str
    system: str
    human: dict[str, tuple[int, int]]
    gpt: dict[str, int]


@dataclass(frozen=True)
class AbcEvalDialogue:
    """One conversation: its id, the bot that took part, and its bot turns in order."""

    dialogue_id: str
    bot: str
    turns: tuple[BotTurn, ...]


def _label(value: object, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return value
    raise AbcEvalFormatError(f"{where}: a label must be 0 or 1, got {value!r}")


def _turn(raw: object, where: str) -> BotTurn:
    if not isinstance(raw, dict) or not isinstance(raw.get("user"), str) or not isinstance(raw.get("system"), str):
        raise AbcEvalFormatError(f"{where}: a turn needs 'user' and 'system' texts")
    behaviours = raw.get("behaviors")
    if not isinstance(behaviours, dict) or set(behaviours) != set(BEHAVIOURS):
        raise AbcEvalFormatError(f"{where}: 'behaviors' must hold exactly the nine behaviours {list(BEHAVIOURS)}")
    human, gpt = {}, {}
    for b in BEHAVIOURS:
        labels = behaviours[b]
        if not isinstance(labels, dict) or not isinstance(labels.get("human"), list) or len(labels["human"]) != 2:
            raise AbcEvalFormatError(f"{where}, {b}: needs two human labels and a gpt label")
        a, c = (_label(v, f"{where}, {b}, human") for v in labels["human"])
        human[b] = (a, c)
        gpt[b] = _label(labels.get("gpt"), f"{where}, {b}, gpt")
    return BotTurn(raw["user"], raw["system"], human, gpt)


def load_abc_eval(path: str | Path) -> tuple[AbcEvalDialogue, ...]:
    """Read the results file (or the folder holding it): the dialogues in the file's order."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise AbcEvalFormatError(f"{path}: cannot read it as JSON ({e})") from None
    if not isinstance(raw, dict) or not raw:
        raise AbcEvalFormatError(f"{path}: expected an object of dialogue id -> turns")
    dialogues = []
    for dialogue_id, turns in raw.items():
        bot = dialogue_id.partition("_")[2]
        if not bot or not isinstance(turns, list) or not turns:
            raise AbcEvalFormatError(f"{path}: dialogue {dialogue_id!r} needs a bot suffix and a list of turns")
        parsed = tuple(_turn(t, f"{path}: {dialogue_id} turn {i}") for i, t in enumerate(turns))
        dialogues.append(AbcEvalDialogue(dialogue_id, bot, parsed))
    return tuple(dialogues)
