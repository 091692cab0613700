"""Applying operator requests (contract.requests): the executor alone writes the journal, so
`submit`, `abort` and `promote` leave a request and the loop applies it here, with the checks the
journal's writers have always made, and answers."""

from __future__ import annotations

import redis
import structlog

from hotswap.contract.fence import Fence
from hotswap.contract.journal import Journal, SwapExists, SwapPhase, UnknownSwap
from hotswap.contract.names import Keys
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.requests import REQUEST_TTL_S, OperatorRequest, RequestAnswer, RequestKind, submitted

log = structlog.get_logger(__name__)

TAKEN_PER_TICK = 20  # each is a few Redis round trips; a burst must not hold the loop for long


class OperatorRequests:
    def __init__(self, client: redis.Redis, keys: Keys, fence: Fence | None) -> None:
        self._redis = client
        self._keys = keys
        self._journal = Journal(client, keys, fence)

    def apply_pending(self) -> int:
        """Apply the requests waiting, oldest first; returns how many ids were taken."""
        taken = 0
        while taken < TAKEN_PER_TICK:
            raw_id = self._redis.rpop(self._keys.requests)
            if raw_id is None:
                break
            taken += 1
            request_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            # GETDEL: once taken, a client's DEL finds nothing, so it knows the request is ours.
            raw = self._redis.getdel(self._keys.request(request_id))
            if raw is None:  # withdrawn by its client, or expired: nobody waits for it
                continue
            try:
                request = OperatorRequest.model_validate_json(raw)
            except ValueError as exc:
                self._answer(request_id, RequestAnswer(request_id=request_id, ok=False, error=f"unreadable: {exc}"))
                continue
            if request.id != request_id:  # the answer goes where the client that pushed this id reads it
                self._answer(request_id, RequestAnswer(request_id=request_id, ok=False, error="mismatched request id"))
                continue
            self._answer(request_id, self._apply(request))
        return taken

    def _apply(self, request: OperatorRequest) -> RequestAnswer:
        ok = RequestAnswer(request_id=request.id, ok=True)

        def refused(error: str, code: ReasonCode | None = None) -> RequestAnswer:
            log.info("operator request refused", request=request.kind.value, swap_id=request.swap_id, error=error)
            return RequestAnswer(request_id=request.id, ok=False, error=error, reason_code=code)

        if request.kind is RequestKind.SUBMIT:
            if request.swap is None or request.swap.id != request.swap_id:
                return refused("a submit request must carry the swap it submits")
            proposed = submitted(request.swap)
            try:
                self._journal.create(proposed)
            except SwapExists as exc:
                # Our own write, retried after its reply was lost, finds itself: the ids are random.
                found = self._journal.find(proposed.id)
                if found is None or (found.to_query, found.source) != (proposed.to_query, proposed.source):
                    return refused(str(exc))
            log.info("swap submitted", swap_id=request.swap_id, query_id=proposed.to_query)
            return ok
        try:
            swap = self._journal.get(request.swap_id)
        except UnknownSwap as exc:
            return refused(str(exc))
        if request.kind is RequestKind.PROMOTE:
            if self._journal.request_promotion(swap.id) is None:
                latest = self._journal.get(swap.id)
                if latest.promote:
                    return ok  # promoted already (or our write, retried)
                return refused(
                    f"swap {swap.id} is {swap.state}; only a shadow that has started (`shadowing`) can be promoted"
                    if swap.shadow
                    else f"swap {swap.id} is not a shadow; submit the query with --shadow to run it beside the "
                    "current one"
                )
            return ok
        withdraw = request.kind is RequestKind.WITHDRAW
        aborted = self._journal.advance(
            swap.id,
            SwapPhase.ABORTED,
            error="not validated in time; withdrawn by submit" if withdraw else "aborted by operator",
            reason_code=ReasonCode.ABORTED_BY_OPERATOR,
            when=(lambda r: r.state is SwapPhase.SUBMITTED) if withdraw else (lambda r: r.state.is_before_cut),
        )
        if aborted is None:
            latest = self._journal.get(swap.id)
            if latest.state is SwapPhase.ABORTED:
                return ok  # aborted already (or our write, retried): what was asked holds
            if latest.state.is_past_cut:
                return refused(f"swap {swap.id} is {latest.state}; only a swap before its cut can be aborted")
            if latest.state.is_before_cut:  # a withdrawal only: validated meanwhile, so it goes on
                return refused(f"swap {swap.id} is {latest.state}: validated meanwhile")
            return refused(f"swap {swap.id} has already ended ({latest.state})")
        log.info("swap aborted by operator", swap_id=swap.id, withdrawn=withdraw)
        return ok

    def _answer(self, request_id: str, answer: RequestAnswer) -> None:
        self._redis.set(self._keys.request_answer(request_id), answer.model_dump_json(), ex=REQUEST_TTL_S)
