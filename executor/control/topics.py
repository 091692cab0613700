"""Kafka topics the executor creates and removes: graph input topics, late and dead-letter, and the
source and results topics when they are missing.

Each is created with `topic_replication_factor` replicas and, when set, `topic_min_insync_replicas`.
Every admin call retries transient errors (a broker restarting, a controller moving) until
`retry_deadline`, then fails with a one-line reason.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import NewTopic
from kafka.errors import (
    InvalidReplicationFactorError,
    KafkaError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

from hotswap.contract.errors import TimeoutExpired
from hotswap.contract.settings import KafkaSettings, PipelineSettings, Timeouts
from hotswap.executor.control.transient import retry_transient
from hotswap.executor.errors import ExecutorError

log = structlog.get_logger(__name__)

T = TypeVar("T")


class TooFewBrokers(KafkaError):  # type: ignore[misc]
    """Kafka has fewer live brokers than the replicas a new topic asks for. Retried like any transient
    error: a broker that is restarting comes back within the retry deadline."""

    retriable = True


class Topics:
    def __init__(self, kafka: KafkaSettings, pipeline: PipelineSettings, timeouts: Timeouts) -> None:
        self._kafka = kafka
        self._pipeline = pipeline
        self._timeouts = timeouts
        self._admin: KafkaAdminClient | None = None
        self._closer: weakref.finalize[Any, Any] | None = None

    def _client(self) -> KafkaAdminClient:
        if self._admin is None:
            self._admin = KafkaAdminClient(**self._kafka.kafka_python_config(), request_timeout_ms=15000)
            # A Topics dropped without close() (`Topics(...).ensure(...)`) closes its client when
            # it is collected, not when the broker goes away: an open client then logs a refused
            # connection on every retry ("Connection lost ... ECONNREFUSED") once a stack stops.
            self._closer = weakref.finalize(self, _close_admin, self._admin)
        return self._admin

    def _call(self, what: str, action: Callable[[KafkaAdminClient], T]) -> T:
        def attempt() -> T:
            try:
                return action(self._client())
            except KafkaError:
                # A client that saw the broker go away may hold stale connections: start afresh.
                self.close()
                raise

        try:
            return retry_transient(attempt, what, self._timeouts.retry_deadline.s)
        except KafkaError as exc:
            raise ExecutorError(
                f"{what} failed at Kafka {self._kafka.bootstrap}: {type(exc).__name__}: {exc}; "
                "is the stack up (`hotswap stack up`)?"
            ) from exc

    def partitions(self, topic: str) -> int | None:
        """Partition count of an existing topic, or None if it does not exist."""

        def read() -> int | None:
            consumer = KafkaConsumer(**self._kafka.kafka_python_config(), enable_auto_commit=False)
            try:
                parts = consumer.partitions_for_topic(topic)
            finally:
                consumer.close()
            return len(parts) if parts else None

        return retry_transient(read, f"reading the metadata of topic {topic}", self._timeouts.retry_deadline.s)

    def ensure(
        self, topic: str, partitions: int, configs: dict[str, str] | None = None, timeout_s: float = 30.0
    ) -> None:
        """Create the topic if missing and wait until its metadata is visible."""
        replicas = self._pipeline.topic_replication_factor
        new = NewTopic(topic, partitions, replicas, topic_configs=topic_configs(self._pipeline, configs))

        def create(admin: KafkaAdminClient) -> None:
            try:
                admin.create_topics([new], timeout_ms=15000)
                log.info("topic created", topic=topic, partitions=partitions, replicas=replicas)
            except TopicAlreadyExistsError:
                pass
            except InvalidReplicationFactorError as exc:
                raise TooFewBrokers(
                    f"topic {topic} needs {replicas} replicas, more than the brokers Kafka has alive; start the "
                    "missing brokers or lower topic_replication_factor (HOTSWAP_TOPIC_REPLICATION_FACTOR)"
                ) from exc

        self._call(f"creating topic {topic}", create)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.partitions(topic):
                return
            time.sleep(0.2)
        raise TimeoutExpired(f"topic {topic} was not visible in Kafka metadata after {timeout_s:.0f}s")

    def names(self, prefix: str) -> list[str]:
        """Existing topics whose names start with `prefix`."""
        found = self._call("listing topics", lambda admin: admin.list_topics())
        return sorted(str(t) for t in found if str(t).startswith(prefix))

    def delete(self, topic: str) -> None:
        def remove(admin: KafkaAdminClient) -> None:
            try:
                admin.delete_topics([topic], timeout_ms=15000)
                log.info("topic deleted", topic=topic)
            except UnknownTopicOrPartitionError:
                pass

        self._call(f"deleting topic {topic}", remove)

    def close(self) -> None:
        if self._admin is not None:
            self._admin = None
            if self._closer is not None:
                self._closer()  # closes the client, once

    def __enter__(self) -> Topics:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _close_admin(admin: KafkaAdminClient) -> None:
    try:
        admin.close()
    except KafkaError as exc:
        log.debug("admin client not closed cleanly", error=str(exc))


def topic_configs(pipeline: PipelineSettings, configs: dict[str, str] | None = None) -> dict[str, str]:
    """The configs a topic hotswap creates gets: the caller's, and min.insync.replicas when set."""
    merged = dict(configs or {})
    if pipeline.topic_min_insync_replicas is not None:
        merged["min.insync.replicas"] = str(pipeline.topic_min_insync_replicas)
    return merged
