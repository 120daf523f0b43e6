"""librdkafka's own test suite against the Kafka listener, as Tansu runs it: a project tool, not
part of the test suite (it needs librdkafka's source, which CI cannot fetch).

    python bench/librdkafka_suite.py --source ~/src/librdkafka [--build] [--tests 0001,0012]
        [--timeout 900] [--quick] [--group-protocol classic|consumer]
        [--out docs/pages/librdkafka-findings.md]

It builds the tests from the source directory when asked (`./configure` with OpenSSL where
libssl-dev is installed and without the other optional dependencies, `make libs`, `make -C tests
build`), starts `coordinator serve --kafka-listener` on a fresh SQLite store with a short initial
rebalance delay, points `tests/test.conf` at it (and KAFKA_PATH at Kafka's own `kafka-topics` tool,
from the jars the README's test command resolved), and runs each broker test (the ones librdkafka
marks local run against its own mock cluster and are left out) alone (those in `AUTH_TESTS`, which
manage ACLs, with auth on and the test's client logged in with SASL/PLAIN as the tokens file's
admin), with `TEST_KAFKA_VERSION=4.0.0`, under a timeout, in full mode as a user runs it (`--quick`
passes -Q, which skips every sub-test not marked quick, so a test can pass there having run
nothing). It writes a findings table: test, verdict, cause. A cause comes from `CAUSES` below (what
a failure was traced to, or why a test is outside this project's scope); a failing test that has
none is listed as "unexplained" with its last error line, so the table never hides one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from coordinator.launcher import Launched, free_port

# What a test needs that one broker over a database does not have, or what its failure was
# traced to. Keep it true: a test that starts passing leaves this table.
OUT_OF_SCOPE = "outside scope"
CAUSES: dict[str, str] = {
    "0009_mock_cluster": f"{OUT_OF_SCOPE}: librdkafka's mock cluster",
    "0049_consume_conn_close": f"{OUT_OF_SCOPE}: sockem (needs librdkafka built with it)",
    "0081_admin": "its ACL sub-tests pass (Create-, Describe-, DeleteAcls, logged in as the tokens "
    "file's admin); AlterConfigs of a BROKER resource (sasl.kerberos.min.time.before.relogin) is "
    "refused: the listener keeps no broker configs",
    "0101_fetch_from_follower": f"{OUT_OF_SCOPE}: needs replicas and racks (one broker)",
    # These deny User:* on a cluster without authentication (an authorizer that lets the
    # anonymous user do what no ACL speaks to); here ACLs are kept with auth on only.
    "0109_auto_create_topics": f"{OUT_OF_SCOPE}: denies User:* with kafka-acls.sh on a cluster "
    "without authentication; ACLs need auth on here",
    "0115_producer_auth": f"{OUT_OF_SCOPE}: denies User:* with kafka-acls.sh on a cluster without "
    "authentication; ACLs need auth on here",
    "0119_consumer_auth": f"{OUT_OF_SCOPE}: denies User:* with kafka-acls.sh on a cluster without "
    "authentication; ACLs need auth on here",
    "0126_oauthbearer_oidc": f"{OUT_OF_SCOPE}: SASL/OAUTHBEARER with an OIDC server",
    "0142_reauthentication": f"{OUT_OF_SCOPE}: SASL re-authentication (KIP-368) is not served",
}

# Tests run with auth on (a tokens file; the test's client logs in with SASL/PLAIN as its admin):
# 0081 creates, lists and deletes ACLs, which only a listener with auth on keeps.
AUTH_TESTS = {"0081_admin"}
ADMIN_USER, ADMIN_TOKEN = "ops", "librdkafka-suite-admin"

_TEST_DECL = re.compile(r"_TEST\((\d{4}_\w+),(.*?)\)\s*,\s*(?=_TEST\(|\{)", re.S)


@dataclass
class Finding:
    test: str
    verdict: str
    cause: str
    seconds: float


@dataclass
class Declared:
    name: str
    scenario: str  # "default", or another (librdkafka's "noautocreate")


def broker_tests(source: Path) -> list[Declared]:
    """The tests `tests/test.c` declares that need a broker (not TEST_F_LOCAL, not the manual
    ones), each with the scenario it runs in."""
    declared = (source / "tests" / "test.c").read_text()
    found: dict[str, Declared] = {}
    for name, rest in _TEST_DECL.findall(declared):
        if "TEST_F_LOCAL" in rest or "TEST_F_MANUAL" in rest or name.startswith("0000"):
            continue
        scenario = re.search(r'\.scenario\s*=\s*"([^"]+)"', rest)
        found[name] = Declared(name, scenario.group(1).split(",")[0] if scenario else "default")
    return [found[n] for n in sorted(found)]


def librdkafka_version(source: Path) -> str:
    """The version `src/rdkafka.h` declares (0xMMmmrrpp)."""
    found = re.search(
        r"#define RD_KAFKA_VERSION\s+0x([0-9a-fA-F]{8})", (source / "src" / "rdkafka.h").read_text()
    )
    if found is None:
        return "(unknown version)"
    number = int(found.group(1), 16)
    return f"{number >> 24}.{(number >> 16) & 0xFF}.{(number >> 8) & 0xFF}"


def build(source: Path) -> None:
    steps = [
        [
            "./configure",
            "--disable-gssapi",
            "--disable-zstd",
            "--disable-curl",
            "--disable-sasl",
        ],
        ["make", "-j2", "libs"],
        ["make", "-C", "tests", "-j2", "build"],
    ]
    for step in steps:
        subprocess.run(step, cwd=source, check=True)


class Listener(Launched):
    """`coordinator serve` with the Kafka listener on a fresh SQLite store."""

    def __init__(
        self, workdir: Path, group_delay_ms: int, no_auto_create: bool, auth: bool = False
    ) -> None:
        self.kafka_port = free_port()
        extra = {}
        if auth:
            tokens = workdir / "tokens.json"
            tokens.write_text(
                json.dumps(
                    {
                        "tokens": [
                            {"token": ADMIN_TOKEN, "principal": ADMIN_USER, "roles": ["admin"]}
                        ]
                    }
                )
            )
            extra["COORDINATOR_AUTH_TOKENS_FILE"] = str(tokens)
        super().__init__(
            workdir,
            database_url=f"sqlite:///{workdir / 'store.db'}",
            env={
                "COORDINATOR_KAFKA_LISTENER": f"127.0.0.1:{self.kafka_port}",
                "COORDINATOR_GROUP_INITIAL_REBALANCE_DELAY_MS": str(group_delay_ms),
                "COORDINATOR_GROUP_MIN_SESSION_TIMEOUT_MS": "1000",
                # As the clusters librdkafka's tests are written for (trivup's num.partitions).
                "COORDINATOR_NUM_PARTITIONS": "4",
                "COORDINATOR_AUTO_CREATE_TOPICS_ENABLE": "false" if no_auto_create else "true",
                # The cleaner every second (0077 waits 20 s for its compacted topic to be
                # cleaned), and no retention by time where a topic sets none: a test cluster
                # checks retention every 5 minutes, longer than any test, and 0052 writes its
                # records with 1970's timestamps, which a 7-day retention would take at once.
                "COORDINATOR_LOG_RETENTION_CHECK_INTERVAL_MS": "1000",
                "COORDINATOR_LOG_RETENTION_MS": "-1",
                **extra,
            },
            log=workdir / "serve.log",
        )
        self.start()


# Kafka's command-line tools, as the README's test command resolves them with Maven.
KAFKA_TOOLS = Path(__file__).resolve().parents[1] / "tests" / "clients" / "java" / "target" / "lib"


def kafka_path(workdir: Path, tools: Path) -> Path:
    """A KAFKA_PATH for the tests that run Kafka's shell tools (`bin/kafka-topics.sh`: 0045's
    partition changes and deletions, 0052, 0077): each script runs the tool's main class from
    Kafka's own jars."""
    if not list(tools.glob("kafka-tools-*.jar")):
        sys.exit(f"Kafka's tools are not in {tools}: run the README's test command (mvn package)")
    path = workdir / "kafka"
    (path / "bin").mkdir(parents=True)
    script = path / "bin" / "kafka-topics.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"exec java -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp '{tools}/*' "
        'org.apache.kafka.tools.TopicCommand "$@"\n'
    )
    script.chmod(0o755)
    return path


def run_test(
    source: Path,
    test: Declared,
    timeout_s: float,
    group_protocol: str | None,
    log_dir: Path | None,
    quick: bool,
    tools_env: dict[str, str],
) -> tuple[str, str, float]:
    name = test.name
    env = {
        **os.environ,
        **tools_env,
        "TESTS": name,
        "TEST_KAFKA_VERSION": "4.0.0",
        "TEST_LEVEL": "2",
        # As tests/run-test.sh sets it: the libraries just built.
        "LD_LIBRARY_PATH": f"{source / 'src'}:{source / 'src-cpp'}",
    }
    if group_protocol:
        env["TEST_CONSUMER_GROUP_PROTOCOL"] = group_protocol
    started = time.monotonic()
    try:
        done = subprocess.run(
            ["./test-runner", "-L", *(["-Q"] if quick else []), "-V", "4.0.0", "-s", test.scenario],
            cwd=source / "tests",
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or "") if isinstance(expired.stdout, str) else ""
        return "TIMEOUT", _last_error(output), time.monotonic() - started
    output = done.stdout + done.stderr
    seconds = time.monotonic() - started
    if log_dir is not None:
        (log_dir / f"{name}.log").write_text(f"{output}\nexit status {done.returncode}\n")
    # The verdict is the runner's own banner for the test: the test-runner built here often
    # dies of a signal (SIGSEGV, SIGABRT) in its teardown after every test passed, so its exit
    # status alone would call a passed test failed.
    if f"Test {name} PASSED" in output:
        return "PASSED", "", seconds
    if "SKIPPING" in output or f"Test {name} SKIPPED" in output:
        return "SKIPPED", _skip_reason(output), seconds
    return "FAILED", _last_error(output), seconds


_ANSI = re.compile(r"\x1b\[[0-9;]*m|\x1b\(B")


def _last_error(output: str) -> str:
    lines = [
        line.strip()
        for line in output.splitlines()
        if "FAIL" in line or "Error" in line or "error" in line
    ]
    return _ANSI.sub("", lines[-1] if lines else "no error line").strip()[:200]


def _skip_reason(output: str) -> str:
    for line in output.splitlines():
        if "SKIP" in line:
            return _ANSI.sub("", line).strip()[:200]
    return "skipped by the test"


def write_table(findings: list[Finding], out: Path, source_version: str, quick: bool) -> None:
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.verdict] = counts.get(f.verdict, 0) + 1
    lines = [
        "# librdkafka's test suite against the Kafka listener",
        "",
        f"Written by `bench/librdkafka_suite.py` (librdkafka {source_version}, "
        + ("quick mode, -Q" if quick else "full mode, every sub-test as a user runs them")
        + f") on {time.strftime('%Y-%m-%d')}: "
        + ", ".join(f"{v}: {n}" for v, n in sorted(counts.items()))
        + ".",
        "",
        "Every broker test librdkafka declares runs alone (its local tests run against its own "
        "mock cluster and are left out; 0081, which manages ACLs, with auth on, its client "
        "logged in as the tokens file's admin), with `TEST_KAFKA_VERSION=4.0.0`, against a fresh "
        "listener on a fresh SQLite store configured as the suite's clusters are: 4 partitions "
        "per auto-created topic, auto-creation as the test's scenario says, Kafka's own "
        "`kafka-topics` as KAFKA_PATH's tool. Every test not passed says why: a cause traced "
        "here, or the test's own reason for skipping (librdkafka skips share groups for Kafka "
        "4.0, tests its build cannot run, and tests filtered as local or manual).",
        "",
        "| test | verdict | seconds | cause |",
        "|---|---|---|---|",
    ]
    for f in findings:
        cause = f.cause.replace("|", "/")
        lines.append(f"| {f.test} | {f.verdict} | {f.seconds:.0f} | {cause} |")
    out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="librdkafka's source tree")
    parser.add_argument("--build", action="store_true", help="build the library and tests first")
    parser.add_argument("--tests", help="comma-separated test numbers or names (default: all)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per test")
    parser.add_argument(
        "--quick", action="store_true", help="librdkafka's quick mode (-Q): quick sub-tests only"
    )
    parser.add_argument("--group-protocol", choices=["classic", "consumer"], default=None)
    parser.add_argument("--group-delay-ms", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path("docs/pages/librdkafka-findings.md"))
    parser.add_argument("--logs", type=Path, default=None, help="keep each test's output here")
    parser.add_argument(
        "--kafka-tools",
        type=Path,
        default=KAFKA_TOOLS,
        help="the jars of Kafka's tools, for KAFKA_PATH (default: tests/clients/java's)",
    )
    args = parser.parse_args()
    source: Path = args.source.resolve()
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
    if args.build:
        build(source)
    if not (source / "tests" / "test-runner").exists():
        sys.exit(f"{source}/tests/test-runner is missing: run with --build")
    names = broker_tests(source)
    if args.tests:
        wanted = args.tests.split(",")
        names = [n for n in names if any(n.name.startswith(w) for w in wanted)]
    version = librdkafka_version(source)
    workdir = Path(tempfile.mkdtemp(prefix="librdkafka-suite-"))
    tools = kafka_path(workdir, args.kafka_tools)
    findings = []
    for test in names:
        name = test.name
        if CAUSES.get(name, "").startswith(OUT_OF_SCOPE):
            findings.append(Finding(name, "NOT RUN", CAUSES[name], 0))
            continue
        # A fresh store per test, as a fresh cluster: no test sees another's topics or groups.
        store = workdir / name
        store.mkdir()
        # The "noautocreate" scenario is a cluster without auto.create.topics.enable.
        auth = name in AUTH_TESTS
        listener = Listener(store, args.group_delay_ms, test.scenario == "noautocreate", auth)
        try:
            (source / "tests" / "test.conf").write_text(
                f"metadata.broker.list=127.0.0.1:{listener.kafka_port}\ntest.timeout.multiplier=2\n"
                + (
                    "security.protocol=SASL_PLAINTEXT\nsasl.mechanisms=PLAIN\n"
                    f"sasl.username={ADMIN_USER}\nsasl.password={ADMIN_TOKEN}\n"
                    if auth
                    else ""
                )
            )
            bootstrap = f"127.0.0.1:{listener.kafka_port}"
            verdict, detail, seconds = run_test(
                source,
                test,
                args.timeout,
                args.group_protocol,
                args.logs,
                args.quick,
                {"KAFKA_PATH": str(tools), "BROKERS": bootstrap},
            )
        finally:
            listener.stop()
        cause = CAUSES.get(name, "") if verdict != "PASSED" else ""
        if verdict in ("FAILED", "TIMEOUT") and not cause:
            cause = f"unexplained: {detail}"
        elif verdict == "SKIPPED":
            cause = cause or detail
        findings.append(Finding(name, verdict, cause, seconds))
        print(f"{name}: {verdict} {cause}", flush=True)
        write_table(findings, args.out, version, args.quick)
    write_table(findings, args.out, version, args.quick)
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
