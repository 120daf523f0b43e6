"""The `coordinator` command: serve, migrate, and the admin commands over HTTP.

coordinator serve [--host 127.0.0.1] [--port 8080] [--kafka-listener HOST:PORT]
          [--advertised-listener HOST:PORT] [--node-id N] [--rack R]
          [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]
                                                     run the service (migrates the store first),
                                                     with Kafka's protocol too (kafka/), over TLS
coordinator scram set|delete|list                    SASL/SCRAM credentials of the Kafka
                                                     listener, like kafka-configs.sh --entity-type
                                                     users (admin/scram_cli.py)
coordinator migrate                                  bring the store's schema to the newest version
coordinator transactions list|describe|...           inspect and abort transactions over HTTP,
                                                     like kafka-transactions.sh (admin/cli.py)
coordinator groups list|describe|delete|reset-offsets  consumer groups over HTTP, like
                                                     kafka-consumer-groups.sh (admin/groups_cli.py)
coordinator topics list|describe|create|delete|alter-configs|delete-records  topics over HTTP,
                                                     like kafka-topics.sh, kafka-configs.sh and
                                                     kafka-delete-records.sh (admin/topics_cli.py)
coordinator demo [--events N] [--master M] ...       the main job end to end: payments settled
                                                     by Spark exactly once (jobs/demo/, pyspark)

Commands beyond the service's own (the demo) come from the installed distributions' entry points
in the group `coordinator.commands`, each a function that adds its subparser: the jobs run on the
coordinator, and the coordinator imports none of them.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import ssl
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

try:
    from coordinator.admin.cli import add_transactions_parser
    from coordinator.admin.groups_cli import add_groups_parser
    from coordinator.admin.scram_cli import add_scram_parser
    from coordinator.admin.topics_cli import add_topics_parser
    from coordinator.core.settings import ConfigurationError, Settings, load_settings
except ModuleNotFoundError as missing:  # the SDK's install alone: no server to run
    raise SystemExit(
        f"coordinator: the server is not installed ({missing.name} is missing); install it with "
        "pip install 'txn-coordinator[server]'"
    ) from None

# The entry-point group of the commands other distributions add (pyproject.toml: the demo).
COMMANDS = "coordinator.commands"


def _settings(args: argparse.Namespace) -> Settings:
    if getattr(args, "database_url", None):
        return load_settings(database_url=args.database_url)
    return load_settings()


def _migrate(args: argparse.Namespace) -> int:
    from coordinator.core.migrate import upgrade_to_head

    settings = _settings(args)
    upgrade_to_head(settings.database_url)
    print(f"store at head: {_redact(settings.database_url)}", file=sys.stderr)
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from coordinator.app import create_app
    from coordinator.core.limits import BoundedHttpToolsProtocol
    from coordinator.core.migrate import upgrade_to_head

    # --log-level governs the service's own loggers (coordinator.*), not only uvicorn's; in
    # worker processes too, which read it from the environment.
    logging.getLogger("coordinator").setLevel(args.log_level.upper())
    os.environ["COORDINATOR_LOG_LEVEL"] = args.log_level
    settings = _settings(args)
    if args.kafka_listener is not None:
        settings = settings.model_copy(update={"kafka_listener": args.kafka_listener or None})
    broker = {
        name: getattr(args, name)
        for name in ("kafka_advertised_listener", "kafka_node_id", "kafka_broker_rack")
        if getattr(args, name) is not None
    }
    settings = settings.model_copy(update=broker)
    tls = {
        name: getattr(args, arg)
        for name, arg in (
            ("tls_cert_file", "tls_cert"),
            ("tls_key_file", "tls_key"),
            ("tls_client_ca_file", "tls_client_ca"),
        )
        if getattr(args, arg) is not None
    }
    settings = settings.model_copy(update=tls)
    if (settings.tls_cert_file is None) != (settings.tls_key_file is None):
        print("TLS needs both a certificate and its key (--tls-cert, --tls-key)", file=sys.stderr)
        return 2
    if settings.tls_client_ca_file is not None and settings.tls_cert_file is None:
        print("--tls-client-ca needs --tls-cert and --tls-key", file=sys.stderr)
        return 2
    hosts = [args.host]
    if settings.kafka_listener is not None:
        hosts.append(settings.kafka_listener.rpartition(":")[0].strip("[]"))
    for host in hosts:
        if settings.auth_tokens_file is None and not _is_loopback(host) and not args.insecure:
            print(
                f"refusing to listen on {host} without authentication: set "
                "COORDINATOR_AUTH_TOKENS_FILE, or pass --insecure to serve the network "
                "unauthenticated",
                file=sys.stderr,
            )
            return 2
    upgrade_to_head(settings.database_url)
    common = {
        "host": args.host,
        "port": args.port,
        "log_level": args.log_level,
        "access_log": args.access_log,
        "timeout_graceful_shutdown": 5,
        # httptools with a cap on the header block (coordinator.core.limits).
        "http": BoundedHttpToolsProtocol,
    }
    if settings.tls_cert_file is not None:
        common |= {
            "ssl_certfile": str(settings.tls_cert_file),
            "ssl_keyfile": str(settings.tls_key_file),
        }
        if settings.tls_client_ca_file is not None:
            common |= {
                "ssl_ca_certs": str(settings.tls_client_ca_file),
                "ssl_cert_reqs": ssl.CERT_REQUIRED,
            }
    if args.workers == 1:
        uvicorn.run(create_app(settings), **common)
        return 0
    # Worker processes build their own app from the environment: hand them the chosen store
    # and listener. Correct because all state is in the store (row locks, SKIP LOCKED sweeps).
    os.environ["COORDINATOR_DATABASE_URL"] = settings.database_url
    if settings.kafka_listener is not None:
        os.environ["COORDINATOR_KAFKA_LISTENER"] = settings.kafka_listener
    for name in (
        "tls_cert_file",
        "tls_key_file",
        "tls_client_ca_file",
        "kafka_advertised_listener",
        "kafka_node_id",
        "kafka_broker_rack",
    ):
        value = getattr(settings, name)
        if value is not None:
            os.environ[f"COORDINATOR_{name.upper()}"] = str(value)
    uvicorn.run("coordinator.app:create_app", factory=True, workers=args.workers, **common)
    return 0


def _listener(value: str) -> str:
    try:
        checked = Settings._host_port(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return checked or value


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _redact(url: str) -> str:
    scheme, _, rest = url.partition("://")
    if "@" in rest:
        credentials, _, host = rest.rpartition("@")
        user = credentials.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in credentials else url
    return url


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="coordinator",
        description="Exactly-once transaction coordinator: Kafka's idempotent producers and "
        "transactions over HTTP, on Postgres or an embedded SQLite file.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    database_help = (
        "the store (default: $COORDINATOR_DATABASE_URL, else coordinator.db in the working "
        "directory); a plain postgresql:// or sqlite:/// URL"
    )
    serve = commands.add_parser("serve", help="run the service; migrates the store first")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on (8080)")
    serve.add_argument("--database-url", help=database_help)
    serve.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("COORDINATOR_WORKERS", "1")),
        help="service processes sharing the port and the store ($COORDINATOR_WORKERS, else 1)",
    )
    serve.add_argument(
        "--kafka-listener",
        metavar="HOST:PORT",
        type=_listener,
        help="also speak Kafka's wire protocol there, in every worker "
        "($COORDINATOR_KAFKA_LISTENER; default off)",
    )
    serve.add_argument(
        "--advertised-listener",
        dest="kafka_advertised_listener",
        metavar="HOST:PORT",
        type=_listener,
        help="the address Kafka clients are told to reach this listener at, as Kafka's "
        "advertised.listeners ($COORDINATOR_KAFKA_ADVERTISED_LISTENER; default: the address "
        "each client reached); needed when several processes serve one store as a cluster",
    )
    serve.add_argument(
        "--node-id",
        dest="kafka_node_id",
        metavar="N",
        type=int,
        help="this listener's broker id in the store's cluster, as Kafka's node.id "
        "($COORDINATOR_KAFKA_NODE_ID; default: the id its address had, else the lowest free)",
    )
    serve.add_argument(
        "--rack",
        dest="kafka_broker_rack",
        metavar="RACK",
        help="this broker's rack, as Kafka's broker.rack ($COORDINATOR_KAFKA_BROKER_RACK)",
    )
    serve.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="serve HTTPS and Kafka over TLS with this certificate chain "
        "($COORDINATOR_TLS_CERT_FILE; default: plain TCP)",
    )
    serve.add_argument(
        "--tls-key", metavar="PEM", help="the certificate's private key ($COORDINATOR_TLS_KEY_FILE)"
    )
    serve.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help="require client certificates signed by this CA, through both doors (mTLS; "
        "$COORDINATOR_TLS_CLIENT_CA_FILE)",
    )
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --host or --kafka-listener without a tokens file (no "
        "authentication at all)",
    )
    serve.add_argument(
        "--log-level",
        default=os.environ.get("COORDINATOR_LOG_LEVEL", "info"),
        choices=["critical", "error", "warning", "info", "debug"],
        help="log level of the service and of uvicorn ($COORDINATOR_LOG_LEVEL, else info)",
    )
    serve.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="log every request (off)",
    )
    serve.set_defaults(run=_serve)

    migrate = commands.add_parser("migrate", help="bring the store's schema to the newest version")
    migrate.add_argument("--database-url", help=database_help)
    migrate.set_defaults(run=_migrate)

    add_transactions_parser(commands)
    add_scram_parser(commands)
    add_groups_parser(commands)
    add_topics_parser(commands)
    for command in sorted(entry_points(group=COMMANDS), key=lambda e: e.name):
        command.load()(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        result: int = args.run(args)
    except ConfigurationError as exc:
        print(f"coordinator: configuration error: {exc}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
