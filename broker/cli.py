"""The `spool` command line."""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import gc
import importlib
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from broker import logging as spool_logging
from broker.config import BrokerConfig, load_static
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.broker import Broker

log = structlog.get_logger("spool.cli")

# How long `spool serve` may take to exit once the broker has stopped.
EXIT_GRACE_S = 10.0


def _endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def apply_listen_shorthands(
    static: dict[str, Any],
    listen: tuple[str, int] | None,
    advertise: tuple[str, int] | None,
) -> None:
    """`--listen` / `--advertise` as the `listeners` / `advertised.listeners` of one
    PLAINTEXT listener; refused beside those keys, which they would silently override."""
    from broker.listeners import endpoint_text

    for flag, value, key in (
        ("--listen", listen, "listeners"),
        ("--advertise", advertise, "advertised.listeners"),
    ):
        if value is None:
            continue
        if key in static:
            raise KafkaError(
                ErrorCode.invalid_config,
                f"{flag} is short for {key}=PLAINTEXT://HOST:PORT, and {key} is also set "
                f"(to {static[key]!r}): use one or the other",
            )
        static[key] = endpoint_text(*value)


def apply_node_id(static: dict[str, Any], node_id: int | None) -> None:
    """`--node-id N` as `node.id`; refused beside that key, which it would override."""
    if node_id is None:
        return
    if "node.id" in static:
        raise KafkaError(
            ErrorCode.invalid_config,
            f"--node-id is short for node.id, and node.id is also set (to "
            f"{static['node.id']!r}): use one or the other",
        )
    static["node.id"] = node_id


# The tools beside `serve`: each module has `register(subparsers)`, which adds its
# subcommand(s) with `set_defaults(run=...)`; `run(args) -> int` is the exit code. A module
# imports what is heavy (the admin client, pyspark) inside `run`, so `spool --help` and
# `spool serve` stay fast.
TOOL_MODULES: tuple[str, ...] = (
    "broker.tools.share_groups",
    "broker.tools.consumer_groups",
    "broker.tools.topics",
    "broker.tools.cluster",
    "broker.tools.configs",
    "broker.tools.acls",
    "broker.tools.users",
    "broker.tools.storage",
    "broker.tools.migrate",
    "broker.tools.transactions",
    "persister.spark.audit",
    "persister.spark.compact",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spool", description="A Kafka broker for queues.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run a broker")
    serve.add_argument(
        "--listen",
        type=_endpoint,
        default=None,
        metavar="HOST:PORT",
        help="one PLAINTEXT listener on this address, short for "
        "--set listeners=PLAINTEXT://HOST:PORT (default 127.0.0.1:9092)",
    )
    serve.add_argument(
        "--advertise",
        type=_endpoint,
        default=None,
        metavar="HOST:PORT",
        help="address given to clients in metadata, short for "
        "--set advertised.listeners=PLAINTEXT://HOST:PORT (default: the listen address)",
    )
    serve.add_argument(
        "--node-id",
        type=int,
        default=None,
        metavar="N",
        help="this broker's id, unique among the brokers of one storage database; short "
        "for --set node.id=N (default 1)",
    )
    serve.add_argument(
        "--data-dir",
        type=Path,
        default=Path("data"),
        help="where logs and state live (default ./data)",
    )
    serve.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help="make the logs durable in PostgreSQL (postgresql://user@host:port/db), the "
        "data dir being a cache; short for --set storage=URL (default: the data dir's files)",
    )
    serve.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="TOML file of Kafka-style config keys",
    )
    serve.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config key, e.g. --set num.partitions=3 (repeatable, wins over all)",
    )
    serve.add_argument(
        "--metrics",
        type=_endpoint,
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus /metrics and /health on this address (default: off)",
    )
    serve.add_argument("--log-format", choices=["console", "json"], default="console")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    serve.set_defaults(run=serve_command)
    for name in TOOL_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.run(args)
    return result


def serve_command(args: argparse.Namespace) -> int:
    spool_logging.configure(args.log_format, args.log_level)
    return serve(args)


def serve(args: argparse.Namespace) -> int:
    from broker.authorizer import Authorizer
    from broker.broker import Broker
    from broker.listeners import inter_broker_client, listeners_from_config
    from broker.server import ServerLimits, raise_open_file_limit
    from coordinator.acls import AclSet

    try:
        static = load_static(args.config, args.set)
        apply_listen_shorthands(static, args.listen, args.advertise)
        apply_node_id(static, args.node_id)
        if args.storage is not None:
            static["storage"] = args.storage
        config = BrokerConfig(static)
        storage = storage_engine(config)
        ServerLimits.from_config(config)  # settings that must agree, checked up front
        Authorizer.from_config(config, AclSet)  # the class name and super.users
        listeners = listeners_from_config(config)
        for listener in listeners:
            if listener.tls is not None:
                listener.tls.context()  # key and trust stores load, or say why not
        # Brokers sharing a database reach each other on the inter-broker listener,
        # with its TLS and SASL settings: they must be complete and load.
        inter_broker_client(config, listeners, bool(config.get("storage"))).check()
    except (KafkaError, OSError, ValueError) as exc:
        print(f"spool: {exc}", file=sys.stderr)
        return 2
    raise_open_file_limit()
    broker = Broker(config, args.data_dir, storage=storage)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # Up before the broker starts, so /health says "starting" while it loads.
        metrics = _start_metrics(args.metrics, broker, loop)
        broker.on_fatal = stop.set  # fenced: another broker took its node id
        try:
            await broker.start()
            # What startup made (modules, the Kafka schemas' classes, recovered state)
            # lives as long as the process: out of the collector's reach, a full
            # collection does not stop the loop to walk it all again (such pauses were
            # the share path's worst latencies, 50-75 ms each).
            gc.freeze()
            # The schema classes of the versions no request has used yet load between
            # requests now; then they too leave the collector's reach.
            warming = asyncio.create_task(_warm_up(broker))
            await stop.wait()
            warming.cancel()
            log.info("shutdown_requested")
            await broker.stop()
            # The process ends once the loop closes. Should a thread or a task keep it
            # (a bounded exit above all), every thread's stack goes to stderr and it
            # exits with 1 after EXIT_GRACE_S.
            faulthandler.dump_traceback_later(EXIT_GRACE_S, exit=True)
        finally:
            if metrics is not None:
                metrics.stop()

    try:
        import uvloop

        uvloop.run(run())
    except OSError as exc:
        log.error("startup_failed", error=str(exc))
        return 1
    if broker.fatal is not None:
        log.error("stopped_fenced", reason=broker.fatal)
        return 1
    return 0


def storage_engine(config: BrokerConfig) -> Any:
    """The storage engine the `storage` key names: the data dir's files when unset,
    PostgreSQL for a postgresql:// URL (its password from the URL, the file
    `storage.password.file` names, or PGPASSWORD)."""
    from persister.storage import FILE_STORAGE

    url = config.get("storage")
    if not url:
        return FILE_STORAGE
    from persister.pg_storage import PgStorage

    password = None
    password_file = config.get("storage.password.file")
    if password_file:
        try:
            lines = Path(password_file).read_text().splitlines()
        except OSError as exc:
            raise KafkaError(
                ErrorCode.invalid_config,
                f"storage.password.file {password_file}: cannot read it ({exc.strerror})",
            ) from exc
        password = lines[0] if lines else ""
    return PgStorage(str(url), password=password)


async def _warm_up(broker: Any) -> None:
    try:
        await broker.warm_up()
    except Exception as exc:  # each request still loads its own version's classes
        log.warning("schema_warm_up_failed", error=str(exc))
        return
    gc.freeze()


def _start_metrics(
    address: tuple[str, int] | None, broker: Broker, loop: asyncio.AbstractEventLoop
) -> Any:
    if address is None:
        return None
    from broker.metrics import MetricsServer

    server = MetricsServer(*address, broker)
    server.start(loop)
    return server


if __name__ == "__main__":
    sys.exit(main())
