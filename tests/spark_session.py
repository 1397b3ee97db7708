"""The local Spark session of the Spark test files: one per module, configured alike (two
shuffle partitions, one core, no UI, a JVM that starts fast)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

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


def skip_without_jdk() -> None:
    """Skip the calling test module (at its import) when no JDK is installed: ``java`` on
    ``PATH`` or under ``JAVA_HOME``."""
    home = Path(os.environ.get("JAVA_HOME", "/nonexistent"))
    if not (shutil.which("java") or (home / "bin" / "java").exists()):
        pytest.skip(
            "the Spark tests need a JDK (java on PATH or JAVA_HOME)", allow_module_level=True
        )
