"""``python -m rtserve stream``: score a Kafka topic's events through the running TorchServe, exactly or at least once.

    python -m rtserve stream run [--kafka-run-dir .run/kafka | --bootstrap 127.0.0.1:9092]
        [--model realtime-classifier] [--group rtserve-stream] [--input events]
        [--output predictions] [--dead-letters events.dlq] [--features 32]
        [--guarantee exactly-once|at-least-once] [--linger 0.002]
        [--metrics-port 8088 --metrics-host 127.0.0.1] [--token-file TOKENS]

    python -m rtserve stream start [--stream-dir .run/stream] [-- RUN OPTIONS]
    python -m rtserve stream stop [--stream-dir .run/stream]

``run`` runs until SIGTERM or SIGINT and serves ``/metrics``, ``/healthz`` and ``/ready`` on --metrics-port;
``start`` runs it in the background (PID file and log in --stream-dir), ``stop`` ends it. See docs/streaming.md.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import signal
import socket
import threading
from pathlib import Path

from rtserve.cli.common import client, client_options, command, group
from rtserve.cli.kafka import RUN_DIR as KAFKA_RUN_DIR
from rtserve.settings import PACKAGE_HOME
from rtserve.stream import service
from rtserve.stream.service import STOPPED

STREAM_DIR = PACKAGE_HOME / ".run" / "stream"


def cmd_run(args: argparse.Namespace) -> int:
    """Consume --input, write one prediction (--output) or dead letter (--dead-letters) per event.

    Exactly once, each transaction commits the consumed offsets with what it wrote; at least once,
    the offsets follow the outputs' delivery.
    """
    from rtserve.gateway.nginx import parse_tokens
    from rtserve.stream import local, metrics
    from rtserve.stream.consumer import StreamConfig, StreamConsumer

    bootstrap = args.bootstrap or local.load_state(args.kafka_run_dir)["bootstrap"]
    config = StreamConfig(
        bootstrap,
        model=args.model,
        group=args.group,
        input=args.input,
        output=args.output,
        dead_letters=args.dead_letters,
        transactional_id=args.transactional_id or f"rtserve-stream-{args.group}-{socket.gethostname()}",
        batch=args.batch,
        concurrency=args.concurrency,
        instances=args.instances,
        n_features=args.features,
        linger=args.linger,
        guarantee=args.guarantee,
    )
    # A gateway's shared token (the Secret's file, in Kubernetes), else TorchServe's key file.
    token = parse_tokens(Path(args.token_file).read_text())[0] if args.token_file else None
    stop = threading.Event()
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID`: every thread's stack into the log
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    port = metrics.METRICS_PORT if args.metrics_port is None else args.metrics_port
    host = args.metrics_host or metrics.METRICS_HOST
    observed = metrics.StreamMetrics(stall=args.stall_seconds or metrics.STALL_SECONDS)
    server = metrics.serve(observed, host, port) if port else None
    try:
        member = StreamConsumer(config, client(args, token), observed)
        # what is loaded now lives as long as the process: keep it out of every later collection
        gc.collect()
        gc.freeze()
        where = f"; metrics on http://{host}:{server.server_port}/metrics" if server else ""
        print(
            f">> consuming {config.input} at {bootstrap} (group {config.group}) into {config.output}, "
            f"dead letters into {config.dead_letters}{where}",
            flush=True,
        )
        counts = member.run(stop)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    print(
        f"{STOPPED}{counts.predictions} predictions, {counts.dead_letters} dead letters in "
        f"{counts.transactions} {'transactions' if config.guarantee == 'exactly-once' else 'commits'} "
        f"({counts.aborted} aborted, {counts.retries} retries)"
    )
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    """Run the consumer (``stream run`` with the options after ``--``) in the background."""
    options = args.options[1:] if args.options[:1] == ["--"] else args.options
    pid, took = service.start(args.stream_dir, options)
    print(f">> stream consumer started in {took:.1f} s (pid {pid}); log: {args.stream_dir / service.LOG_FILE}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop the consumer of --stream-dir (by its PID file): it finishes its step and leaves its group."""
    last = service.stop(args.stream_dir)
    print(f">> stream consumer stopped: {last}" if last else f">> no stream consumer runs from {args.stream_dir}")
    return 0


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "stream", __doc__)
    stream_dir = (
        ["--stream-dir"],
        {"type": Path, "default": STREAM_DIR, "help": "the background consumer's PID file and log"},
    )
    command(
        commands,
        "start",
        cmd_start,
        stream_dir,
        (["options"], {"nargs": argparse.REMAINDER, "help": "options of stream run, after --"}),
    )
    command(commands, "stop", cmd_stop, stream_dir)
    command(
        commands,
        "run",
        cmd_run,
        (["--bootstrap"], {"help": "the Kafka bootstrap address (default: the broker of --kafka-run-dir)"}),
        (
            ["--kafka-run-dir"],
            {"type": Path, "default": KAFKA_RUN_DIR, "help": "the run directory of make kafka's broker"},
        ),
        (["--model"], {"default": "realtime-classifier"}),
        (["--group"], {"default": "rtserve-stream", "help": "the consumer group"}),
        (["--input"], {"default": "events"}),
        (["--output"], {"default": "predictions"}),
        (["--dead-letters"], {"default": "events.dlq"}),
        (
            ["--transactional-id"],
            {
                "help": "the producer's transactional id, one per member: two members "
                "with one id fence each other (default: rtserve-stream-GROUP-HOSTNAME)"
            },
        ),
        (["--batch"], {"type": int, "default": 512, "help": "most events per poll and transaction"}),
        (["--concurrency"], {"type": int, "default": 16, "help": "requests in flight to TorchServe"}),
        (
            ["--instances"],
            {
                "type": int,
                "default": 64,
                "help": "events per request to TorchServe (KServe v1 instances, at most the "
                "model's handler.max_instances); 1: one /predictions request each",
            },
        ),
        (["--features"], {"type": int, "help": "the model's feature count (default: TorchServe checks it)"}),
        (
            ["--linger"],
            {
                "type": float,
                "default": 0.002,
                "help": "seconds a micro-batch waits for more events before it is sent (at most --instances)",
            },
        ),
        (
            ["--guarantee"],
            {
                "choices": ["exactly-once", "at-least-once"],
                "default": "exactly-once",
                "help": "exactly-once: outputs and offsets in one transaction; at-least-once: no transactions, "
                "offsets committed once the outputs are delivered (a crash or rebalance can write an output "
                "twice; each carries its source to drop them)",
            },
        ),
        (
            ["--token-file"],
            {
                "help": "a file of shared gateway tokens, the first is sent (a Kubernetes "
                "Secret's file); default: TorchServe's key file"
            },
        ),
        # (the defaults are rtserve.stream.metrics', resolved in cmd_run: no prometheus_client
        # import for every other command)
        (
            ["--metrics-port"],
            {"type": int, "help": "the port of /metrics, /healthz and /ready (default: 8088; 0: none)"},
        ),
        (["--metrics-host"], {"help": "the address it listens on (default: 127.0.0.1; 0.0.0.0 in a pod)"}),
        (
            ["--stall-seconds"],
            {"type": float, "help": "/healthz fails when the loop has not come round for this long (default: 180)"},
        ),
        parents=(client_options(),),
    )
