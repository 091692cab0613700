"""How the executor creates hotswap's own topics: their replication, and what a cluster short of
brokers makes it say. The admin client is faked; no Kafka."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kafka.errors import InvalidReplicationFactorError

from hotswap.contract.settings import KafkaSettings, PipelineSettings, Settings, Timeouts
from hotswap.executor.control import topics as topics_module
from hotswap.executor.control.topics import Topics
from hotswap.executor.control.transient import TransientErrorsPersisted


class FakeAdmin:
    """Records the topics it is asked to create; refuses them while `brokers` is below their replicas."""

    def __init__(self, brokers: int) -> None:
        self.brokers = brokers
        self.created: list[Any] = []
        self.attempts = 0

    def create_topics(self, new_topics: list[Any], timeout_ms: int) -> None:
        self.attempts += 1
        for topic in new_topics:
            if topic.replication_factor > self.brokers:
                raise InvalidReplicationFactorError("Replication factor: 3 larger than available brokers: 2.")
            self.created.append(topic)

    def close(self) -> None:
        pass


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    fake = FakeAdmin(brokers=3)
    monkeypatch.setattr(topics_module, "KafkaAdminClient", lambda **_: fake)
    monkeypatch.setattr(Topics, "partitions", lambda self, topic: 1)
    return fake


def settings(tmp_path: Path, **values: Any) -> Settings:
    return Settings(home=tmp_path, kafka_bootstrap="127.0.0.1:1", retry_deadline="1s", **values)


def slices(settings: Settings) -> tuple[KafkaSettings, PipelineSettings, Timeouts]:
    return settings.kafka, settings.pipeline, settings.timeouts


def test_hotswaps_topics_get_the_configured_replicas_and_min_insync_replicas(admin: FakeAdmin, tmp_path: Path) -> None:
    topics = Topics(*slices(settings(tmp_path, topic_replication_factor=3, topic_min_insync_replicas=2)))
    topics.ensure("hotswap.ns.late", 2)
    topics.ensure("results", 2, {"cleanup.policy": "compact"})
    assert [(t.name, t.num_partitions, t.replication_factor) for t in admin.created] == [
        ("hotswap.ns.late", 2, 3),
        ("results", 2, 3),
    ]
    assert [t.topic_configs for t in admin.created] == [
        {"min.insync.replicas": "2"},
        {"cleanup.policy": "compact", "min.insync.replicas": "2"},
    ]


def test_without_a_min_insync_replicas_the_brokers_default_applies(admin: FakeAdmin, tmp_path: Path) -> None:
    Topics(*slices(settings(tmp_path))).ensure("hotswap.ns.graph.q", 1)
    assert [(t.replication_factor, t.topic_configs) for t in admin.created] == [(1, {})]


def test_too_few_live_brokers_is_retried_then_named_with_what_to_do(admin: FakeAdmin, tmp_path: Path) -> None:
    admin.brokers = 2  # one of three is down, and stays down past the retry deadline
    with pytest.raises(TransientErrorsPersisted) as gave_up:
        Topics(*slices(settings(tmp_path, topic_replication_factor=3))).ensure("hotswap.ns.graph.q", 1)
    assert admin.attempts > 1
    message = str(gave_up.value)
    assert "topic hotswap.ns.graph.q needs 3 replicas, more than the brokers Kafka has alive" in message
    assert "HOTSWAP_TOPIC_REPLICATION_FACTOR" in message
    assert "\n" not in message
