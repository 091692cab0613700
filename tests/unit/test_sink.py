"""The declared sink (`--sink`): what it accepts, what it refuses in one line, and how a result
column is stored in a Postgres table."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError
from pyspark.sql import types as T

from hotswap.contract.causes import is_sink_outage
from hotswap.contract.settings import Settings
from hotswap.contract.sink import SinkKind, SinkSpec
from hotswap.service_sink.postgres import postgres_type

URL = "postgresql://writer:s3cret@db:5432/analytics"


@pytest.mark.parametrize(
    ("text", "kind", "target"),
    [
        ("kafka:results", SinkKind.KAFKA, "results"),
        ("KAFKA:ns.results", SinkKind.KAFKA, "ns.results"),
        ("postgres:results", SinkKind.POSTGRES, "results"),
        ("postgres:analytics.window_results", SinkKind.POSTGRES, "analytics.window_results"),
        ("delta:/data/results", SinkKind.DELTA, "/data/results"),
        ("delta:s3a://bucket/results", SinkKind.DELTA, "s3a://bucket/results"),
    ],
)
def test_a_sink_is_kind_colon_target(text: str, kind: SinkKind, target: str) -> None:
    spec = SinkSpec.parse(text)
    assert (spec.kind, spec.target) == (kind, target)
    assert str(spec) == f"{kind}:{target}"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("results", "is not KIND:TARGET"),
        ("kafka:", "is not KIND:TARGET"),
        ("iceberg:t", "sink kind 'iceberg' is unknown; use one of kafka:..., postgres:..., delta:..."),
        ("postgres:Results", "is not a lower-case SQL name"),
        ("postgres:a.b.c", "is not a lower-case SQL name"),
        ("postgres:results; drop table x", "is not a lower-case SQL name"),
    ],
)
def test_a_bad_sink_is_refused_in_one_line(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)) as refused:
        SinkSpec.parse(text)
    assert "\n" not in str(refused.value)


def test_the_default_sink_is_the_results_topic() -> None:
    assert Settings(sink_topic="out").pipeline.sink == SinkSpec(SinkKind.KAFKA, "out")


def test_a_kafka_sink_names_the_results_topic() -> None:
    settings = Settings(sink="kafka:ns.out")
    assert settings.sink_topic == "ns.out"
    assert settings.pipeline.sink_topic == "ns.out"
    with pytest.raises(ValidationError, match="name two results topics"):
        Settings(sink="kafka:a", sink_topic="b")


def test_only_a_delta_sink_loads_deltas_extension_into_the_session() -> None:
    assert Settings(sink="delta:/data/results").spark.delta_lake
    assert not Settings().spark.delta_lake
    assert not Settings(sink="postgres:results", sink_url=URL).spark.delta_lake


def test_a_postgres_sink_needs_its_url_which_is_never_shown() -> None:
    with pytest.raises(ValidationError, match=r"needs its database: set sink_url \(HOTSWAP_SINK_URL, --sink-url\)"):
        Settings(sink="postgres:results")
    with pytest.raises(ValidationError, match="a sink URL starts with postgresql://"):
        Settings(sink="postgres:results", sink_url="mysql://db/x")
    settings = Settings(sink="postgres:results", sink_url=URL)
    assert settings.pipeline.sink == SinkSpec(SinkKind.POSTGRES, "results")
    assert "s3cret" not in repr(settings)
    assert "s3cret" not in repr(settings.pipeline)


@pytest.mark.parametrize(
    ("spark", "postgres"),
    [
        (T.StringType(), "text"),
        (T.LongType(), "bigint"),
        (T.IntegerType(), "bigint"),
        (T.DoubleType(), "double precision"),
        (T.FloatType(), "double precision"),
        (T.DecimalType(10, 2), "numeric"),
        (T.BooleanType(), "boolean"),
        (T.TimestampType(), "timestamp with time zone"),
        (T.DateType(), "date"),
        (T.BinaryType(), "bytea"),
        (T.ArrayType(T.StringType()), "jsonb"),
        (T.StructType([T.StructField("a", T.LongType())]), "jsonb"),
    ],
)
def test_each_result_column_has_a_postgres_type(spark: T.DataType, postgres: str) -> None:
    # The names information_schema.columns gives, so a column already there is compared as it is.
    assert postgres_type(spark) == postgres


def test_a_sink_outage_is_told_from_a_query_failure() -> None:
    assert is_sink_outage("[FOREACH_BATCH_USER_FUNCTION_ERROR] sink unavailable: delta:/d: java.io.IOException: gone")
    assert not is_sink_outage("[USER_RAISED_EXCEPTION] poison row")
    assert not is_sink_outage("postgres:results refused the batch's rows: numeric field overflow")
