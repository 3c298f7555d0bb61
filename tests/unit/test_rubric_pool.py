"""Rubric pools: the shipped seed and baseline pools, the file format, merging, refusal of bad files."""

from __future__ import annotations

import json

import pytest

from scorers.learning.pool import (
    MAX_TEXT_CHARS,
    SOURCES,
    PoolRubric,
    RubricPool,
    RubricPoolError,
    direct_question_pool,
    generic_baseline_pool,
    merge,
    seed_pool,
    text_key,
    to_rubric,
)
from scorers.rubrics import LIKERT_SCALE, Polarity, RubricSet

AMULET_SUB_MAXIMS = {
    "quantity 1",
    "quantity 2",
    "quality",
    "relevance 1",
    "relevance 2",
    "manner 1",
    "manner 2",
    "benevolence 1",
    "benevolence 2",
    "transparency 1",
    "transparency 2",
    "transparency 3",
}
ABC_EVAL_BEHAVIOURS = {
    "ignore",
    "irrelevant",
    "self contradiction",
    "partner contradiction",
    "redundant",
    "lack of empathy",
    "commonsense contradiction",
    "incorrect fact",
    "uninterpretable",
    "antisocial",
}


def _by_source(pool: RubricPool, source: str) -> list[PoolRubric]:
    return [r for r in pool if r.source == source]


def test_seed_pool_has_generic_amulet_and_abc_eval_rubrics():
    pool = seed_pool()
    generic = _by_source(pool, "seed:generic")
    assert sum(r.polarity is Polarity.SAT for r in generic) >= 10
    assert sum(r.polarity is Polarity.DSAT for r in generic) >= 10
    amulet = _by_source(pool, "seed:amulet")
    assert {r.metadata["sub_maxim"] for r in amulet} == AMULET_SUB_MAXIMS and len(amulet) == 12
    assert all(r.polarity is Polarity.SAT for r in amulet)
    abc = _by_source(pool, "seed:abc-eval")
    assert {r.metadata["behaviour"] for r in abc} == ABC_EVAL_BEHAVIOURS and len(abc) == 10
    assert all(r.polarity is Polarity.DSAT for r in abc)
    assert len(pool) == len(generic) + len(amulet) + len(abc)
    for source in ("seed:generic", "seed:amulet", "seed:abc-eval"):
        assert pool.metadata["sources"][source]  # every source is cited
    assert all(len(r.text) <= MAX_TEXT_CHARS and r.text.endswith(".") for r in pool)


def test_baseline_pools():
    generic = generic_baseline_pool()
    texts = {r.text for r in generic}
    assert "The user expresses gratitude." in texts and "The user rephrases a request." in texts
    assert {r.polarity for r in generic} == {Polarity.SAT, Polarity.DSAT}
    assert all(r.source == "seed:baseline" for r in generic)
    direct = direct_question_pool()
    assert [(r.text, r.polarity) for r in direct] == [("Overall, the user is satisfied with the conversation.", Polarity.SAT)]
    # the three shipped pools share no rubric text: merging them drops nothing
    merged = merge(seed_pool(), generic, direct)
    assert len(merged) == len(seed_pool()) + len(generic) + len(direct)
    assert merged.metadata["dropped_duplicates"] == []


def test_to_rubric_uses_the_likert_agreement_scale_mapped_to_zero_ten():
    pool_rubric = seed_pool().rubrics[0]
    rubric = to_rubric(pool_rubric)
    assert (rubric.id, rubric.text, rubric.polarity) == (pool_rubric.id, pool_rubric.text, pool_rubric.polarity)
    assert rubric.scale == LIKERT_SCALE and rubric.scale.scores == (0.0, 2.5, 5.0, 7.5, 10.0)
    assert rubric.question().option_labels[0] == "Strongly disagree"
    rubric_set = seed_pool().rubric_set({"name": "all seed rubrics"})
    assert isinstance(rubric_set, RubricSet) and len(rubric_set.rubrics) == len(seed_pool())


def test_save_load_round_trip(tmp_path):
    pool = RubricPool(
        (
            PoolRubric("gen.sat.0001", "The assistant books the table.", "sat", "generated", {"batch": 3, "reasons": ["booked"]}),
            PoolRubric("gen.dsat.0001", "The assistant forgets the date.", Polarity.DSAT, "generated"),
        ),
        prompt_versions={"extract": "extract-v1", "summarise": "summarise-v1"},
        metadata={"name": "generated", "domain_hash": "abc"},
    )
    path = tmp_path / "pool.json"
    pool.save(path)
    assert RubricPool.load(path) == pool
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == 1 and "metadata" not in doc["rubrics"][1]
    assert pool.content_hash() == RubricPool.load(path).content_hash()
    assert pool.content_hash() != pool.subset([1, 0]).content_hash()


def test_merge_drops_duplicate_texts_and_refuses_conflicts():
    a = RubricPool((PoolRubric("a.1", "The assistant helps.", "sat", "manual"),), {"extract": "v1"}, {"name": "a"})
    b = RubricPool(
        (
            PoolRubric("b.1", "the  ASSISTANT helps.", "sat", "generated"),  # same text up to case and spaces
            PoolRubric("b.2", "The assistant stalls.", "dsat", "generated"),
        ),
        {"extract": "v1", "summarise": "v2"},
        {"name": "b"},
    )
    merged = merge(a, b)
    assert merged.ids == ("a.1", "b.2")
    assert merged.metadata["dropped_duplicates"] == ["b.1"]
    assert merged.metadata["merged_from"] == [{"name": "a"}, {"name": "b"}]
    assert merged.prompt_versions == {"extract": "v1", "summarise": "v2"}
    clash = RubricPool((PoolRubric("a.1", "Something else entirely.", "sat", "generated"),))
    with pytest.raises(RubricPoolError, match=r"pools\[1\].rubrics\[0\].id: 'a.1' is already used for a different text"):
        merge(a, clash)
    other_version = RubricPool((PoolRubric("c.1", "A third text.", "sat", "generated"),), {"extract": "v2"})
    with pytest.raises(RubricPoolError, match=r"pools\[1\].prompt_versions.extract: 'v2' conflicts with 'v1'"):
        merge(a, other_version)
    assert text_key("  The  Assistant\thelps. ") == "the assistant helps."


def test_pools_refuse_duplicates_on_construction():
    r = PoolRubric("x.1", "The assistant helps.", "sat", "manual")
    with pytest.raises(RubricPoolError, match=r"rubrics\[1\].id: duplicate id 'x.1' \(also rubrics\[0\]\)"):
        RubricPool((r, PoolRubric("x.1", "Another.", "sat", "manual")))
    with pytest.raises(RubricPoolError, match=r"rubrics\[1\].text: duplicate text"):
        RubricPool((r, PoolRubric("x.2", "The assistant  helps.", "dsat", "manual")))
    with pytest.raises(RubricPoolError, match="at least one rubric"):
        RubricPool(())
    with pytest.raises(RubricPoolError, match="is not one of"):
        PoolRubric("x.3", "Fine.", "sat", "invented")
    assert "generated" in SOURCES


def _doc(**rubric_overrides) -> dict:
    rubric = {"id": "r.1", "text": "The assistant helps.", "polarity": "sat", "source": "manual"}
    rubric.update(rubric_overrides)
    return {
        "schema_version": 1,
        "prompt_versions": {},
        "metadata": {},
        "rubrics": [{k: v for k, v in rubric.items() if v is not None}],
    }


@pytest.mark.parametrize(
    "doc, message",
    [
        ([1, 2], r"\(top level\): must be a JSON object"),
        ({"schema_version": 1, "rubrics": [], "extra": 1}, r"unknown key\(s\) \['extra'\]"),
        ({**_doc(), "schema_version": 2}, "schema_version: this convowatch reads version 1, got 2"),
        ({**_doc(), "rubrics": []}, "rubrics: must be a non-empty list"),
        (_doc(text=None), r"rubrics\[0\].text: required string, got None"),
        (_doc(text=""), r"rubrics\[0\].text: rubric 'r.1': must be a non-empty string"),
        (_doc(text="Line one.\nLine two."), r"rubrics\[0\].text: .*must be one line"),
        (_doc(text=" padded."), r"rubrics\[0\].text: .*without surrounding whitespace"),
        (
            _doc(text="x" * (MAX_TEXT_CHARS + 1)),
            rf"rubrics\[0\].text: .*{MAX_TEXT_CHARS + 1} characters, at most {MAX_TEXT_CHARS}",
        ),
        (_doc(polarity="neutral"), r"rubrics\[0\].polarity: rubric 'r.1': 'neutral' is not 'sat' or 'dsat'"),
        (_doc(source="web"), r"rubrics\[0\].source: rubric 'r.1': 'web' is not one of"),
        (_doc(id="has space"), r"rubrics\[0\].id: 'has space' does not match"),
        (_doc(metadata=[1]), r"rubrics\[0\].metadata: must be a JSON object"),
        (_doc(weight=2), r"rubrics\[0\]: unknown key\(s\) \['weight'\]"),
        ({**_doc(), "prompt_versions": {"extract": 1}}, "prompt_versions.extract: must be a string, got 1"),
    ],
)
def test_bad_pool_files_are_refused_naming_file_and_field(tmp_path, doc, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(RubricPoolError, match=message) as info:
        RubricPool.load(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "cannot read rubric pool: Expecting property name"),
        ('{"schema_version": 1, "schema_version": 1}', "duplicate JSON key.*schema_version"),
        ('{"schema_version": NaN}', "NaN is not valid JSON"),
    ],
)
def test_unparseable_pool_files_are_refused(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(RubricPoolError, match=message):
        RubricPool.load(path)
    with pytest.raises(RubricPoolError, match="cannot read rubric pool"):
        RubricPool.load(tmp_path / "missing.json")
