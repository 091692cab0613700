-- Orders per customer country in 10-second windows. Reads the orders profile of `hotswap generate`
-- with the schema in examples/orders.ddl (README, "Your own topic").
SELECT window.start     AS window_start,
       window.end       AS window_end,
       customer.country AS country,
       count(*)         AS orders,
       sum(amount)      AS revenue
FROM events
GROUP BY window(event_time, '10 seconds'), customer.country
