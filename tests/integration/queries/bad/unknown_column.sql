SELECT window.start AS window_start, window.end AS window_end, colour, count(*) AS n
FROM events GROUP BY window(event_time, '10 seconds'), colour
