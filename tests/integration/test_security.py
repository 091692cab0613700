"""Security: Redis ACL users, secrets kept out of output, and submitted queries confined to their input."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr
from pyspark.sql import SparkSession

from hotswap.contract.journal import SwapPhase
from hotswap.contract.settings import Settings
from hotswap.execution_graph.errors import QueryRejected
from hotswap.executor.errors import SubmitRejected
from hotswap.executor.operator.client import Client, redis_client
from tests.integration.harness import REPO, changed, executor_running, run_cli
from tests.integration.scenarios import COUNT_10S

pytestmark = [pytest.mark.integration]


def test_a_redis_acl_user_works_and_its_password_never_shows(
    settings: Settings, control: redis.Redis, tmp_path: Path
) -> None:
    user, password = f"hs-{uuid.uuid4().hex[:6]}", f"pw-{uuid.uuid4().hex}"
    control.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+@all"])
    try:
        address = settings.redis_dsn.split("://", 1)[1]
        secured = settings.model_copy(update={"redis_url": SecretStr(f"redis://{user}:{password}@{address}")})
        assert redis_client(secured.control).acl_whoami() == user
        assert Client(secured.control, secured.kafka, secured.pipeline).status().current is None
        assert password not in repr(secured)
        status = run_cli(secured, "status", "--json")
        stack = run_cli(secured, "stack", "status")
    finally:
        control.acl_deluser(user)
    assert status.returncode == 0, status.stderr
    assert stack.returncode == 0, stack.stderr
    for output in (status.stdout, status.stderr, stack.stdout, stack.stderr):
        assert password not in output


def test_a_wrong_redis_password_is_a_one_line_error(settings: Settings) -> None:
    address = settings.redis_dsn.split("://", 1)[1]
    wrong = settings.model_copy(update={"redis_url": SecretStr(f"redis://nobody:wrong-secret@{address}")})
    result = run_cli(wrong, "status")
    assert result.returncode == 1
    assert "wrong-secret" not in result.stderr
    assert result.stderr.startswith("hotswap: Redis refused the credentials")
    assert len(result.stderr.strip().splitlines()) == 1


WINDOWED = "SELECT window.start AS window_start, window.end AS window_end"
GROUPED = "GROUP BY window(event_time, '10 seconds')"
# Submissions that would reach outside their input, each with the reason code it is refused with.
OUTSIDE = [
    ("set.sql", "SET spark.sql.shuffle.partitions = 7", "query_not_a_query"),
    ("view.sql", "CREATE TEMP VIEW sneaky AS SELECT * FROM events", "query_not_a_query"),
    ("jar.sql", "ADD JAR /tmp/hotswap-not-there.jar", "query_not_a_query"),
    ("insert.sql", "INSERT OVERWRITE DIRECTORY '{out}' USING json SELECT 1 AS x", "query_not_a_query"),
    ("two.sql", "SELECT 1 AS x; SELECT 2 AS y", "query_not_a_query"),
    (
        "passwd.sql",
        f"{WINDOWED}, p.value AS line, count(*) AS n FROM events JOIN text.`/etc/passwd` AS p {GROUPED}, p.value",
        "query_reads_outside",
    ),
    (
        "getenv.sql",
        f"{WINDOWED}, java_method('java.lang.System', 'getenv', 'HOTSWAP_REDIS_URL') AS r, count(*) AS n "
        f"FROM events {GROUPED}, 3",
        "query_function_refused",
    ),
    ("average.py", (REPO / "examples" / "average_per_key.py").read_text(), "query_kind_refused"),
]


def test_a_submission_reaching_outside_its_input_is_refused_and_changes_nothing(
    settings: Settings, spark: SparkSession, client: Client, tmp_path: Path
) -> None:
    sql_only = changed(settings, query_kinds="sql")  # the default: Python only where the operator says so
    out = tmp_path / "written"
    shuffle = spark.conf.get("spark.sql.shuffle.partitions")
    files = []
    for name, text, code in OUTSIDE:
        path = tmp_path / name
        path.write_text(text.format(out=out))
        files.append((path, code))
    with executor_running(sql_only, spark, COUNT_10S):
        before = client.status()
        for path, code in files:
            plan = client.dry_run(path)
            assert (plan.valid, plan.reason_code) == (False, code), f"dry run of {path.name}: {plan.reason}"
            with pytest.raises(SubmitRejected) as refused:
                client.submit(path)
            assert refused.value.reason_code == code, f"{path.name}: {refused.value}"
            assert "\n" not in str(refused.value)
        oversized = tmp_path / "oversized.sql"
        oversized.write_text(f"{WINDOWED}, count(*) AS n FROM events {GROUPED} -- " + "x" * 300_000)
        with pytest.raises(QueryRejected) as too_large:
            client.submit(oversized)
        assert too_large.value.reason_code == "query_too_large"
        after = client.status()
    # Each was refused; none ran: no graph, no view, no setting, no file, and the secret stayed secret.
    assert after.current == before.current
    assert set(after.graphs) == {"count_per_key"}
    assert [s.state for s in after.swaps] == [SwapPhase.REJECTED] * len(OUTSIDE)
    assert not spark.catalog.tableExists("sneaky")
    assert not spark.catalog.tableExists("events")
    assert spark.conf.get("spark.sql.shuffle.partitions") == shuffle
    assert not out.exists()
    assert settings.redis_dsn.split("@")[-1] not in " ".join(s.error or "" for s in after.swaps)


def test_kafkas_own_parser_reads_back_a_password_with_quotes_and_backslashes(spark: SparkSession) -> None:
    password = 'p"a\\ss\\"w;rd'
    settings = Settings(kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username='svc"1', kafka_sasl_password=password)
    line = settings.spark_kafka_options()["kafka.sasl.jaas.config"]
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    # The class Spark's Kafka client parses sasl.jaas.config with.
    parsed = jvm.org.apache.kafka.common.security.JaasConfig("KafkaClient", line)
    options = parsed.getAppConfigurationEntry("KafkaClient")[0].getOptions()
    assert options.get("password") == password
    assert options.get("username") == 'svc"1'
