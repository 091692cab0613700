"""A batch's observed metrics (Spark's `observe`) as one column.

The service graph observes its routing statistics on the rows it writes (service_graph/frames.py),
and a closing graph's job the route headers of the rows it reads (execution_graph/closing.py): a
score of conditional aggregates each. Given as columns of their own, each aggregate costs the driver
four to five py4j round trips per batch (PySpark looks up `functions`, calls `expr`, wraps the column,
and adds it to the list it hands the JVM): an observed job of 26 aggregates made 146-150 round trips
in all, 25-28 with them as the fields of one struct (measured warm, on an idle machine). Spark
computes the same aggregates either way, so the rows cost the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The one observed column.
OBSERVED = "observed"


def observed_column(aggregates: Sequence[str]) -> str:
    """SQL for one struct column holding `aggregates`, each `<aggregate> AS <name>` (the name may be
    back-quoted), under their names."""
    fields = []
    for aggregate in aggregates:
        expression, _, alias = aggregate.rpartition(" AS ")
        name = alias.strip().strip("`")
        if not expression or not name or "'" in name or "\\" in name:
            raise ValueError(f"an observed aggregate must read `<aggregate> AS <name>`: {aggregate!r}")
        fields.append(f"'{name}', {expression}")
    return f"named_struct({', '.join(fields)}) AS {OBSERVED}"


def observed_values(observed: Mapping[str, Any]) -> dict[str, Any] | None:
    """The aggregates by name, from what Spark answered for `observed_column` (an observation's metrics,
    or a row of the same aggregation); None if the answer does not hold the column."""
    struct = observed.get(OBSERVED)
    if struct is None:
        return None
    return dict(struct.asDict(recursive=False))
