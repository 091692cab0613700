from typing import Any

from hotswap.contract.lifecycle import HEALTHY_RESET_S, RestartBudget, stop_between_batches


class BusyQuery:
    """A query always in a batch, as a busy graph looks to a poller; with `batch_ends_after`, the
    batch in flight ends at that status read and the next one begins at once (a backlog)."""

    def __init__(self, batch_ends_after: int | None = None) -> None:
        self.status_reads = 0
        self.stopped = False
        self.batch_ends_after = batch_ends_after

    @property
    def isActive(self) -> bool:
        return not self.stopped

    @property
    def status(self) -> dict[str, Any]:
        self.status_reads += 1
        return {"isTriggerActive": True}

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        ended = self.batch_ends_after is not None and self.status_reads >= self.batch_ends_after
        return {"batchId": 7 if ended else 6}

    def stop(self) -> None:
        self.stopped = True


def test_restarts_back_off_doubling_until_the_budget_is_spent() -> None:
    budget = RestartBudget(limit=2, backoff_s=2.0)
    assert budget.first_seen(100.0)
    assert not budget.first_seen(100.5)  # the same failure, seen again
    assert not budget.restart_due(101.9)
    assert budget.restart_due(102.0)  # 2 s after the failure
    budget.first_seen(110.0)
    assert not budget.restart_due(113.9)
    assert budget.restart_due(114.0)  # then 4 s
    assert budget.exhausted


def test_a_query_that_stays_healthy_gets_its_budget_back() -> None:
    budget = RestartBudget(limit=1, backoff_s=1.0)
    budget.first_seen(0.0)
    assert budget.restart_due(1.0)
    assert budget.exhausted
    budget.healthy(1.0 + HEALTHY_RESET_S / 2)
    assert budget.exhausted
    budget.healthy(2.0 + HEALTHY_RESET_S)
    assert not budget.exhausted


def test_a_query_stopped_without_finishing_its_batch_is_stopped_at_once() -> None:
    query = BusyQuery()
    times = stop_between_batches(query, timeout_s=0.0)
    assert query.stopped
    assert query.status_reads == 0
    assert times.waited_s == 0.0


def test_a_query_whose_batch_never_ends_is_stopped_when_the_wait_runs_out() -> None:
    query = BusyQuery()
    stop_between_batches(query, timeout_s=0.2)
    assert query.stopped
    assert query.status_reads > 1  # it did wait, polling, before stopping anyway


def test_a_query_with_a_backlog_is_stopped_once_its_batch_in_flight_ends() -> None:
    """Batches follow each other without a pause: the stop comes when the one in flight ends, not when
    the wait runs out (the next batch has just begun, and stop() cancels it)."""
    query = BusyQuery(batch_ends_after=4)
    stop_between_batches(query, timeout_s=30.0)
    assert query.stopped
    assert query.status_reads == 4  # the read at which the batch ended: no more waiting after it
