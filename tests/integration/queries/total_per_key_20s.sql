SELECT window.start AS window_start, window.end AS window_end, key, sum(value) AS total, count(*) AS n
FROM events
GROUP BY window(event_time, '20 seconds'), key
