"""A stand-in bank: an HTTP endpoint in this process that counts every payout call, and the
faults the payout tasks meet."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StandInBank:
    """The outside world: an HTTP endpoint (`url`, POST) that pays a merchant and counts every
    call it gets. It refuses a call whose fencing token is lower than one it saw for the same
    key (409), as a bank checking the token would; a repeated key is counted, never hidden."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[dict[str, Any]] = []
        self.refused = 0
        self.highest: dict[str, int] = {}
        bank = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                status, answer = bank.pay(body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/pay"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def pay(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            key, token = body["key"], body["fencing_token"]
            if token < self.highest.get(key, -1):
                self.refused += 1
                return 409, {"error": f"stale fencing token {token} for {key}"}
            self.highest[key] = token
            self.calls.append(body)
            return 200, {"transfer": f"tr-{len(self.calls):06d}", "paid": body["amount_minor"]}

    def paid_per_merchant(self) -> dict[tuple[str, str], int]:
        totals: dict[tuple[str, str], int] = {}
        for call in self.calls:
            where = (call["merchant"], call["currency"])
            totals[where] = totals.get(where, 0) + call["amount_minor"]
        return totals

    def __enter__(self) -> StandInBank:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def payout_faults(straggler_seconds: float) -> tuple[dict[str, list[float]], list[str]]:
    """The payout tasks' faults: task 0's first attempt dies after its first payout, task 1's
    stalls after its first."""
    faults: dict[str, list[float]] = {"kill": [0, 0, 1], "stall": [1, 0, 1, straggler_seconds]}
    said = [
        "payout task 0 attempt 0 dies after its first payout",
        f"payout task 1 attempt 0 stalls {straggler_seconds:.0f} s after its first payout",
    ]
    return faults, said
