"""`coordinator demo` is wired into the CLI: its options and defaults, an accurate `--help`, and
bad options or a missing pyspark refused with a clear line and status 2 before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from coordinator.cli import build_parser, main
from jobs.demo import _demo


def test_demo_defaults() -> None:
    args = build_parser().parse_args(["demo"])
    assert args.run is _demo
    assert (args.events, args.merchants, args.rounds, args.seed) == (2000, 12, 2, 7)
    assert (args.drop_rate, args.master, args.keep) == (0.15, None, False)


def test_demo_options() -> None:
    sizes = ["--events", "300", "--merchants", "5", "--rounds", "1", "--seed", "3"]
    where = ["--drop-rate", "0.3", "--master", "local[2,3]", "--keep"]
    args = build_parser().parse_args(["demo", *sizes, *where])
    assert (args.events, args.merchants, args.rounds, args.seed) == (300, 5, 1, 3)
    assert (args.drop_rate, args.master, args.keep) == (0.3, "local[2,3]", True)


def test_demo_help_describes_the_run_and_local_mode() -> None:
    answer = subprocess.run(
        [sys.executable, "-m", "coordinator", "demo", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert answer.returncode == 0, answer.stderr
    text = " ".join(answer.stdout.split())
    for option in ("--events", "--merchants", "--rounds", "--seed", "--master", "--keep"):
        assert option in text
    assert "never speculates in local mode" in text
    assert "last line is one JSON object" in text
    assert "pip install '.[spark]'" in text


def test_top_level_help_lists_demo() -> None:
    assert "demo" in build_parser().format_help()


@pytest.mark.parametrize("events", ["0", "-3", "many"])
def test_bad_event_counts_are_refused(events: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["demo", "--events", events])
    assert exit_.value.code == 2


@pytest.mark.parametrize("rate", ["1", "1.5", "-0.1"])
def test_bad_drop_rates_are_refused(rate: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--drop-rate", rate]) == 2
    assert "--drop-rate" in capsys.readouterr().err


def test_without_pyspark_the_demo_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark raises ImportError
    assert main(["demo"]) == 2
    assert "pip install '.[spark]'" in capsys.readouterr().err
