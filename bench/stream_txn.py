"""Back-to-back Kafka transactions: what a pause after each commit does to CONCURRENT_TRANSACTIONS.

Right after a commit the coordinator still writes the transaction's markers and refuses the next
transaction's AddPartitionsToTxn with CONCURRENT_TRANSACTIONS; librdkafka retries that after a fixed
20 ms. For each pause (ms, after commit, before the next transaction's first write) this sends
``--transactions`` transactions of ``--outputs`` records over the partitions of one topic, from one
transactional producer with librdkafka's ``debug=eos``, and prints the refusals it logged and the
p50/p90/p99 of a transaction's time (first write to commit answered), and the transactions per
second. `make bench-stream-txn`; the consumer's :data:`rtserve.stream.consumer.MARKER_GRACE` is the
pause chosen from it.
"""

from __future__ import annotations

import argparse
import logging
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench import common
from bench.stream import start_broker
from rtserve.stream import local

logger = logging.getLogger("bench.stream_txn")
#: What librdkafka logs (debug=eos) for an AddPartitionsToTxn refused with CONCURRENT_TRANSACTIONS.
REFUSAL = "another concurrent operation on the same transaction"
PARTITIONS = 4


class Refusals(logging.Handler):
    """Counts librdkafka's log lines that say a transaction request met CONCURRENT_TRANSACTIONS."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += REFUSAL in record.getMessage()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def run(bootstrap: str, topic: str, pause_ms: float, transactions: int, outputs: int) -> dict:
    """One producer's ``transactions`` back-to-back transactions with ``pause_ms`` after each commit."""
    refusals = Refusals()
    log = logging.getLogger(f"rdkafka.{uuid.uuid4().hex[:8]}")
    log.addHandler(refusals)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"bench-txn-{uuid.uuid4().hex}",
            "linger.ms": 5,
            "retry.backoff.ms": 5,
            "debug": "eos",
            "log_level": 7,
            "logger": log,
        }
    )
    producer.init_transactions(30)
    value = b"x" * 120
    took: list[float] = []
    begin = time.perf_counter()
    for _ in range(transactions):
        start = time.perf_counter()
        producer.begin_transaction()
        for i in range(outputs):
            producer.produce(topic, value=value, partition=i % PARTITIONS)
        producer.commit_transaction(30)
        took.append((time.perf_counter() - start) * 1000.0)
        producer.poll(0)
        if pause_ms:
            time.sleep(pause_ms / 1000.0)
    elapsed = time.perf_counter() - begin
    producer.flush(10)
    return {
        "pause_ms": pause_ms,
        "refusals": refusals.count,
        "p50_ms": percentile(took, 50),
        "p90_ms": percentile(took, 90),
        "p99_ms": percentile(took, 99),
        "per_s": transactions / elapsed,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kafka-libs", type=Path, required=True, help="the jars of make kafka-deps")
    p.add_argument("--kafka-heap", default="512m")
    p.add_argument("--run-root", type=Path, default=common.REPO / "build", help="the broker's run directory's parent")
    p.add_argument("--pauses", default="0,1,2,5,10", help="pauses after each commit, ms, comma-separated")
    p.add_argument("--transactions", type=int, default=300, help="transactions per pause")
    p.add_argument("--outputs", type=int, default=16, help="records per transaction")
    p.add_argument("--rounds", type=int, default=3, help="rounds over all pauses (interleaved, same machine)")
    args = p.parse_args(argv)
    common.log_to_stdout()
    pauses = [float(x) for x in args.pauses.split(",") if x.strip()]
    if not pauses or any(x < 0 for x in pauses) or args.transactions < 10 or args.outputs < 1 or args.rounds < 1:
        p.error("--pauses must be >= 0 ms, --transactions at least 10, --outputs and --rounds at least 1")
    layout = start_broker(args)
    try:
        topic = f"txn-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": layout.bootstrap})  # (kept: its futures need it)
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
        run(layout.bootstrap, topic, 0, 500, args.outputs)  # the broker warmed (JIT, log segments)
        results: dict[float, list[dict]] = {pause: [] for pause in pauses}
        for _ in range(args.rounds):
            for pause in pauses:
                results[pause].append(run(layout.bootstrap, topic, pause, args.transactions, args.outputs))
    finally:
        logger.info(">> %s", local.stop(layout.run_dir))
    logger.info(
        "%d transactions of %d records per pause and round, %d rounds; refusals: CONCURRENT_TRANSACTIONS per 100",
        args.transactions,
        args.outputs,
        args.rounds,
    )
    logger.info("%9s %9s %8s %8s %8s %9s", "pause ms", "refusals", "p50 ms", "p90 ms", "p99 ms", "txn/s")
    for pause, rows in results.items():
        for row in rows:
            logger.info(
                "%9.1f %9.1f %8.1f %8.1f %8.1f %9.0f",
                pause,
                100.0 * row["refusals"] / args.transactions,
                row["p50_ms"],
                row["p90_ms"],
                row["p99_ms"],
                row["per_s"],
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
