"""The command line, wired into `coordinator demo`."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from typing import Any

from jobs.demo.common import Options
from jobs.demo.run import run

# -- the command line (wired into `coordinator demo`) --------------------------------------------


DESCRIPTION = (
    "Start an embedded coordinator (SQLite, temporary), produce payments through an idempotent "
    "producer whose answers are sometimes lost, settle them per merchant with a Spark job "
    "(speculation on, one task attempt killed mid-output, one straggler) into a SQL table, pay "
    "each settlement out once at a stand-in bank, and check the settlements and the payouts "
    "against the payments. Prints a report; the last line is one JSON object with "
    "the figures, `mismatches` 0 when exactly once held (exit status 1 otherwise). Needs "
    "`pip install '.[spark]'` and Java 17."
)


def add_demo_parser(commands: Any) -> None:
    """`coordinator demo`: a subcommand of the CLI's parser."""
    demo = commands.add_parser(
        "demo",
        help="run the main job end to end: payments through a lossy network, settled by Spark "
        "exactly once despite failed and speculative task attempts (needs pyspark and Java)",
        description=DESCRIPTION,
    )
    add_demo_options(demo)


def add_demo_options(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--events", type=_positive, default=2000, help="payments (2000)")
    demo.add_argument("--merchants", type=_positive, default=12, help="merchants (12)")
    demo.add_argument(
        "--rounds",
        type=_positive,
        default=2,
        help="waves of payments, each followed by a settlement run that settles only the new "
        "ones (2)",
    )
    demo.add_argument("--seed", type=int, default=7, help="seed of the payments and losses (7)")
    demo.add_argument(
        "--drop-rate",
        type=float,
        default=0.15,
        help="share of produce answers lost after the service handled them (0.15)",
    )
    demo.add_argument(
        "--master",
        help="Spark master (default: a local standalone cluster of 2 workers on 127.0.0.2 and "
        "127.0.0.3, where Spark speculates; local[2,3] also works, with task retries but no "
        "speculation: Spark never speculates in local mode)",
    )
    demo.add_argument(
        "--output",
        choices=["sql", "topic"],
        default="sql",
        help="where the settlements go: a SQL table in an SQLite file through txsql, the input "
        "offsets committed with them (sql, the default), or the settlements topic through txlog "
        "(topic)",
    )
    demo.add_argument(
        "--keep",
        action="store_true",
        help="keep the working folder (the SQLite store, service and Spark logs) and say where",
    )
    demo.set_defaults(run=_demo)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _demo(args: argparse.Namespace) -> int:
    if not 0 <= args.drop_rate < 1:
        print("--drop-rate: must be in [0, 1)", file=sys.stderr)
        return 2
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print(
            "coordinator demo needs pyspark: pip install '.[spark]' (and Java 17)", file=sys.stderr
        )
        return 2
    options = Options(
        events=args.events,
        merchants=args.merchants,
        rounds=args.rounds,
        seed=args.seed,
        drop_rate=args.drop_rate,
        master=args.master,
        keep=args.keep,
        output=args.output,
    )
    # SIGTERM unwinds like Ctrl-C: Spark, the cluster and the service are stopped on the way out.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        figures = run(options)
    except KeyboardInterrupt:
        print("interrupted: Spark, the cluster and the coordinator were stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(json.dumps(figures), flush=True)
    return 0 if figures["mismatches"] == 0 else 1


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m jobs.demo`: the same as `coordinator demo`."""
    parser = argparse.ArgumentParser(prog="python -m jobs.demo", description=DESCRIPTION)
    add_demo_options(parser)
    return _demo(parser.parse_args(argv))
