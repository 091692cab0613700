"""How many tasks a graph's query may run at once.

Every Spark query of an executor shares one application's task slots: the service graph, each
execution graph and each shadow. A submitted query may hold its tasks for long (a slow model server, a
model to load, a stall), and a stage of it runs with `spark.sql.shuffle.partitions` tasks, 2 by default:
every slot of `local[2]`. Spark's scheduler never takes a slot back from a running task, so such a
query would stop the service graph's routing and the old graph's drain with it. The stages that run a
graph's query therefore get at most one task fewer than the application has slots; the read of the
graph's topic (no user code) keeps one task per partition.
"""

from __future__ import annotations

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


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


def leave_a_slot(session: SparkSession, configured: int) -> int:
    """Set the partitions of the stages `session` (a graph's own session) runs from now on; returns them."""
    partitions = query_partitions(configured, task_slots(session))
    session.conf.set(SHUFFLE_PARTITIONS, str(partitions))
    return partitions
