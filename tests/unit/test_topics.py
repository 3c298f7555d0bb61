"""What `ensure_topics` asks the broker to create, checked on the request itself (the integration tests create every
topic on the real broker)."""

from __future__ import annotations

from stream.settings import KafkaSettings
from stream.topics import changelog_topic, new_topic, service_topics


def test_the_changelog_is_compacted_and_the_other_topics_keep_the_brokers_default() -> None:
    settings = KafkaSettings(partitions=6, replication_factor=3, app_id="cw")
    topics = {name: new_topic(settings, name) for name in service_topics(settings)}
    assert changelog_topic(settings) == "cw-conversations-changelog"
    assert topics["cw-conversations-changelog"].topic_configs == {"cleanup.policy": "compact", "segment.ms": "3600000"}
    assert all(t.topic_configs == {} for name, t in topics.items() if name != "cw-conversations-changelog")
    assert {(t.num_partitions, t.replication_factor) for t in topics.values()} == {(6, 3)}
