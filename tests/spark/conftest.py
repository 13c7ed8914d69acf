"""Spark tests share one local SparkSession for the whole run (starting one takes
seconds): local[2] (the CI machine's two cores), web UI off."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pyspark = pytest.importorskip("pyspark")

from pyspark.sql import SparkSession  # noqa: E402

from persister.spark.segments import spark_session  # noqa: E402


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", "spool-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
