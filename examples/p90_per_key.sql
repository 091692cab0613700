-- The exact 90th percentile of value per key in 10-second windows (Spark's percentile: interpolated
-- between the two nearest values), beside the events it was taken over. Written for the closing
-- engine (HOTSWAP_GRAPH_ENGINE=closing), which computes each window once, as a batch over all of its
-- rows, when it closes.
SELECT window.start           AS window_start,
       window.end             AS window_end,
       key,
       percentile(value, 0.9) AS p90,
       count(*)               AS n
FROM events
GROUP BY window(event_time, '10 seconds'), key
