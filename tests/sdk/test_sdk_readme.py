"""The SDK's page of the docs (docs/pages/sdk.md) says true things: its example runs as written
against `coordinator serve`, and its table lists every configuration key with its default."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sdk import AdminConfig, ConsumerConfig, ProducerConfig
from sdk._config import config_keys
from tests.support.services import ServiceProcess

PAGE = Path(__file__).resolve().parents[2] / "docs" / "pages" / "sdk.md"


def sdk_section() -> str:
    return PAGE.read_text()


def example() -> str:
    """The page's first Python block: the job that runs as written (later ones are fragments)."""
    blocks = re.findall(r"```python\n(.*?)```", sdk_section(), re.DOTALL)
    return str(blocks[0])


def test_the_example_is_under_25_lines() -> None:
    assert len(example().splitlines()) < 25


def test_the_readme_example_runs_as_written_against_coordinator_serve(tmp_path: Path) -> None:
    """As a new user would: `coordinator serve` on its embedded default (a fresh SQLite file in
    an empty directory), then the example, twice: the second run resumes after the first."""
    script = tmp_path / "example.py"
    script.write_text(example())
    with ServiceProcess(f"sqlite:///{tmp_path / 'coordinator.db'}", tmp_path) as served:
        env = {**os.environ, "COORDINATOR_URL": served.url}
        for run, expected in ((1, 10), (2, 20)):
            try:
                done = subprocess.run(
                    [sys.executable, str(script)],
                    env=env,
                    cwd=tmp_path,
                    capture_output=True,
                    text=True,
                    timeout=90,
                )
            except subprocess.TimeoutExpired as timed_out:
                pytest.fail(f"run {run} hung: {timed_out.stderr!r}; {served.log.read_text()}")
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip() == f"doubled every order below offset {expected}", run
        records = httpx.get(
            f"{served.url}/v1/topics/doubled/partitions/0/records", params={"max_records": 100}
        ).json()["records"]
    # Each run doubled exactly the ten orders it added.
    assert [r["value"] for r in records] == [str(2 * i) for i in range(10)] * 2


def test_the_readme_table_lists_every_config_key_with_its_default() -> None:
    rows = {
        m.group(1): m.group(2).strip()
        for m in re.finditer(r"^\| `([^`]+)` \| ([^|]+) \|", sdk_section(), re.MULTILINE)
    }
    expected = {
        key: default
        for cls in (ProducerConfig, ConsumerConfig, AdminConfig)
        for key, default, _ in config_keys(cls)
    }
    assert rows == expected
