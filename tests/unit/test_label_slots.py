"""Metric label slots go by volume over a window, re-evaluated (issue 54): a junk burst that took every slot gives
them up to the real values once they outweigh it, instead of holding them until a restart."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stream.metrics import OTHER, TRACKED_VALUES_PER_SLOT, AttributeLabels, LabelSlots, ServiceMetrics
from stream.service import new_metrics
from stream.settings import MetricsSettings, Settings

WINDOW_S = 60.0


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_real_model_versions_displace_a_junk_burst_after_re_evaluation() -> None:
    clock = Clock()
    labels = AttributeLabels(["model_version"], max_values=50, slot_window_s=WINDOW_S, clock=clock)
    for i in range(500):  # junk first: 500 distinct values, the first 50 take every slot
        labels.values({"model_version": f"junk-{i}"})
    real = [f"v{i}" for i in range(50)]
    before = {labels.values({"model_version": v})[0] for v in real for _ in range(20)}
    assert before == {OTHER}  # all 50 real versions merged while the junk holds the slots
    clock.now += WINDOW_S  # the window ends: the next use re-evaluates
    assert [labels.values({"model_version": v})[0] for v in real] == real
    assert labels.values({"model_version": "junk-0"}) == (OTHER,)


def test_within_a_window_free_slots_go_first_come_and_a_slot_is_kept_while_used() -> None:
    clock = Clock()
    labels = AttributeLabels(["product"], max_values=2, slot_window_s=WINDOW_S, clock=clock)
    assert labels.values({"product": "a"}) == ("a",)
    assert labels.values({"product": "b"}) == ("b",)
    assert labels.values({"product": "c"}) == (OTHER,)
    clock.now += WINDOW_S - 1  # not yet
    for _ in range(3):
        assert labels.values({"product": "c"}) == (OTHER,)
    labels.values({"product": "a"})
    clock.now += 1
    # the window held c x4, a x2, b x1: c and a hold the slots now, b (used least) is merged
    assert labels.values({"product": "c"}) == ("c",)
    assert labels.values({"product": "a"}) == ("a",)
    assert labels.values({"product": "b"}) == (OTHER,)


def test_combination_slots_are_re_evaluated_by_volume_too() -> None:
    clock = Clock()
    labels = AttributeLabels(["product", "model_version"], 50, max_combinations=2, slot_window_s=WINDOW_S, clock=clock)
    labels.values({"product": "p", "model_version": "junk1"})
    labels.values({"product": "p", "model_version": "junk2"})
    for _ in range(5):
        assert labels.values({"product": "p", "model_version": "real"}) == ("p", OTHER)
    clock.now += WINDOW_S
    assert labels.values({"product": "p", "model_version": "real"}) == ("p", "real")


def test_a_flood_of_distinct_values_keeps_counting_bounded_and_still_finds_the_busy_value() -> None:
    slots = LabelSlots(capacity=5)
    for i in range(100_000):
        slots.admit(f"junk-{i}")
        if i % 10 == 0:
            slots.admit("busy")
    assert len(slots._volume) <= 5 * TRACKED_VALUES_PER_SLOT
    slots.reevaluate()
    assert "busy" in slots.slots


def test_the_window_is_a_setting_and_the_exported_series_follow_the_slots() -> None:
    settings = Settings(metrics=MetricsSettings(label_attributes=["model_version"], max_label_values=1, label_slot_window_s=5))
    metrics = new_metrics(settings)
    assert metrics.attributes.slot_window_s == 5
    clock = Clock()
    metrics.attributes = AttributeLabels(["model_version"], max_values=1, slot_window_s=5, clock=clock)
    scored = metrics.conversations_scored
    scored.labels("sat", *metrics.attribute_values({"model_version": "junk"})).inc()
    for _ in range(3):
        scored.labels("sat", *metrics.attribute_values({"model_version": "v1"})).inc()
    clock.now += 5
    scored.labels("sat", *metrics.attribute_values({"model_version": "v1"})).inc()
    exported = {
        s.labels["model_version"]: s.value
        for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in f.samples
        if s.name == "convowatch_conversations_scored_total"
    }
    assert exported == {"junk": 1.0, OTHER: 3.0, "v1": 1.0}


def test_service_metrics_default_window() -> None:
    assert ServiceMetrics().attributes.slot_window_s == Settings().metrics.label_slot_window_s
