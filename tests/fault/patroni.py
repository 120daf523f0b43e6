"""A Postgres primary and a synchronous standby that Patroni keeps, with etcd as its store, all
from Debian's packages (`apt-get install patroni etcd-server`) and started here, for the fault
run's `patroni` profile. Patroni, not this harness, notices each failure and promotes; the
harness only injects faults, as a machine or an operator would, and waits for the pair to be
whole again (a leader, and a synchronous standby streaming from it):

- `kill_postgres`: SIGKILL every process of the leader's Postgres (Patroni restarts it, or
  fails over when it cannot);
- `kill_patroni`: SIGKILL the leader's Patroni, leaving its Postgres running; the standby takes
  the leader lock once its TTL passes, and the killed Patroni, started again as its service
  manager would, demotes its Postgres (pg_rewind) and follows;
- `pause_primary`: SIGSTOP the leader's Patroni and Postgres past the lock's TTL, then SIGCONT;
- `restart_etcd`: SIGKILL etcd and start it again once Patroni's retry timeout has passed.

With `synchronous_mode`, Patroni promotes only the standby named synchronous, so a commit that
returned is on the node that takes over; the old primary, until it is demoted, waits for a
standby that no longer follows it, so nothing it takes meanwhile returns. The services reach
the pair with one URL naming both nodes, `target_session_attrs=read-write`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.fault.postgres_pair import DATABASE, OS_USER, as_postgres, chown, postgres_bin
from tests.support.services import free_port

log = logging.getLogger("fault.patroni")

READY_S = 90.0
# Patroni's timing (its DCS settings): the leader lock's TTL, the loop's period, and how long
# Patroni retries the DCS and Postgres before it acts. Patroni wants loop_wait + 2 *
# retry_timeout <= ttl.
TTL_S, LOOP_WAIT_S, RETRY_TIMEOUT_S = 10, 1, 4
REINIT_AFTER_S = 30.0  # a standby not following by then is rebuilt (`_measured`)
SETTINGS = {
    "synchronous_mode": True,
    "ttl": TTL_S,
    "loop_wait": LOOP_WAIT_S,
    "retry_timeout": RETRY_TIMEOUT_S,
}


@dataclass
class Node:
    name: str
    port: int  # Postgres
    rest: int  # Patroni's REST API
    data: Path
    config: Path
    patroni: subprocess.Popen[bytes] | None = None

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{OS_USER}@127.0.0.1:{self.port}/{database}"


class PatroniPair:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fault-patroni-"))
        chown(self.root)
        self.etcd_client, self.etcd_peer = free_port(), free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.nodes = [
            Node(
                f"node{i}",
                free_port(),
                free_port(),
                self.root / f"node{i}",
                self.root / f"node{i}.yml",
            )
            for i in range(2)
        ]
        self.settings = SETTINGS

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgresql://{OS_USER}@{hosts}/{DATABASE}?target_session_attrs=read-write"

    # -- building ------------------------------------------------------------------------------

    def start(self) -> PatroniPair:
        for tool in ("patroni", "etcd"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"no {tool}: apt-get install patroni etcd-server")
        self._start_etcd()
        for node in self.nodes:
            node.config.write_text(json.dumps(self._config(node), indent=1))  # YAML is JSON's
            chown(node.config)
            self._start_patroni(node)
            self.await_whole() if node is self.nodes[-1] else self._await_leader()
        with psycopg.connect(self.leader().dsn(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{DATABASE}"')
        return self

    def _config(self, node: Node) -> dict[str, Any]:
        local = f"127.0.0.1:{node.port}"
        return {
            "scope": "fault",
            "name": node.name,
            "restapi": {
                "listen": f"127.0.0.1:{node.rest}",
                "connect_address": f"127.0.0.1:{node.rest}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_client}"]},
            "bootstrap": {
                "dcs": {
                    **self.settings,
                    "maximum_lag_on_failover": 16 * 1024 * 1024,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "wal_log_hints": "on",
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "256MB",
                            "max_connections": 100,
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
                "pg_hba": [
                    "host replication all 127.0.0.1/32 trust",
                    "host all all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": local,
                "connect_address": local,
                "data_dir": str(node.data),
                "bin_dir": str(postgres_bin()),
                "pgpass": str(self.root / f"{node.name}.pgpass"),
                "authentication": {
                    "superuser": {"username": OS_USER},
                    "replication": {"username": OS_USER},
                    "rewind": {"username": OS_USER},
                },
                "parameters": {
                    "unix_socket_directories": str(self.root),
                    "fsync": "off",  # the faults are process kills; the page cache survives
                    "shared_buffers": "32MB",
                },
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
        }

    def _start_etcd(self) -> None:
        client, peer = f"http://127.0.0.1:{self.etcd_client}", f"http://127.0.0.1:{self.etcd_peer}"
        with (self.root / "etcd.log").open("ab") as out:
            self.etcd = subprocess.Popen(
                [
                    "etcd",
                    "--name=fault",
                    f"--data-dir={self.root / 'etcd'}",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=fault={peer}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._until(lambda: self._get(f"{client}/health") is not None, "etcd to answer")

    def _start_patroni(self, node: Node) -> None:
        with (self.root / f"{node.name}.log").open("ab") as out:
            node.patroni = subprocess.Popen(
                ["patroni", str(node.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.root,
                **as_postgres(),
            )

    # -- the cluster as Patroni reports it -----------------------------------------------------

    def _get(self, url: str) -> Any:
        with (
            contextlib.suppress(OSError, ValueError),
            urllib.request.urlopen(url, timeout=2) as answer,
        ):
            return json.loads(answer.read())
        return None

    def members(self) -> list[dict[str, Any]]:
        for node in self.nodes:
            cluster = self._get(f"http://127.0.0.1:{node.rest}/cluster")
            if cluster is not None:
                members: list[dict[str, Any]] = cluster.get("members", [])
                return members
        return []

    def leader(self) -> Node:
        for member in self.members():
            if member.get("role") == "leader" and member.get("state") == "running":
                return next(n for n in self.nodes if n.name == member["name"])
        raise RuntimeError("no leader")

    def _writable(self) -> bool:
        """A primary takes a write and its commit returns, within 2 s (it waits for the
        synchronous standby, when Patroni names one). A commit still waiting is cancelled
        from here (no server timeout covers that wait); cancelled, it is committed locally
        only, and not counted."""
        cancelled: list[str] = []
        try:
            with psycopg.connect(
                self.url.replace(f"/{DATABASE}?", "/postgres?"),
                connect_timeout=2,
                autocommit=True,
            ) as connection:
                connection.add_notice_handler(
                    lambda notice: cancelled.append(notice.message_primary or "")
                )
                timer = threading.Timer(2.0, connection.cancel_safe)
                timer.start()
                try:
                    connection.execute("CREATE TABLE IF NOT EXISTS fault_probe (at timestamptz)")
                    connection.execute("INSERT INTO fault_probe VALUES (now())")
                finally:
                    timer.cancel()
        except psycopg.Error:
            return False
        return not any("synchronous replication" in message for message in cancelled)

    def _whole(self) -> bool:
        """Patroni names a leader and a synchronous standby, and the leader has a
        synchronous standby streaming from it."""
        roles = {(m.get("role"), m.get("state")) for m in self.members()}
        # A standby's state is "running" before Patroni 3.1, "streaming" from it.
        following = roles & {("sync_standby", "running"), ("sync_standby", "streaming")}
        if ("leader", "running") not in roles or not following:
            return False
        try:
            with psycopg.connect(self.leader().dsn(), connect_timeout=2) as connection:
                rows = connection.execute(
                    "SELECT 1 FROM pg_stat_replication "
                    "WHERE state = 'streaming' AND sync_state = 'sync'"
                ).fetchall()
        except (psycopg.Error, RuntimeError):
            return False
        return bool(rows)

    def _await_leader(self) -> None:
        self._until(lambda: any(m.get("role") == "leader" for m in self.members()), "a leader")

    def await_whole(self) -> None:
        self._until(self._whole, "a leader and a synchronous standby streaming")

    def _until(self, done: Any, what: str, limit_s: float = READY_S) -> float:
        started = time.monotonic()
        while not done():
            if time.monotonic() - started > limit_s:
                raise RuntimeError(f"no {what} after {limit_s:g} s: {self.members()}")
            time.sleep(0.1)
        return time.monotonic() - started

    def _measured(self, started: float, lost: Node) -> dict[str, float | str | bool]:
        """Seconds from the fault until a primary took a write again, and until the pair was
        whole; which node leads now. A standby that cannot follow the leader (its timeline
        ahead of the leader's: see `pause_primary`) leaves a synchronous primary unable to
        commit; after `REINIT_AFTER_S` it is rebuilt as an operator would (`patronictl
        reinit`), and the fault's record says so."""
        reinit = False
        try:
            self._until(self._writable, "primary taking writes", REINIT_AFTER_S)
        except RuntimeError:
            standby = next(n for n in self.nodes if n is not self.leader())
            log.warning("%s does not follow the leader; reinit", standby.name)
            command = ["patronictl", "-c", str(standby.config), "reinit", "fault"]
            subprocess.run(
                [*command, standby.name, "--force"],
                capture_output=True,
                timeout=60,
                check=True,
            )
            reinit = True
            self._until(self._writable, "primary taking writes")
        writable = time.monotonic() - started
        self.await_whole()
        return {
            "lost": lost.name,
            "leader": self.leader().name,
            "writable_s": round(writable, 3),
            "whole_s": round(time.monotonic() - started, 3),
            "reinit": reinit,
        }

    # -- the faults ----------------------------------------------------------------------------

    def _postgres_pids(self, node: Node) -> list[int]:
        """The node's postmaster and its children."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            postmaster = int((node.data / "postmaster.pid").read_text().split()[0])
            children = []
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    with contextlib.suppress(OSError):
                        fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                        if int(fields[1]) == postmaster:
                            children.append(int(entry.name))
            return [postmaster, *children]
        return []

    def _signal(self, pids: list[int], sig: signal.Signals) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def kill_postgres(self) -> dict[str, float | str | bool]:
        lost = self.leader()
        started = time.monotonic()
        self._signal(self._postgres_pids(lost), signal.SIGKILL)
        return self._measured(started, lost)

    def kill_patroni(self) -> dict[str, float | str | bool]:
        lost = self.leader()
        assert lost.patroni is not None
        started = time.monotonic()
        lost.patroni.kill()
        lost.patroni.wait(30)
        # The other node takes the lock once its TTL passes; then the killed Patroni is
        # started again, as its service manager would, and demotes its Postgres.
        self._until(
            lambda: any(
                m.get("role") == "leader" and m.get("name") != lost.name for m in self.members()
            ),
            "the standby to take the leader lock",
        )
        self._start_patroni(lost)
        return self._measured(started, lost)

    def pause_primary(self) -> dict[str, float | str | bool]:
        lost = self.leader()
        assert lost.patroni is not None
        pids = [lost.patroni.pid, *self._postgres_pids(lost)]
        started = time.monotonic()
        self._signal(pids, signal.SIGSTOP)
        try:
            self._until(
                lambda: any(
                    m.get("role") == "leader" and m.get("name") != lost.name for m in self.members()
                ),
                "the standby to take the leader lock",
            )
        finally:
            self._signal(pids, signal.SIGCONT)
        return self._measured(started, lost)

    def restart_etcd(self) -> dict[str, float | str | bool]:
        lost = self.leader()
        assert self.etcd is not None
        started = time.monotonic()
        self.etcd.kill()
        self.etcd.wait(30)
        time.sleep(RETRY_TIMEOUT_S + LOOP_WAIT_S)  # past Patroni's retries of its store
        self._start_etcd()
        return self._measured(started, lost)

    def stop(self) -> None:
        for node in self.nodes:
            if node.patroni is not None and node.patroni.poll() is None:
                node.patroni.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.patroni.wait(30)
            self._signal(self._postgres_pids(node), signal.SIGKILL)
            if node.patroni is not None and node.patroni.poll() is None:
                node.patroni.kill()
        if self.etcd is not None:
            self.etcd.kill()
            self.etcd.wait(30)
        shutil.rmtree(self.root, ignore_errors=True)
