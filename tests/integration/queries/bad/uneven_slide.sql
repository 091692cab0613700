SELECT window.start AS window_start, window.end AS window_end, key, count(*) AS n
FROM events GROUP BY window(event_time, '10 seconds', '4 seconds'), key
