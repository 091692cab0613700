-- A replacement with different logic, different columns and a larger window (30 s).
SELECT window.start AS window_start,
       window.end   AS window_end,
       key,
       max(value)   AS peak,
       min(value)   AS low
FROM events
GROUP BY window(event_time, '30 seconds'), key
