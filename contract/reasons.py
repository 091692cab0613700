"""Why a swap failed, was rejected, was stranded or was aborted, in a word a program can match.

Every such ending carries a `reason_code` beside its one-line prose `error`: in the journal
(`SwapRecord.reason_code`), in `hotswap status --json` and in the CLI's exit message. README,
"Reason codes", says what each one means and what to do. Codes may be added; none is renamed
without a changelog entry.
"""

from __future__ import annotations

from enum import StrEnum


class ReasonCode(StrEnum):
    # -- rejected: the query was refused at submit; nothing changed ----------------------------
    NO_QUERY = "no_query"  # the swap carries no query text
    QUERY_INVALID = "query_invalid"  # does not analyse, is not windowed, lacks window columns, ...
    QUERY_NOT_A_QUERY = (
        "query_not_a_query"  # SQL text that is a command (SET, CREATE, INSERT, ...) or several statements
    )
    QUERY_READS_OUTSIDE = "query_reads_outside"  # reads a file, a catalog table or a source besides its input
    QUERY_FUNCTION_REFUSED = "query_function_refused"  # calls reflection (java_method, ...) or a qualified function
    QUERY_KIND_REFUSED = "query_kind_refused"  # a .py query where the operator allows only SQL (query_kinds)
    QUERY_TOO_LARGE = "query_too_large"  # a query file over 256 KiB
    VALIDATION_TIMEOUT = "validation_timeout"  # its analysis did not end within validation_timeout
    QUERY_RAISED = "query_raised"  # the user's own code raised while it was analysed
    WINDOWS_NOT_CUTTABLE = "windows_not_cuttable"  # no near boundary shared with the query it replaces
    SHADOW_NEEDS_KAFKA_SINK = "shadow_needs_kafka_sink"  # `submit --shadow` where results go to a table

    # -- failed: before the cut; the old query keeps serving -----------------------------------
    NOTHING_TO_REPLACE = "nothing_to_replace"  # no query serves the namespace
    GRAPH_NOT_RECORDED = "graph_not_recorded"  # the new graph's record is missing
    DEPLOY_FAILED = "deploy_failed"  # the new graph's Spark query did not start
    DEPLOY_TIMEOUT = "deploy_timeout"  # ... nor within deploy_timeout
    QUERY_FAILED_BEFORE_CUT = "query_failed_before_cut"  # it started, then died before the cut
    CUT_TIMEOUT = "cut_timeout"  # the service graph took no cut within cut_timeout
    NOTHING_TO_RECOVER = "nothing_to_recover"  # a rollback or fix of a swap that is not stranded
    RECOVERY_NOT_ALIGNED = "recovery_not_aligned"  # the failed query stopped off the new windows' grid

    # -- stranded: after the cut; its rows wait in its topic ----------------------------------
    QUERY_FAILED_AFTER_CUT = "query_failed_after_cut"  # the new query kept failing past its restarts

    # -- past the cut, the old graph: its drain waits for an operator -------------------------
    DRAIN_STALLED = "drain_stalled"  # the old graph's batches kept stalling (batch_stall_timeout) in its drain

    # -- said in the log and counted, not a swap's end ----------------------------------------
    BATCH_STALLED = "batch_stalled"  # a batch ran over batch_stall_timeout; cancelled, its query restarted
    RETIRE_TIMEOUT = "retire_timeout"  # a drained old query did not stop within retire_timeout; retired anyway
    SKIPPED_READ = "skipped_read"  # Spark's source read skipped records Kafka holds; the batch replayed
    POISON_BATCH_SKIPPED = (
        "poison_batch_skipped"  # the serving query failed for good on a batch: its rows dead-lettered
    )

    # -- aborted ------------------------------------------------------------------------------
    ABORTED_BY_OPERATOR = "aborted_by_operator"  # `hotswap abort` or `hotswap rollback` before the cut
