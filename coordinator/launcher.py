"""`coordinator serve` in a child process, on a free loopback port, ready once it answers
`/healthz`: the one launcher of the demo's embedded coordinator, the tests' services and the
benchmarks'. Only the standard library and httpx: it runs in processes that only drive one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

SERVE = ("-m", "coordinator", "serve")


_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's pick), and never one this process was given
    before: the kernel may pick a port again once the probe closes, so two calls before either
    port is bound (a service's HTTP and Kafka ports) could otherwise get the same one."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port: int = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


class Launched:
    """`python -m coordinator serve --port P [args]` (or another `command` that takes `--port`),
    with `env` over this process's environment and its output appended to `log`. The store is
    `database_url` when given (`COORDINATOR_DATABASE_URL`); the service migrates it itself."""

    def __init__(
        self,
        workdir: Path,
        *,
        database_url: str | None = None,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        command: Sequence[str] = SERVE,
        log: Path | None = None,
        port: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.database_url = database_url
        self.env = dict(env or {})
        self.args = list(args)
        self.command = list(command)
        self.port = port or free_port()
        self.log = log or workdir / f"service-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log_tail(self, size: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def spawn(self) -> None:
        env = dict(os.environ)
        if self.database_url is not None:
            env["COORDINATOR_DATABASE_URL"] = self.database_url
        env.update(self.env)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, *self.command, "--port", str(self.port), *self.args],
                cwd=self.workdir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def client(self, **kwargs: Any) -> httpx.Client:
        """An HTTP client for this service (a subclass serving TLS gives its own). Plain HTTP
        needs no CA bundle, whose loading costs a verifying client tens of milliseconds of CPU."""
        return httpx.Client(base_url=self.url, verify=False, **kwargs)

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Until `/healthz` answers 200, looking every 50 ms through one client."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        with self.client(timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the coordinator exited:\n{self.log_tail()}")
                try:
                    if client.get("/healthz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        raise TimeoutError(f"the coordinator did not come up:\n{self.log_tail()}")

    def start(self, timeout: float = 60.0) -> Launched:
        self.spawn()
        self.wait_healthy(timeout)
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no flushing; what is committed is all that is left."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
