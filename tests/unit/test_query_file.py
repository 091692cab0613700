"""Reading a query file for `hotswap submit`: what is refused before anything reaches Redis."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotswap.contract.models import QueryKind
from hotswap.execution_graph.errors import QueryRejected
from hotswap.execution_graph.source import MAX_QUERY_BYTES, load_query_source


def test_a_query_file_over_256_kib_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "huge.sql"
    path.write_text("SELECT 1 -- " + "x" * MAX_QUERY_BYTES)
    with pytest.raises(QueryRejected) as refused:
        load_query_source(path)
    assert "at most 262,144" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_query_file_that_is_not_utf8_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.sql"
    path.write_bytes("SELECT 'café' AS x".encode("latin-1"))
    with pytest.raises(QueryRejected) as refused:
        load_query_source(path)
    assert str(refused.value) == f"query file {path} is not UTF-8 text (byte 11 cannot be read)"


def test_a_query_file_at_the_limit_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.sql"
    text = "SELECT 1 -- " + "x" * (MAX_QUERY_BYTES - 12)
    path.write_text(text)
    source = load_query_source(path)
    assert (source.kind, source.text) == (QueryKind.SQL, text)


@pytest.mark.parametrize("name", ["a b", "naïve", "x" * 101, "semi;colon"])
def test_a_query_name_that_cannot_name_a_topic_is_refused_in_one_line(tmp_path: Path, name: str) -> None:
    path = tmp_path / "count.sql"
    path.write_text("SELECT 1")
    with pytest.raises(QueryRejected) as refused:
        load_query_source(path, name)
    assert str(refused.value).startswith(f"query name {name!r} (from --name) may hold only letters")


def test_a_file_name_that_cannot_name_a_topic_asks_for_a_name(tmp_path: Path) -> None:
    path = tmp_path / "my query.sql"
    path.write_text("SELECT 1")
    with pytest.raises(QueryRejected) as refused:
        load_query_source(path)
    assert "(from the file name)" in str(refused.value)
    assert load_query_source(path, "my_query").name == "my_query"
