"""A Python query: the average value per key in 10-second windows."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def query(events: DataFrame) -> DataFrame:
    return (
        events.groupBy(F.window("event_time", "10 seconds"), "key")
        .agg(F.avg("value").alias("mean"), F.count("*").alias("n"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "key",
            "mean",
            "n",
        )
    )
