"""`python -m tests.fault`: one fault run; prints the checker's table and, as the last line of
stdout, the summary as one JSON object. Exits 0 without anomalies, 1 with any, 2 if the run
broke."""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import orjson

from tests.fault.runner import PROFILES, RunError, default_postgres_url, run, with_postgres_restarts

DESCRIPTION = """\
Exactly-once under faults. Starts two `coordinator serve` processes on a fresh Postgres database
(COORDINATOR_TEST_POSTGRES_URL, default postgresql://postgres@127.0.0.1:5432/test; dropped at the
end), four transactional producers (processes, through the SDK and a fault proxy, or with --door
kafka through confluent-kafka and the services' Kafka listener, or half each way with --door
both) that commit and abort at random,
and two read_committed readers. Meanwhile a nemesis kills and restarts a service
(SIGKILL), pauses a producer past its transaction timeout (SIGSTOP, then SIGCONT: a zombie),
starts a second instance of a live transactional id, and, in the long profile (or with
--restart-postgres), restarts Postgres; the proxy drops requests, drops answers after the
service handled them, delays and duplicates requests. Then every fault stops, every producer
must commit again, every reader reads every partition from the start, and the checker looks for
duplicates, lost commits, aborted or uncommitted reads, torn transactions, reordering,
disagreeing readers and group offsets ahead of their data.

Profiles: short (1 minute; no Postgres restart: it is what the test suite runs, and other tests
share the server), long (10 minutes, every fault kind but failover, Postgres restarts included: it
restarts the local cluster with pg_ctlcluster, so run it only where nothing else uses that
server), failover (1 minute: the run builds its own Postgres primary and standby from the
machine's binaries, on free ports in a temporary folder, and fails over again and again: SIGKILL
of every primary process, promotion of the standby, a new standby built from it; the suite runs
it; --minutes 10 for the long run, --replication async for what an asynchronous standby loses),
patroni (2 minutes: a primary and a synchronous standby that Patroni keeps, with etcd, Debian's
packages (apt-get install patroni etcd-server), started on free ports in a temporary folder;
the nemesis SIGKILLs the leader's Postgres, SIGKILLs its Patroni, pauses both past the leader
lock's TTL, and restarts etcd, and Patroni fails over; not in the suite, for its length),
cluster (1 minute: three services, each a Kafka broker with its own listener, as one cluster
(docs/pages/cluster.md), with leases of 1.5 s; producers through the Kafka door with all three
as bootstrap; the nemesis SIGKILLs and restarts a service, and SIGSTOPs one past its lease, then
SIGCONTs it, in turn with the producer faults).
"""

EPILOG = """\
Output: progress on stderr; on stdout the seed and history directory, the checker's table
(transactions attempted, committed, aborted; faults by kind; anomalies by kind) and, as the last
line, the same counts as one JSON object. Exit status: 0 no anomaly, 1 anomalies, 2 the run broke
(no verdict; see the logs in the history directory), 130 interrupted. The same --seed makes the
same choices (which fault when, its victim and length, each producer's transactions and fault
odds); how they interleave with real time still varies.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fault",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--profile", choices=sorted(PROFILES), default="short", help="default: short"
    )
    parser.add_argument(
        "--minutes",
        type=float,
        help="how long faults run (default: the profile's: short 1, long 10); a run goes on, up "
        "to two minutes more, until it did what its profile demands: every fault kind, and "
        "committed transactions ("
        + ", ".join(
            f"{p.name} {p.min_committed}"
            + "".join(f" and {n} of {kind}" for kind, n in p.min_faults.items())
            for p in PROFILES.values()
            if p.min_committed
        )
        + ")",
    )
    parser.add_argument(
        "--seed", type=int, help="seed of every random choice (default: a random one, printed)"
    )
    parser.add_argument(
        "--out", type=Path, help="directory for the history and logs (default: a new temp dir)"
    )
    parser.add_argument(
        "--door",
        choices=("http", "kafka", "both"),
        help="the producers' door: http (the SDK through the fault proxy; the default but in "
        "the cluster profile), kafka (confluent-kafka transactional producers through the "
        "services' Kafka listener, sending their input offsets in every transaction; the "
        "readers stay on HTTP; the cluster profile's), or both (half the producers through each "
        "door)",
    )
    parser.add_argument(
        "--replication",
        choices=("sync", "async"),
        help="the failover profile's standby: sync (default; a commit waits for the standby) or "
        "async (it does not: a failover may lose acknowledged writes, which the checker counts)",
    )
    parser.add_argument(
        "--link-delay-ms",
        type=int,
        help="the failover profile's replication link delays every byte this long each way, as "
        "a standby in another zone (default 0: loopback)",
    )
    restarts = parser.add_mutually_exclusive_group()
    restarts.add_argument(
        "--restart-postgres",
        action="store_true",
        default=None,
        help="also restart Postgres (pg_ctlcluster; default only in the long profile)",
    )
    restarts.add_argument(
        "--no-restart-postgres",
        dest="restart_postgres",
        action="store_false",
        help="never restart Postgres, whatever the profile",
    )
    args = parser.parse_args(argv)

    profile = PROFILES[args.profile]
    if args.minutes is not None:
        if args.minutes <= 0:
            parser.error("--minutes must be positive")
        profile = replace(profile, minutes=args.minutes)
    if args.restart_postgres is not None:
        profile = with_postgres_restarts(profile, args.restart_postgres)
    if args.door is not None:
        profile = replace(profile, door=args.door)
    if args.replication is not None:
        if profile.replication is None:
            parser.error("--replication goes with --profile failover")
        profile = replace(profile, replication=args.replication)
    if args.link_delay_ms is not None:
        if profile.replication is None or args.link_delay_ms < 0:
            parser.error("--link-delay-ms (>= 0) goes with --profile failover")
        profile = replace(profile, link_delay_ms=args.link_delay_ms)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    out = args.out or Path(tempfile.mkdtemp(prefix=f"fault-{profile.name}-{seed}-"))
    out.mkdir(parents=True, exist_ok=True)
    default_postgres_url()
    signal.signal(signal.SIGTERM, _exit_on_signal)

    print(f"seed {seed}, profile {profile.name}, history in {out}", flush=True)
    try:
        result = run(profile, seed, out)
    except RunError as exc:
        print(f"the run broke (no verdict): {exc}", file=sys.stderr)
        print(f"history and logs in {out}; rerun with --seed {seed}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted; history and logs in {out}", file=sys.stderr)
        return 130
    print(result.report.table())
    print(f"history in {out}; rerun with --seed {seed} --profile {profile.name}")
    print(orjson.dumps(result.summary()).decode(), flush=True)
    return 0 if result.report.ok else 1


def _exit_on_signal(signum: int, frame: object) -> NoReturn:
    # Unwinds through the runner's cleanup, which stops every process and drops the database.
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
