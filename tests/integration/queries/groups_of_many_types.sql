-- Groups of bigint, double, timestamp and string columns (the string null for some rows, and
-- the text 'null' for others): each group must get a result key of its own.
SELECT window.start                                                    AS window_start,
       window.end                                                      AS window_end,
       ts DIV 10 % 2                                                   AS parity,
       CAST(ts DIV 10 % 3 AS DOUBLE) / 2                               AS half,
       date_trunc('SECOND', event_time)                                AS second,
       CASE key WHEN 'k0' THEN NULL WHEN 'k1' THEN 'null' ELSE key END AS tag,
       count(*)                                                        AS n
FROM events
GROUP BY window(event_time, '10 seconds'),
         ts DIV 10 % 2,
         CAST(ts DIV 10 % 3 AS DOUBLE) / 2,
         date_trunc('SECOND', event_time),
         CASE key WHEN 'k0' THEN NULL WHEN 'k1' THEN 'null' ELSE key END
