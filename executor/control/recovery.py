"""Swaps that undo a swap: the one record a rollback is, whoever asks for it (an operator with
`hotswap rollback`, or the executor itself for a swap submitted with `--auto-rollback`)."""

from __future__ import annotations

import uuid

from hotswap.contract.journal import SwapRecord
from hotswap.contract.models import GraphRecord


def new_swap_id() -> str:
    return uuid.uuid4().hex[:10]


def rollback_swap(swap: SwapRecord, previous: GraphRecord, *, takes_over: bool, cause: str | None = None) -> SwapRecord:
    """A swap back to the query `swap` replaced (`previous`, whose text the graph record keeps).

    `takes_over`: `swap`'s new query failed for good after its cut, so the previous query takes over
    its buffer from where it stopped (a recovery) instead of cutting at a new boundary."""
    return SwapRecord(
        id=new_swap_id(),
        to_query=previous.source.name,
        source=previous.source,
        rollback_of=swap.id,
        recovers=swap.id if takes_over else None,
        cause=cause,
    )
