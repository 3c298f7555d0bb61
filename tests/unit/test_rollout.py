"""Scorer versions: the registry directory, a worker's rollout switching without a restart, shadow scoring, and the
comparison of a shadow with the active version.

Real parts throughout: LLM-Rubric's Q1-Q8 rubric set fitted on the recorded GPT-3.5 answers, an ordinal calibrator
trained on the synthetic split, real conversations assembled from replayed events.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from scorers.calibrators import load_calibrator
from scorers.datasets.llm_rubric import load_split
from scorers.ordinal_calibration import OrdinalCalibrator
from scorers.rubrics import ConfidenceWindows, RubricSet, RubricSetError
from stream.metrics import ServiceMetrics
from stream.records import SHADOW
from stream.registry import ROLLOUT_FILE, RegistryError, Rollout, ScorerRegistry, ScorerVersion
from stream.report.comparison import cohen_kappa, compare
from stream.rollout import ScorerRollout, Scorers
from stream.scoring import ConversationScorer
from tests.unit.test_scoring import DATA, fast_retries, sample, score
from tests.unit.test_scoring import closed_conversations as closed_conversations
from tests.unit.test_scoring import conversation as conversation
from tests.unit.test_scoring import judge as judge
from tests.unit.test_scoring import rubric_set as rubric_set
from tests.unit.test_scoring import unfitted as unfitted


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, rubric_set: RubricSet) -> dict[str, Path]:
    """Two rubric sets that label differently (the fitted one, and one that calls everything dsat) and an ordinal calibrator."""
    out = tmp_path_factory.mktemp("versions")
    rubric_set.save(out / "v1.json")
    # Everything at or below NetSAT 999 is dissatisfied: every conversation labelled dsat.
    replace(rubric_set, windows=ConfidenceWindows(threshold=1000.0, dsat_upper=999.0)).save(out / "v2.json")
    OrdinalCalibrator().fit(load_split(DATA, "synth")).save(out / "calibrator")
    return {"v1": out / "v1.json", "v2": out / "v2.json", "calibrator": out / "calibrator"}


@pytest.fixture
def registry(tmp_path: Path, files: dict[str, Path]) -> ScorerRegistry:
    registry = ScorerRegistry(tmp_path / "registry")
    registry.register("v1", files["v1"], files["calibrator"])
    registry.register("v2", files["v2"])
    return registry


def builder(judge, metrics: ServiceMetrics):
    """What the worker builds (stream.service.build_rollout): the first version's scorer, then versions sharing it."""
    first: list[ConversationScorer] = []

    def build(version: ScorerVersion) -> ConversationScorer:
        if not first:
            first.append(
                ConversationScorer(judge, version.rubric_set, version.calibrator, fast_retries(), metrics, name=version.name)
            )
            return first[0]
        return first[0].for_version(version.rubric_set, version.calibrator, version.name)

    return build


def total(metrics: ServiceMetrics, name: str) -> float:
    """The sum of a metric's samples over all its label values."""
    return sum(s.value for family in metrics.registry.collect() for s in family.samples if s.name == name)


# --- the registry -----------------------------------------------------------------------------


def test_a_registered_version_is_a_copy_loaded_back_as_it_was(tmp_path: Path, files: dict[str, Path]) -> None:
    source = tmp_path / "source"
    shutil.copytree(files["calibrator"], source / "calibrator")
    shutil.copy(files["v1"], source / "v1.json")
    registry = ScorerRegistry(tmp_path / "registry")
    registered = registry.register("v1", source / "v1.json", source / "calibrator")
    shutil.rmtree(source)  # the registry keeps its own copy
    loaded = registry.version("v1")
    assert loaded.rubric_set.version == registered.rubric_set.version == RubricSet.load(files["v1"]).version
    assert loaded.calibrator_version == load_calibrator(files["calibrator"]).version_
    assert registry.names() == ["v1"] and registry.rollout() == Rollout()


def test_names_are_final_and_bad_files_are_refused_leaving_nothing(registry: ScorerRegistry, tmp_path: Path, files) -> None:
    with pytest.raises(RegistryError, match="'v1' is already registered"):
        registry.register("v1", files["v2"])
    for bad in ("", "../up", "has space", "x" * 65, ".hidden"):
        with pytest.raises(RegistryError, match="version name"):
            registry.register(bad, files["v2"])
    broken = tmp_path / "broken.json"
    broken.write_text('{"rubrics": [', encoding="utf-8")
    with pytest.raises(RubricSetError):
        registry.register("v3", broken)
    assert registry.names() == ["v1", "v2"]
    assert sorted(p.name for p in (registry.root / "versions").iterdir()) == ["v1", "v2"]  # no staging left behind


def test_promote_and_shadow_check_the_version_and_the_rollout(registry: ScorerRegistry) -> None:
    with pytest.raises(RegistryError, match=r"no version 'v9' .*registered: v1, v2"):
        registry.promote("v9")
    with pytest.raises(RegistryError, match="no active version"):
        registry.start_shadow("v2", 0.5)
    assert registry.promote("v1") == Rollout("v1")
    with pytest.raises(RegistryError, match="both the active version and its shadow"):
        registry.start_shadow("v1", 0.5)
    with pytest.raises(RegistryError, match="shadow_rate"):
        registry.start_shadow("v2", 1.5)
    assert registry.start_shadow("v2", 0.25) == Rollout("v1", "v2", 0.25)
    assert registry.rollout() == Rollout("v1", "v2", 0.25)
    assert registry.promote("v2") == Rollout("v2")  # the promoted shadow stops shadowing
    registry.start_shadow("v1", 0.5)
    assert registry.stop_shadow() == registry.rollout() == Rollout("v2")


def test_a_version_edited_in_the_registry_or_a_broken_rollout_is_refused_by_name(registry: ScorerRegistry) -> None:
    path = registry.root / "versions" / "v2" / "rubric_set.json"
    doc = json.loads(path.read_text())
    doc["rubrics"][0]["text"] += " (edited)"
    doc.pop("version")
    path.write_text(json.dumps(doc))
    with pytest.raises(RegistryError, match="'v2'.*edited by hand"):
        registry.version("v2")
    (registry.root / ROLLOUT_FILE).write_text("{not json")
    with pytest.raises(RegistryError, match="rollout.json: cannot read the rollout"):
        registry.rollout()
    (registry.root / ROLLOUT_FILE).write_text(json.dumps({"active": "../etc"}))
    with pytest.raises(RegistryError, match="version name"):
        registry.rollout()


# --- the worker's rollout ---------------------------------------------------------------------


def test_a_worker_needs_an_active_version(registry: ScorerRegistry, judge) -> None:
    metrics = ServiceMetrics()
    with pytest.raises(RegistryError, match="no active version.*scorers promote"):
        ScorerRollout.from_registry(registry, builder(judge, metrics), metrics)


def test_a_promotion_switches_the_scorer_and_every_record_names_its_version(registry, judge, conversation) -> None:
    metrics = ServiceMetrics()
    registry.promote("v1")
    rollout = ScorerRollout.from_registry(registry, builder(judge, metrics), metrics)
    before = score(rollout.current.active, conversation)
    assert rollout.refresh() is False  # nothing changed
    registry.promote("v2")
    assert rollout.refresh() is True
    after = score(rollout.current.active, conversation)
    assert (before.scorer_name, after.scorer_name) == ("v1", "v2")
    assert before.scorer_version != after.scorer_version and before.rubric_set_version != after.rubric_set_version
    assert before.calibrator_version != "none" and after.calibrator_version == "none"  # v2 has no calibrator
    assert after.netsat == before.netsat and (after.label, after.threshold_label) == ("dsat", "dsat")  # same rubrics
    assert (
        sample(metrics, "convowatch_scorer_version_info", role="active", scorer_name="v2", scorer_version=after.scorer_version)
        == 1
    )
    assert (
        sample(metrics, "convowatch_scorer_version_info", role="active", scorer_name="v1", scorer_version=before.scorer_version)
        is None
    )
    assert sample(metrics, "convowatch_scorer_rollout_changes_total", outcome="applied") == 1


def test_a_rollout_that_cannot_load_is_refused_once_and_the_old_version_keeps_scoring(registry, judge, conversation) -> None:
    metrics = ServiceMetrics()
    registry.promote("v1")
    rollout = ScorerRollout.from_registry(registry, builder(judge, metrics), metrics)
    (registry.root / ROLLOUT_FILE).write_text(json.dumps({"active": "v9"}))  # by hand: promote would refuse it
    assert rollout.refresh() is False and rollout.refresh() is False
    assert sample(metrics, "convowatch_scorer_rollout_changes_total", outcome="refused") == 1  # counted once
    assert score(rollout.current.active, conversation).scorer_name == "v1"
    shutil.rmtree(registry.root / "versions")  # every version gone, too
    assert rollout.refresh() is False and rollout.current.active.name == "v1"
    assert sample(metrics, "convowatch_scorer_rollout_changes_total", outcome="refused") == 2  # a new reason
    assert sample(metrics, "convowatch_scorer_rollout_changes_total", outcome="applied") is None


def test_a_shadow_scores_beside_the_active_version_and_feeds_only_its_own_metric(registry, judge, conversation) -> None:
    metrics = ServiceMetrics()
    registry.promote("v1")
    registry.start_shadow("v2", 1.0)
    rollout = ScorerRollout.from_registry(registry, builder(judge, metrics), metrics)
    scorers = rollout.current
    assert scorers.shadow is not None and scorers.shadows(conversation.conversation_id)
    assert scorers.shadow.budget is scorers.active.budget and scorers.shadow.sampling is scorers.active.sampling
    active = replace(score(scorers.active, conversation), inclusion_probability=0.5, sampling_reason="rate")
    shadow = asyncio.run(scorers.shadow.score_shadow(conversation, active))
    assert (shadow.role, shadow.scorer_name, shadow.inclusion_probability, shadow.sampling_reason) == (SHADOW, "v2", 0.5, "rate")
    assert shadow.scorer_version != active.scorer_version and shadow.status == "scored"
    assert total(metrics, "convowatch_conversations_scored_total") == 1  # the active version's only
    assert total(metrics, "convowatch_conversations_sampled_total") == 1
    outcome = shadow.label
    assert (
        sample(
            metrics,
            "convowatch_shadow_conversations_total",
            scorer_name="v2",
            scorer_version=shadow.scorer_version,
            outcome=outcome,
        )
        == 1
    )
    assert (
        sample(metrics, "convowatch_scorer_version_info", role="shadow", scorer_name="v2", scorer_version=shadow.scorer_version)
        == 1
    )


def test_the_shadow_share_is_drawn_from_the_conversation_id(registry, judge) -> None:
    metrics = ServiceMetrics()
    build = builder(judge, metrics)
    scorers = Scorers(build(registry.version("v1")), build(registry.version("v2")), 0.3)
    ids = [f"conversation-{i}" for i in range(4000)]
    picked = [scorers.shadows(i) for i in ids]
    assert abs(np.mean(picked) - 0.3) < 0.03
    assert picked == [scorers.shadows(i) for i in ids]  # a replay shadows the same conversations
    assert not any(Scorers(scorers.active).shadows(i) for i in ids)


# --- the comparison ---------------------------------------------------------------------------


def test_cohens_kappa_by_hand() -> None:
    # observed 3/4; chance: sat 1/2·1/4 + dsat 1/2·3/4 = 1/2; κ = (3/4 − 1/2) / (1 − 1/2) = 1/2
    assert cohen_kappa(["sat", "sat", "dsat", "dsat"], ["sat", "dsat", "dsat", "dsat"]) == pytest.approx(0.5)
    assert cohen_kappa(["sat", "dsat"], ["sat", "dsat"]) == pytest.approx(1.0)
    assert np.isnan(cohen_kappa(["sat", "sat"], ["sat", "sat"]))


def _pair(cid: str, active: str, candidate: str, pa: float, pc: float, ratings: list[str]) -> dict:
    netsat = {"sat": 5.0, "dsat": -5.0, "uncertain": 0.0}
    return {
        "conversation_id": cid,
        "active_version": "hash-a",
        "candidate_version": "hash-c",
        "active_label": active,
        "candidate_label": candidate,
        "active_threshold_label": "dsat" if active == "dsat" else "sat",
        "candidate_threshold_label": "dsat" if candidate == "dsat" else "sat",
        "active_netsat": netsat[active],
        "candidate_netsat": netsat[candidate],
        "active_p": pa,
        "candidate_p": pc,
        "ratings": ratings,
    }


def test_the_comparison_counts_pairs_shares_differences_and_agreement_with_users() -> None:
    t0, t1 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 8, tzinfo=UTC)
    rows = (
        [_pair(f"a{i}", "sat", "sat", 0.1, 0.2, ["up"]) for i in range(40)]
        + [_pair(f"b{i}", "dsat", "dsat", 0.7, 0.8, ["down"]) for i in range(20)]
        + [_pair(f"c{i}", "sat", "dsat", 0.3, 0.6, ["down"]) for i in range(10)]
        + [_pair(f"d{i}", "uncertain", "sat", 0.4, 0.3, []) for i in range(30)]
    )
    c = compare("v1", "v2", rows, t0, t1, shadow_unscored=3)
    assert c.pairs == 100 and c.shadow_unscored == 3
    assert c.labels == {
        "sat": {"sat": 40, "dsat": 10, "uncertain": 0},
        "dsat": {"sat": 0, "dsat": 20, "uncertain": 0},
        "uncertain": {"sat": 30, "dsat": 0, "uncertain": 0},
    }
    assert c.label_agreement is not None and c.label_agreement.estimate == pytest.approx(0.6)
    assert c.label_agreement.low < 0.6 < c.label_agreement.high
    assert c.dsat_share_difference is not None and c.dsat_share_difference.estimate == pytest.approx(0.1)
    assert c.dsat_share_difference.low < 0.1 < c.dsat_share_difference.high
    d = c.dissatisfaction_probability_difference
    assert d is not None and d.estimate == pytest.approx((40 * 0.1 + 20 * 0.1 + 10 * 0.3 - 30 * 0.1) / 100)
    assert c.active is not None and c.candidate is not None
    assert (c.active.dsat_share.estimate, c.candidate.dsat_share.estimate) == (pytest.approx(0.2), pytest.approx(0.3))
    assert c.active.uncertain_share.estimate == pytest.approx(0.3) and c.candidate.uncertain_share.estimate == 0
    ua, uc = c.active.users, c.candidate.users
    assert ua is not None and uc is not None and (ua.rated_down, ua.rated_up) == (uc.rated_down, uc.rated_up) == (30, 40)
    assert ua.dsat_when_rated_down is not None and ua.dsat_when_rated_down.estimate == pytest.approx(20 / 30)
    assert uc.dsat_when_rated_down is not None and uc.dsat_when_rated_down.estimate == pytest.approx(1.0)
    assert json.loads(json.dumps(c.as_dict()))["candidate"]["users"]["rated_down"] == 30


def test_a_comparison_without_pairs_says_so() -> None:
    t0, t1 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 8, tzinfo=UTC)
    c = compare("v1", "v2", [], t0, t1, shadow_unscored=2)
    assert (c.pairs, c.label_agreement, c.active, c.candidate, c.shadow_unscored) == (0, None, None, None, 2)
    one_label = compare("v1", "v2", [_pair("x", "sat", "sat", 0.1, 0.1, []), _pair("y", "sat", "sat", 0.1, 0.1, [])], t0, t1)
    assert one_label.kappa is None and one_label.active is not None and one_label.active.users is None
