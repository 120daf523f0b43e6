"""franz-go's kgo integration tests against the Kafka listener: a project tool, not part of the test
suite (its module comes from the Go module proxy, which CI does not reach).

    python bench/franz_go_suite.py [--version v1.22.3] [--run 'TestGroupETL|TestTxnEtl']
        [--records 20000] [--timeout-minutes 25] [--database-url postgresql://...]
        [--setting COORDINATOR_NAME=VALUE ...]
        [--out docs/pages/franz-go-findings.md] [--log franz-go.json]

It downloads `github.com/twmb/franz-go` at the pinned version (`go mod download`, into the module
cache, tests included), builds its `pkg/kgo` tests (`go test -c`), starts `coordinator serve` with
the Kafka listener on a fresh store (SQLite unless `--database-url` names another), and runs every
test of the package against it, as franz-go's own CI runs them against a broker: `KGO_SEEDS` the
listener, `KGO_TEST_RF=1`, `KGO_TEST_RECORDS` the records each ETL test moves, and
`KGO_TEST_SCRAM_SEEDS` a second listener that requires SASL/SCRAM, with the user
`KGO_TEST_SCRAM` names. It writes a findings
table: test, whether it talks to a broker, verdict, seconds, cause. The tests that never reach a
broker (franz-go's unit tests, run by the same binary) are listed apart. A cause comes from
`CAUSES` below (what a test needs that is not served, and why); a broker test that fails and has
none is listed as "unexplained" with its last error line, so the table never hides one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _support import log

from coordinator.launcher import Launched, free_port

MODULE = "github.com/twmb/franz-go"
VERSION = "v1.22.3"

# Why a broker test does not pass here, where that is known and not the service's to fix. Keep it
# true: a test that starts passing leaves this table.
CAUSES: dict[str, str] = {
    "TestOAuthAuth": "needs KGO_TEST_OAUTH_SEEDS: SASL/OAUTHBEARER is not served",
    "TestConsumeRegex": "outside scope: needs an internal topic in Metadata, Kafka's "
    "__consumer_offsets; here a group's offsets live in the store and no internal topic is listed",
    "Test848RegexBrokerResolves": "outside scope: needs an internal topic for the broker's regex "
    "to match, Kafka's __consumer_offsets (as TestConsumeRegex)",
    "TestConsumeMaxDecompressBatchBytes": "outside scope by design: it produces a 3 KB gzip batch "
    "that inflates to 3 MiB, which the listener refuses as a decompression bomb "
    "(RECORD_LIST_TOO_LARGE: over 250 times its size, COORDINATOR_MAX_COMPRESSION_RATIO) before "
    "the client's own limit is reached; it passes with --setting "
    "COORDINATOR_MAX_COMPRESSION_RATIO=2000",
    "TestShareGroup": "share groups (KIP-932) are not served: the test skips itself",
    "TestConsumeRegexShareSkipsInternal": "share groups (KIP-932) are not served: the test skips "
    "itself",
    "TestShareGroupETL": "share groups (KIP-932) are not served: the test skips itself",
    "TestShareGroupAckOnClose": "share groups (KIP-932) are not served: the test skips itself",
    "TestShareGroupOffsetsAdmin": "share groups (KIP-932) are not served: the test skips itself",
}

# The test helpers that reach the broker (KGO_SEEDS); a test that calls one, directly or through
# other functions of the package's tests, is a broker test.
_SEEDS = {
    "adm",
    "testClientOpts",
    "newTestClient",
    "getSeedBrokers",
    "tmpTopic",
    "tmpTopicPartitions",
    "tmpNamedTopicPartitions",
    "tmpGroup",
    "tmpShareGroup",
}
# The SASL tests dial their own listeners, named by these variables (KGO_TEST_SCRAM_SEEDS, ...).
_SEED_VARIABLES = re.compile(r"\b(scramSeeds|oauthSeeds)\b")
_FUNC = re.compile(r"^func (?:\([^)]*\) )?(\w+)\s*[\[(]", re.M)
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


@dataclass
class Finding:
    test: str
    broker: bool
    verdict: str = "NOT RUN"
    seconds: float = 0.0
    cause: str = ""
    output: list[str] = field(default_factory=list)


def module_dir(version: str) -> Path:
    """The module's source, tests included, from the Go module proxy into the module cache."""
    with tempfile.TemporaryDirectory(prefix="franz-go-mod-") as scratch:
        subprocess.run(
            ["go", "mod", "init", "scratch"], cwd=scratch, check=True, capture_output=True
        )
        done = subprocess.run(
            ["go", "mod", "download", "-json", f"{MODULE}@{version}"],
            cwd=scratch,
            check=True,
            capture_output=True,
            text=True,
        )
    return Path(json.loads(done.stdout)["Dir"])


def broker_tests(package: Path) -> tuple[list[str], set[str]]:
    """Every top-level test of the package, in file order, and the ones that reach a broker: a
    call graph of the package's test functions, by name, closed over the seed helpers."""
    bodies: dict[str, str] = {}
    tests: list[str] = []
    for path in sorted(package.glob("*_test.go")):
        text = path.read_text()
        starts = list(_FUNC.finditer(text))
        for i, match in enumerate(starts):
            end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
            name = match.group(1)
            bodies[name] = bodies.get(name, "") + text[match.end() : end]
            if name.startswith("Test") and name not in tests:
                tests.append(name)
    calls = {
        name: set(_CALL.findall(body)) & bodies.keys() | set(_CALL.findall(body)) & _SEEDS
        for name, body in bodies.items()
    }
    reaching = set(_SEEDS) | {name for name, body in bodies.items() if _SEED_VARIABLES.search(body)}
    grew = True
    while grew:
        grew = False
        for name, called in calls.items():
            if name not in reaching and called & reaching:
                reaching.add(name)
                grew = True
    return tests, {t for t in tests if t in reaching}


# The SCRAM listener's user, as franz-go's CI makes it (KGO_TEST_SCRAM: SCRAM-SHA-256).
SCRAM_USER, SCRAM_PASSWORD = "testuser", "testpass"


def scram_listener(workdir: Path, settings: dict[str, str]) -> tuple[Launched, int]:
    """A second listener, on a store of its own, that requires SASL: a tokens file with one
    principal, whose SCRAM-SHA-256 credential `coordinator scram set` stores (franz-go's SCRAM
    tests dial it)."""
    home = workdir / "scram"
    home.mkdir()
    url = f"sqlite:///{home / 'store.db'}"
    subprocess.run(
        [
            *(sys.executable, "-m", "coordinator", "scram", "set", SCRAM_USER),
            *("--mechanism", "SCRAM-SHA-256", "--password-stdin", "--database-url", url),
        ],
        input=SCRAM_PASSWORD + "\n",
        text=True,
        check=True,
        capture_output=True,
    )
    tokens = home / "tokens.json"
    entry = {"token": "franz-go-admin", "principal": SCRAM_USER, "roles": ["admin"]}
    tokens.write_text(json.dumps({"tokens": [entry]}))
    port = free_port()
    listener = Launched(
        home,
        database_url=url,
        env={
            **settings,
            "COORDINATOR_KAFKA_LISTENER": f"127.0.0.1:{port}",
            "COORDINATOR_AUTH_TOKENS_FILE": str(tokens),
        },
        log=home / "serve.log",
    )
    listener.start()
    return listener, port


def run_tests(
    binary: Path,
    package: Path,
    seeds: str,
    scram_seeds: str,
    records: int,
    timeout_minutes: int,
    run: str | None,
    events: Path | None,
) -> dict[str, Finding]:
    env = {
        **os.environ,
        "KGO_SEEDS": seeds,
        "KGO_TEST_SCRAM_SEEDS": scram_seeds,
        "KGO_TEST_SCRAM": f"{SCRAM_USER}:{SCRAM_PASSWORD}",
        "KGO_TEST_RF": "1",
        "KGO_TEST_RECORDS": str(records),
        "KGO_LOG_LEVEL": "none",
    }
    command = ["go", "tool", "test2json", "-t", str(binary), "-test.v"]
    command += ["-test.timeout", f"{timeout_minutes}m"]
    if run:
        command += ["-test.run", run]
    found: dict[str, Finding] = {}
    output: dict[str, list[str]] = defaultdict(list)
    kept = events.open("w") if events is not None else None
    with subprocess.Popen(command, cwd=package, env=env, stdout=subprocess.PIPE, text=True) as go:
        assert go.stdout is not None
        for line in go.stdout:
            if kept is not None:
                kept.write(line)
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            test = event.get("Test")
            if not test:
                continue
            top = test.split("/")[0]
            action = event["Action"]
            if action == "output":
                output[top].append(event["Output"].rstrip())
            elif action in ("pass", "fail", "skip") and "/" not in test:
                verdict = {"pass": "PASSED", "fail": "FAILED", "skip": "SKIPPED"}[action]
                found[top] = Finding(top, False, verdict, event.get("Elapsed", 0.0))
                log(f"{top}: {verdict}")
    if kept is not None:
        kept.close()
    for name, finding in found.items():
        finding.output = output[name]
    for name in output.keys() - found.keys():  # still running when the binary's timeout hit
        found[name] = Finding(name, False, "TIMEOUT", timeout_minutes * 60.0, output=output[name])
    return found


def _cause(finding: Finding) -> str:
    if finding.verdict == "PASSED":
        return ""
    if finding.test in CAUSES:
        return CAUSES[finding.test]
    # The test's own last words, not go test's "=== RUN" and "--- FAIL" banners.
    said = [
        line.strip()
        for line in finding.output
        if line.strip()
        and not line.strip().startswith(("=== ", "--- "))
        and "NOT DELETING" not in line  # the test's cleanup, after its failure
    ]
    if finding.verdict == "SKIPPED":
        return said[-1][:200] if said else "skipped by the test"
    if finding.verdict in ("FAILED", "TIMEOUT") and finding.broker:
        return "unexplained: " + (said[-1][:200] if said else "no output")
    return ""


def write_table(findings: list[Finding], out: Path, version: str, database: str) -> None:
    broker = [f for f in findings if f.broker]
    unit = [f for f in findings if not f.broker]

    def counts(group: list[Finding]) -> str:
        tally: dict[str, int] = defaultdict(int)
        for f in group:
            tally[f.verdict] += 1
        return ", ".join(f"{v}: {n}" for v, n in sorted(tally.items())) or "none run"

    lines = [
        "# franz-go's kgo tests against the Kafka listener",
        "",
        f"Written by `bench/franz_go_suite.py` (franz-go {version}, `pkg/kgo`, on {database}). "
        f"Broker tests (they reach the listener): {counts(broker)}. Unit tests (the same "
        f"binary's, no broker): {counts(unit)}.",
        "",
        "## Broker tests",
        "",
        "| test | verdict | seconds | cause |",
        "|---|---|---|---|",
    ]
    for f in broker:
        lines.append(f"| {f.test} | {f.verdict} | {f.seconds:.0f} | {f.cause.replace('|', '/')} |")
    lines += ["", "## Unit tests", "", "| test | verdict |", "|---|---|"]
    lines += [f"| {f.test} | {f.verdict} |" for f in unit]
    out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--version", default=VERSION, help=f"franz-go's version (default {VERSION})"
    )
    parser.add_argument(
        "--run", help="only the tests this regular expression matches (go test -run)"
    )
    parser.add_argument("--records", type=int, default=20000, help="KGO_TEST_RECORDS")
    parser.add_argument("--timeout-minutes", type=int, default=25)
    parser.add_argument("--database-url", help="the listener's store (default: a fresh SQLite)")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a COORDINATOR_ setting for the listener, over the tool's (repeatable)",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/pages/franz-go-findings.md"))
    parser.add_argument("--log", type=Path, help="keep go test's events (JSON lines) here")
    args = parser.parse_args()

    source = module_dir(args.version)
    package = source / "pkg" / "kgo"
    tests, reaching = broker_tests(package)
    workdir = Path(tempfile.mkdtemp(prefix="franz-go-suite-"))
    binary = workdir / "kgo.test"
    log(f"building {MODULE}@{args.version}'s pkg/kgo tests")
    subprocess.run(["go", "test", "-c", "-o", str(binary), "./pkg/kgo"], cwd=source, check=True)

    settings = {
        "COORDINATOR_GROUP_INITIAL_REBALANCE_DELAY_MS": "300",
        "COORDINATOR_GROUP_MIN_SESSION_TIMEOUT_MS": "1000",
        # As franz-go's CI configures kfake for its KIP-848 groups.
        "COORDINATOR_GROUP_HEARTBEAT_INTERVAL_MS": "1000",
        **dict(setting.split("=", 1) for setting in args.setting),
    }
    kafka_port = free_port()
    listener = Launched(
        workdir,
        database_url=args.database_url or f"sqlite:///{workdir / 'store.db'}",
        env={**settings, "COORDINATOR_KAFKA_LISTENER": f"127.0.0.1:{kafka_port}"},
        log=workdir / "serve.log",
    )
    listener.start()
    scram, scram_port = scram_listener(workdir, settings)
    started = time.monotonic()
    try:
        found = run_tests(
            binary,
            package,
            f"127.0.0.1:{kafka_port}",
            f"127.0.0.1:{scram_port}",
            args.records,
            args.timeout_minutes,
            args.run,
            args.log,
        )
    finally:
        listener.stop()
        scram.stop()
    log(f"ran in {time.monotonic() - started:.0f} s; the listener's log: {listener.log}")
    findings = []
    for name in tests:
        finding = found.get(name, Finding(name, False))
        if args.run and name not in found:
            continue
        finding.broker = name in reaching
        finding.cause = _cause(finding)
        findings.append(finding)
    database = "Postgres" if args.database_url else "SQLite"
    write_table(findings, args.out, args.version, database)
    log(f"findings: {args.out}")


if __name__ == "__main__":
    main()
