"""`coordinator transactions ...`: the admin calls over HTTP, like Kafka's `kafka-transactions.sh`.
Like Kafka's tools on its Admin client, every command here and in `coordinator topics|groups` sits
on the SDK's `AdminClient` (`call_api`): one HTTP client, one way of quoting ids, one set of errors.

Aligned tables for people, `--json` (the API's answer, unchanged) for scripts. Any failure is an
`error: ...` line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson

from sdk import AdminClient, KafkaException, TransportError

URL_ENV = "COORDINATOR_URL"
TOKEN_ENV = "COORDINATOR_TOKEN"
DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_S = 30.0
# The states docs/pages/http-api.md names, spelled out rather than imported from the server's state
# machine so the client starts without loading FastAPI and SQLAlchemy.
STATES = ("Empty", "Ongoing", "Prepared", "CompleteCommit", "CompleteAbort", "Dead")
# `list` shows this many partitions per transaction; `describe` shows them all.
LIST_PARTITIONS = 4

Params = dict[str, str | int]


@dataclass(frozen=True)
class Call:
    """One call of the admin API: its path's segments after /v1/, as `AdminClient.call_api`
    takes them (it quotes each)."""

    method: str
    path: tuple[str | int, ...]
    params: Params = field(default_factory=dict)
    body: dict[str, Any] | None = None  # sent as JSON


class CommandFailed(Exception):
    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


# -- the subcommands: what each asks, and how its answer reads -----------------------------------


def _list_call(args: argparse.Namespace) -> Call:
    params: Params = {}
    if args.state is not None:
        params["state"] = args.state
    if args.prefix is not None:
        params["prefix"] = args.prefix
    if args.older_than_ms is not None:
        params["older_than_ms"] = args.older_than_ms
    return Call("GET", ("admin", "transactions"), params)


def _list_render(answer: Any, args: argparse.Namespace) -> str:
    return _transactions_table(answer["transactions"], all_partitions=False)


def _describe_call(args: argparse.Namespace) -> Call:
    return Call("GET", ("transactions", args.transactional_id))


def _describe_render(answer: Any, args: argparse.Namespace) -> str:
    return _transactions_table([answer], all_partitions=True)


def _producers_call(args: argparse.Namespace) -> Call:
    return Call("GET", ("admin", "producers"), {"topic": args.topic, "partition": args.partition})


def _producers_render(answer: Any, args: argparse.Namespace) -> str:
    return _table(
        [
            "ProducerId",
            "ProducerEpoch",
            "LastSequence",
            "LastTimestamp",
            "CurrentTransactionStartOffset",
        ],
        [
            [
                p["producer_id"],
                p["producer_epoch"],
                p["last_sequence"],
                _instant(p["last_timestamp"]),
                p["current_txn_start_offset"],
            ]
            for p in answer["producers"]
        ],
    )


def _abort_call(args: argparse.Namespace) -> Call:
    return Call("POST", ("admin", "transactions", args.transactional_id, "abort"))


def _abort_render(answer: Any, args: argparse.Namespace) -> str:
    return (
        f"aborted {args.transactional_id}: {answer['state']}; producer {answer['producer_id']} "
        f"is fenced, its epoch is now {answer['producer_epoch']}"
    )


def _hanging_call(args: argparse.Namespace) -> Call:
    return Call(
        "GET",
        ("admin", "hanging"),
        {"max_transaction_timeout_ms": args.max_transaction_timeout_ms},
    )


def _hanging_render(answer: Any, args: argparse.Namespace) -> str:
    limit = args.max_transaction_timeout_ms
    transactions, partitions = answer["transactions"], answer["partitions"]
    if not transactions and not partitions:
        return (
            f"no hanging transactions: none open for more than {limit} ms, "
            "and no partition's last stable offset is held by a producer without one"
        )
    sections = []
    if transactions:
        sections.append(
            f"Transactions open for more than {limit} ms:\n"
            + _transactions_table(transactions, all_partitions=False)
        )
    if partitions:
        sections.append(
            "Partitions whose last stable offset is held by a producer with no open transaction:\n"
            + _table(
                ["Topic", "Partition", "ProducerId", "StartOffset"],
                [
                    [p["topic"], p["partition"], p["producer_id"], p["current_txn_start_offset"]]
                    for p in partitions
                ],
            )
        )
    return "\n\n".join(sections)


# -- tables ----------------------------------------------------------------------------------------


def _cell(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def _table(headers: list[str], rows: list[list[object]]) -> str:
    cells = [headers, *([_cell(v) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def _transactions_table(transactions: list[dict[str, Any]], all_partitions: bool) -> str:
    now = datetime.now(UTC)
    headers = [
        "TransactionalId",
        "ProducerId",
        "ProducerEpoch",
        "State",
        "TimeoutMs",
        "StartedAt",
        "Age",
        "Partitions",
    ]
    if all_partitions:
        headers.append("Groups")
    rows: list[list[object]] = []
    for t in transactions:
        row: list[object] = [
            t["transactional_id"],
            t["producer_id"],
            t["producer_epoch"],
            t["state"],
            t["timeout_ms"],
            t["started_at"],
            _age(t["started_at"], now),
            _partitions(t["partitions"], None if all_partitions else LIST_PARTITIONS),
        ]
        if all_partitions:
            row.append(",".join(t.get("groups", [])))
        rows.append(row)
    return _table(headers, rows)


def _partitions(partitions: list[dict[str, Any]], limit: int | None) -> str:
    names = [f"{p['topic']}-{p['partition']}" for p in partitions]
    if limit is not None and len(names) > limit:
        return ",".join(names[:limit]) + f",+{len(names) - limit} more"
    return ",".join(names)


def _age(started_at: str | None, now: datetime) -> str | None:
    """How long ago the transaction started, by this machine's clock."""
    if started_at is None:
        return None
    try:
        seconds = max(0, int((now - datetime.fromisoformat(started_at)).total_seconds()))
    except ValueError:
        return None
    minutes, s = divmod(seconds, 60)
    hours, m = divmod(minutes, 60)
    days, h = divmod(hours, 24)
    if days:
        return f"{days}d{h:02d}h"
    if hours:
        return f"{hours}h{m:02d}m"
    if minutes:
        return f"{minutes}m{s:02d}s"
    return f"{s}s"


def _instant(ms: int | None) -> str | None:
    if ms is None:
        return None
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


# -- the admin client ------------------------------------------------------------------------------


def _send(args: argparse.Namespace, call: Call) -> Any:
    """`call` through the SDK's `AdminClient` (its HTTP client, token, quoting and typed errors),
    one attempt within `--timeout`; the API's JSON answer, or `CommandFailed` saying why not."""
    url = (args.url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise CommandFailed(f"--url must be an http:// or https:// URL, not {url!r}")
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    timeout_ms = max(1, round(args.timeout * 1000))
    config = {
        "coordinator.url": url,
        "coordinator.token": token or None,
        "client.id": "coordinator-cli",
        "request.timeout.ms": timeout_ms,
        "default.api.timeout.ms": timeout_ms,
    }
    try:
        with AdminClient(config) as admin:
            return admin.call_api(
                call.method, *call.path, params=call.params, body=call.body, retry=False
            )
    except TransportError as exc:
        if isinstance(exc.__cause__, httpx.TimeoutException) and not isinstance(
            exc.__cause__, httpx.ConnectTimeout
        ):
            raise CommandFailed(
                f"the coordinator at {url} did not answer within {args.timeout:g} s"
            ) from None
        raise CommandFailed(
            f"cannot reach the coordinator at {url}: {exc.__cause__ or exc}",
            f"hint: is it running there? --url or ${URL_ENV} says where (default {DEFAULT_URL})",
        ) from None
    except KafkaException as exc:
        raise _failure(exc, token_sent=bool(token)) from None


def _failure(error: KafkaException, token_sent: bool) -> CommandFailed:
    hint = None
    if error.status == 401:
        hint = (
            "hint: HTTP 401 Unauthorized: the coordinator does not know the token given"
            if token_sent
            else f"hint: HTTP 401 Unauthorized: pass an admin token with --token or ${TOKEN_ENV}"
        )
    elif error.status == 403:
        hint = (
            "hint: HTTP 403 Forbidden: the token's principal may not do this; "
            "these commands need the admin role"
        )
    return CommandFailed(f"{error.code}: {error.detail}", hint)


def _run(args: argparse.Namespace) -> int:
    try:
        answer = _send(args, args.call(args))
        if args.json:
            print(orjson.dumps(answer).decode())
            return 0
        try:
            text = args.render(answer, args)
        except (ValueError, KeyError, TypeError):
            raise CommandFailed("the answer is not the coordinator's: is --url right?") from None
        print(text)
    except CommandFailed as failure:
        print(f"error: {failure.message}", file=sys.stderr)
        if failure.hint:
            print(failure.hint, file=sys.stderr)
        return 1
    return 0


# -- the parser ------------------------------------------------------------------------------------


def _subcommands(
    command: argparse.ArgumentParser,
) -> Callable[[str, str], argparse.ArgumentParser]:
    """Give `command` the connection options and subcommands; returns the function that adds a
    subcommand (name, summary) taking the connection options after it too."""
    _connection_options(command, here=True)
    subcommands = command.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")

    def add(name: str, summary: str) -> argparse.ArgumentParser:
        parser = subcommands.add_parser(name, help=summary, description=summary)
        _connection_options(parser, here=False)
        return parser

    return add


def _connection_options(parser: argparse.ArgumentParser, here: bool) -> None:
    """`--url`, `--token`, `--json`, `--timeout` go before or after the subcommand. After it, they
    default to SUPPRESS so that leaving them out there keeps what was given before it."""

    def default(value: object) -> object:
        return value if here else argparse.SUPPRESS

    parser.add_argument(
        "--url",
        default=default(None),
        help=f"the coordinator's base URL (default: ${URL_ENV}, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--token",
        default=default(None),
        help=f"bearer token of a principal with the admin role, needed when the service has a "
        f"tokens file (default: ${TOKEN_ENV}, which keeps it out of the process list)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print the API's JSON answer as it is, instead of a table",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=default(DEFAULT_TIMEOUT_S),
        metavar="SECONDS",
        help=f"give up on an answer after this long (default: {DEFAULT_TIMEOUT_S:g})",
    )


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


Request = Callable[[argparse.Namespace], Call]
Render = Callable[[Any, argparse.Namespace], str]


def add_transactions_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `coordinator transactions` and its subcommands."""
    group = commands.add_parser(
        "transactions",
        help="list, describe and abort transactions on a running coordinator (over HTTP)",
        description="Inspect and abort transactions on a running coordinator, like Kafka's "
        "kafka-transactions.sh. Prints aligned tables, or the API's JSON with --json. Exits 1 "
        "with 'error: CODE: detail' on stderr when the coordinator refuses or cannot be reached. "
        "The connection options go before or after the subcommand.",
    )
    subcommand = _subcommands(group)

    def add(name: str, summary: str, call: Request, render: Render) -> argparse.ArgumentParser:
        parser = subcommand(name, summary)
        parser.set_defaults(run=_run, call=call, render=render)
        return parser

    listing = add(
        "list",
        "list transactions, ordered by transactional id",
        _list_call,
        _list_render,
    )
    listing.add_argument(
        "--state",
        choices=STATES,
        metavar="STATE",
        help=f"only transactions in this state: {', '.join(STATES)}",
    )
    listing.add_argument(
        "--prefix", metavar="P", help="only transactional ids that start with P (literally)"
    )
    listing.add_argument(
        "--older-than-ms",
        type=_non_negative_int,
        metavar="N",
        help="only transactions that started at least N ms ago (so only open ones)",
    )

    describe = add(
        "describe",
        "describe one transactional id: producer, epoch, state, partitions, pending groups",
        _describe_call,
        _describe_render,
    )
    describe.add_argument(
        "--transactional-id", required=True, metavar="TID", help="the transactional id"
    )

    producers = add(
        "describe-producers",
        "the producers with state on one partition: epoch, last sequence and timestamp, and "
        "the first offset of their open transaction",
        _producers_call,
        _producers_render,
    )
    producers.add_argument("--topic", required=True, metavar="T", help="the topic")
    producers.add_argument(
        "--partition", required=True, type=_non_negative_int, metavar="P", help="the partition"
    )

    abort = add(
        "abort",
        "abort the open transaction of a transactional id and fence its producer: its epoch is "
        "raised, so its next call gets PRODUCER_FENCED",
        _abort_call,
        _abort_render,
    )
    abort.add_argument(
        "--transactional-id", required=True, metavar="TID", help="the transactional id"
    )

    hanging = add(
        "find-hanging",
        "find transactions open for longer than any should be, and partitions whose last stable "
        "offset is held by a producer with no open transaction",
        _hanging_call,
        _hanging_render,
    )
    hanging.add_argument(
        "--max-transaction-timeout-ms",
        type=_non_negative_int,
        default=900_000,
        metavar="N",
        help="a transaction open longer than this is hanging; use the service's "
        "COORDINATOR_TRANSACTION_MAX_TIMEOUT_MS (default: 900000)",
    )
