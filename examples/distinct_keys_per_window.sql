-- Distinct keys in 10-second windows, beside the events they sent. Spark refuses distinct
-- aggregations on a stream: run it on the closing engine (HOTSWAP_GRAPH_ENGINE=closing), which
-- computes each window once, as a batch over its rows, when it closes.
SELECT window.start        AS window_start,
       window.end          AS window_end,
       count(DISTINCT key) AS distinct_keys,
       count(*)            AS n
FROM events
GROUP BY window(event_time, '10 seconds')
