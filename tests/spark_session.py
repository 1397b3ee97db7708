"""The local Spark session of the Spark test files: one per module, configured alike (two
shuffle partitions, one core, no UI, a JVM that starts fast)."""

from __future__ import annotations

SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


def local_session(app: str):
    """A local Spark session named ``app`` (stop it when done)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[1]").appName(app)
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("OFF")
    return session
