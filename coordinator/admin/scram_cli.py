"""`coordinator scram set|delete|list`: the SASL/SCRAM credentials of the Kafka listener, stored
salted in the store itself (like `kafka-configs.sh --alter --add-config 'SCRAM-SHA-256=[...]'
--entity-type users`). The password is read from standard input or a prompt, never from the
command line (it would be in the shell's history and the process list)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
from typing import Any

from coordinator.core import scram
from coordinator.core.settings import load_settings


def add_scram_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "scram", help="SASL/SCRAM credentials for the Kafka listener (salted, in the store)"
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    database = "the store (default: $COORDINATOR_DATABASE_URL, else coordinator.db here)"

    put = verbs.add_parser(
        "set", help="set (or replace) a principal's credential; the password from stdin"
    )
    put.add_argument("principal", help="the principal, as the tokens file names it")
    put.add_argument("--mechanism", choices=scram.MECHANISMS, default="SCRAM-SHA-512")
    put.add_argument(
        "--iterations",
        type=int,
        default=scram.DEFAULT_ITERATIONS,
        help=f"PBKDF2 iterations (at least {scram.MIN_ITERATIONS})",
    )
    put.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from standard input (else a prompt)",
    )
    put.add_argument("--database-url", help=database)
    put.set_defaults(run=_set)

    remove = verbs.add_parser("delete", help="delete a principal's credential")
    remove.add_argument("principal")
    remove.add_argument("--mechanism", choices=scram.MECHANISMS, required=True)
    remove.add_argument("--database-url", help=database)
    remove.set_defaults(run=_delete)

    listing = verbs.add_parser("list", help="principals with credentials (never the keys)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument("--database-url", help=database)
    listing.set_defaults(run=_list)


def _database(args: argparse.Namespace) -> Any:
    from coordinator.core.migrate import upgrade_to_head
    from coordinator.store.engines import open_store

    settings = (
        load_settings(database_url=args.database_url) if args.database_url else load_settings()
    )
    upgrade_to_head(settings.database_url)
    return open_store(settings)


async def _with_db(args: argparse.Namespace, work: Any) -> Any:
    db = _database(args)
    try:
        return await work(db)
    finally:
        await db.dispose()


def _set(args: argparse.Namespace) -> int:
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass(f"password for {args.principal}: ")
    try:
        asyncio.run(
            _with_db(
                args,
                lambda db: scram.set_credential(
                    db, args.principal, args.mechanism, password, args.iterations
                ),
            )
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.mechanism} credential set for {args.principal}", file=sys.stderr)
    return 0


def _delete(args: argparse.Namespace) -> int:
    deleted = asyncio.run(
        _with_db(args, lambda db: scram.delete_credential(db, args.principal, args.mechanism))
    )
    if not deleted:
        print(f"error: {args.principal} has no {args.mechanism} credential", file=sys.stderr)
        return 1
    print(f"{args.mechanism} credential of {args.principal} deleted", file=sys.stderr)
    return 0


def _list(args: argparse.Namespace) -> int:
    listed = asyncio.run(_with_db(args, scram.list_credentials))
    if args.json:
        print(json.dumps([vars(c) for c in listed]))
        return 0
    print(f"{'PRINCIPAL':<32} {'MECHANISM':<14} ITERATIONS")
    for c in listed:
        print(f"{c.principal:<32} {c.mechanism:<14} {c.iterations}")
    return 0
