"""The declared sink: where every query version's results land (the protocol's *user sink*).

A namespace has one sink, named at `hotswap run --sink KIND:TARGET`:
- `kafka:TOPIC`, the default (`kafka:<sink_topic>`): one record per result, keyed by (window,
  group), so a replayed batch overwrites its own results (docs/architecture.md, "One key per result");
- `postgres:TABLE` (or `postgres:SCHEMA.TABLE`), with `--sink-url`: one row per (version, window,
  group), upserted in one transaction per batch (docs/sinks.md);
- `delta:PATH` (a directory, or a URI such as `s3a://bucket/results`): a Delta Lake table, each
  batch appended once under its graph's transaction id (docs/sinks.md).

Pure data: service_sink turns a `SinkSpec` into its writer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

# A plain SQL identifier, or schema.identifier: quoted when used, but kept to what needs no quoting
# so a table is named the same way in psql as on the command line.
_TABLE = re.compile(r"^[a-z_][a-z0-9_]{0,62}(\.[a-z_][a-z0-9_]{0,62})?$")


class SinkKind(StrEnum):
    KAFKA = "kafka"
    POSTGRES = "postgres"
    DELTA = "delta"


@dataclass(frozen=True)
class SinkSpec:
    kind: SinkKind
    target: str  # the topic, or the table

    @classmethod
    def parse(cls, text: str) -> SinkSpec:
        """`kafka:TOPIC` or `postgres:TABLE`; raises ValueError with a one-line reason."""
        kind_text, sep, target = text.partition(":")
        kinds = ", ".join(f"{k}:..." for k in SinkKind)
        if not sep or not target:
            raise ValueError(f"sink {text!r} is not KIND:TARGET; use one of {kinds}")
        try:
            kind = SinkKind(kind_text.strip().lower())
        except ValueError:
            raise ValueError(f"sink kind {kind_text!r} is unknown; use one of {kinds}") from None
        target = target.strip()
        if kind is SinkKind.POSTGRES and not _TABLE.match(target):
            raise ValueError(
                f"postgres table {target!r} is not a lower-case SQL name (letters, digits and _, at most 63, "
                "optionally schema.table)"
            )
        return cls(kind, target)

    @property
    def is_table(self) -> bool:
        """Results land in a table (each graph writes its batches itself), not a topic."""
        return self.kind is not SinkKind.KAFKA

    @property
    def is_kafka(self) -> bool:
        return self.kind is SinkKind.KAFKA

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}"
