"""How many tasks a graph's query may run at once, and whether Spark may run a task twice.

Every Spark query of an executor shares one application's task slots: the service graph, each
execution graph and each shadow. A submitted query may hold its tasks for long (a slow model server, a
model to load, a stall), and a stage of it runs with `spark.sql.shuffle.partitions` tasks, 2 by default:
every slot of `local[2]`. Spark's scheduler never takes a slot back from a running task, so such a
query would stop the service graph's routing and the old graph's drain with it. The stages that run a
graph's query therefore get at most one task fewer than the application has slots; the read of the
graph's topic keeps one task per partition, unless the query's code runs in the read's stage (a close
job with no shuffle before the query): then that stage too.

A task that Spark runs again (a retry after a failure, a speculative copy, a task killed from the
web UI, which Spark queues again) writes its rows to Kafka again within the same batch. In local mode
Spark fails the job at a task's first failure, speculation is off unless set, and hotswap's session
runs without the UI: so there a row is written twice only by a replayed batch, which the service
graph records (contract.rewrites). Anywhere else a closing graph deduplicates every window.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
# `local`, `local[4]`, `local[*]`: one attempt per task (`local[4,3]` and clusters retry).
ONE_ATTEMPT_MASTER = re.compile(r"local(\[(\d+|\*)\])?")


def runs_tasks_twice(master: str | None, conf: Mapping[str, str]) -> bool:
    """Whether an application on `master` (None: not known), with Spark settings `conf`, may run a
    task twice within one job."""

    def on(key: str, default: str) -> bool:
        return conf.get(key, default).strip().lower() == "true"

    if on("spark.speculation", "false") or (on("spark.ui.enabled", "true") and on("spark.ui.killEnabled", "true")):
        return True
    return master is None or ONE_ATTEMPT_MASTER.fullmatch(master.strip()) is None


def tasks_may_run_twice(spark: SparkSession) -> bool:
    """`runs_tasks_twice` for the application `spark` runs in."""
    context = spark.sparkContext
    return runs_tasks_twice(context.master, dict(context.getConf().getAll()))


def task_slots(spark: SparkSession) -> int:
    """The tasks the application can run at once, now; 0 when Spark cannot tell (a cluster whose
    executors have not registered yet)."""
    context = spark.sparkContext._jsc.sc()
    try:
        return int(context.maxNumConcurrentTasks(context.resourceProfileManager().defaultResourceProfile()))
    except Py4JError:
        return 0


def query_partitions(configured: int, slots: int) -> int:
    """The partitions of a graph query's stages: `configured`, but one fewer than `slots` at most (and
    at least one); `configured` when the slots are unknown."""
    if slots <= 0:
        return configured
    return max(1, min(configured, slots - 1))


def leave_a_slot(session: SparkSession, configured: int, slots: int | None = None) -> int:
    """Set the partitions of the stages `session` (a graph's own session) runs from now on; returns them.
    `slots`: the application's task slots, if just looked up."""
    partitions = query_partitions(configured, task_slots(session) if slots is None else slots)
    session.conf.set(SHUFFLE_PARTITIONS, str(partitions))
    return partitions
