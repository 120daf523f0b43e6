"""`coordinator groups ...`: consumer groups over HTTP, like Kafka's `kafka-consumer-groups.sh`
(its column names too): list, describe (offsets and lag, members, state), delete, reset-offsets.

Tables for people, `--json` for scripts; failures are `error: ...` on stderr and exit status 1,
as in `coordinator transactions` (whose HTTP and table helpers this reuses).
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

STATES = ("Empty", "Assigning", "Reconciling", "Stable")


# -- list ------------------------------------------------------------------------------------------


def _list_call(args: argparse.Namespace) -> Call:
    return Call("GET", ("groups",))


def _list_render(answer: Any, args: argparse.Namespace) -> str:
    groups = [g for g in answer["groups"] if args.state is None or g["state"] in args.state]
    return _table(
        ["GROUP", "TYPE", "STATE", "MEMBERS"],
        [[g["group_id"], g.get("type"), g["state"], g["members"]] for g in groups],
    )


# -- describe --------------------------------------------------------------------------------------


def _describe_call(args: argparse.Namespace) -> Call:
    return Call("GET", ("groups", args.group))


def _describe_render(answer: Any, args: argparse.Namespace) -> str:
    group = answer["group_id"]
    if args.state:
        return _table(
            ["GROUP", "TYPE", "STATE", "GROUP-EPOCH", "#MEMBERS"],
            [
                [
                    group,
                    answer["type"],
                    answer["state"],
                    answer["group_epoch"],
                    len(answer["members"]),
                ]
            ],
        )
    members = answer["members"]
    if args.members:
        return _table(
            ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "EPOCH", "#PARTITIONS", "ASSIGNMENT"],
            [
                [
                    group,
                    m["member_id"],
                    m.get("client_host"),
                    m["client_id"],
                    m["member_epoch"],
                    len(m["assignment"]),
                    ",".join(f"{p['topic']}-{p['partition']}" for p in m["assignment"]),
                ]
                for m in members
            ],
        )
    by_member = {m["member_id"]: m for m in members}
    rows: dict[tuple[str, int], list[object]] = {}
    for o in answer["offsets"]:
        owner = by_member.get(o.get("member_id") or "")
        rows[(o["topic"], o["partition"])] = [
            group,
            o["topic"],
            o["partition"],
            o["offset"],
            o["high_watermark"],
            o["lag"],
            *_owner_columns(owner),
        ]
    for m in members:
        for p in m["assignment"]:
            rows.setdefault(
                (p["topic"], p["partition"]),
                [group, p["topic"], p["partition"], None, None, None, *_owner_columns(m)],
            )
    table = _table(
        [
            "GROUP",
            "TOPIC",
            "PARTITION",
            "CURRENT-OFFSET",
            "LOG-END-OFFSET",
            "LAG",
            "CONSUMER-ID",
            "HOST",
            "CLIENT-ID",
        ],
        [rows[key] for key in sorted(rows)],
    )
    if not members:
        return f"Consumer group '{group}' has no active members.\n\n{table}"
    return table


def _owner_columns(member: dict[str, Any] | None) -> list[object]:
    if member is None:
        return [None, None, None]
    return [member["member_id"], member.get("client_host"), member["client_id"]]


# -- delete ----------------------------------------------------------------------------------------


def _delete(args: argparse.Namespace) -> int:
    failed = 0
    for group in args.group:
        try:
            _send(args, Call("DELETE", ("groups", group)))
        except CommandFailed as failure:
            failed += 1
            print(f"error: {group}: {failure.message}", file=sys.stderr)
            if failure.hint:
                print(failure.hint, file=sys.stderr)
            continue
        if not args.json:
            print(f"Deletion of requested consumer group ('{group}') was successful.")
    if args.json:
        print(json.dumps({"deleted": len(args.group) - failed}))
    return 1 if failed else 0


# -- reset-offsets ---------------------------------------------------------------------------------


def _topic_partitions(text: str) -> tuple[str, list[int] | None]:
    """`topic` or `topic:0,1,2`, as kafka-consumer-groups.sh takes them."""
    topic, _, numbers = text.partition(":")
    if not topic:
        raise argparse.ArgumentTypeError(f"expected TOPIC or TOPIC:P,P..., not {text!r}")
    if not numbers:
        return topic, None
    try:
        return topic, sorted({int(n) for n in numbers.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"partitions must be numbers, in {text!r}") from None


def _reset_offsets(args: argparse.Namespace) -> int:
    try:
        plan = _plan_reset(args)
        if args.execute and plan:
            body = {"offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in plan]}
            _send(args, Call("POST", ("groups", args.group, "offsets"), body=body))
    except CommandFailed as failure:
        print(f"error: {failure.message}", file=sys.stderr)
        if failure.hint:
            print(failure.hint, file=sys.stderr)
        return 1
    if args.json:
        print(
            json.dumps(
                {
                    "group_id": args.group,
                    "executed": bool(args.execute),
                    "offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in plan],
                }
            )
        )
    else:
        print(
            _table(
                ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
                [[args.group, t, p, o] for t, p, o in plan],
            )
        )
    if not args.execute:
        print(
            "(dry run: nothing was changed; pass --execute to reset the offsets)", file=sys.stderr
        )
    return 0


def _plan_reset(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """The new offset of every partition asked about, as kafka-consumer-groups.sh computes it:
    clamped between the partition's log start offset and its high watermark."""
    group = _group_state(args)
    if group is not None and group["members"]:
        raise CommandFailed(
            f"Assignments can only be reset if the group '{args.group}' is inactive, but the "
            f"current state is {group['state']} ({len(group['members'])} member(s)).",
            "hint: stop its consumers (or wait for their session timeout) first",
        )
    current = {
        (o["topic"], o["partition"]): o["offset"]
        for o in _send(args, Call("GET", ("groups", args.group, "offsets")))["offsets"]
    }
    wanted: list[tuple[str, list[int] | None]] = (
        list(args.topic) if args.topic else [(t, None) for t in sorted({t for t, _ in current})]
    )
    plan: list[tuple[str, int, int]] = []
    for topic, partitions in wanted:
        described = _send(args, Call("GET", ("topics", topic)))
        bounds = {
            p["partition"]: (p["log_start_offset"], p["high_watermark"])
            for p in described["partitions"]
        }
        for partition in partitions if partitions is not None else sorted(bounds):
            if partition not in bounds:
                raise CommandFailed(f"{topic} has no partition {partition}")
            start, end = bounds[partition]
            if args.to_earliest:
                offset = start
            elif args.to_latest:
                offset = end
            elif args.to_offset is not None:
                offset = args.to_offset
            else:
                if (topic, partition) not in current:
                    raise CommandFailed(
                        f"cannot shift {topic}-{partition}: the group has no committed offset there"
                    )
                offset = current[(topic, partition)] + args.shift_by
            plan.append((topic, partition, min(max(offset, start), end)))
    return plan


def _group_state(args: argparse.Namespace) -> dict[str, Any] | None:
    try:
        group: dict[str, Any] = _send(args, Call("GET", ("groups", args.group)))
    except CommandFailed as failure:
        if failure.message.startswith("GROUP_ID_NOT_FOUND"):
            return None  # a new group: resetting creates its offsets
        raise
    return group


# -- the parser ------------------------------------------------------------------------------------


def add_groups_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `coordinator groups` and its subcommands."""
    groups = commands.add_parser(
        "groups",
        help="list, describe, delete consumer groups and reset their offsets (over HTTP)",
        description="Consumer groups on a running coordinator, like Kafka's "
        "kafka-consumer-groups.sh. Prints aligned tables, or the API's JSON with --json. Exits 1 "
        "with 'error: CODE: detail' on stderr when the coordinator refuses or cannot be reached. "
        "The connection options go before or after the subcommand.",
    )
    add = _subcommands(groups)

    listing = add("list", "list the groups: type, state and number of members")
    listing.add_argument(
        "--state",
        nargs="+",
        choices=STATES,
        metavar="STATE",
        help=f"only groups in these states: {', '.join(STATES)}",
    )
    listing.set_defaults(run=_run, call=_list_call, render=_list_render)

    describe = add(
        "describe",
        "describe a group: each partition's committed offset, log end offset, lag and owner "
        "(default), its members (--members), or its state (--state)",
    )
    describe.add_argument("--group", required=True, metavar="GROUP", help="the group id")
    shown = describe.add_mutually_exclusive_group()
    shown.add_argument("--members", action="store_true", help="the members and their partitions")
    shown.add_argument("--state", action="store_true", help="state, type, epoch, member count")
    describe.set_defaults(run=_run, call=_describe_call, render=_describe_render)

    delete = add(
        "delete",
        "delete groups with no members, with their committed offsets (admin role)",
    )
    delete.add_argument(
        "--group", required=True, action="append", metavar="GROUP", help="a group id (repeat)"
    )
    delete.set_defaults(run=_delete)

    reset = add(
        "reset-offsets",
        "compute new committed offsets for a group with no members, and with --execute set "
        "them (a dry run by default)",
    )
    reset.add_argument("--group", required=True, metavar="GROUP", help="the group id")
    scope = reset.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--topic",
        action="append",
        type=_topic_partitions,
        metavar="TOPIC[:P,P...]",
        help="a topic, or some of its partitions (repeat)",
    )
    scope.add_argument(
        "--all-topics", action="store_true", help="every topic the group has offsets for"
    )
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="to the log start offset")
    target.add_argument("--to-latest", action="store_true", help="to the high watermark")
    target.add_argument(
        "--to-offset", type=int, metavar="N", help="to offset N (kept within the log's bounds)"
    )
    target.add_argument(
        "--shift-by",
        type=int,
        metavar="N",
        help="by N from the committed offset (negative: back; kept within the log's bounds)",
    )
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="only show the new offsets (default)")
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    reset.set_defaults(run=_reset_offsets)
