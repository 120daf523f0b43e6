"""A Postgres primary and a streaming standby of their own, built from the machine's binaries
(`initdb`, `pg_basebackup`), for the fault run's `failover` nemesis: it SIGKILLs the primary
(every process of it at once, as the loss of its machine), promotes the standby, and builds a
new standby from the promoted one on the lost primary's port, so the pair is whole again and
the next failover can come.

The services reach it with one URL naming both ports, `target_session_attrs=read-write`, which
stays true through every failover: whichever port holds the primary, the driver finds it.

Replication is synchronous (`synchronous_standby_names = '*'`: a commit returns once the standby
has it) or asynchronous (the primary does not wait, and a failover can lose what the standby had
not received). `link_delay_ms` puts the standby behind a link that delays every byte each way
(`TcpProxy`), as a standby in another zone is: on loopback an asynchronous standby is never far
enough behind to lose anything. `fsync` is off: the faults are process kills, which the
kernel's page cache survives, and what is measured is replication, not disks.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.support.services import TcpProxy, free_port

log = logging.getLogger("fault.postgres")

DATABASE = "coordinator"
OS_USER = "postgres"  # initdb refuses to run as root
READY_S = 60.0


def postgres_bin() -> Path:
    """The newest installed Postgres's binaries (Debian: /usr/lib/postgresql/<major>/bin)."""
    root = Path("/usr/lib/postgresql")
    majors = (
        sorted(
            (p for p in root.iterdir() if (p / "bin" / "initdb").exists()),
            key=lambda p: int(p.name) if p.name.isdigit() else 0,
        )
        if root.is_dir()
        else []
    )
    if not majors:
        raise RuntimeError(
            "no Postgres binaries under /usr/lib/postgresql: apt-get install postgresql"
        )
    return majors[-1] / "bin"


@dataclass
class Server:
    """One postgres process group on a port, with its data directory."""

    port: int
    data: Path
    process: subprocess.Popen[bytes] | None = None

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{OS_USER}@127.0.0.1:{self.port}/{database}"


class PostgresPair:
    def __init__(self, synchronous: bool = True, link_delay_ms: int = 0) -> None:
        self.synchronous = synchronous
        self.link_delay_s = link_delay_ms / 1000
        self._link: TcpProxy | None = None
        self.bin = postgres_bin()
        self.root = Path(tempfile.mkdtemp(prefix="fault-postgres-"))
        self._chown(self.root)
        self.primary = Server(free_port(), self.root / "a")
        self.standby = Server(free_port(), self.root / "b")
        self.ports = (self.primary.port, self.standby.port)  # the URL's order, fixed
        self.failovers = 0
        self._generation = 0

    # -- what the services see -----------------------------------------------------------------

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"postgresql://{OS_USER}@{hosts}/{DATABASE}?target_session_attrs=read-write"

    # -- building ------------------------------------------------------------------------------

    def start(self) -> PostgresPair:
        self._run(
            "initdb",
            "-D",
            str(self.primary.data),
            "-U",
            OS_USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-instructions",
        )
        with (self.primary.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "\n# the fault run's primary (tests/fault/postgres_pair.py)\n"
                "listen_addresses = '127.0.0.1'\n"
                "unix_socket_directories = ''\n"
                "wal_level = replica\n"
                "max_wal_senders = 10\n"
                "wal_retrieve_retry_interval = '100ms'\n"
                "wal_keep_size = '256MB'\n"
                "hot_standby = on\n"
                "fsync = off\n"
                "full_page_writes = off\n"
                "max_connections = 100\n"
                "shared_buffers = '32MB'\n"
                "synchronous_commit = on\n"
            )
        with (self.primary.data / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 trust\n")
        self._launch(self.primary)
        with psycopg.connect(self.primary.dsn(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{DATABASE}"')
        self._build_standby(self.standby, self.primary)
        if self.synchronous:
            # Only now: a commit before there is a standby would wait for one forever. Set with
            # ALTER SYSTEM, so every copy (each standby, promoted in its turn) carries it.
            with psycopg.connect(self.primary.dsn(), autocommit=True) as connection:
                connection.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                connection.execute("SELECT pg_reload_conf()")
            self._await_streaming(self.primary)
        return self

    def _build_standby(self, standby: Server, primary: Server) -> None:
        """A copy of `primary` streaming from it (through the delayed link, if any), on
        `standby`'s port."""
        self._generation += 1
        standby.data = self.root / f"d{self._generation}"
        self._run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            OS_USER,
            "-D",
            str(standby.data),
            "-X",
            "stream",
            "-c",
            "fast",
            "-R",
        )
        with (standby.data / "postgresql.conf").open("a") as conf:
            conf.write(f"port = {standby.port}\n")
            if self.synchronous:
                # Idle while it is a standby; the rule it follows from the moment it is promoted.
                conf.write("synchronous_standby_names = '*'\n")
        if self.link_delay_s > 0:
            if self._link is not None:
                self._link.stop()
            self._link = TcpProxy("127.0.0.1", primary.port, self.link_delay_s).start()
            with (standby.data / "postgresql.auto.conf").open("a") as conf:  # overrides -R's
                conf.write(
                    f"primary_conninfo = 'host=127.0.0.1 port={self._link.port} user={OS_USER}'\n"
                )
        self._launch(standby)
        self._await_streaming(primary, "sync" if self._sync_configured(primary) else "async")

    def _launch(self, server: Server) -> None:
        """`postgres` in a process group of its own, so one killpg takes every process of it."""
        options = ["-c", f"port={server.port}"]
        log_file = (self.root / f"{server.data.name}.log").open("ab")
        server.process = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(server.data), *options],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            **self._as_postgres(),
        )
        log_file.close()
        deadline = time.monotonic() + READY_S
        while True:
            try:
                with psycopg.connect(server.dsn(), connect_timeout=2) as connection:
                    connection.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if server.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"postgres on {server.port} did not start: "
                        f"{(self.root / f'{server.data.name}.log').read_text()[-2000:]}"
                    ) from None
                time.sleep(0.1)

    def _sync_configured(self, server: Server) -> bool:
        with psycopg.connect(server.dsn(), autocommit=True) as connection:
            row = connection.execute("SHOW synchronous_standby_names").fetchone()
        return row is not None and row[0] != ""

    def _await_streaming(self, primary: Server, wanted: str | None = None) -> None:
        """Until the primary has a standby streaming, counted as `wanted` (sync or async; by
        default what the pair is)."""
        wanted = wanted or ("sync" if self.synchronous else "async")
        deadline = time.monotonic() + READY_S
        with psycopg.connect(primary.dsn(), autocommit=True) as connection:
            while True:
                rows = connection.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
                ).fetchall()
                if any(state == wanted for (state,) in rows):
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no {wanted} standby streaming after {READY_S:g} s: {rows}")
                time.sleep(0.05)

    # -- the fault -----------------------------------------------------------------------------

    def failover(self) -> dict[str, float | int]:
        """Kill the primary, promote the standby, build a new standby on the old primary's port.
        Returns what it took: seconds to the promotion, and to the pair being whole again."""
        started = time.monotonic()
        lost, survivor = self.primary, self.standby
        self._kill(lost)
        self._run("pg_ctl", "promote", "-D", str(survivor.data), "-w", "-t", str(int(READY_S)))
        promoted = time.monotonic() - started
        shutil.rmtree(lost.data, ignore_errors=True)
        self.primary, self.standby = survivor, lost
        self._build_standby(self.standby, self.primary)
        self.failovers += 1
        return {
            "lost_port": lost.port,
            "primary_port": survivor.port,
            "promoted_s": round(promoted, 3),
            "whole_s": round(time.monotonic() - started, 3),
        }

    def _kill(self, server: Server) -> None:
        if server.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(30)
        server.process = None

    def stop(self) -> None:
        for server in (self.primary, self.standby):
            self._kill(server)
        if self._link is not None:
            self._link.stop()
            self._link = None
        shutil.rmtree(self.root, ignore_errors=True)

    # -- as the postgres user ------------------------------------------------------------------

    def _as_postgres(self) -> dict[str, object]:
        return as_postgres()

    def _chown(self, path: Path) -> None:
        chown(path)

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run(
            [str(self.bin / tool), *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.root,
            **self._as_postgres(),  # type: ignore[arg-type]
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr[-2000:]}")


def as_postgres() -> dict[str, object]:
    """Popen's arguments that run a child as the postgres user (when run as root)."""
    if os.geteuid() != 0:
        return {}
    return {"user": OS_USER, "group": OS_USER, "extra_groups": []}


def chown(path: Path) -> None:
    """Give `path` to the postgres user (when run as root)."""
    if os.geteuid() == 0:
        os.chown(path, pwd.getpwnam(OS_USER).pw_uid, grp.getgrnam(OS_USER).gr_gid)
