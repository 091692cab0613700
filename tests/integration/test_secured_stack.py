"""Swaps over real TLS listeners with least privilege: Kafka on SASL_SSL (SCRAM-SHA-512), Redis on
TLS only, hotswap's executor as a Redis ACL user that may touch only its namespace's keys with the
commands `hotswap acl` lists, and a submitter that may only submit, abort and read."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from pyspark.sql import SparkSession

from hotswap.contract.access import executor_rules, submitter_rules
from hotswap.contract.journal import Journal, SwapPhase, SwapRecord
from hotswap.contract.names import Keys
from hotswap.contract.settings import Settings
from hotswap.executor.operator.client import Client
from tests.integration.harness import changed, executor_running, namespace_settings, read_topic, slow_to_start
from tests.integration.scenarios import COUNT_10S, assert_three_swaps_keep_every_invariant, three_swaps_under_load
from tests.integration.secured import SecuredServices, secured_services

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Kafka's JAAS parser and a URL both have characters that careless quoting breaks on.
KAFKA_PASSWORD = 'pa"ss\\wo;rd "quoted" \\\\ ' + secrets.token_hex(4)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredServices]:
    with secured_services(tmp_path_factory.mktemp("secured")) as services:
        yield services


def add_redis_user(secured: SecuredServices, rules: list[str]) -> tuple[str, str]:
    user, password = f"u-{secrets.token_hex(3)}", f'r"e\\dis@:/{secrets.token_hex(8)}'
    secured.admin_redis.execute_command("ACL", "SETUSER", user, "on", f">{password}", *rules)  # type: ignore[no-untyped-call]
    return user, password


def secured_settings(secured: SecuredServices, home: Path) -> tuple[Settings, str]:
    """A fresh namespace on the secured services, as the executor's least-privilege Redis user."""
    kafka_user = f"svc-{secrets.token_hex(3)}"
    secured.add_kafka_user(kafka_user, KAFKA_PASSWORD)
    kafka = secured.kafka_settings(kafka_user, KAFKA_PASSWORD)
    settings = namespace_settings(home, kafka.pop("kafka_bootstrap"), "redis://unused", "s", **kafka)
    user, password = add_redis_user(secured, executor_rules(settings.namespace))
    return changed(settings, redis_url=secured.redis_url(user, password)), password


def test_three_swaps_under_load_over_tls_and_scram_as_least_privilege_users(
    secured: SecuredServices, spark: SparkSession, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    settings, redis_password = secured_settings(secured, tmp_path / "home")
    client = Client(settings)
    with executor_running(settings, spark, COUNT_10S):
        run = three_swaps_under_load(settings, client)
    assert_three_swaps_keep_every_invariant(settings, client, run)

    # Neither password shows: not in the log (Spark's included), the status or the results.
    output = capfd.readouterr()
    shown = output.out + output.err + client.status().model_dump_json()
    shown += "".join(r.value.decode(errors="replace") for r in read_topic(settings, settings.sink_topic))
    for secret in (KAFKA_PASSWORD, redis_password):
        assert secret not in shown


def test_a_submitter_may_submit_abort_and_read_but_never_write_the_executors_keys(
    secured: SecuredServices, spark: SparkSession, tmp_path: Path
) -> None:
    settings, _ = secured_settings(secured, tmp_path / "home")
    user, password = add_redis_user(secured, submitter_rules(settings.namespace))
    as_submitter = changed(settings, redis_url=secured.redis_url(user, password))
    submitter = Client(as_submitter)
    keys = Keys(settings.namespace)
    with executor_running(settings, spark, COUNT_10S):
        # Submitted and validated; then aborted before its cut, while its graph is slow to start.
        swap = submitter.submit(slow_to_start(tmp_path, 60))
        assert swap.state is not SwapPhase.REJECTED
        aborted = submitter.abort(swap.id)
        assert aborted.state is SwapPhase.ABORTED
        status = submitter.status()
        assert [(s.id, s.state) for s in status.swaps] == [(swap.id, SwapPhase.ABORTED)]
        assert status.current is not None
        assert status.current.query_id == "count_per_key"

        # The journal, the lease, the routing plans and the graph records are the executor's alone.
        direct = redis.Redis.from_url(as_submitter.redis_dsn)
        forged = SwapRecord(id="forged", to_query="x")
        writes: list[Callable[[], object]] = [
            lambda: Journal(direct, keys).create(forged),
            lambda: direct.set(keys.lease, "mine"),
            lambda: direct.set(keys.routing_plan(1), "{}"),
            lambda: direct.rpush(keys.swaps, "forged"),
            lambda: direct.hset(keys.graphs, "x", "{}"),
            lambda: direct.set(keys.current, "x"),
        ]
        for write in writes:
            with pytest.raises(redis.exceptions.NoPermissionError):
                write()
        direct.close()
        assert [s.id for s in submitter.status().swaps] == [swap.id]
