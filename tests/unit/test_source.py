"""The declared source as settings give it, and the route header as every reader finds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotswap.contract.envelope import marker_route, parse_route
from hotswap.contract.errors import ConfigError
from hotswap.contract.settings import Settings
from hotswap.contract.source import DEFAULT_SCHEMA, EventTimeKind, SourceFormat, SourceSpec


def test_the_default_source_is_the_demo_format_with_its_fields_required() -> None:
    spec = Settings().source_spec()
    assert (spec.format, spec.schema_ddl, spec.event_time) == (SourceFormat.JSON, DEFAULT_SCHEMA, "ts")
    assert "NOT NULL" in spec.schema_ddl


def test_an_avro_source_reads_its_schema_file(tmp_path: Path) -> None:
    avsc = tmp_path / "orders.avsc"
    avsc.write_text('{"type": "record", "name": "R", "fields": [{"name": "t", "type": "long"}]}')
    spec = Settings(source_format="avro", avro_schema=avsc, event_time="t").source_spec()
    assert spec.avro_schema == avsc.read_text()
    assert spec.schema_ddl == ""  # derived from the .avsc when the executor starts


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"source_format": "avro"}, "an Avro source needs its schema: --avro-schema FILE"),
        ({"avro_schema": Path("x.avsc")}, "cannot read the Avro schema x.avsc"),
        ({"source_format": "avro", "timestamp_format": "dd/MM/yyyy"}, "--timestamp-format applies to JSON text"),
        ({"event_time": "meta..ts"}, "is not a column or a dotted path"),
    ],
)
def test_a_source_that_cannot_work_is_refused_in_one_line(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings(**settings).source_spec()  # type: ignore[arg-type]
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_what_a_namespace_must_keep_ignores_the_schema_versions_declare() -> None:
    base = SourceSpec(schema_ddl="a STRING, t BIGINT", event_time="t", event_time_kind=EventTimeKind.EPOCH)
    assert base.for_version(schema_ddl="a STRING, t BIGINT, b INT").reading_identity() == base.reading_identity()
    assert base.changed(event_time_unit="s").reading_identity() != base.reading_identity()
    assert base.changed(event_time="a").reading_identity() != base.reading_identity()


def test_a_dotted_event_time_is_a_path_and_kafka_is_the_record_timestamp() -> None:
    assert SourceSpec(event_time="meta.ts").event_time_path == ("meta", "ts")
    assert SourceSpec(event_time="kafka").event_time_path == ()
    assert SourceSpec(event_time="kafka").uses_kafka_time


def test_a_marker_route_carries_only_its_event_time() -> None:
    assert parse_route(marker_route(1_700_000_000_000)) == ("marker", None, None, 1_700_000_000_000, None)
    assert parse_route(b"data,3,41,1700000000000,1700000000005") == (
        "data",
        3,
        41,
        1_700_000_000_000,
        1_700_000_000_005,
    )
