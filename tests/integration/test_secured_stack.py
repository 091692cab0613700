"""A swap over real TLS listeners with least privilege: Kafka on SASL_SSL (SCRAM-SHA-512), Redis on
TLS only, the executor as a Redis ACL user that may touch only its namespace's keys with the
commands `hotswap acl` lists, and a submitter's user that may only submit, abort and read."""

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
from hotswap.executor.tools.generator import GeneratorSpec
from hotswap.service_sink.audit import read_results
from tests.conftest import wait_until
from tests.integration.harness import (
    changed,
    committed_watermark,
    continuous_load,
    executor_running,
    final_graph,
    namespace_settings,
    read_topic,
    slow_to_start,
)
from tests.integration.oracle import Version, assert_invariants, count_and_total, peak_and_low, settle
from tests.integration.scenarios import COUNT_10S, MAX_30S, PHASES, T0, cut_of
from tests.integration.secured import SecuredServices, secured_services

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Kafka's JAAS parser and a URL both have characters that careless quoting breaks on.
KAFKA_PASSWORD = 'pa"ss\\wo;rd "quoted" \\\\ ' + secrets.token_hex(4)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredServices]:
    with secured_services(tmp_path_factory.mktemp("secured")) as services:
        yield services


def as_redis_user(secured: SecuredServices, settings: Settings, rules: list[str]) -> tuple[Settings, str]:
    """These settings as a new Redis ACL user with `rules`; and its password."""
    user, password = f"u-{secrets.token_hex(3)}", f'r"e\\dis@:/{secrets.token_hex(8)}'
    secured.admin_redis.execute_command("ACL", "SETUSER", user, "on", f">{password}", *rules)  # type: ignore[no-untyped-call]
    return changed(settings, redis_url=secured.redis_url(user, password)), password


def forbidden_writes(settings: Settings) -> list[Callable[[redis.Redis], object]]:
    """Writes that only the executor may make: the journal, the lease, a routing plan, the graphs."""
    keys = Keys(settings.namespace)
    return [
        lambda r: Journal(r, keys).create(SwapRecord(id="forged", to_query="x")),
        lambda r: r.rpush(keys.swaps, "forged"),
        lambda r: r.set(keys.lease, "mine"),
        lambda r: r.set(keys.routing_plan(1), "{}"),
        lambda r: r.hset(keys.graphs, "x", "{}"),
        lambda r: r.set(keys.current, "x"),
    ]


def test_a_swap_under_load_over_tls_and_scram_as_least_privilege_users(
    secured: SecuredServices, spark: SparkSession, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    kafka_user = f"svc-{secrets.token_hex(3)}"
    secured.add_kafka_user(kafka_user, KAFKA_PASSWORD)
    kafka = secured.kafka_settings(kafka_user, KAFKA_PASSWORD)
    base = namespace_settings(tmp_path / "home", kafka.pop("kafka_bootstrap"), "redis://unused", "s", **kafka)
    settings, executor_password = as_redis_user(secured, base, executor_rules(base.namespace))
    as_submitter, submitter_password = as_redis_user(secured, base, submitter_rules(base.namespace))
    operator, submitter = (
        Client(settings.control, settings.kafka, settings.pipeline),
        Client(as_submitter.control, as_submitter.kafka, as_submitter.pipeline),
    )

    spec = GeneratorSpec(rate=300, keys=3, seed=31, disorder_ms=500, time_scale=10, start_ts=T0)
    with executor_running(settings, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(operator, "count_per_key") > T0 + 10_000, 120, "first windows")
        # The submitter's user: a swap submitted and aborted before its cut (its graph is slow to start)...
        slow = submitter.submit(slow_to_start(tmp_path, 60))
        assert submitter.abort(slow.id).state is SwapPhase.ABORTED
        # ... and one submitted that completes, followed with its `status`.
        swap = submitter.submit(MAX_30S)
        done = submitter.wait_until_done(swap.id, 180)
        assert [p.name for p in done.phases] == PHASES
        status = submitter.status()
        assert [(s.id, s.state) for s in status.swaps] == [(slow.id, SwapPhase.ABORTED), (swap.id, SwapPhase.COMPLETED)]
        cut = cut_of(next(s for s in status.swaps if s.id == swap.id))
        wait_until(lambda: committed_watermark(operator, "max_per_key_30s") >= cut + 60_000, 120, "30 s windows")
        load.stop()
        truth = settle(settings, final_graph(operator, "max_per_key_30s"))

        # Redis refuses the submitter every write that is the executor's alone.
        direct = redis.Redis.from_url(as_submitter.redis_dsn)
        for write in forbidden_writes(settings):
            with pytest.raises(redis.exceptions.NoPermissionError):
                write(direct)
        direct.close()

    versions = [Version("count_per_key", 10_000, count_and_total), Version("max_per_key_30s", 30_000, peak_and_low)]
    results = read_results(settings.kafka, settings.sink_topic)
    assert_invariants(results, truth.on_time, versions, [cut], truth.closed_until)

    # No password shows: not in the log (Spark's included), the status or the results.
    output = capfd.readouterr()
    shown = output.out + output.err + submitter.status().model_dump_json()
    shown += "".join(r.value.decode(errors="replace") for r in read_topic(settings, settings.sink_topic))
    for secret in (KAFKA_PASSWORD, executor_password, submitter_password):
        assert secret not in shown
