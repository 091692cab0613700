"""The two pipelines the benchmark compares, started and stopped the same way.

- `PlainPipeline`: one plain Spark Kafka-to-Kafka query (parse JSON, Spark's own watermark, the
  reference query, the same ResultWriter hotswap uses): what a user runs without hotswap.
- `HotswapPipeline`: an executor in this process (the Spark driver's), with the service graph and
  the execution graphs it runs, on the engine its settings name (one side per engine).

Both write to their namespace's results topic, where the benchmark reads every measure of progress
(`probe.ResultWatcher`), and both name their Spark queries by role (`plain`, `service`,
`graph.<query id>`) for the per-stage numbers.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from benchmarks.profile import graph_tasks
from hotswap.contract.settings import Settings
from hotswap.execution_graph.graph import GraphQuery
from hotswap.execution_graph.source import load_query_source
from hotswap.execution_graph.user_query import apply_query
from hotswap.executor.control.controller import Executor
from hotswap.executor.control.topics import Topics
from hotswap.executor.operator.client import Client, redis_client
from hotswap.service_sink.results import ResultWriter

EXECUTOR_START_S = 300.0


class Pipeline(Protocol):
    side: str
    settings: Settings

    def start(self) -> None: ...

    def queries(self) -> dict[str, GraphQuery]: ...

    def stop(self) -> None: ...


def plain_events(spark: SparkSession, settings: Settings, starting: str) -> DataFrame:
    """The source as a plain user would read it: parse JSON, event time, Spark's own watermark."""
    return (
        spark.readStream.format("kafka")
        .options(**settings.spark_kafka_options())
        .option("subscribe", settings.source_topic)
        .option("startingOffsets", starting)
        .option("maxOffsetsPerTrigger", str(settings.max_offsets_per_trigger))
        .load()
        .selectExpr("from_json(CAST(value AS STRING), 'key STRING, value DOUBLE, ts BIGINT') AS e")
        .selectExpr("e.key AS key", "e.value AS value", "e.ts AS ts", "timestamp_millis(e.ts) AS event_time")
        .withWatermark("event_time", f"{settings.lateness.ms} milliseconds")
    )


def start_plain(spark: SparkSession, settings: Settings, query: Path, version: str, starting: str) -> StreamingQuery:
    """One plain query writing through the same ResultWriter hotswap uses (same keys and JSON)."""
    output = apply_query(plain_events(spark, settings, starting), load_query_source(query))
    # Spark's default trigger, as a user runs plain Spark (it is plain Spark's faster one: README,
    # "Performance", "Trigger"), whatever hotswap's trigger_interval.
    return (
        output.writeStream.outputMode("append")
        .queryName(f"plain-{settings.namespace}-{version}")
        .option("checkpointLocation", f"{settings.names.checkpoint_root}/plain-{version}")
        .foreachBatch(ResultWriter(settings.kafka, settings.sink_topic, version, ("key",)))
        .start()
    )


def stop_quietly(query: StreamingQuery) -> None:
    """stop() interrupts the batch in flight, as a user's restart does; py4j logs that interruption
    of the Python foreachBatch as an error with a long trace, which is expected here."""
    py4j_log = logging.getLogger("py4j.clientserver")
    level = py4j_log.level
    py4j_log.setLevel(logging.CRITICAL)
    try:
        query.stop()
    finally:
        py4j_log.setLevel(level)


class PlainPipeline:
    side = "plain_spark"

    def __init__(self, spark: SparkSession, settings: Settings, query: Path, starting: str = "earliest") -> None:
        self.settings = settings
        self._spark = spark
        self._query_path = query
        self._starting = starting
        self.query: StreamingQuery | None = None

    def start(self) -> None:
        self.query = start_plain(self._spark, self.settings, self._query_path, self._query_path.stem, self._starting)

    def queries(self) -> dict[str, GraphQuery]:
        return {"plain": self.query} if self.query is not None else {}

    def replace(self, query: Path) -> None:
        """Stop-and-restart: the new version on a fresh checkpoint, from `latest` offsets."""
        if self.query is not None:
            stop_quietly(self.query)
        self.query = start_plain(self._spark, self.settings, query, query.stem, "latest")

    def stop(self) -> None:
        if self.query is not None and self.query.isActive:
            stop_quietly(self.query)


class HotswapPipeline:
    def __init__(self, spark: SparkSession, settings: Settings, query: Path, side: str = "hotswap") -> None:
        self.side = side
        self.settings = settings
        self._spark = spark
        self._query_path = query
        self.client = Client(settings.control, settings.kafka, settings.pipeline, redis_client(settings.control))
        self.executor = Executor(settings, spark, redis_client(settings.control))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def start(self) -> None:
        def run() -> None:
            try:
                self.executor.run(load_query_source(self._query_path), self._stop)
            except BaseException as exc:
                self._failure = exc
                raise

        self._thread = threading.Thread(target=run, daemon=True, name=f"executor-{self.settings.namespace}")
        self._thread.start()
        # Ready once the service graph and the first execution graph run.
        if not self.executor.ready.wait(EXECUTOR_START_S):
            raise TimeoutError(f"benchmark: executor not ready within {EXECUTOR_START_S:.0f}s")
        self.check()

    def check(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"the executor stopped: {type(self._failure).__name__}: {self._failure}")

    def queries(self) -> dict[str, GraphQuery]:
        self.check()
        found: dict[str, GraphQuery] = {}
        if self.executor.service.query is not None:
            found["service"] = self.executor.service.query
        for query_id, query in self.executor.graphs.runner.running().items():
            found[f"graph.{query_id}"] = query
        return found

    def graph_layout(self) -> dict[str, dict[str, Any]]:
        """Per running execution graph (role `graph.<query id>`): its engine and partitions as its
        record says, and its topic's partitions as Kafka says (what the graph actually read)."""
        records = self.client.graph_records()
        out: dict[str, dict[str, Any]] = {}
        with Topics(self.settings.kafka, self.settings.pipeline, self.settings.timeouts) as topics:
            for query_id in self.executor.graphs.runner.running():
                record = records.get(query_id)
                out[f"graph.{query_id}"] = {
                    "engine": None if record is None else record.engine.value,
                    "recorded_partitions": None if record is None else record.partitions,
                    "topic_partitions": topics.partitions(self.settings.names.graph_topic(query_id)),
                }
        return out

    def graph_report(self, queries: dict[str, GraphQuery], start_ms: int, end_ms: int) -> dict[str, dict[str, Any]]:
        """Per execution graph: its engine, its topic's partitions, and the Spark tasks each of its
        batches that started within [start_ms, end_ms] ran. Read after the period (Kafka's metadata
        and Spark's status store); a failure to read the layout is recorded, not fatal."""
        try:
            layout = self.graph_layout()
        except Exception as exc:  # noqa: BLE001 - Redis or Kafka metadata: the tasks are still worth having
            layout = {name: {"error": f"{type(exc).__name__}: {exc}"} for name in queries if name.startswith("graph.")}
        tasks = graph_tasks(self._spark, queries, start_ms, end_ms)
        return {name: {**layout.get(name, {}), "tasks": tasks.get(name)} for name in sorted({*layout, *tasks})}

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
