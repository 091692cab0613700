"""A batch's own numbers in Spark SQL, kept out of the Java code Spark generates.

hotswap's plans change from batch to batch only in a few numbers: the service graph's watermark, its
limit for events too far ahead and each destination's event-time range (service_graph/frames.py),
the windows a closing graph's job closes and the buckets it watches (execution_graph/closing.py),
and the bounds of the windows a graph owns when its results are written (service_sink/results.py).
Written as plain literals, Spark inlines each long into the code it generates, so every batch
compiles its code anew (about 180 ms a batch for the service graph; 45 compilations and 1.3 s of
driver time in one closing drain of 200,000 events, measured). `batch_long(n)` is instead

    CAST(coalesce(IF(spark_partition_id() < 0, CAST(NULL AS DECIMAL(18,0)), NULL),
                  CAST(n AS DECIMAL(18,0))) AS BIGINT)

Spark keeps a decimal literal as an object the generated code refers to; the nondeterministic
`spark_partition_id()` in the first argument stops the optimizer from folding the whole into a long;
every part is generated code. So the code is the same whatever `n` is, and Spark's code cache
serves it. A cast over `IF(<nondeterministic>, n, NULL)` is not enough: the optimizer pushes the
cast into the branches and folds it. `java_method('java.lang.Long', 'valueOf', 'n')`, used before,
is interpreted: a reflective call per row and constant, and a break between generated stages that
copies every row (the service graph's routing job on 400,000 cached rows, `local[2]`, medians of
eight alternating rounds: 1.73 s with it, 1.36 s with `batch_long`).
"""

from __future__ import annotations

# What a constant can hold: the widest a DECIMAL(18,0) holds, so it stays a compact decimal (a long
# inside, no BigDecimal). An event time past contract.windows.MAX_EVENT_TIME_MS (about 2.5e14 ms)
# never reaches a plan, so these also serve as open bounds.
LOWEST, HIGHEST = -(10**18 - 1), 10**18 - 1

_NEVER = "IF(spark_partition_id() < 0, CAST(NULL AS DECIMAL(18,0)), NULL)"


def batch_long(value: int) -> str:
    """SQL for the BIGINT `value` (clamped to [LOWEST, HIGHEST]) that leaves the generated code the same
    whatever the value."""
    clamped = max(LOWEST, min(HIGHEST, int(value)))
    return f"CAST(coalesce({_NEVER}, CAST({clamped} AS DECIMAL(18,0))) AS BIGINT)"


def batch_timestamp(epoch_ms: int) -> str:
    """SQL for the TIMESTAMP at `epoch_ms`, as `batch_long` keeps a long."""
    return f"timestamp_millis({batch_long(epoch_ms)})"
