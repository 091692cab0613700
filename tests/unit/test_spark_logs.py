"""The driver's log4j2 configuration: Spark's task and query failure lines go to a file, whole, and the
console keeps hotswap's one-line report (README, "Watching a swap", Logs)."""

from __future__ import annotations

from pathlib import Path

from hotswap.contract.settings import Settings
from hotswap.executor.control.spark_session import log4j2_file, session_conf, spark_log4j2, spark_log_file


def properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def test_spark_failure_lines_go_to_a_file_and_the_heartbeat_npe_off_the_console(tmp_path: Path) -> None:
    conf = properties(spark_log4j2(tmp_path / "spark.log"))
    assert conf["appender.file.fileName"] == str(tmp_path / "spark.log")
    routed = {conf[k]: k.rsplit(".", 1)[0] for k in conf if k.startswith("logger.failure") and k.endswith(".name")}
    assert "org.apache.spark.sql.execution.streaming" in routed  # "Query ... terminated with error"
    assert "org.apache.spark.executor.Executor" in routed  # "Exception in task ..."
    for prefix in routed.values():
        assert conf[f"{prefix}.additivity"] == "false"
        assert conf[f"{prefix}.appenderRef.file.ref"] == "file"
    assert "executor-heartbeater" in conf["appender.console.filter.heartbeat.regex"]
    assert conf["appender.console.filter.heartbeat.onMatch"] == "DENY"


def test_the_driver_reads_that_configuration_from_home(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    options = session_conf(settings.spark)["spark.driver.extraJavaOptions"]
    assert f"-Dlog4j2.configurationFile={log4j2_file(settings.spark)}" in options
    assert spark_log_file(settings.spark) == (tmp_path / "logs" / "spark.log").resolve()
