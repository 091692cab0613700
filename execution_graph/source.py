"""Reading a user query's file into a QuerySource.

Kept apart from user_query (which applies queries with Spark) so that `hotswap submit` and the
other operator commands read a query file without importing pyspark.
"""

from __future__ import annotations

import re
from pathlib import Path

from hotswap.contract.models import QueryKind, QuerySource
from hotswap.contract.reasons import ReasonCode
from hotswap.execution_graph.errors import QueryRejected

# A query is text a person wrote; anything larger is refused before it reaches Redis.
MAX_QUERY_BYTES = 256 * 1024
# A query's name becomes its graph's id: part of a Kafka topic name, a checkpoint directory and Redis keys.
QUERY_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")


def load_query_source(path: Path, name: str | None = None) -> QuerySource:
    if not path.exists():
        raise QueryRejected(f"query file {path} does not exist")
    if not path.is_file():
        raise QueryRejected(f"query path {path} is not a file")
    query_name = name or path.stem
    if not QUERY_NAME.fullmatch(query_name):
        given = "--name" if name else "the file name"
        raise QueryRejected(
            f"query name {query_name!r} (from {given}) may hold only letters, digits, '.', '-' and '_', at most 100 "
            "of them; give another with --name"
        )
    suffix = path.suffix.lower()
    if suffix == ".sql":
        kind = QueryKind.SQL
    elif suffix == ".py":
        kind = QueryKind.PYTHON
    else:
        raise QueryRejected(f"query file {path} must end in .sql or .py")
    size = path.stat().st_size
    if size > MAX_QUERY_BYTES:
        raise QueryRejected(
            f"query file {path} has {size:,} bytes; a query file may have at most {MAX_QUERY_BYTES:,} (256 KiB)",
            ReasonCode.QUERY_TOO_LARGE,
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise QueryRejected(f"query file {path} is not UTF-8 text (byte {exc.start} cannot be read)") from exc
    except OSError as exc:
        raise QueryRejected(f"query file {path} cannot be read: {exc.strerror}") from exc
    if not text.strip():
        raise QueryRejected(f"query file {path} is empty")
    return QuerySource(name=query_name, kind=kind, text=text, path=str(path))
