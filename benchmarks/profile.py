"""Where a batch's time goes, read in the driver after a measured period (never during it):

- the product's own stage timings (`hotswap.contract.stages`), per query role and stage;
- Spark's per-batch durations (`durationMs` of each progress report: addBatch, latestOffset,
  queryPlanning, walCommit, commitOffsets, triggerExecution), per query role;
- Spark's code generation: compilations and compile seconds per batch, from the driver JVM's
  counters (`CodegenMetrics` and `CodeGenerator.compileTime`). In local mode the tasks run in the
  driver JVM, so this counts every compilation, driver and tasks; a batch that keeps compiling is a
  plan that keeps changing.
- the Spark tasks each execution-graph batch ran (`graph_tasks`), from the driver's status store
  (`statusTracker`, no REST): the stages of the jobs in the query's job group, matched to its
  batches by their submission time.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession

from benchmarks.measures import tasks_per_batch
from hotswap.contract import stages
from hotswap.contract.settings import Settings
from hotswap.execution_graph.graph import GraphQuery
from hotswap.service_sink.progress import parse_spark_time


def role(query_name: str, settings: Settings) -> str:
    """A Spark query's name without its namespace, so rounds on different namespaces add up."""
    prefix = settings.names.owned_topic_prefix
    return query_name[len(prefix) :] if query_name.startswith(prefix) else query_name


def stage_samples(settings: Settings) -> dict[str, dict[str, list[float]]]:
    """The stage timings recorded so far by this namespace's queries, by role."""
    out: dict[str, dict[str, list[float]]] = {}
    for query, by_stage in stages.snapshot().items():
        if query.startswith(settings.names.owned_topic_prefix):
            out[role(query, settings)] = by_stage
    return out


def merge(into: dict[str, dict[str, list[float]]], more: Mapping[str, Mapping[str, list[float]]]) -> None:
    for query, by_stage in more.items():
        for stage, values in by_stage.items():
            into.setdefault(query, {}).setdefault(stage, []).extend(values)


def medians_ms(samples: Mapping[str, Mapping[str, list[float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """role -> stage -> {median_ms, samples}; seconds as recorded, milliseconds as reported."""
    return {
        query: {
            stage: {"median_ms": round(statistics.median(values) * 1000, 1), "samples": len(values)}
            for stage, values in by_stage.items()
            if values
        }
        for query, by_stage in samples.items()
    }


def progress_between(query: GraphQuery, start_ms: int, end_ms: int) -> list[dict[str, Any]]:
    """The query's progress reports of batches that started within [start_ms, end_ms] (Spark keeps
    the last 100 in the driver)."""
    out = []
    for progress in query.recentProgress:
        started = parse_spark_time(progress.get("timestamp"))
        if started is not None and start_ms <= started <= end_ms:
            out.append(
                {
                    "batch": int(progress["batchId"]),
                    "start_ms": started,
                    "rows": int(progress.get("numInputRows") or 0),
                    "durations_ms": {str(k): float(v) for k, v in (progress.get("durationMs") or {}).items()},
                }
            )
    return sorted(out, key=lambda p: p["start_ms"])


def duration_medians(batches: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Median milliseconds per `durationMs` entry over the batches that reported it."""
    by_key: dict[str, list[float]] = {}
    for batch in batches:
        for key, value in batch["durations_ms"].items():
            by_key.setdefault(key, []).append(value)
    return {key: round(statistics.median(values), 1) for key, values in sorted(by_key.items())}


@dataclass(frozen=True)
class Codegen:
    compilations: int
    compile_s: float


def codegen(spark: SparkSession) -> Codegen | None:
    """The driver JVM's cumulative code generation counters; None if this Spark does not have them."""
    jvm = spark.sparkContext._jvm
    if jvm is None:
        return None
    try:
        count = int(jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount())
        nanos = int(jvm.org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator.compileTime())
    except Exception:  # noqa: BLE001 - a Spark without these counters: the report says "not measured"
        return None
    return Codegen(count, nanos / 1e9)


def codegen_per_batch(before: Codegen | None, after: Codegen | None, batches: int) -> dict[str, Any] | None:
    if before is None or after is None:
        return None
    compilations, seconds = after.compilations - before.compilations, after.compile_s - before.compile_s
    return {
        "batches": batches,
        "compilations": compilations,
        "compile_s": round(seconds, 3),
        "compilations_per_batch": round(compilations / batches, 2) if batches else None,
        "compile_ms_per_batch": round(seconds * 1000 / batches, 1) if batches else None,
    }


def query_stages(spark: SparkSession, query: GraphQuery) -> list[tuple[int, int]] | None:
    """(submission epoch ms, tasks run) of each stage of the query's Spark jobs that the driver's
    status store still holds; None if Spark would not say.

    A streaming query's thread runs every batch in the job group of its run id, and a foreachBatch's
    Python calls back into the JVM on that same thread (py4j pins them to it), so the jobs a
    foreachBatch starts (a closing graph's batch reads, the result writer's) are in that group too.
    A skipped stage was never submitted (time 0): it ran nothing.
    """
    # The JVM's tracker, not pyspark's wrapper: the wrapper drops each stage's submission time.
    tracker = spark.sparkContext._jsc.statusTracker()
    seen: set[int] = set()
    out: list[tuple[int, int]] = []
    try:
        for job_id in list(tracker.getJobIdsForGroup(str(query.runId))):
            job = tracker.getJobInfo(job_id)
            if job is None:  # forgotten by the store since the list was read
                continue
            for stage_id in list(job.stageIds()):
                if stage_id in seen:
                    continue
                seen.add(stage_id)
                stage = tracker.getStageInfo(stage_id)
                submitted = 0 if stage is None else int(stage.submissionTime())
                if submitted > 0:
                    out.append((submitted, int(stage.numCompletedTasks())))
    except Py4JError:
        return None
    return out


def graph_tasks(
    spark: SparkSession, queries: Mapping[str, GraphQuery], start_ms: int, end_ms: int
) -> dict[str, dict[str, Any]]:
    """Per execution graph (role `graph.<query id>`): the Spark tasks each of its batches that
    started within [start_ms, end_ms] ran (`measures.tasks_per_batch`). Read after the period, like
    the rest of the profile; the bench keeps enough of Spark's stages for that (run.STATUS_RETENTION)."""
    out: dict[str, dict[str, Any]] = {}
    for name, query in queries.items():
        if not name.startswith("graph."):
            continue
        batches = [
            (b["start_ms"], int(b["durations_ms"].get("triggerExecution", 0)))
            for b in progress_between(query, start_ms, end_ms)
        ]
        held = query_stages(spark, query)
        got = tasks_per_batch(batches, held or [])
        if held is None:
            got["error"] = "Spark's status tracker did not answer"
        elif not held:
            got["error"] = f"no stage of job group {query.runId} (the query's run id) in Spark's status store"
        out[name] = got
    return out
