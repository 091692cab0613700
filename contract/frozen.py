"""The frozen record every value hotswap keeps in Redis is, and the wall clock it stamps them with."""

from __future__ import annotations

import time
from typing import Self

from pydantic import BaseModel, ConfigDict


def now_ms() -> int:
    """Wall-clock epoch milliseconds, for records shown to people (never for time budgets)."""
    return time.time_ns() // 1_000_000


class Record(BaseModel):
    # extra="ignore": a record written by a newer hotswap still reads here.
    model_config = ConfigDict(frozen=True, extra="ignore")

    def changed(self, **changes: object) -> Self:
        """A copy with `changes`, validated as a new record. A field name the record does not have
        is an error: `model_copy(update=...)` would drop it without a word."""
        unknown = set(changes) - set(type(self).model_fields)
        if unknown:
            raise ValueError(f"{type(self).__name__} has no field {', '.join(sorted(unknown))}")
        return type(self).model_validate({**self.model_dump(), **changes})
