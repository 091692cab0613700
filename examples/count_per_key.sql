-- Events per key in 10-second windows.
SELECT window.start AS window_start,
       window.end   AS window_end,
       key,
       count(*)     AS n,
       sum(value)   AS total
FROM events
GROUP BY window(event_time, '10 seconds'), key
