SELECT key, count(*) AS n FROM events GROUP BY window(event_time, '10 seconds'), key
