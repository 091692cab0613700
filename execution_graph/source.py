"""Reading a user query's file into a QuerySource.

Kept apart from user_query (which applies queries with Spark) so that `hotswap submit` and the
other operator commands read a query file without importing pyspark.
"""

from __future__ import annotations

from pathlib import Path

from hotswap.contract.models import QueryKind, QuerySource
from hotswap.execution_graph.errors import QueryRejected

# A query is text a person wrote; anything larger is refused before it reaches Redis.
MAX_QUERY_BYTES = 256 * 1024


def load_query_source(path: Path, name: str | None = None) -> QuerySource:
    if not path.exists():
        raise QueryRejected(f"query file {path} does not exist")
    if not path.is_file():
        raise QueryRejected(f"query path {path} is not a file")
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
            f"query file {path} has {size:,} bytes; a query file may have at most {MAX_QUERY_BYTES:,} (256 KiB)"
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise QueryRejected(f"query file {path} is not UTF-8 text (byte {exc.start} cannot be read)") from exc
    except OSError as exc:
        raise QueryRejected(f"query file {path} cannot be read: {exc.strerror}") from exc
    if not text.strip():
        raise QueryRejected(f"query file {path} is empty")
    return QuerySource(name=name or path.stem, kind=kind, text=text, path=str(path))
