"""The sinks' cost per batch: the same batch of results written by an execution graph's result
writer into each sink (the Kafka topic, a Postgres table, a Delta Lake table), in alternating
rounds, on the bench's broker and a PostgreSQL server started for it.

Runs in a process of its own (`python -m benchmarks.sinks`), with a Spark session that loads Delta
Lake's extension, as the executor's does when its sink is Delta. A batch is `rows` results of one
window (a group each), the size of a closing window's output at the bench's key count; the first
batches of each sink are not counted (a first write creates the table, Delta's first commits read
an empty log). What is timed is the writer's call: the results' plan, the write and its commit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kafka.admin import KafkaAdminClient, NewTopic
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks.common import settings_for
from hotswap.contract.settings import Settings
from hotswap.executor.control.spark_session import build_spark_session
from hotswap.service_sink.delta import DeltaTable
from hotswap.service_sink.postgres import PostgresTable
from hotswap.service_sink.results import ResultTable, ResultWriter
from tests.integration.postgres import PostgresServer

SINKS = ("kafka", "postgres", "delta")
WARM_BATCHES = 3
TIMEOUT_S = 900


def run_sinks(quick: bool) -> dict[str, Any]:
    """The section, as `benchmarks.run` calls it: the measuring process's JSON."""
    command = [sys.executable, "-m", "benchmarks.sinks", *(["--quick"] if quick else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"benchmarks.sinks exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _batch(spark: SparkSession, rows: int, batch_id: int) -> DataFrame:
    start = batch_id * 10_000
    return spark.range(rows).select(
        F.timestamp_millis(F.lit(start)).alias("window_start"),
        F.timestamp_millis(F.lit(start + 10_000)).alias("window_end"),
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
        F.col("id").alias("n"),
        (F.col("id") * 1.5).alias("total"),
    )


def measure(rounds: int, batches: int, rows: int) -> dict[str, Any]:
    base = settings_for("sinks")
    root = Path(tempfile.mkdtemp(prefix="hotswap-bench-sinks-"))
    delta_path = root / "delta"
    settings = Settings.model_validate({**base.model_dump(), "sink": f"delta:{delta_path}"})
    postgres = PostgresServer()
    postgres.start()
    admin = KafkaAdminClient(**settings.kafka.kafka_python_config())
    admin.create_topics([NewTopic(settings.sink_topic, 2, 1)])
    admin.close()
    spark = build_spark_session(settings.spark)
    spark.sparkContext.setLogLevel("ERROR")
    per_batch: dict[str, list[float]] = {sink: [] for sink in SINKS}
    try:
        pg_settings = Settings.model_validate(
            {**base.model_dump(), "sink": "postgres:bench_results", "sink_url": postgres.url}
        )
        tables: dict[str, ResultTable | None] = {
            "kafka": None,
            "postgres": PostgresTable(pg_settings.pipeline.sink, postgres.url_secret),
            "delta": DeltaTable(settings.pipeline.sink, "bench-writer"),
        }
        batch_id = 0
        for _ in range(rounds):
            for sink in SINKS:
                writer = ResultWriter(settings.kafka, settings.sink_topic, "bench", ("key",), table=tables[sink])
                for i in range(batches):
                    frame = _batch(spark, rows, batch_id)
                    began = time.monotonic()
                    writer(frame, batch_id)
                    if i >= WARM_BATCHES:
                        per_batch[sink].append(time.monotonic() - began)
                    batch_id += 1
        for table in tables.values():
            if table is not None:
                table.close()
    finally:
        spark.stop()
        postgres.remove()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "rows_per_batch": rows,
        "batches_counted": {sink: len(times) for sink, times in per_batch.items()},
        "median_ms": {sink: round(statistics.median(t) * 1000, 1) for sink, t in per_batch.items()},
        "p90_ms": {sink: round(sorted(t)[int(0.9 * len(t))] * 1000, 1) for sink, t in per_batch.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds, batches = (2, 13) if args.quick else (3, 23)
    print(json.dumps(measure(rounds, batches, rows=30)), flush=True)


if __name__ == "__main__":
    main()
