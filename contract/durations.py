"""A duration setting, typed once: read from '10s', '500ms', '2m', '1h' or a plain number of
milliseconds, kept with the text it was given for display, and used as `.ms` or `.s`."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, GetCoreSchemaHandler, PlainSerializer
from pydantic_core import CoreSchema, core_schema

from hotswap.contract.errors import ConfigError
from hotswap.contract.windows import format_duration_ms, parse_duration_ms


class Duration:
    """A length of time: `ms` (int), `s` (float), and `str()` gives the text it was written as."""

    __slots__ = ("_ms", "_text")

    def __init__(self, ms: int, text: str | None = None) -> None:
        if ms < 0:
            raise ValueError(f"a duration cannot be negative ({ms} ms)")
        self._ms = ms
        self._text = text if text is not None else format_duration_ms(ms)

    @classmethod
    def parse(cls, value: object) -> Duration:
        if isinstance(value, Duration):
            return value
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(f"cannot read duration {value!r}: use a number and a unit such as 10s, 500ms, 2m")
        try:
            ms = parse_duration_ms(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc
        return cls(ms, value.strip() if isinstance(value, str) else None)

    @property
    def ms(self) -> int:
        return self._ms

    @property
    def s(self) -> float:
        return self._ms / 1000

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"Duration({self._text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Duration) and other._ms == self._ms

    def __hash__(self) -> int:
        return hash(self._ms)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        # Read from text or ms, written back as its text (TOML, JSON and the environment all hold text).
        return core_schema.no_info_plain_validator_function(
            cls.parse,
            json_schema_input_schema=core_schema.str_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(str, return_schema=core_schema.str_schema()),
        )


def _off_or_duration(value: object) -> Duration | None:
    if value is None or (isinstance(value, str) and value.strip().lower() == "off"):
        return None
    return Duration.parse(value)


def _off_text(value: Duration | None) -> str:
    return "off" if value is None else str(value)


# A duration that may be switched off: "off" reads as None (and is written back as "off").
OffOrDuration = Annotated[
    Duration | None, BeforeValidator(_off_or_duration), PlainSerializer(_off_text, return_type=str)
]
