"""Differential conformance against Apache Kafka (issue 38, item 3): the corpus of
`tests/support/conformance_corpus.py`, sent byte by byte to the reference broker
(`reference_broker.py`) and to the coordinator's Kafka listener on Postgres, every answer
compared field by field after `tests.support.conformance.Normaliser`.

It writes:
- `tests/kafka/conformance_kafka.json`: Kafka's normalised answers, which the suite
  (`tests/kafka/test_conformance.py`) holds the listener to without a JVM;
- `docs/pages/conformance.md`: the findings, every served API and version with its scenarios,
  and each difference that remains with its reason (`KNOWN`); unexplained ones are listed too
  and make the exit status 1.

    python bench/conformance.py                         # the whole corpus
    python bench/conformance.py --scenario fetch --show # one scenario, its differences printed
    python bench/conformance.py --check                 # compare only; write nothing

Postgres comes from `--postgres-url`, else $COORDINATOR_TEST_POSTGRES_URL (a scratch database is
made and dropped). The reference broker's jars come from the README's test command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the corpus lives in tests/
from _support import add_postgres_url, cancel_on_sigterm, log, plain_url, scratch_database, serving
from produce import SERVE, SERVE_OPTIONS
from reference_broker import ReferenceBroker

from coordinator.kafka.wire import SUPPORTED
from coordinator.launcher import free_port
from tests.support.conformance import Difference, differences, explain, run_scenario
from tests.support.conformance_corpus import KNOWN, RACY, SCENARIOS
from tests.support.kafka_wire import Connection

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "kafka" / "conformance_kafka.json"
FINDINGS = ROOT / "docs" / "pages" / "conformance.md"


def connector(host: str, port: int) -> Any:
    async def connect() -> Connection:
        return Connection(*await asyncio.open_connection(host, port))

    return connect


async def run_all(names: list[str], host: str, port: int) -> dict[str, list[dict[str, Any]]]:
    answers = {}
    for name in names:
        answers[name] = await run_scenario(SCENARIOS, name, connector(host, port))
    return answers


async def on_kafka(names: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    with ReferenceBroker() as broker:
        log(f"reference broker: Apache Kafka on {broker.bootstrap}")
        return await run_all(names, "127.0.0.1", broker.port), broker.describe()


async def on_coordinator(names: list[str], postgres_url: str) -> dict[str, Any]:
    port = free_port()
    options = [*SERVE_OPTIONS, "--kafka-listener", f"127.0.0.1:{port}"]
    # As the reference broker is set: a first rebalance that does not wait for more members
    # (the service inherits this process's environment).
    os.environ["COORDINATOR_GROUP_INITIAL_REBALANCE_DELAY_MS"] = "0"
    async with (
        scratch_database(plain_url(postgres_url), "bench_conformance_") as (_, url),
        serving(url, "bench-conformance-", SERVE, options),
    ):
        return await run_all(names, "127.0.0.1", port)


def coverage(answers: dict[str, list[dict[str, Any]]]) -> dict[int, set[int]]:
    """The versions of each API key the corpus sent."""
    seen: dict[int, set[int]] = defaultdict(set)
    for steps in answers.values():
        for step in steps:
            seen[step["api_key"]].add(step["version"])
    return seen


def findings(
    reference: dict[str, Any],
    kafka: dict[str, list[dict[str, Any]]],
    found: list[Difference],
) -> str:
    seen = coverage(kafka)
    placed = {"listeners", "advertised.listeners", "controller.quorum.voters", "log.dirs"}
    settings = {k: v for k, v in sorted(reference["settings"].items()) if k not in placed}
    lines = [
        "# Differential conformance against Apache Kafka",
        "",
        "`bench/conformance.py` sends one corpus of request sequences",
        "(`tests/support/conformance_corpus.py`) byte by byte to Apache Kafka "
        f"{reference['kafka']} (one KRaft node, `bench/reference_broker.py`) and to the",
        "coordinator's Kafka listener on Postgres, and compares every answer field by field.",
        "Before comparing it rewrites only what must differ between two brokers: node and",
        "cluster ids, hosts and ports, throttle times, topic ids, the broker's clock (log append",
        "times, transaction start times, control batches' timestamps), producer and member ids",
        "(numbered in the order a scenario meets them) and error messages (free text, not",
        "compared); lists of configs are compared sorted by name. The suite replays the whole",
        "corpus against the listener on both stores and holds it to Kafka's recorded answers",
        "(`tests/kafka/test_conformance.py`), so a change that moves an answer away from",
        "Kafka's fails there; rerun this tool to record Kafka again after a corpus change.",
        "",
        f"Kafka's settings (besides its addresses and log folder): `{json.dumps(settings)}`",
        "",
        f"{len(kafka)} scenarios, {sum(len(v) for v in kafka.values())} compared answers, "
        f"{len(found)} differences, each explained below.",
        "",
        "## Coverage",
        "",
        "| API key | served versions | versions the corpus sends |",
        "|---|---|---|",
    ]
    for key, (low, high) in sorted(SUPPORTED.items()):
        sent = sorted(seen.get(key, ()))
        lines.append(f"| {key} | {low}-{high} | {_ranges(sent) or 'none'} |")
    explained: dict[str, list[Difference]] = defaultdict(list)
    unexplained: list[Difference] = []
    for d in found:
        reason = explain(d, KNOWN)
        if reason is None:
            unexplained.append(d)
        else:
            explained[reason].append(d)
    lines += ["", "## Differences that remain", ""]
    if not explained:
        lines.append("None.")
    else:
        lines += [
            "| where (scenario/step/version/field) | Kafka | coordinator | reason |",
            "|---|---|---|---|",
        ]
        for reason, items in explained.items():
            first = items[0]
            more = f" (and {len(items) - 1} more like it)" if len(items) > 1 else ""
            lines.append(
                f"| `{first.where}`{more} | {_cell(first.kafka)} | {_cell(first.ours)} | {reason} |"
            )
    if unexplained:
        lines += [
            "",
            "## Not yet explained",
            "",
            "| where | Kafka | coordinator |",
            "|---|---|---|",
        ]
        for d in unexplained:
            lines.append(f"| `{d.where}` | {_cell(d.kafka)} | {_cell(d.ours)} |")
    return "\n".join(lines) + "\n"


def _ranges(values: list[int]) -> str:
    out: list[str] = []
    for v in values:
        if out and out[-1].split("-")[-1] == str(v - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{v}"
        else:
            out.append(str(v))
    return ", ".join(out)


def _cell(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    if len(text) > 120:
        text = text[:117] + "..."
    return "`" + text.replace("|", "\\|") + "`"


async def main_async(args: argparse.Namespace) -> int:
    cancel_on_sigterm()
    names = args.scenario or list(SCENARIOS)
    kafka, reference = await on_kafka(names)
    ours = await on_coordinator(names, args.postgres_url)
    found = [d for name in names for d in differences(name, kafka[name], ours[name])]
    unexplained = [d for d in found if explain(d, KNOWN) is None]
    if args.show:
        for d in found:
            reason = explain(d, KNOWN)
            print(
                f"{d.where}\n  kafka: {json.dumps(d.kafka)}\n  ours:  {json.dumps(d.ours)}"
                f"\n  {'known: ' + reason if reason else 'UNEXPLAINED'}"
            )
    steps = sum(len(v) for v in kafka.values())
    print(
        f"{len(names)} scenarios, {steps} compared answers: {len(found)} differences, "
        f"{len(unexplained)} unexplained"
    )
    # In a whole-corpus run, an explanation that matches nothing is stale: the table must stay true.
    stale = (
        []
        if args.scenario
        else [
            pattern
            for pattern, reason in KNOWN
            if pattern not in RACY and not any(explain(d, [(pattern, reason)]) for d in found)
        ]
    )
    for pattern in stale:
        print(f"KNOWN explains nothing any more: {pattern}")
    if not args.check:
        recorded = json.loads(RECORDED.read_text()) if RECORDED.exists() else {}
        recorded.update({"kafka": reference["kafka"], "settings": reference["settings"]})
        recorded.setdefault("scenarios", {}).update(kafka)
        RECORDED.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        if args.scenario:  # the findings cover the whole corpus
            log("findings are written only for a whole-corpus run")
        else:
            FINDINGS.write_text(findings(reference, kafka, found))
            log(f"wrote {RECORDED.relative_to(ROOT)} and {FINDINGS.relative_to(ROOT)}")
    return 1 if unexplained or stale else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Send the differential corpus to Apache Kafka and to the coordinator's Kafka "
        "listener, compare the answers, and write Kafka's answers and the findings table."
    )
    add_postgres_url(parser)
    parser.add_argument(
        "--scenario",
        action="append",
        choices=sorted(SCENARIOS),
        help="run only this scenario (repeatable); records its answers only",
    )
    parser.add_argument("--show", action="store_true", help="print every difference")
    parser.add_argument("--check", action="store_true", help="compare only; write nothing")
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
