"""Logging: hotswap's structlog events and the standard library's records of the libraries below it
come out in one format, with the bound context."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import structlog
from redis.backoff import NoBackoff

from hotswap.contract import outages
from hotswap.contract.outages import Outages
from hotswap.executor.logs import configure_logging
from hotswap.executor.operator.client import ReportedRetry


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """Where the configured handler writes; the logging set-up is restored afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    kafka_level = logging.getLogger("kafka").level
    yield io.StringIO()
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("kafka").setLevel(kafka_level)
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_library_and_hotswap_lines_are_json_with_level_logger_time_and_context(stream: io.StringIO) -> None:
    configure_logging("json", "info", stream=stream)
    structlog.contextvars.bind_contextvars(namespace="blue")
    logging.getLogger("urllib3.connectionpool").warning("host %s is unreachable", "b1:9092")
    structlog.get_logger("hotswap.executor.control.swap").bind(swap_id="s-1").info("swap cut", query_id="max")

    library, own = json_lines(stream)
    assert library["event"] == "host b1:9092 is unreachable"
    assert (library["level"], library["logger"], library["namespace"]) == ("warning", "urllib3.connectionpool", "blue")
    assert own["event"] == "swap cut"
    assert (own["level"], own["logger"]) == ("info", "hotswap.executor.control.swap")
    assert (own["swap_id"], own["query_id"], own["namespace"]) == ("s-1", "max", "blue")
    for line in (library, own):
        assert line["timestamp"].endswith("Z")


def test_chatty_libraries_stay_at_warning_unless_debug(stream: io.StringIO) -> None:
    configure_logging("json", "info", stream=stream)
    logging.getLogger("kafka.conn").info("connecting to b1:9092")
    logging.getLogger("py4j.clientserver").info("closing down clientserver connection")
    assert stream.getvalue() == ""

    configure_logging("json", "debug", stream=stream)
    logging.getLogger("kafka.conn").debug("sending request")
    assert [line["event"] for line in json_lines(stream)] == ["sending request"]


def test_an_outage_is_one_warning_when_it_begins_and_one_line_when_it_ends(stream: io.StringIO) -> None:
    configure_logging("json", "info", stream=stream)
    now = [0.0]
    outages = Outages(clock=lambda: now[0])
    for _ in range(50):  # a broker away: kafka-python's chatter, and every retry, at debug only
        logging.getLogger("kafka.conn").error("Connect attempt to <BrokerConnection node_id=1> returned error 111")
        outages.down("Kafka", "NoBrokersAvailable", "the executor's loop, for up to 300s")
        outages.down("Redis", "ConnectionError", "the lease's renewal, every 5s")
    outages.up("Redis")  # a call that began before Redis went away, ending on another thread: not the end
    now[0] = 15.0
    outages.up("Kafka")
    outages.up("Kafka")
    outages.up("Redis")
    lines = [(line["level"], line["event"]) for line in json_lines(stream)]
    assert lines == [
        ("warning", "Kafka unreachable; retrying"),
        ("warning", "Redis unreachable; retrying"),
        ("info", "Kafka reachable again"),
        ("info", "Redis reachable again"),
    ]


def test_an_outage_that_ends_unevenly_is_still_said_once_each_way(stream: io.StringIO) -> None:
    configure_logging("json", "info", stream=stream)
    now = [0.0]
    outages = Outages(clock=lambda: now[0])
    outages.down("Kafka", "NoBrokersAvailable", "the loop")
    now[0] = 15.0
    outages.up("Kafka")
    now[0] = 16.0  # back, then a produce refused while the broker registers: the same outage
    outages.down("Kafka", "NodeNotReadyError: 1", "the loop")
    now[0] = 18.0
    outages.up("Kafka")
    lines = [(line["level"], line["event"]) for line in json_lines(stream)]
    assert lines == [("warning", "Kafka unreachable; retrying"), ("info", "Kafka reachable again")]

    now[0] = 20.0  # away again, and this time for good: said, once it has lasted FLAP_S
    outages.down("Kafka", "NoBrokersAvailable", "the loop")
    now[0] = 31.0
    outages.down("Kafka", "NoBrokersAvailable", "the loop")
    outages.down("Kafka", "NoBrokersAvailable", "the loop")
    now[0] = 40.0
    outages.up("Kafka")
    lines = [(line["level"], line["event"]) for line in json_lines(stream)]
    assert lines[2:] == [("warning", "Kafka unreachable; retrying"), ("info", "Kafka reachable again")]


def test_a_call_asked_during_an_outage_that_times_out_after_it_ended_says_nothing_more(stream: io.StringIO) -> None:
    configure_logging("json", "info", stream=stream)
    now = [0.0]
    outages = Outages(clock=lambda: now[0])
    outages.down("Kafka", "NoBrokersAvailable", "the loop")
    now[0] = 15.0
    outages.up("Kafka")  # back at 15 s; a look asked at 12 s times out 15 s later, at 27 s
    now[0] = 27.0
    outages.down("Kafka", "KafkaTimeoutError", "a closing graph's next batch", began=12.0)
    now[0] = 28.0
    outages.up("Kafka")
    lines = [(line["level"], line["event"]) for line in json_lines(stream)]
    assert lines == [("warning", "Kafka unreachable; retrying"), ("info", "Kafka reachable again")]


def test_configuring_again_replaces_the_handler(stream: io.StringIO) -> None:
    configure_logging("json", "info", stream=io.StringIO())
    configure_logging("console", "info", stream=stream)
    logging.getLogger("urllib3.connectionpool").warning("retrying")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert "retrying" in lines[0]
    assert "[urllib3.connectionpool]" in lines[0]
    assert not lines[0].startswith("{")


def test_the_executors_redis_client_says_an_outage_once_each_way(
    stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure_logging("json", "info", stream=stream)
    retry = ReportedRetry(NoBackoff(), retries=5)
    monkeypatch.setattr(outages, "SETTLE_S", 0.0)  # this test's outage lasts microseconds
    failures = iter([redis.ConnectionError("refused")] * 3)

    def command() -> str:
        error = next(failures, None)
        if error is not None:
            raise error
        return "PONG"

    assert retry.call_with_retry(command, lambda error: None) == "PONG"
    assert retry.call_with_retry(command, lambda error: None) == "PONG"
    lines = [(line["level"], line["event"]) for line in json_lines(stream)]
    assert lines == [("warning", "Redis unreachable; retrying"), ("info", "Redis reachable again")]
