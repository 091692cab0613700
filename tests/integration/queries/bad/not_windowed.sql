SELECT timestamp_millis(0) AS window_start, timestamp_millis(10000) AS window_end, key, count(*) AS n
FROM events GROUP BY key
