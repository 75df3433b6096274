"""Send examples/request.json as one event to a broker's ``events`` and print its prediction.

    .venv/bin/python examples/stream_roundtrip.py BOOTSTRAP [--timeout 60]

For the stream consumer in the cluster (docs/streaming.md, "In the cluster"): BOOTSTRAP is the
in-cluster broker's pod address (``<pod IP>:9092``), which this machine, the node, reaches. The
prediction (or dead letter) is read with ``read_committed`` (committed transactions only), matched
by the event's key, a new one; exit status 1 when none came within the timeout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer

REQUEST = Path(__file__).with_name("request.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bootstrap", help="the broker's address, host:port")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the prediction")
    args = parser.parse_args(argv)
    key = f"example-{uuid.uuid4().hex[:8]}".encode()
    event = json.loads(REQUEST.read_text())
    reader = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"example-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "log_level": 4,
        }
    )
    reader.subscribe(["predictions", "events.dlq"])  # from their beginnings: the event's key is its own
    deadline = time.monotonic() + args.timeout
    producer = Producer({"bootstrap.servers": args.bootstrap, "log_level": 4})
    sent = time.monotonic()
    producer.produce("events", key=key, value=json.dumps(event).encode())
    producer.flush(10)
    try:
        while time.monotonic() < deadline:
            msg = reader.poll(0.5)
            if msg is not None and not msg.error() and msg.key() == key:
                print(f"{msg.topic()} key {key.decode()} after {time.monotonic() - sent:.2f} s: {msg.value().decode()}")
                return 0
    finally:
        reader.close()
    print(f"error: no output for key {key.decode()} within {args.timeout:.0f} s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
