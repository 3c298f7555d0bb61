"""Rubric pools: the candidate assertions that RUBICON's selection chooses from.

A *pool* is a flat list of `PoolRubric`s (id, assertion text, SAT/DSAT
polarity, where it came from, free metadata), the versions of the prompts that
generated them, and pool metadata. Seed pools ship with the project; a rubric
generator (``scorers.learning.generation``) produces ``source="generated"``
rubrics; `merge` joins pools; selection (``scorers.learning.selection``) turns a
chosen subset into a `scorers.rubrics.RubricSet`.

File format (JSON, UTF-8), one pool per file::

    {"schema_version": 1,
     "prompt_versions": {"extract": "extract-v1"},      # str -> str, may be empty
     "metadata": {"name": "seed", ...},                  # any JSON object
     "rubrics": [
        {"id": "generic.sat.resolves",                   # rubrics.RUBRIC_ID_PATTERN
         "text": "The assistant resolves the user's request.",
         "polarity": "sat",                              # "sat" | "dsat"
         "source": "seed:generic",                       # one of SOURCES
         "metadata": {}}]}                               # optional JSON object

Rules (checked on load and on construction; errors name the field): ids unique
and id-shaped; texts are single-line assertions of 1..`MAX_TEXT_CHARS`
characters without surrounding whitespace; no two texts equal after folding
case and whitespace (`text_key`); unknown keys are refused (typos do not pass
silently). Every rubric is answered on the 5-point Likert agreement scale
(`scorers.rubrics.LIKERT_SCALE`: Strongly disagree .. Strongly agree ->
0, 2.5, 5, 7.5, 10); `to_rubric` makes that explicit.

Packaged pools (``scorers/data/``): `seed_pool` (generic SAT/DSAT, AMULET's 12
sub-maxims as SAT assertions, ABC-Eval behaviours as DSAT assertions),
`generic_baseline_pool` (a few SPUR/Bing-style generic signals) and
`direct_question_pool` (the single SAT rubric "Overall, the user is satisfied
with the conversation."). Their metadata cite the sources.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from scorers.errors import UserError
from scorers.json_file import loads_strict, write_json
from scorers.rubrics import LIKERT_SCALE, RUBRIC_ID_PATTERN, Polarity, Rubric, RubricSet

POOL_SCHEMA_VERSION = 1
MAX_TEXT_CHARS = 200  # "short" assertions: one sentence a judge reads in one go
SOURCES: tuple[str, ...] = (
    "seed:generic",
    "seed:amulet",
    "seed:abc-eval",
    "seed:baseline",  # generic SPUR/Bing-style baseline set
    "seed:direct",  # the single direct satisfaction question
    "generated",  # produced by a generative model (scorers.learning.generation)
    "manual",  # written by the team that runs convowatch
)
SEED_POOL_FILE = "seed_pool.json"
GENERIC_BASELINE_POOL_FILE = "generic_baseline_pool.json"
DIRECT_QUESTION_POOL_FILE = "direct_question_pool.json"

_TOP_KEYS = {"schema_version", "prompt_versions", "metadata", "rubrics"}
_RUBRIC_KEYS = {"id", "text", "polarity", "source", "metadata"}
_RUBRIC_REQUIRED = ("id", "text", "polarity", "source")


class RubricPoolError(UserError, ValueError):
    """A pool or pool file that is not usable; names the field (``rubrics[3].text``) and, for files, the path."""

    def __init__(self, field: str, reason: str, source: str | None = None) -> None:
        self.field = field
        self.reason = reason
        self.source = source
        where = f"{field}: " if field else ""
        super().__init__(f"{source}: {where}{reason}" if source else f"{where}{reason}")


def text_key(text: str) -> str:
    """What makes two rubric texts duplicates: equal after folding case and runs of whitespace."""
    return " ".join(text.split()).casefold()


def _check_json_object(value: Any, field_name: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise RubricPoolError(field_name, f"must be a JSON object, got {type(value).__name__}")
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise RubricPoolError(field_name, f"must be JSON-serialisable: {e}") from None
    return dict(value)


@dataclass(frozen=True)
class PoolRubric:
    """One candidate rubric: an assertion rated on the 5-point Likert scale, SAT or DSAT."""

    id: str
    text: str
    polarity: Polarity
    source: str
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not re.fullmatch(RUBRIC_ID_PATTERN, self.id):
            raise RubricPoolError("id", f"{self.id!r} does not match {RUBRIC_ID_PATTERN}")
        if not isinstance(self.text, str) or not self.text.strip():
            raise RubricPoolError("text", f"rubric {self.id!r}: must be a non-empty string")
        if self.text != self.text.strip() or "\n" in self.text or "\r" in self.text:
            raise RubricPoolError("text", f"rubric {self.id!r}: must be one line without surrounding whitespace")
        if len(self.text) > MAX_TEXT_CHARS:
            raise RubricPoolError("text", f"rubric {self.id!r}: {len(self.text)} characters, at most {MAX_TEXT_CHARS}")
        try:
            object.__setattr__(self, "polarity", Polarity(self.polarity))
        except ValueError:
            raise RubricPoolError("polarity", f"rubric {self.id!r}: {self.polarity!r} is not 'sat' or 'dsat'") from None
        if self.source not in SOURCES:
            raise RubricPoolError("source", f"rubric {self.id!r}: {self.source!r} is not one of {list(SOURCES)}")
        object.__setattr__(self, "metadata", _check_json_object(self.metadata, "metadata"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "text": self.text, "polarity": self.polarity.value, "source": self.source}
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out


def to_rubric(pool_rubric: PoolRubric) -> Rubric:
    """The `Rubric` a judge answers: the assertion on the 5-point Likert scale mapped to 0..10."""
    return Rubric(id=pool_rubric.id, text=pool_rubric.text, polarity=pool_rubric.polarity, scale=LIKERT_SCALE)


@dataclass(frozen=True)
class RubricPool:
    """An ordered pool of candidate rubrics; column j of a ratings matrix is ``rubrics[j]``."""

    rubrics: tuple[PoolRubric, ...]
    prompt_versions: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rubrics", tuple(self.rubrics))
        if not self.rubrics:
            raise RubricPoolError("rubrics", "a pool needs at least one rubric")
        ids: dict[str, int] = {}
        texts: dict[str, int] = {}
        for i, r in enumerate(self.rubrics):
            if not isinstance(r, PoolRubric):
                raise RubricPoolError(f"rubrics[{i}]", f"must be a PoolRubric, got {type(r).__name__}")
            if r.id in ids:
                raise RubricPoolError(f"rubrics[{i}].id", f"duplicate id {r.id!r} (also rubrics[{ids[r.id]}])")
            ids[r.id] = i
            key = text_key(r.text)
            if key in texts:
                raise RubricPoolError(f"rubrics[{i}].text", f"duplicate text {r.text!r} (also rubrics[{texts[key]}])")
            texts[key] = i
        versions = self.prompt_versions
        if not isinstance(versions, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in versions.items()):
            raise RubricPoolError("prompt_versions", "must map prompt names to version strings")
        object.__setattr__(self, "prompt_versions", dict(versions))
        object.__setattr__(self, "metadata", _check_json_object(self.metadata, "metadata"))

    def __len__(self) -> int:
        return len(self.rubrics)

    def __iter__(self) -> Iterator[PoolRubric]:
        return iter(self.rubrics)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(r.id for r in self.rubrics)

    @property
    def polarities(self) -> tuple[Polarity, ...]:
        return tuple(r.polarity for r in self.rubrics)

    def index(self, rubric_id: str) -> int:
        """Column of ``rubric_id``; `RubricPoolError` if absent."""
        for i, r in enumerate(self.rubrics):
            if r.id == rubric_id:
                return i
        raise RubricPoolError("id", f"no rubric {rubric_id!r} in the pool")

    def subset(self, indices: Sequence[int]) -> RubricPool:
        """The rubrics at ``indices`` (in that order), same prompt versions and metadata."""
        return RubricPool(tuple(self.rubrics[i] for i in indices), self.prompt_versions, self.metadata)

    def rubric_set(self, metadata: Mapping[str, Any] | None = None) -> RubricSet:
        """Every rubric of the pool as an unfitted `RubricSet` (the "all rubrics" baseline)."""
        return RubricSet(tuple(to_rubric(r) for r in self.rubrics), metadata=dict(metadata or {}))

    def content_hash(self) -> str:
        """SHA-256 (16 hex) of ids, texts and polarities in order: names the pool a ratings matrix belongs to."""
        canonical = json.dumps([[r.id, r.text, r.polarity.value] for r in self.rubrics], ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]

    # -- file format ------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": POOL_SCHEMA_VERSION,
            "prompt_versions": dict(self.prompt_versions),
            "metadata": dict(self.metadata),
            "rubrics": [r.to_dict() for r in self.rubrics],
        }

    def save(self, path: str | Path) -> None:
        """Write the JSON file atomically."""
        write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, doc: Any, source: str | None = None) -> RubricPool:
        """Validate a parsed document and build the pool; errors carry ``source`` (a path) and the field."""
        try:
            return _from_dict(doc)
        except RubricPoolError as e:
            raise RubricPoolError(e.field, e.reason, source) from None

    @classmethod
    def load(cls, path: str | Path) -> RubricPool:
        """Read and validate a pool file."""
        path = Path(path)
        try:
            doc = loads_strict(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise RubricPoolError("", f"cannot read rubric pool: {e}", str(path)) from None
        return cls.from_dict(doc, source=str(path))


def _from_dict(doc: Any) -> RubricPool:
    if not isinstance(doc, dict):
        raise RubricPoolError("(top level)", f"must be a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise RubricPoolError("(top level)", f"unknown key(s) {unknown}; expected {sorted(_TOP_KEYS)}")
    if doc.get("schema_version") != POOL_SCHEMA_VERSION:
        raise RubricPoolError(
            "schema_version", f"this convowatch reads version {POOL_SCHEMA_VERSION}, got {doc.get('schema_version')!r}"
        )
    raw_rubrics = doc.get("rubrics")
    if not isinstance(raw_rubrics, list) or not raw_rubrics:
        raise RubricPoolError("rubrics", "must be a non-empty list")
    rubrics = []
    for i, raw in enumerate(raw_rubrics):
        where = f"rubrics[{i}]"
        if not isinstance(raw, dict):
            raise RubricPoolError(where, f"must be an object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - _RUBRIC_KEYS)
        if unknown:
            raise RubricPoolError(where, f"unknown key(s) {unknown}; expected {sorted(_RUBRIC_KEYS)}")
        for key in _RUBRIC_REQUIRED:
            if not isinstance(raw.get(key), str):
                raise RubricPoolError(f"{where}.{key}", f"required string, got {raw.get(key)!r}")
        try:
            rubrics.append(PoolRubric(raw["id"], raw["text"], raw["polarity"], raw["source"], raw.get("metadata", {})))
        except RubricPoolError as e:
            raise RubricPoolError(f"{where}.{e.field}", e.reason) from None
    prompt_versions = doc.get("prompt_versions", {})
    if not isinstance(prompt_versions, dict):
        raise RubricPoolError("prompt_versions", "must be an object of strings")
    for k, v in prompt_versions.items():
        if not isinstance(v, str):
            raise RubricPoolError(f"prompt_versions.{k}", f"must be a string, got {v!r}")
    return RubricPool(tuple(rubrics), prompt_versions, doc.get("metadata", {}))


def merge(*pools: RubricPool, metadata: Mapping[str, Any] | None = None) -> RubricPool:
    """One pool with every rubric of ``pools`` in order; later exact-duplicate texts (see `text_key`) are dropped.

    The dropped ids are listed in the result's ``metadata["dropped_duplicates"]``.
    An id reused for a *different* text, or one prompt name with two versions,
    is an error (rename generated ids, e.g. ``gen.sat.0007``). Pool metadata
    go to ``metadata["merged_from"]`` unless ``metadata`` is given.
    """
    if not pools:
        raise RubricPoolError("pools", "merge needs at least one pool")
    kept: list[PoolRubric] = []
    by_text: dict[str, PoolRubric] = {}
    by_id: dict[str, PoolRubric] = {}
    dropped: list[str] = []
    versions: dict[str, str] = {}
    for p, pool in enumerate(pools):
        for name, version in pool.prompt_versions.items():
            if versions.setdefault(name, version) != version:
                raise RubricPoolError(f"pools[{p}].prompt_versions.{name}", f"{version!r} conflicts with {versions[name]!r}")
        for i, r in enumerate(pool.rubrics):
            if text_key(r.text) in by_text:
                dropped.append(r.id)
                continue
            if r.id in by_id:
                raise RubricPoolError(
                    f"pools[{p}].rubrics[{i}].id", f"{r.id!r} is already used for a different text {by_id[r.id].text!r}"
                )
            by_text[text_key(r.text)] = by_id[r.id] = r
            kept.append(r)
    meta: dict[str, Any] = dict(metadata) if metadata is not None else {"merged_from": [dict(p.metadata) for p in pools]}
    meta["dropped_duplicates"] = dropped
    return RubricPool(tuple(kept), versions, meta)


def load_packaged(name: str) -> RubricPool:
    """A pool file shipped in ``scorers/data/``."""
    resource = resources.files("scorers").joinpath("data", name)
    try:
        text = resource.read_text(encoding="utf-8")
    except (OSError, FileNotFoundError) as e:
        raise RubricPoolError("", f"cannot read packaged pool: {e}", f"scorers/data/{name}") from None
    try:
        doc = loads_strict(text)
    except ValueError as e:
        raise RubricPoolError("", f"cannot read rubric pool: {e}", f"scorers/data/{name}") from None
    return RubricPool.from_dict(doc, source=f"scorers/data/{name}")


def seed_pool() -> RubricPool:
    """The shipped seed pool: 11 generic SAT + 11 generic DSAT, AMULET's 12 sub-maxims (SAT), 10 ABC-Eval behaviours (DSAT)."""
    return load_packaged(SEED_POOL_FILE)


def generic_baseline_pool() -> RubricPool:
    """A SPUR/Bing-style generic set (4 SAT, 4 DSAT: gratitude, rephrasing, frustration, ...): a baseline, not a seed."""
    return load_packaged(GENERIC_BASELINE_POOL_FILE)


def direct_question_pool() -> RubricPool:
    """The single SAT rubric "Overall, the user is satisfied with the conversation." (the direct-question baseline)."""
    return load_packaged(DIRECT_QUESTION_POOL_FILE)
