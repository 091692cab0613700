"""Issue 8: validation reads the window and the group columns from the query's plan.

No event passes through a query here: each one is analysed over the streaming `events` an
execution graph would read (a Kafka source that is never started), as the executor does.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaProducer
from pyspark.sql import DataFrame, SparkSession

from hotswap.contract.envelope import ROUTE_HEADER, marker_route
from hotswap.contract.models import GraphEngine, QueryKind, QuerySource
from hotswap.contract.settings import Settings, StaticTable
from hotswap.contract.source import SourceSpec
from hotswap.contract.windows import marker_event_time
from hotswap.execution_graph.confinement import isolated_session
from hotswap.execution_graph.errors import QueryRejected, SchemaRefused
from hotswap.execution_graph.events import batch_events
from hotswap.execution_graph.graph import events_stream
from hotswap.execution_graph.schemas import resolve
from hotswap.execution_graph.source import load_query_source
from hotswap.execution_graph.user_query import apply_query
from hotswap.execution_graph.validation import QueryShape, validate_query
from hotswap.executor.control.topics import Topics
from tests.conftest import DEMO_SOURCE
from tests.integration.conftest import Services
from tests.integration.harness import JARS, QUERIES, REPO

pytestmark = [pytest.mark.integration]

BAD = QUERIES / "bad"
EXAMPLES = REPO / "examples"
RUNNING_WINDOW_MS = 10_000  # every query is checked as the replacement of examples/count_per_key.sql
T0 = 1_700_000_000_000
WINDOW = "SELECT window.start AS window_start, window.end AS window_end"


@pytest.fixture(scope="module")
def events(spark: SparkSession, services: Services) -> DataFrame:
    settings = Settings(jars_dir=JARS, kafka_bootstrap=services.bootstrap)
    return events_stream(
        spark, settings.pipeline, settings.kafka, settings.names.graph_topic("validation"), DEMO_SOURCE
    )


def validate(spark: SparkSession, events: DataFrame, source: QuerySource) -> QueryShape:
    return validate_query(spark, source, events, RUNNING_WINDOW_MS)


def sql(text: str) -> QuerySource:
    return QuerySource(name="candidate", kind=QueryKind.SQL, text=text)


FILTERED_PYTHON = """
from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def query(events: DataFrame) -> DataFrame:
    return (
        events.where(F.col("value") >= 50)
        .groupBy(F.window("event_time", "30 seconds"), "key")
        .agg(F.avg("value").alias("mean"), F.count("*").alias("n"))
        .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "key", "mean",
                "n")
    )
"""

# (query, window ms, group columns): none of these needs a single event to match its filter.
VALID = [
    pytest.param(
        sql(
            f"{WINDOW}, key, count(*) AS n FROM events WHERE key = 'k7' GROUP BY window(event_time, '10 seconds'), key"
        ),
        10_000,
        ("key",),
        id="key-filter",
    ),
    pytest.param(
        sql(
            f"{WINDOW}, key, max(value) AS peak FROM events WHERE value > 90 "
            "GROUP BY window(event_time, '10 seconds'), key"
        ),
        10_000,
        ("key",),
        id="value-filter",
    ),
    pytest.param(
        sql(
            f"WITH hot AS (SELECT * FROM events WHERE value >= 50) "
            f"{WINDOW}, key, count(*) AS n FROM hot GROUP BY window(event_time, '10 seconds'), key"
        ),
        10_000,
        ("key",),
        id="cte",
    ),
    pytest.param(
        sql(f"{WINDOW}, key, count(*) AS n FROM events GROUP BY window(event_time, '10 seconds'), key HAVING n > 100"),
        10_000,
        ("key",),
        id="having",
    ),
    pytest.param(
        sql(
            f"{WINDOW}, ts DIV 1000 % 4 AS bucket, count(*) AS n FROM events "
            "GROUP BY window(event_time, '10 seconds'), ts DIV 1000 % 4"
        ),
        10_000,
        ("bucket",),
        id="bigint-group",
    ),
    pytest.param(
        sql(
            f"{WINDOW}, round(value, -1) AS level, count(*) AS n FROM events "
            "GROUP BY window(event_time, '20 seconds'), round(value, -1)"
        ),
        20_000,
        ("level",),
        id="double-group",
    ),
    pytest.param(
        sql(
            f"{WINDOW}, date_trunc('MINUTE', event_time) AS minute, key, sum(value) AS total FROM events "
            "GROUP BY window(event_time, '1 hour'), date_trunc('MINUTE', event_time), key"
        ),
        3_600_000,
        ("minute", "key"),
        id="timestamp-group",
    ),
    pytest.param(
        sql(f"{WINDOW}, value > 50 AS high, count(*) AS n FROM events GROUP BY window(event_time, '10 seconds'), 3"),
        10_000,
        ("high",),
        id="boolean-group",
    ),
    pytest.param(
        sql(f"{WINDOW}, key, count(*) AS n FROM events GROUP BY window(event_time, '1 minute'), key"),
        60_000,
        ("key",),
        id="one-minute",
    ),
    pytest.param(
        sql(f"{WINDOW}, key, avg(value) AS mean FROM events GROUP BY window(event_time, '1 hour'), key"),
        3_600_000,
        ("key",),
        id="one-hour",
    ),
    pytest.param(
        sql(f"{WINDOW}, count(*) AS n, sum(value) AS total FROM events GROUP BY window(event_time, '5 seconds')"),
        5_000,
        (),
        id="no-group",
    ),
    pytest.param(
        QuerySource(name="filtered", kind=QueryKind.PYTHON, text=FILTERED_PYTHON),
        30_000,
        ("key",),
        id="python-filter",
    ),
    pytest.param(
        sql(
            "SELECT ws AS window_start, we AS window_end, upper(k) AS k, n * 2 AS twice, 'v1' AS version FROM "
            "(SELECT window.start AS ws, window.end AS we, key AS k, count(*) AS n FROM events "
            "WHERE key IN ('k1', 'k2') GROUP BY window(event_time, '10 seconds'), key)"
        ),
        10_000,
        ("k",),
        id="subquery-renames",
    ),
    pytest.param(
        sql(
            f"{WINDOW}, to_date(event_time) AS day, key IS NULL AS keyless, window.end AS closes, count(*) AS n "
            "FROM events GROUP BY window(event_time, '10 seconds'), to_date(event_time), key IS NULL"
        ),
        10_000,
        ("day", "keyless"),
        id="date-group-and-window-derived-column",
    ),
    pytest.param(
        sql(
            f"{WINDOW}, key, count(*) AS n FROM events "
            "GROUP BY GROUPING SETS ((window(event_time, '10 seconds'), key), (window(event_time, '10 seconds')))"
        ),
        10_000,
        ("key",),
        id="grouping-sets",
    ),
    pytest.param(
        sql(
            "SELECT window(event_time, '10 seconds').start AS window_start, window(event_time, '10 seconds').end "
            "AS window_end, key, value FROM events WHERE value < 1"
        ),
        10_000,
        ("key", "value"),
        id="not-aggregated",
    ),
    pytest.param(
        sql(f"{WINDOW}, key, count(*) AS n FROM events GROUP BY window(event_time, '30 seconds', '10 seconds'), key"),
        30_000,
        ("key",),
        id="sliding",
    ),
]


@pytest.mark.parametrize(("source", "window_ms", "groups"), VALID)
def test_a_valid_query_is_accepted_with_its_window_and_group_columns(
    spark: SparkSession, events: DataFrame, source: QuerySource, window_ms: int, groups: tuple[str, ...]
) -> None:
    shape = validate(spark, events, source)
    assert shape.window_ms == window_ms
    assert shape.group_columns == groups
    assert shape.columns[:2] == ("window_start", "window_end")


def test_every_valid_query_runs_on_a_stream(spark: SparkSession, services: Services, tmp_path: Path) -> None:
    """Accepted is not enough: each query runs as an execution graph would, over routed rows and
    a watermark marker that closes every window, and fails none of its batches."""
    settings = Settings(home=tmp_path, jars_dir=JARS, kafka_bootstrap=services.bootstrap)
    topic = f"validation-run-{uuid.uuid4().hex[:8]}"
    topics = Topics(settings.kafka, settings.pipeline, settings.timeouts)
    topics.ensure(topic, 1)
    topics.close()
    producer = KafkaProducer(**settings.kafka_python_config(), acks="all")
    for offset in range(120):  # two minutes of event time, keys k0..k9 and values 0..99
        ts = T0 + offset * 1000
        row = {"key": f"k{offset % 10}", "value": float(offset * 7 % 100), "ts": ts}
        route = f"data,0,{offset},{ts},{ts}".encode()
        producer.send(topic, value=json.dumps(row).encode(), headers=[(ROUTE_HEADER, route)])
    producer.send(topic, value=b"", headers=[(ROUTE_HEADER, marker_route(marker_event_time(T0 + 3 * 3_600_000)))])
    producer.flush(timeout=30)
    producer.close(timeout=10)
    stream = events_stream(spark, settings.pipeline, settings.kafka, topic, DEMO_SOURCE)
    queries = [
        apply_query(stream, param.values[0])  # type: ignore[arg-type]  # pytest.param values are untyped
        .writeStream.format("noop")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / f"checkpoint-{i}"))
        .start()
        for i, param in enumerate(VALID)
    ]
    failed = []
    for param, running in zip(VALID, queries, strict=True):
        running.awaitTermination(300)
        if running.isActive:
            running.stop()
            failed.append(f"{param.id}: still running after 300 s")
        elif running.exception() is not None:
            failed.append(f"{param.id}: {running.exception()}")
    assert not failed, failed
    assert len(queries) >= 12


@dataclass(frozen=True)
class Example:
    """A query in examples/ and what validation must read from it."""

    file: str
    window_ms: int
    slide_ms: int
    groups: tuple[str, ...]
    streams: bool = True  # the stateful engine runs it too; else only the closing engine does
    schema: str | None = None  # the DDL file in examples/ it reads (event time created_at); None: the demo's


EXAMPLE_QUERIES = [
    Example("count_per_key.sql", 10_000, 10_000, ("key",)),
    Example("max_per_key_30s.sql", 30_000, 30_000, ("key",)),
    Example("average_per_key.py", 10_000, 10_000, ("key",)),
    Example("count_per_key_30s_every_10s.sql", 30_000, 10_000, ("key",)),
    Example("distinct_keys_per_window.sql", 10_000, 10_000, (), streams=False),
    Example("p90_per_key.sql", 10_000, 10_000, ("key",), streams=False),
    Example("top3_keys_per_window.sql", 10_000, 10_000, ("key",), streams=False),
    Example("orders_per_country.sql", 10_000, 10_000, ("country",), schema="orders.ddl"),
    Example("orders_per_channel.sql", 20_000, 20_000, ("channel",), schema="orders_with_channel.ddl"),
]


def test_every_example_query_is_listed() -> None:
    queries = sorted(path.name for path in EXAMPLES.iterdir() if path.suffix in (".sql", ".py"))
    assert queries == sorted(example.file for example in EXAMPLE_QUERIES)


@pytest.mark.parametrize("example", EXAMPLE_QUERIES, ids=lambda example: example.file)
def test_every_example_validates_on_each_engine_that_runs_it(
    spark: SparkSession, services: Services, example: Example
) -> None:
    """Over the `events` each engine gives a query (a stream for the stateful one, a batch for the
    closing one), of the schema the example reads, as the replacement of count_per_key.sql."""
    reads = DEMO_SOURCE
    if example.schema is not None:
        ddl = (EXAMPLES / example.schema).read_text().strip()
        reads = resolve(spark, SourceSpec(schema_ddl=ddl, event_time="created_at"))
    engines = {GraphEngine.CLOSING: batch_events(spark, reads)}
    if example.streams:
        settings = Settings(jars_dir=JARS, kafka_bootstrap=services.bootstrap)
        topic = settings.names.graph_topic("validation")
        engines[GraphEngine.STATEFUL] = events_stream(spark, settings.pipeline, settings.kafka, topic, reads)
    source = load_query_source(EXAMPLES / example.file)
    for engine, events in engines.items():
        shape = validate(spark, events, source)
        assert (shape.window_ms, shape.windowing.slide_ms, shape.group_columns) == (
            example.window_ms,
            example.slide_ms,
            example.groups,
        ), engine
        assert shape.columns[:2] == ("window_start", "window_end"), engine


# Per-window SQL that only the closing engine runs: (example, its group columns, a word the stateful
# engine's one-line reason must hold, or None where it is not checked).
PER_WINDOW = [
    pytest.param("distinct_keys_per_window.sql", (), "distinct", id="distinct-count"),
    pytest.param("p90_per_key.sql", ("key",), None, id="exact-percentile"),
    pytest.param("top3_keys_per_window.sql", ("key",), "row_number", id="top-n"),
]


@pytest.mark.parametrize(("name", "groups", "refused_for"), PER_WINDOW)
def test_the_closing_engine_accepts_per_window_sql_the_stateful_engine_refuses(
    spark: SparkSession, events: DataFrame, name: str, groups: tuple[str, ...], refused_for: str | None
) -> None:
    source = load_query_source(EXAMPLES / name)
    shape = validate(spark, batch_events(spark, DEMO_SOURCE), source)
    assert (shape.window_ms, shape.windowing.slide_ms, shape.group_columns) == (10_000, 10_000, groups)
    if refused_for is None:
        return
    with pytest.raises(QueryRejected) as rejected:
        validate(spark, events, source)
    message = str(rejected.value)
    assert "\n" not in message
    assert refused_for in message.lower(), message
    assert "without an event-time window" not in message, message  # it has one: that is not why


@pytest.mark.parametrize(
    ("window", "size_ms", "slide_ms"),
    [
        ("'30 seconds', '10 seconds'", 30_000, 10_000),
        ("'1 minute', '20 seconds'", 60_000, 20_000),
        ("'20 seconds', '20 seconds'", 20_000, 20_000),  # a slide equal to the size: tumbling
        ("'20 seconds'", 20_000, 20_000),
    ],
)
def test_a_window_is_read_with_its_size_and_slide(
    spark: SparkSession, events: DataFrame, window: str, size_ms: int, slide_ms: int
) -> None:
    shape = validate(
        spark, events, sql(f"{WINDOW}, key, count(*) AS n FROM events GROUP BY window(event_time, {window}), key")
    )
    assert (shape.window_ms, shape.windowing.slide_ms, shape.windowing.sliding) == (
        size_ms,
        slide_ms,
        size_ms != slide_ms,
    )


# (file in tests/integration/queries/bad, or query text) -> the one-line reason, or the part of it
# that Spark words.
BAD_FILES = {
    "syntax_error.sql": "query 'syntax_error' does not analyse: ",
    "unknown_column.sql": "colour",
    "no_window_columns.sql": (
        "query 'no_window_columns' output has no window_start column; "
        "select window.start AS window_start, window.end AS window_end"
    ),
    "not_windowed.sql": (
        "query 'not_windowed' aggregates without an event-time window (group by window(event_time, ...)); "
        "append mode cannot emit it"
    ),
    "misaligned_window.sql": (
        "window sizes 10s and 999ms share a boundary only every 9990s; "
        "choose a size that divides or is a multiple of the running one"
    ),
    "uneven_slide.sql": (
        "query 'uneven_slide' slides its 10s windows every 4s, which does not divide their size; "
        "choose a slide that divides the window size"
    ),
    "no_query_function.py": "query 'no_query_function' defines no function query(events) -> DataFrame",
    "query_raises.py": "query 'query_raises' raised: ValueError: model weights not found",
    "python_syntax_error.py": "query 'python_syntax_error' has a syntax error: ",
}

BAD_TEXTS = [
    pytest.param(
        f"{WINDOW}, key, count(*) AS n FROM events "
        "GROUP BY window(event_time, '10 seconds', '10 seconds', '3 seconds'), key",
        "query 'candidate' windows are offset from the epoch; drop the window() startTime argument",
        id="offset",
    ),
    pytest.param(
        f"{WINDOW}, key, count(*) AS n FROM events GROUP BY window(event_time, '10 seconds'), key UNION ALL "
        f"{WINDOW}, key, count(*) AS n FROM events GROUP BY window(event_time, '20 seconds'), key",
        "query 'candidate' produces windows of several sizes or slides; a query can be cut only with one window",
        id="several-sizes",
    ),
    pytest.param(
        f"{WINDOW}, key, count(*) AS n FROM events GROUP BY window(event_time, '30 seconds', '10 seconds'), key "
        f"UNION ALL {WINDOW}, key, count(*) AS n FROM events GROUP BY window(event_time, '30 seconds'), key",
        "query 'candidate' produces windows of several sizes or slides; a query can be cut only with one window",
        id="several-slides",
    ),
    pytest.param(
        f"{WINDOW}, key, count(*) AS n FROM events "
        "GROUP BY window(event_time, '30 seconds', '10 seconds', '5 seconds'), key",
        "query 'candidate' windows are offset from the epoch; drop the window() startTime argument",
        id="sliding-offset",
    ),
    pytest.param(
        f"{WINDOW}, key, count(*) AS n FROM events GROUP BY window(event_time, '3003 milliseconds', "
        "'1001 milliseconds'), key",
        "window slides 10s and 1001ms share a boundary only every 10010s; "
        "choose a slide that divides or is a multiple of the running one",
        id="sliding-not-cuttable",
    ),
    pytest.param(
        "SELECT session_window.start AS window_start, session_window.end AS window_end, key, count(*) AS n "
        "FROM events GROUP BY session_window(event_time, '10 seconds'), key",
        "query 'candidate' uses session windows, whose boundaries are known only once the rows have arrived; "
        "only tumbling and sliding windows can be cut",
        id="session",
    ),
    pytest.param(
        "SELECT event_time AS window_start, event_time AS window_end, key FROM events",
        "query 'candidate' has no window(event_time, ...) in its plan; is it windowed?",
        id="no-window",
    ),
    pytest.param(
        "SELECT unix_millis(window.start) AS window_start, unix_millis(window.end) AS window_end, key, count(*) AS n "
        "FROM events GROUP BY window(event_time, '10 seconds'), key",
        "query 'candidate' column window_start must be a timestamp, not LongType()",
        id="window-not-a-timestamp",
    ),
    pytest.param(
        "SELECT min(event_time) AS window_start, window.end AS window_end, key FROM events "
        "GROUP BY window(event_time, '10 seconds'), key",
        "query 'candidate' column window_start does not come from the window; "
        "select window.start AS window_start, window.end AS window_end",
        id="window-start-aggregated",
    ),
    pytest.param(
        f"{WINDOW}, key, count(*) AS n FROM events GROUP BY window(event_time, '1500 microseconds'), key",
        "query 'candidate' window size must be a whole number of milliseconds, not 1500 microseconds",
        id="sub-millisecond",
    ),
    pytest.param(
        "SELECT window(a.event_time, '10 seconds').start AS window_start, "
        "window(a.event_time, '10 seconds').end AS window_end, a.key FROM events a FULL OUTER JOIN events b "
        "ON a.key = b.key",
        "query 'candidate' cannot run as a stream: Stream-stream FullOuter join",
        id="not-appendable",
    ),
    pytest.param(
        f"{WINDOW}, key, count(*) AS n FROM events GROUP BY window(event_time, '1001 milliseconds'), key",
        "window sizes 10s and 1001ms share a boundary only every 10010s; "
        "choose a size that divides or is a multiple of the running one",
        id="not-cuttable",
    ),
]


def assert_one_line_reason(source: QuerySource, spark: SparkSession, events: DataFrame, reason: str) -> None:
    with pytest.raises(QueryRejected) as rejected:
        validate(spark, events, source)
    message = str(rejected.value)
    assert "\n" not in message
    if reason.endswith(": "):  # the rest is Spark's or Python's own wording
        assert message.startswith(reason), message
    else:
        assert reason in message, message


@pytest.mark.parametrize(("name", "reason"), sorted(BAD_FILES.items()))
def test_a_bad_query_file_is_rejected_with_its_one_line_reason(
    spark: SparkSession, events: DataFrame, name: str, reason: str
) -> None:
    assert_one_line_reason(load_query_source(BAD / name), spark, events, reason)


def test_every_bad_query_file_has_its_reason_listed() -> None:
    assert sorted(p.name for p in BAD.iterdir()) == sorted(BAD_FILES)


@pytest.mark.parametrize(("text", "reason"), BAD_TEXTS)
def test_a_bad_query_is_rejected_with_its_one_line_reason(
    spark: SparkSession, events: DataFrame, text: str, reason: str
) -> None:
    assert_one_line_reason(sql(text), spark, events, reason)


def test_a_python_query_is_applied_once(spark: SparkSession, events: DataFrame, tmp_path: Path) -> None:
    """Validation learns everything from one application of the query, to the stream."""
    calls = tmp_path / "calls"
    counting = FILTERED_PYTHON.replace(
        "def query(events: DataFrame) -> DataFrame:\n",
        f"def query(events: DataFrame) -> DataFrame:\n    with open({str(calls)!r}, 'a') as calls:\n"
        "        calls.write('c')\n",
    )
    source = QuerySource(name="counted", kind=QueryKind.PYTHON, text=counting)
    assert validate(spark, events, source).window_ms == 30_000
    assert calls.read_text() == "c"


# -- only queries: statements are parsed, refused and never run ----------------------------------------
NOT_QUERIES = [
    pytest.param("SET spark.sql.shuffle.partitions = 7", "SetCommand", id="set"),
    pytest.param("CREATE TEMP VIEW sneaky AS SELECT * FROM events", "CreateViewStatement", id="create-temp-view"),
    pytest.param("ADD JAR /tmp/hotswap-not-there.jar", "AddJarsCommand", id="add-jar"),
    pytest.param("CREATE TEMPORARY FUNCTION sneaky AS 'java.lang.String'", "CreateFunction", id="create-function"),
    pytest.param("INSERT OVERWRITE DIRECTORY '{out}' USING json SELECT 1 AS x", "InsertIntoDir", id="insert-directory"),
    pytest.param("SELECT 1 AS x; SELECT 2 AS y", "several statements", id="two-statements"),
]


@pytest.mark.parametrize(("text", "named"), NOT_QUERIES)
def test_a_statement_that_is_not_a_query_is_refused_and_leaves_no_trace(
    spark: SparkSession, events: DataFrame, tmp_path: Path, text: str, named: str
) -> None:
    out = tmp_path / "written"
    shuffle = spark.conf.get("spark.sql.shuffle.partitions")
    with pytest.raises(QueryRejected) as refused:
        validate(spark, events, sql(text.format(out=out)))
    assert refused.value.reason_code == "query_not_a_query"
    message = str(refused.value)
    assert "\n" not in message
    # The statement's kind is named (Catalyst's name for it, which may vary by Spark version).
    assert named.split("Statement")[0].split("Command")[0].lower() in message.lower(), message
    # Nothing ran: no view, no function, no setting, no file.
    assert not spark.catalog.tableExists("sneaky")
    assert not spark.catalog.functionExists("sneaky")
    assert spark.conf.get("spark.sql.shuffle.partitions") == shuffle
    assert not out.exists()


SECRET_FILE_PY = """
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

def query(events: DataFrame) -> DataFrame:
    secret = events.sparkSession.read.text("{path}").withColumnRenamed("value", "line")
    return (
        events.join(secret, F.lit(True))
        .groupBy(F.window("event_time", "10 seconds"), "line")
        .count()
        .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "line", "count")
    )
"""

REFLECTING_PY = """
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

def query(events: DataFrame) -> DataFrame:
    home = F.expr("java_method('java.lang.System', 'getenv', 'HOME')")
    return (
        events.groupBy(F.window("event_time", "10 seconds"), home.alias("home"))
        .count()
        .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "home", "count")
    )
"""

GROUPED = "GROUP BY window(event_time, '10 seconds')"
# Submissions that reach outside their input: (query, reason code, what the reason names).
REACHING_OUT = [
    pytest.param(
        sql(f"{WINDOW}, line.value AS line, count(*) AS n FROM events JOIN text.`{{secret}}` AS line {GROUPED}, 3"),
        "query_reads_outside",
        "text",
        id="file-by-path",
    ),
    pytest.param(
        sql(f"{WINDOW}, count(*) AS n FROM events WHERE key IN (SELECT value FROM text.`{{secret}}`) {GROUPED}"),
        "query_reads_outside",
        "text",
        id="file-in-a-subquery",
    ),
    pytest.param(
        sql(f"WITH s AS (SELECT * FROM json.`{{secret}}`) {WINDOW}, count(*) AS n FROM events, s {GROUPED}"),
        "query_reads_outside",
        "json",
        id="file-in-a-cte",
    ),
    pytest.param(
        sql(f"{WINDOW}, count(*) AS n FROM events, read_files('{{secret}}', format => 'text') {GROUPED}"),
        "query_reads_outside",
        "read_files",
        id="read-files",
    ),
    pytest.param(
        sql(f"{WINDOW}, count(*) AS n FROM events, global_temp.hotswap_secret {GROUPED}"),
        "query_reads_outside",
        "global_temp",
        id="qualified-table",
    ),
    pytest.param(
        sql(
            f"{WINDOW}, java_method('java.lang.System', 'getenv', 'HOME') AS home, count(*) AS n "
            f"FROM events {GROUPED}, 3"
        ),
        "query_function_refused",
        "java_method",
        id="java-method",
    ),
    pytest.param(
        sql(f"{WINDOW}, count(*) AS n FROM events WHERE reflect('java.lang.System', 'exit', '0') IS NULL {GROUPED}"),
        "query_function_refused",
        "reflect",
        id="reflect",
    ),
    pytest.param(
        sql(
            f"{WINDOW}, try_reflect('java.lang.System', 'getenv', 'HOME') AS h, count(*) AS n FROM events {GROUPED}, 3"
        ),
        "query_function_refused",
        "try_reflect",
        id="try-reflect",
    ),
    pytest.param(
        QuerySource(name="reads-a-file", kind=QueryKind.PYTHON, text=SECRET_FILE_PY),
        "query_reads_outside",
        "secret",
        id="python-reads-a-file",
    ),
    pytest.param(
        QuerySource(name="reflects", kind=QueryKind.PYTHON, text=REFLECTING_PY),
        "query_function_refused",
        "java_method",
        id="python-reflects",
    ),
]


@pytest.mark.parametrize(("source", "code", "named"), REACHING_OUT)
def test_a_query_that_reads_outside_its_input_or_reflects_is_refused(
    spark: SparkSession, services: Services, tmp_path: Path, source: QuerySource, code: str, named: str
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2\n")
    text = source.text.replace("{secret}", str(secret)).replace("{path}", str(secret))
    session = isolated_session(spark, {})
    settings = Settings(jars_dir=JARS, kafka_bootstrap=services.bootstrap)
    stream = events_stream(
        session, settings.pipeline, settings.kafka, settings.names.graph_topic("validation"), DEMO_SOURCE
    )
    with pytest.raises(QueryRejected) as refused:
        validate_query(session, source.model_copy(update={"text": text}), stream, RUNNING_WINDOW_MS)
    assert refused.value.reason_code == code, str(refused.value)
    message = str(refused.value)
    assert "\n" not in message
    assert named in message, message
    assert "hunter2" not in message


def test_a_query_reads_the_static_tables_the_operator_lists_and_sees_nothing_of_the_executors_session(
    spark: SparkSession, services: Services, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    spark.catalog.dropTempView("events")  # another test's, made on this session by hand
    spark.createDataFrame([("k1", "north"), ("k2", "south")], "key STRING, region STRING").write.parquet(str(keys))
    tables = {"regions": StaticTable(path=str(keys))}
    session = isolated_session(spark, tables)
    settings = Settings(jars_dir=JARS, kafka_bootstrap=services.bootstrap)
    stream = events_stream(
        session, settings.pipeline, settings.kafka, settings.names.graph_topic("validation"), DEMO_SOURCE
    )
    lookup = sql(f"{WINDOW}, r.region, count(*) AS n FROM events JOIN regions r USING (key) {GROUPED}, r.region")
    shape = validate_query(session, lookup, stream, RUNNING_WINDOW_MS, tuple(tables))
    assert shape.group_columns == ("region",)
    # The same files, not listed by that name: refused, naming the relation.
    unlisted = sql(f"{WINDOW}, count(*) AS n FROM events JOIN parquet.`{keys}` r USING (key) {GROUPED}")
    with pytest.raises(QueryRejected) as refused:
        validate_query(session, unlisted, stream, RUNNING_WINDOW_MS, tuple(tables))
    assert refused.value.reason_code == "query_reads_outside"
    # A view of the executor's own session does not exist for a query.
    spark.range(3).createOrReplaceTempView("executor_only")
    try:
        peeking = sql(f"{WINDOW}, count(*) AS n FROM events, executor_only {GROUPED}")
        with pytest.raises(QueryRejected, match="executor_only"):
            validate_query(session, peeking, stream, RUNNING_WINDOW_MS, tuple(tables))
    finally:
        spark.catalog.dropTempView("executor_only")
    # And the analysis left nothing in the executor's session.
    assert not spark.catalog.tableExists("events")
    assert not spark.catalog.tableExists("regions")


@pytest.mark.parametrize(
    "column",
    ["_hotswap_record", "_HOTSWAP_partition", "_Kafka_Key", "Event_Time"],
)
def test_a_schema_column_named_like_hotswaps_own_is_refused_in_one_line(spark: SparkSession, column: str) -> None:
    """Spark matches names ignoring case: such a column would meet the events view's own columns,
    or the ones a graph reads its rows with, and be dropped or ambiguous."""
    with pytest.raises(SchemaRefused) as refused:
        resolve(spark, SourceSpec(schema_ddl=f"key STRING, ts BIGINT, `{column}` STRING", event_time="ts"))
    assert column in str(refused.value)
    assert "another name" in str(refused.value)
    assert "\n" not in str(refused.value)
