"""Operator requests: how `submit`, `abort` and `promote` reach the executor.

Only the executor writes the journal. A submitter writes a request under keys of its own (so a
Redis ACL user for submitters can be refused the journal, the lease and the routing plans), and
the executor applies it on its loop and answers:

1. the client SETs `request:<id>` (with a time-to-live) and LPUSHes the id onto `requests`;
2. the executor RPOPs the id and GETDELs the request: from then on it is the executor's;
3. the executor applies it to the journal, with the same checks as always, and SETs
   `request:<id>:answer` (with a time-to-live);
4. the client reads the answer. If none came in time, it DELs its request: if that deleted
   something, the executor never took it and nothing changed; if not, the executor took it and
   the client waits a little longer for the answer.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from hotswap.contract.frozen import Record, now_ms
from hotswap.contract.journal import SwapRecord
from hotswap.contract.reasons import ReasonCode

# A request nobody took within this is gone (Redis expires it), and so is an answer nobody read.
REQUEST_TTL_S = 600


class RequestKind(StrEnum):
    SUBMIT = "submit"  # record a new swap, `submitted` (submit, replace, rollback, --fix)
    WITHDRAW = "withdraw"  # abort a swap only if it is still waiting for validation
    ABORT = "abort"  # abort a swap before its cut
    PROMOTE = "promote"  # promote a shadow that is `shadowing`


# What a submission may say of its swap: the rest (phase, cut, times) is the executor's to write.
SUBMITTED_FIELDS = frozenset(
    {"id", "to_query", "source", "recovers", "replaces", "rollback_of", "auto_rollback", "shadow"}
)


class OperatorRequest(Record):
    id: str
    kind: RequestKind
    swap_id: str
    swap: SwapRecord | None = None  # the swap to record, for SUBMIT
    at: int = Field(default_factory=now_ms)


class RequestAnswer(Record):
    request_id: str
    ok: bool
    error: str | None = None  # one line, for the operator, when not ok
    reason_code: ReasonCode | None = None


def submitted(swap: SwapRecord) -> SwapRecord:
    """The swap as a submission may propose it: only the fields a submitter chooses, the rest at
    their defaults, so a hand-written request cannot record a cut or a phase."""
    return SwapRecord.model_validate({k: v for k, v in swap.model_dump().items() if k in SUBMITTED_FIELDS})
