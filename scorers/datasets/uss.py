"""Readers that turn public satisfaction data sets into labelled conversations for rubric learning.

USS (User Satisfaction Simulation, Sun et al., SIGIR 2021; ``MWOZ.txt`` /
``SGD.txt``): one turn per line, ``ROLE<TAB>text<TAB>action<TAB>ratings``,
dialogues separated by blank lines. ``ROLE`` is ``USER`` or ``SYSTEM``; every
USER line carries the comma-separated 1-5 ratings of the crowd raters; the
last line of a dialogue is ``USER<TAB>OVERALL<TAB><TAB>ratings``, the
dialogue-level satisfaction. `read_uss` keeps the turns (USER -> ``user``,
SYSTEM -> ``assistant``), each user turn's crowd ratings and the OVERALL
ratings; dialogue ids are ``<file stem>-<1-based position>`` (``MWOZ-0001``).
Any deviation from the format is a `UssFormatError` naming the file and line.
It is the project's one USS parser: ``convowatch replay uss`` reads the files
with it too, so a replayed dialogue and the same one in a learning data set
share an id.

`uss_labelled` labels a dialogue negative when its mean OVERALL rating is
below 3 and positive when it is at least 3.5; the ones in between are
returned apart (they are not training data). `llm_rubric_labelled` labels the
LLM-Rubric conversations from the human judges' mean Q0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scorers.conversation import Conversation, Role, Turn
from scorers.datasets.labelled import LabelledConversation, LabelledDataError
from scorers.datasets.llm_rubric import (
    NEGATIVE_MAX_MEAN_Q0,
    REAL_CONVERSATIONS_FILE,
    load_real_conversations,
    load_split,
    satisfaction_labels,
)
from scorers.errors import UserError

USS_ROLES: dict[str, Role] = {"USER": "user", "SYSTEM": "assistant"}
OVERALL = "OVERALL"
RATING_MIN, RATING_MAX = 1, 5
NEGATIVE_BELOW = 3.0
POSITIVE_AT_LEAST = 3.5


class UssFormatError(UserError, ValueError):
    """A USS file that does not follow the format; names the file and line."""


@dataclass(frozen=True)
class UssDialogue:
    """One USS dialogue: its turns, the crowd's per-turn ratings and the dialogue-level (OVERALL) ratings.

    ``turn_ratings[i]`` are the raters' 1-5 satisfaction at ``conversation.turns[i]``
    (``()`` for a system turn); ``first_line`` is the dialogue's first line in the file.
    """

    id: str
    conversation: Conversation
    overall_ratings: tuple[int, ...]
    mean_overall: float
    first_line: int
    turn_ratings: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if len(self.turn_ratings) != len(self.conversation.turns):
            raise ValueError(f"{self.id}: {len(self.turn_ratings)} turn ratings for {len(self.conversation.turns)} turns")


def _ratings(cell: str, where: str) -> tuple[int, ...]:
    """Comma-separated ASCII integers 1..5 (``int()`` alone would also take ``' 3'``, ``'+3'`` or non-ASCII digits)."""
    parts = cell.split(",")
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise UssFormatError(f"{where}: ratings {cell!r} are not comma-separated integers")
    values = tuple(int(p) for p in parts)
    if any(not RATING_MIN <= v <= RATING_MAX for v in values):
        raise UssFormatError(f"{where}: ratings {cell!r} must be {RATING_MIN}..{RATING_MAX}")
    return values


def _lines(path: Path) -> list[str]:
    """The file's lines, LF or CRLF ended, each decoded as UTF-8 (an error names the line); no trailing empty line."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UssFormatError(f"{path}: cannot read: {e}") from None
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    lines = []
    for line_no, raw in enumerate(raw_lines, start=1):
        try:
            lines.append(raw.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError as e:
            raise UssFormatError(f"{path}:{line_no}: not UTF-8 ({e.reason} at byte {e.start})") from None
    return lines


def read_uss(path: str | Path) -> list[UssDialogue]:
    """All dialogues of one USS file, in file order; any deviation from the format is a `UssFormatError` naming file:line.

    A dialogue is its turn lines then its ``USER<TAB>OVERALL<TAB><TAB>ratings``
    line, then a blank line (or the end of the file). Turn texts must be
    non-empty, USER turns carry ratings and SYSTEM turns none.
    """
    path = Path(path)
    lines = _lines(path)
    dialogues: list[UssDialogue] = []
    turns: list[Turn] = []
    turn_ratings: list[tuple[int, ...]] = []
    overall_seen = False  # the current dialogue's OVERALL line has been read; only a blank line may follow
    first_line = 0

    def close(where: str) -> None:
        nonlocal turns, turn_ratings, overall_seen
        if turns and not overall_seen:
            raise UssFormatError(f"{where}: the dialogue starting at line {first_line} has no final USER OVERALL line")
        turns, turn_ratings, overall_seen = [], [], False

    for line_no, line in enumerate(lines, start=1):
        where = f"{path}:{line_no}"
        if not line.strip():
            close(where)
            continue
        fields = line.split("\t")
        if len(fields) != 4:
            raise UssFormatError(f"{where}: expected 4 tab-separated fields (role, text, action, ratings), got {len(fields)}")
        role, text, _action, ratings = fields
        if role not in USS_ROLES:
            raise UssFormatError(f"{where}: role {role!r} is not one of {sorted(USS_ROLES)}")
        if overall_seen:
            raise UssFormatError(f"{where}: a line after the dialogue's OVERALL line (dialogues are separated by a blank line)")
        if not turns:
            first_line = line_no
        if role == "USER" and text == OVERALL:
            if not turns:
                raise UssFormatError(f"{where}: OVERALL line before any turn")
            overall = _ratings(ratings, where)
            did = f"{path.stem}-{len(dialogues) + 1:04d}"
            conversation = Conversation(did, tuple(turns), {"dataset": path.stem, "first_line": str(first_line)})
            dialogues.append(UssDialogue(did, conversation, overall, float(np.mean(overall)), first_line, tuple(turn_ratings)))
            overall_seen = True
            continue
        if not text.strip():
            raise UssFormatError(f"{where}: empty turn text")
        if role == "USER":
            turn_ratings.append(_ratings(ratings, where))  # every user turn must carry valid ratings
        elif ratings:
            raise UssFormatError(f"{where}: a SYSTEM line carries ratings {ratings!r}; only USER lines are rated")
        else:
            turn_ratings.append(())
        turns.append(Turn(role=USS_ROLES[role], text=text))
    close(f"{path}:{len(lines)}")
    if not dialogues:
        raise UssFormatError(f"{path}: no dialogues")
    return dialogues


def uss_labelled(
    dialogues: Sequence[UssDialogue],
    negative_below: float = NEGATIVE_BELOW,
    positive_at_least: float = POSITIVE_AT_LEAST,
) -> tuple[list[LabelledConversation], list[UssDialogue]]:
    """(labelled, middle): negative when mean OVERALL < ``negative_below``, positive when >= ``positive_at_least``.

    Dialogues in between are not training data; they come back as ``middle``
    so a report can say how the learned set labels them.
    """
    if not (math.isfinite(negative_below) and math.isfinite(positive_at_least)) or negative_below > positive_at_least:
        raise LabelledDataError(f"negative_below ({negative_below}) must be <= positive_at_least ({positive_at_least})")
    labelled: list[LabelledConversation] = []
    middle: list[UssDialogue] = []
    for d in dialogues:
        if d.mean_overall < negative_below:
            labelled.append(LabelledConversation(d.conversation, False))
        elif d.mean_overall >= positive_at_least:
            labelled.append(LabelledConversation(d.conversation, True))
        else:
            middle.append(d)
    return labelled, middle


def stratified_split(
    items: Sequence[LabelledConversation],
    test_fraction: float = 0.5,
    n_per_class: int | None = None,
    seed: int = 0,
) -> tuple[list[LabelledConversation], list[LabelledConversation]]:
    """(train, test) with each class split ``test_fraction`` to test, at random with ``seed``.

    ``n_per_class`` first draws that many positives and that many negatives
    (before splitting), to bound the judge's work: with 50 per class and a
    50/50 split, train and test each get 25 + 25. Both parts keep the input
    order of the items they hold.
    """
    if not 0.0 < test_fraction < 1.0:
        raise LabelledDataError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    train_idx: list[int] = []
    test_idx: list[int] = []
    for positive in (True, False):
        members = np.array([i for i, item in enumerate(items) if item.positive == positive], dtype=int)
        name = "positive" if positive else "negative"
        if n_per_class is not None:
            if n_per_class < 2:
                raise LabelledDataError(f"n_per_class must be >= 2, got {n_per_class}")
            if len(members) < n_per_class:
                raise LabelledDataError(f"asked for {n_per_class} {name} conversations, only {len(members)} available")
            members = rng.choice(members, n_per_class, replace=False)
        shuffled = rng.permutation(members)
        n_test = int(round(len(shuffled) * test_fraction))
        if n_test == 0 or n_test == len(shuffled):
            raise LabelledDataError(
                f"{len(shuffled)} {name} conversation(s) cannot be split {1 - test_fraction:.0%}/{test_fraction:.0%} "
                "with both parts non-empty"
            )
        test_idx.extend(int(i) for i in shuffled[:n_test])
        train_idx.extend(int(i) for i in shuffled[n_test:])
    return [items[i] for i in sorted(train_idx)], [items[i] for i in sorted(test_idx)]


def llm_rubric_labelled(
    data_dir: str | Path,
    split: str = "real",
    negative_max: float = NEGATIVE_MAX_MEAN_Q0,
) -> list[LabelledConversation]:
    """LLM-Rubric conversations labelled by their human judges' mean Q0 (negative when <= ``negative_max``).

    ``real``: the 223 real conversations with their turns (a labelled
    conversation without text is an error). ``synth``: the synthetic
    conversations are published without text, so they come with no turns
    (only a recorded judge, which answers by id, can rate them). Sorted by id.
    """
    data_dir = Path(data_dir)
    labels = satisfaction_labels(load_split(data_dir, split), negative_max)
    texts: dict[str, Conversation] = {}
    if split == "real":
        texts = load_real_conversations(data_dir / REAL_CONVERSATIONS_FILE)
        missing = sorted(set(labels) - set(texts))
        if missing:
            raise LabelledDataError(f"{data_dir / REAL_CONVERSATIONS_FILE}: no text for labelled conversations {missing[:5]}")
    return [LabelledConversation(texts.get(tid) or Conversation(tid, ()), positive) for tid, positive in sorted(labels.items())]
