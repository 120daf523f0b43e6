"""`coordinator topics ...`: topics over HTTP, like Kafka's `kafka-topics.sh` (list, describe,
create, delete), `kafka-configs.sh` (alter-configs) and `kafka-delete-records.sh`
(delete-records).

Tables for people, `--json` for scripts (the API's answer; `describe` joins the topic's
partitions and configs in one object); failures are `error: ...` on stderr and exit status 1, as
in `coordinator transactions` (whose HTTP and table helpers this reuses).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from coordinator.admin.cli import (
    Call,
    CommandFailed,
    _run,
    _send,
    _subcommands,
    _table,
)


def _config(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, not {text!r}")
    return name, value


def _configs(text: str) -> list[tuple[str, str]]:
    """`k=v,k2=v2`, as kafka-configs.sh --add-config takes them (no value holds a comma:
    cleanup.policy's `compact,delete` is written `[compact,delete]`, as there)."""
    pairs: list[tuple[str, str]] = []
    depth = 0
    current = ""
    for char in text:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            pairs.append(_config(current))
            current = ""
        else:
            current += char
    pairs.append(_config(current))
    return [(name, value.strip("[]")) for name, value in pairs]


def _partition_offset(text: str) -> tuple[int, int]:
    partition, sep, offset = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(partition), int(offset)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected PARTITION:OFFSET (offset -1: the high watermark), not {text!r}"
        ) from None


def _fail(failure: CommandFailed) -> int:
    print(f"error: {failure.message}", file=sys.stderr)
    if failure.hint:
        print(failure.hint, file=sys.stderr)
    return 1


# -- list, describe -------------------------------------------------------------------------------


def _list_call(args: argparse.Namespace) -> Call:
    return Call("GET", ("topics",))


def _list_render(answer: Any, args: argparse.Namespace) -> str:
    return _table(["TOPIC", "PARTITIONS"], [[t["name"], t["partitions"]] for t in answer["topics"]])


def _describe(args: argparse.Namespace) -> int:
    try:
        topic = _send(args, Call("GET", ("topics", args.topic)))
        configs = _send(args, Call("GET", ("topics", args.topic, "configs")))
    except CommandFailed as failure:
        return _fail(failure)
    if args.json:
        print(json.dumps({**topic, **configs}))
        return 0
    set_here = ",".join(
        f"{c['name']}={c['value']}" for c in configs["configs"] if c["source"] == "TOPIC"
    )
    print(
        f"Topic: {topic['name']}\tPartitionCount: {len(topic['partitions'])}\tConfigs: {set_here}"
    )
    print(
        _table(
            ["PARTITION", "LOG-START-OFFSET", "HIGH-WATERMARK", "LAST-STABLE-OFFSET"],
            [
                [
                    p["partition"],
                    p["log_start_offset"],
                    p["high_watermark"],
                    p["last_stable_offset"],
                ]
                for p in topic["partitions"]
            ],
        )
    )
    print()
    print(
        _table(
            ["CONFIG", "VALUE", "SOURCE"],
            [[c["name"], c["value"], c["source"]] for c in configs["configs"]],
        )
    )
    return 0


# -- create, delete -------------------------------------------------------------------------------


def _create_call(args: argparse.Namespace) -> Call:
    body: dict[str, Any] = {"name": args.topic, "partitions": args.partitions}
    if args.config:
        body["configs"] = dict(args.config)
    return Call("POST", ("topics",), body=body)


def _create_render(answer: Any, args: argparse.Namespace) -> str:
    return f"Created topic {answer['name']} with {answer['partitions']} partition(s)."


def _delete(args: argparse.Namespace) -> int:
    if not args.execute:
        print(
            f"(dry run: topic {args.topic!r} and all its records, producer state and group "
            "offsets would be deleted, and open transactions that include it aborted; pass "
            "--execute to delete it)",
            file=sys.stderr,
        )
        return 0
    try:
        answer = _send(args, Call("DELETE", ("topics", args.topic)))
    except CommandFailed as failure:
        return _fail(failure)
    print(json.dumps(answer) if args.json else f"Deleted topic {answer['name']}.")
    return 0


# -- alter-configs, delete-records ----------------------------------------------------------------


def _alter_call(args: argparse.Namespace) -> Call:
    body: dict[str, Any] = {}
    if args.add_config:
        body["set"] = dict(pair for pairs in args.add_config for pair in pairs)
    if args.delete_config:
        body["delete"] = [n.strip() for names in args.delete_config for n in names.split(",")]
    if not body:
        raise CommandFailed("nothing to change: give --add-config and/or --delete-config")
    return Call("PATCH", ("topics", args.topic, "configs"), body=body)


def _configs_render(answer: Any, args: argparse.Namespace) -> str:
    return _table(
        ["CONFIG", "VALUE", "SOURCE"],
        [[c["name"], c["value"], c["source"]] for c in answer["configs"]],
    )


def _delete_records_call(args: argparse.Namespace) -> Call:
    body = {"partitions": [{"partition": p, "offset": o} for p, o in args.offset]}
    return Call("POST", ("topics", args.topic, "delete-records"), body=body)


def _delete_records_render(answer: Any, args: argparse.Namespace) -> str:
    return _table(
        ["TOPIC", "PARTITION", "LOW-WATERMARK"],
        [[args.topic, p["partition"], p["log_start_offset"]] for p in answer["partitions"]],
    )


def _run_checked(args: argparse.Namespace) -> int:
    """`_run`, with a request that cannot be built reported like a refusal."""
    try:
        args.call(args)
    except CommandFailed as failure:
        return _fail(failure)
    return _run(args)


# -- the parser -----------------------------------------------------------------------------------


def add_topics_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `coordinator topics` and its subcommands."""
    topics = commands.add_parser(
        "topics",
        help="list, describe, create, delete topics, alter their configs, delete records "
        "(over HTTP)",
        description="Topics on a running coordinator, like Kafka's kafka-topics.sh, "
        "kafka-configs.sh and kafka-delete-records.sh. Prints aligned tables, or the API's JSON "
        "with --json. Exits 1 with 'error: CODE: detail' on stderr when the coordinator refuses "
        "or cannot be reached. The connection options go before or after the subcommand. "
        "Creating, deleting, altering configs and deleting records need the admin role.",
    )
    add = _subcommands(topics)

    add("list", "list the topics and their partition counts").set_defaults(
        run=_run, call=_list_call, render=_list_render
    )

    describe = add(
        "describe",
        "describe a topic: each partition's log start offset, high watermark and LSO, and "
        "every config with its source (TOPIC: set on it; DEFAULT)",
    )
    describe.add_argument("--topic", required=True, metavar="TOPIC")
    describe.set_defaults(run=_describe)

    create = add("create", "create a topic")
    create.add_argument("--topic", required=True, metavar="TOPIC")
    create.add_argument("--partitions", type=int, default=1, metavar="N", help="(default 1)")
    create.add_argument(
        "--config",
        action="append",
        type=_config,
        metavar="NAME=VALUE",
        help="a topic config, e.g. retention.ms=86400000 or cleanup.policy=compact (repeat)",
    )
    create.set_defaults(run=_run, call=_create_call, render=_create_render)

    delete = add(
        "delete",
        "delete a topic with its records, producer state and group offsets, aborting open "
        "transactions that include it (a dry run unless --execute)",
    )
    delete.add_argument("--topic", required=True, metavar="TOPIC")
    delete.add_argument("--execute", action="store_true", help="really delete it")
    delete.set_defaults(run=_delete)

    alter = add(
        "alter-configs",
        "set configs on a topic and/or put configs back to their defaults, all or nothing",
    )
    alter.add_argument("--topic", required=True, metavar="TOPIC")
    alter.add_argument(
        "--add-config",
        action="append",
        type=_configs,
        metavar="K=V[,K=V...]",
        help="configs to set; a value with a comma in brackets: cleanup.policy=[compact,delete]",
    )
    alter.add_argument(
        "--delete-config",
        action="append",
        metavar="K[,K...]",
        help="configs to put back to their defaults",
    )
    alter.set_defaults(run=_run_checked, call=_alter_call, render=_configs_render)

    records = add(
        "delete-records",
        "move partitions' log start offsets up to the offsets given, deleting the records "
        "below (never down; -1: the high watermark)",
    )
    records.add_argument("--topic", required=True, metavar="TOPIC")
    records.add_argument(
        "--offset",
        action="append",
        required=True,
        type=_partition_offset,
        metavar="PARTITION:OFFSET",
        help="a partition and the offset to delete up to (repeat)",
    )
    records.set_defaults(run=_run, call=_delete_records_call, render=_delete_records_render)
