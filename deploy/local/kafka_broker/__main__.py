"""``python -m deploy.local.kafka_broker --data-dir DIR [--port 9092]``: run the embedded durable broker."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Sequence
from pathlib import Path

from deploy.local.kafka_broker.groups import GroupCoordinator
from deploy.local.kafka_broker.server import BrokerSettings, KafkaBroker
from deploy.local.kafka_broker.storage import BrokerStorage


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.local.kafka_broker",
        description="A one-node Kafka-protocol broker that keeps topics, records and committed offsets in files.",
    )
    parser.add_argument("--data-dir", type=Path, required=True, help="where topics, logs and offsets live")
    parser.add_argument("--host", default=BrokerSettings.host, help="address to listen on and advertise")
    parser.add_argument("--port", type=int, default=BrokerSettings.port)
    parser.add_argument(
        "--fsync",
        action="store_true",
        help="flush every write to the device before acknowledging it (survives the machine, not only the broker)",
    )
    parser.add_argument("--default-partitions", type=int, default=BrokerSettings.default_partitions)
    parser.add_argument("--no-auto-create", action="store_true", help="refuse topics that were not created first")
    parser.add_argument(
        "--initial-rebalance-delay-s",
        type=float,
        default=0.0,
        help="how long a new group waits for more members before its first assignment",
    )
    return parser


async def _serve(args: argparse.Namespace) -> None:
    settings = BrokerSettings(
        host=args.host,
        port=args.port,
        auto_create_topics=not args.no_auto_create,
        default_partitions=args.default_partitions,
    )
    storage = BrokerStorage(args.data_dir, fsync=args.fsync)
    broker = KafkaBroker(storage, GroupCoordinator(args.initial_rebalance_delay_s), settings)
    await broker.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await broker.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
