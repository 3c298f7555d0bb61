"""Event sources for ``convowatch replay``, and the pacing that plays them in (scaled) real time.

Each source yields `ReplayItem`s: the bytes and key to send, the event they
encode and its event time. Sources:

* `jsonl_events` — a file of contract events, one JSON object per line, sent
  byte for byte; lines that break the contract become items with ``error``
  set (the caller refuses the file or skips and reports them).
* `llm_rubric_events` — the 223 real LLM-Rubric conversations, timed from
  their MongoDB ObjectIds.
* `uss_events` — the USS MWOZ/SGD dialogues (not shipped: ``../shared/data/uss``).
* `synthetic_events` — a deterministic, interleaved workload for benchmarks.

Corpus sources load and check everything before they return, so a bad file is
refused before anything is sent. Nothing here talks to Kafka.
"""

from __future__ import annotations

import heapq
import json
import math
import random
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from scorers.datasets.llm_rubric import RubricDataError, load_real_conversations
from scorers.datasets.uss import UssFormatError, read_uss
from scorers.errors import UserError
from stream.contract import (
    MAX_EVENT_BYTES,
    MAX_TEXT_BYTES,
    EndEvent,
    Event,
    InvalidEvent,
    TurnEvent,
    encode_event,
    event_key,
    parse_event,
)

DEFAULT_START = 1_704_067_200.0  # 2024-01-01T00:00:00Z: fixed, so replays are reproducible
LLM_RUBRIC_REAL_DATA = Path(__file__).resolve().parents[2] / "data" / "llm-rubric" / "real_data.json"
LLM_RUBRIC_PRODUCT = "llm-rubric-demo"
_OBJECT_ID = re.compile(r"[0-9a-f]{24}")


class ReplayError(UserError, ValueError):
    """A replay source that cannot be read; the message names the file and line (or conversation)."""


@dataclass(frozen=True)
class ReplayItem:
    """One record to send: ``raw`` with ``key`` at event time ``at`` (UTC epoch seconds).

    ``event`` is what ``raw`` encodes; for a JSONL line that breaks the
    contract it is None and ``error`` says why (``at`` is then the previous
    good line's time, 0.0 before any). ``where`` locates the item in its source.
    """

    at: float
    event: Event | None
    raw: bytes
    key: bytes | None
    error: InvalidEvent | None = None
    where: str = ""

    @classmethod
    def of(cls, event: Event, where: str = "") -> ReplayItem:
        """The item that sends ``event`` in canonical form (raises `InvalidEvent` if it breaks the contract)."""
        return cls(at=event.timestamp, event=event, raw=encode_event(event), key=event_key(event), where=where)


def _merge_by_time(conversations: Sequence[Sequence[ReplayItem]]) -> Iterator[ReplayItem]:
    """Interleave per-conversation item lists (each in time order) into one stream in event-time order."""
    return heapq.merge(*conversations, key=lambda item: item.at)


def _conversation_items(
    conversation_id: str,
    turns: Sequence[tuple[str, str]],
    start: float,
    turn_gap_s: float,
    attributes: Mapping[str, str],
    where: str,
) -> list[ReplayItem]:
    """Turn i at ``start + i * turn_gap_s``, then an end event one gap after the last turn."""
    try:
        items = [
            ReplayItem.of(TurnEvent(conversation_id, i, role, text, start + i * turn_gap_s, dict(attributes)), f"{where}#{i}")
            for i, (role, text) in enumerate(turns)
        ]
        items.append(
            ReplayItem.of(EndEvent(conversation_id, start + len(turns) * turn_gap_s, "end", dict(attributes)), f"{where}#end")
        )
    except InvalidEvent as e:
        raise ReplayError(f"{where}: the conversation cannot be sent as contract events: {e}") from None
    return items


def _check_gap(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


# --- JSONL ------------------------------------------------------------------------


def _key_of_bad_line(line: bytes) -> bytes | None:
    """The conversation id of a refused line when it has a usable one, so a skip-and-send caller can still key it."""
    try:
        obj = json.loads(line)
        cid = obj.get("conversation_id") if isinstance(obj, dict) else None
        return cid.encode("utf-8") if isinstance(cid, str) and cid else None
    except (ValueError, RecursionError):  # not JSON, not UTF-8, lone surrogates
        return None


def jsonl_events(
    path: str | Path, *, max_text_bytes: int = MAX_TEXT_BYTES, max_event_bytes: int = MAX_EVENT_BYTES
) -> Iterator[ReplayItem]:
    """The events of a JSONL file, in file order, each line checked with `parse_event`.

    A valid line is sent byte for byte (newline removed), keyed by its
    conversation id. An invalid one yields an item with ``error`` set and
    ``where`` = ``file:line``. Blank lines are not events and are skipped.
    """
    path = Path(path)
    if not path.is_file():
        raise ReplayError(f"{path}: no such file")

    def lines() -> Iterator[ReplayItem]:
        last_at = 0.0
        with path.open("rb") as f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip(b"\n").rstrip(b"\r")
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    event = parse_event(line, max_text_bytes=max_text_bytes, max_event_bytes=max_event_bytes)
                except InvalidEvent as e:
                    yield ReplayItem(last_at, None, line, _key_of_bad_line(line), e, where)
                    continue
                last_at = event.timestamp
                yield ReplayItem(event.timestamp, event, line, event_key(event), None, where)

    return lines()


# --- LLM-Rubric ---------------------------------------------------------------------


def object_id_time(object_id: str) -> float:
    """Creation time (UTC epoch seconds) in a MongoDB ObjectId: its first 4 bytes, big-endian."""
    if not _OBJECT_ID.fullmatch(object_id):
        raise ValueError(f"{object_id!r} is not a MongoDB ObjectId (24 lower-case hex digits)")
    return float(int(object_id[:8], 16))


def llm_rubric_events(
    real_data_json: str | Path = LLM_RUBRIC_REAL_DATA,
    turn_gap_s: float = 30.0,
    attributes: Mapping[str, str] | None = None,
) -> Iterator[ReplayItem]:
    """The real LLM-Rubric conversations as events, merged in event-time order.

    A conversation starts at its ObjectId's creation time; turn i comes
    ``i * turn_gap_s`` later and the end event one gap after the last turn.
    Attributes: ``dialogue_version`` ("0"/"1"/"2"), ``topic``, ``product``
    (llm-rubric-demo), ``model_version`` ("variant-" + dialogue_version),
    then ``attributes`` (which may override them).
    """
    _check_gap("turn_gap_s", turn_gap_s)
    path = Path(real_data_json)
    try:
        conversations = load_real_conversations(path)
    except RubricDataError as e:
        raise ReplayError(str(e)) from None
    timed = []
    for cid, conversation in conversations.items():
        where = f"{path.name}[{cid}]"
        try:
            start = object_id_time(cid)
        except ValueError as e:
            raise ReplayError(f"{path}: conversation {cid!r}: {e}") from None
        version = conversation.attributes.get("dialogue_version", "")
        if not version:
            raise ReplayError(f"{path}: conversation {cid!r} has no dialogue_version")
        attrs = {
            "dialogue_version": version,
            "topic": conversation.attributes.get("topic", ""),
            "product": LLM_RUBRIC_PRODUCT,
            "model_version": f"variant-{version}",
            **(attributes or {}),
        }
        turns = [(t.role, t.text) for t in conversation.turns]
        timed.append((start, cid, _conversation_items(cid, turns, start, turn_gap_s, attrs, where)))
    timed.sort(key=lambda t: (t[0], t[1]))  # ties in time: earlier-starting conversation, then id, first
    return _merge_by_time([items for _, _, items in timed])


# --- USS (User Satisfaction Simulation) --------------------------------------------------


def uss_events(
    path: str | Path,
    start: float = DEFAULT_START,
    turn_gap_s: float = 30.0,
    conversation_gap_s: float = 60.0,
) -> Iterator[ReplayItem]:
    """The dialogues of a USS file (MWOZ.txt, SGD.txt) as events, merged in event-time order.

    The file is read by `scorers.datasets.uss.read_uss` (a format error becomes a
    `ReplayError` with the same message), so ids are the learning data's:
    ``<file stem>-<NNNN>`` (``MWOZ-0001``). Dialogue k (0-based) starts at
    ``start + k * conversation_gap_s``. Every event of a dialogue carries
    ``product`` (``uss-<dataset>``), ``dataset`` (the file stem in lower case)
    and ``uss_overall_mean`` (the OVERALL raters' mean, ``%.2f``). The
    OVERALL line is not a turn.
    """
    _check_gap("turn_gap_s", turn_gap_s)
    _check_gap("conversation_gap_s", conversation_gap_s)
    path = Path(path)
    dataset = path.stem.lower()
    try:
        dialogues = read_uss(path)
    except UssFormatError as e:
        raise ReplayError(str(e)) from None
    conversations = []
    for k, d in enumerate(dialogues):
        attrs = {"product": f"uss-{dataset}", "dataset": dataset, "uss_overall_mean": f"{d.mean_overall:.2f}"}
        turns = [(t.role, t.text) for t in d.conversation.turns]
        conversations.append(
            _conversation_items(d.id, turns, start + k * conversation_gap_s, turn_gap_s, attrs, f"{path}:{d.first_line}")
        )
    return _merge_by_time(conversations)


# --- synthetic workload -------------------------------------------------------------------


def synthetic_events(
    n_conversations: int,
    turns_per_conversation: int,
    seed: int,
    text_bytes: int = 200,
    start: float = DEFAULT_START,
    window: int = 50,
    event_interval_s: float = 0.01,
) -> Iterator[ReplayItem]:
    """A deterministic benchmark workload: ``n_conversations`` of ``turns_per_conversation`` turns and an end event.

    Up to ``window`` conversations are open at once; each next event goes to
    a (seeded) random open conversation, and a finished one is replaced by a
    new one, as in production traffic. Events are ``event_interval_s`` apart;
    texts are ``text_bytes`` ASCII bytes of pseudo-words. Same arguments, same bytes.
    """
    if n_conversations < 0 or turns_per_conversation < 1 or text_bytes < 0 or window < 1:
        raise ValueError("need n_conversations >= 0, turns_per_conversation >= 1, text_bytes >= 0, window >= 1")
    _check_gap("event_interval_s", event_interval_s)
    rng = random.Random(seed)
    vocabulary = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(500)]
    pool = " ".join(rng.choices(vocabulary, k=max(2000, text_bytes)))
    pool = (pool + " ") * (1 + (2 * text_bytes) // len(pool))  # long enough for any slice
    roles = ("user", "assistant")

    def new_conversation(i: int) -> list:
        attrs = {
            "product": rng.choice(("synthetic-chat", "synthetic-support")),
            "model_version": rng.choice(("variant-a", "variant-b")),
            "locale": rng.choice(("en-US", "en-GB", "de-DE")),
        }
        return [f"synth-{seed}-{i:06d}", 0, attrs]

    def events() -> Iterator[ReplayItem]:
        opened = min(window, n_conversations)
        open_ = [new_conversation(i) for i in range(opened)]
        k = 0
        while open_:
            slot = rng.randrange(len(open_))
            cid, turn, attrs = open_[slot]
            at = start + k * event_interval_s
            k += 1
            if turn < turns_per_conversation:
                offset = rng.randrange(len(pool) - text_bytes)
                event: Event = TurnEvent(cid, turn, roles[turn % 2], pool[offset : offset + text_bytes], at, dict(attrs))
                open_[slot][1] = turn + 1
            else:
                event = EndEvent(cid, at, "end", dict(attrs))
                if opened < n_conversations:
                    open_[slot] = new_conversation(opened)
                    opened += 1
                else:
                    open_.pop(slot)
            yield ReplayItem.of(event, cid)

    return events()


# --- pacing ---------------------------------------------------------------------------------


def paced(
    items: Iterable[ReplayItem],
    speed: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[ReplayItem]:
    """Yield ``items`` so that their event-time gaps pass in ``gap / speed`` seconds of wall time.

    The schedule is absolute (relative to the first good item), so time the
    caller spends sending is not added to every gap. ``speed`` 0 or infinity:
    as fast as possible. Items with ``error`` set and items whose time is
    already past are yielded at once.
    """
    if not speed >= 0:  # also refuses NaN
        raise ValueError(f"speed must be >= 0 (0 or inf = as fast as possible), got {speed!r}")
    unpaced = speed == 0 or math.isinf(speed)
    origin: tuple[float, float] | None = None  # (wall clock, event time) of the first good item
    for item in items:
        if not unpaced and item.error is None:
            if origin is None:
                origin = (clock(), item.at)
            else:
                delay = origin[0] + (item.at - origin[1]) / speed - clock()
                if delay > 0:
                    sleep(delay)
        yield item
