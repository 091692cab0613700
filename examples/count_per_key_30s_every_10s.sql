-- A sliding window: events per key over the last 30 seconds, every 10 seconds. Each event counts in
-- three windows. Swapping to or from it cuts where every window stays whole (README, "Sliding windows").
SELECT window.start AS window_start,
       window.end   AS window_end,
       key,
       count(*)     AS n,
       sum(value)   AS total
FROM events
GROUP BY window(event_time, '30 seconds', '10 seconds'), key
