"""Submit-time validation of a user query.

The query is applied once, to a streaming `events` that is never started. Spark's own streaming
checks run on it (an aggregation that is not event-time windowed cannot run in append mode), and
its analysed logical plan is read, through py4j, for what a swap needs to know:

- The window. Spark's analyser replaces each `window(...)` call with a projection (an `Expand`
  for sliding windows) that computes the window struct from the event time, and marks the
  attribute it defines with `spark.timeWindow` metadata. Evaluating that struct expression at a
  fixed instant (and just before the latest window start) gives the window size, the slide and
  their offset from the epoch, whatever the query filters: no event needs to pass through the
  query. A sliding window is accepted when its slide divides its size (README, "Sliding windows").
- The group columns: output columns whose values come from the grouping expressions of the
  query's `Aggregate`, traced down the plan by expression id. They make up the result key
  (docs/architecture.md, "One key per result").
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from hotswap.contract.causes import first_line
from hotswap.contract.models import QuerySource
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.windows import Windowing, common_boundary_ms, format_duration_ms
from hotswap.execution_graph.errors import QueryRejected
from hotswap.execution_graph.plan import Origin, Plan
from hotswap.execution_graph.user_query import apply_query

# A cut waits for the next boundary shared by both windows' grids (their slides; their sizes when
# tumbling); refuse grids whose common boundary is further apart than this many of the larger one.
MAX_BOUNDARY_SPREAD = 10

WINDOW_COLUMNS = ("window_start", "window_end")
# Never part of the result key: the result writer adds query_id itself.
NOT_GROUP_COLUMNS = (*WINDOW_COLUMNS, "query_id")

# The instant (µs since the epoch) at which window assignment is evaluated. Any instant will do,
# as size, overlap and offset are the same everywhere; it is above 2**31 so py4j passes a long.
_PROBE_MICROS = 1_700_000_000_000_000


@dataclass(frozen=True)
class QueryShape:
    """What validation learned about a query."""

    window_ms: int
    columns: tuple[str, ...]
    group_columns: tuple[str, ...]
    slide_ms: int | None = None  # None: tumbling (slide == size)

    @property
    def windowing(self) -> Windowing:
        return Windowing.of(self.window_ms, self.slide_ms)


def validate_query(
    spark: SparkSession,
    source: QuerySource,
    events: DataFrame,
    running_grid_ms: int | None,
    tables: Collection[str] = (),
) -> QueryShape:
    """Raises QueryRejected with a one-line reason, or returns the query's shape. `events`: a stream
    for a stateful graph (Spark's streaming rules apply), a batch for a closing graph (any batch
    query over a window's rows: distinct counts, exact percentiles, ranking). `running_grid_ms`:
    the spacing of the running query's window ends (its slide; its size when tumbling). `tables`: the
    static tables of `events`' session the query may read besides `events`."""
    output = apply_query(events, source, tables)
    _check_columns(source, output)
    if events.isStreaming:
        _check_streaming(spark, source, output)
    shape = _query_shape(spark, source, output)
    if running_grid_ms is not None:
        check_cuttable(running_grid_ms, shape.windowing.grid_ms, slides=shape.windowing.sliding)
    return shape


def check_cuttable(old_grid_ms: int, new_grid_ms: int, *, slides: bool = False) -> None:
    """Both versions' window ends must meet often enough: W is a boundary of both grids (the
    slides, or the sizes of tumbling windows). `slides`: either version slides, so say slides."""
    step = common_boundary_ms(old_grid_ms, new_grid_ms)
    if step > MAX_BOUNDARY_SPREAD * max(old_grid_ms, new_grid_ms):
        what = "slide" if slides else "size"
        raise QueryRejected(
            f"window {what}s {format_duration_ms(old_grid_ms)} and {format_duration_ms(new_grid_ms)} share a boundary "
            f"only every {format_duration_ms(step)}; choose a {what} that divides or is a multiple of the running one",
            ReasonCode.WINDOWS_NOT_CUTTABLE,
        )


def _check_columns(source: QuerySource, output: DataFrame) -> None:
    fields = {f.name: f.dataType for f in output.schema.fields}
    for column in WINDOW_COLUMNS:
        if column not in fields:
            raise QueryRejected(
                f"query {source.name!r} output has no {column} column; "
                "select window.start AS window_start, window.end AS window_end"
            )
        if not isinstance(fields[column], T.TimestampType):
            raise QueryRejected(f"query {source.name!r} column {column} must be a timestamp, not {fields[column]}")


def _check_streaming(spark: SparkSession, source: QuerySource, output: DataFrame) -> None:
    """Spark's own check that the query can run in append mode on a stream."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    try:
        checker = jvm.org.apache.spark.sql.catalyst.analysis.UnsupportedOperationChecker
        mode = jvm.org.apache.spark.sql.streaming.OutputMode.Append()
        checker.checkForStreaming(output._jdf.queryExecution().analyzed(), mode)
    except (Py4JJavaError, PySparkException) as exc:
        message = first_line(exc)
        message = message.removeprefix("org.apache.spark.sql.AnalysisException: ")
        if "distinct aggregation" in message.lower() or "window function" in message.lower():
            raise QueryRejected(
                f"query {source.name!r} cannot run as a stream: {message} It can on the closing engine, which "
                "computes each window once as a batch (graph_engine = closing)"
            ) from exc
        if "without watermark" in message or "aggregat" in message.lower():
            raise QueryRejected(
                f"query {source.name!r} aggregates without an event-time window "
                "(group by window(event_time, ...)); append mode cannot emit it"
            ) from exc
        raise QueryRejected(f"query {source.name!r} cannot run as a stream: {message}") from exc


def _query_shape(spark: SparkSession, source: QuerySource, output: DataFrame) -> QueryShape:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    plan = Plan(jvm, output._jdf.queryExecution().analyzed())
    windowing = _windowing(source, plan)
    output_attributes = plan.output()
    by_name = dict(output_attributes)
    for column in WINDOW_COLUMNS:
        origins = plan.origins(by_name[column])
        if Origin.UNKNOWN not in origins and origins != {Origin.WINDOW}:
            raise QueryRejected(
                f"query {source.name!r} column {column} does not come from the window; "
                "select window.start AS window_start, window.end AS window_end"
            )
    groups = tuple(
        name for name, attribute in output_attributes if name not in NOT_GROUP_COLUMNS and plan.is_group(attribute)
    )
    columns = tuple(f.name for f in output.schema.fields)
    return QueryShape(window_ms=windowing.size_ms, columns=columns, group_columns=groups, slide_ms=windowing.slide_ms)


def _windowing(source: QuerySource, plan: Plan) -> Windowing:
    """The one epoch-aligned window of the query, tumbling or sliding by a slide that divides its
    size, in ms."""
    name = source.name
    if plan.has_session_window():
        raise QueryRejected(
            f"query {name!r} uses session windows, whose boundaries are known only once the rows have arrived; "
            "only tumbling and sliding windows can be cut"
        )
    try:
        # One per window() of the query: the windows it assigns the probe instant to, and its slide.
        grids = plan.window_grids(_PROBE_MICROS)
    except Py4JJavaError as exc:
        raise QueryRejected(f"query {name!r} window cannot be read from its plan: {first_line(exc)}") from exc
    if not grids:
        if plan.has_aggregate():  # what Spark's streaming checks say of it on a stateful graph, said for both
            raise QueryRejected(
                f"query {name!r} aggregates without an event-time window (group by window(event_time, ...)); "
                "a window's result must be emitted once, when the window closes"
            )
        raise QueryRejected(f"query {name!r} has no window(event_time, ...) in its plan; is it windowed?")
    sizes = {end - start for grid in grids for start, end in grid.windows}
    slides = {grid.slide_micros for grid in grids}
    if len(sizes) != 1 or len(slides) != 1:
        raise QueryRejected(
            f"query {name!r} produces windows of several sizes or slides; a query can be cut only with one window"
        )
    size, slide = sizes.pop(), slides.pop()
    if size <= 0 or slide <= 0:
        raise QueryRejected(f"query {name!r} produces empty windows")
    if size % slide:
        raise QueryRejected(
            f"query {name!r} slides its {_micros(size)} windows every {_micros(slide)}, which does not divide their "
            "size; choose a slide that divides the window size"
        )
    if any(start % slide for grid in grids for start, _ in grid.windows):
        raise QueryRejected(f"query {name!r} windows are offset from the epoch; drop the window() startTime argument")
    for what, micros in (("size", size), ("slide", slide)):
        if micros % 1000:
            raise QueryRejected(
                f"query {name!r} window {what} must be a whole number of milliseconds, not {micros} microseconds"
            )
    return Windowing(size // 1000, slide // 1000)


def _micros(micros: int) -> str:
    return format_duration_ms(micros // 1000) if micros % 1000 == 0 else f"{micros}us"
