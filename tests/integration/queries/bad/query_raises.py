from pyspark.sql import DataFrame


def query(events: DataFrame) -> DataFrame:
    raise ValueError("model weights not found")
