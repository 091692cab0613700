-- The three keys with the largest total in each 10-second window, ranked 1 to 3 (on equal totals the
-- smaller key first). Spark refuses a ranking window function (ROW_NUMBER() OVER ...) on a stream:
-- run it on the closing engine (HOTSWAP_GRAPH_ENGINE=closing), which computes each window once, as a
-- batch over its rows, when it closes.
SELECT window_start, window_end, key, total, rank
FROM (
    SELECT window_start,
           window_end,
           key,
           total,
           ROW_NUMBER() OVER (PARTITION BY window_start ORDER BY total DESC, key) AS rank
    FROM (
        SELECT window.start AS window_start,
               window.end   AS window_end,
               key,
               sum(value)   AS total
        FROM events
        GROUP BY window(event_time, '10 seconds'), key
    ) AS totals
) AS ranked
WHERE rank <= 3
