-- Orders per sales channel in 20-second windows. `channel` is not in examples/orders.ddl: submit
-- this query with the schema that adds it, examples/orders_with_channel.ddl
-- (hotswap submit examples/orders_per_channel.sql --source-schema "$(cat examples/orders_with_channel.ddl)").
SELECT window.start AS window_start,
       window.end   AS window_end,
       channel,
       count(*)     AS orders,
       sum(amount)  AS revenue
FROM events
WHERE status != 'cancelled'
GROUP BY window(event_time, '20 seconds'), channel
