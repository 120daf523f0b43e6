"""`jobs.cluster`'s Spark home for this machine: pyspark's distribution without the zip that made
every Python worker compile pyspark from source (the workers' side is checked in
tests/spark/test_spark_jobs.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pyspark
import pytest

from jobs.cluster import local_spark_home


def test_the_local_spark_home_is_pyspark_s_distribution_without_its_python_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    package = Path(pyspark.__file__).parent
    home = Path(local_spark_home())
    assert home != package
    assert sorted(os.listdir(home)) == sorted(set(os.listdir(package)) - {"python"})
    for entry in home.iterdir():
        assert entry.resolve() == (package / entry.name).resolve()
    assert (home / "bin" / "spark-class").is_file() and (home / "jars").is_dir()
    assert local_spark_home() == str(home)  # made once, then found


def test_a_spark_home_of_the_user_s_own_is_left_as_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    assert local_spark_home() == str(tmp_path)
    assert list(tmp_path.iterdir()) == []
