"""The naive stream consumer ``make bench-stream`` compares rtserve's with (benchmark only).

Written the way the usual Kafka-plus-PyTorch tutorial writes it: a plain consumer loop that
polls one message at a time (offsets auto-committed in the background), scores it with the
model loaded in-process, and produces the result per message. With confluent-kafka, the
client this project has (the tutorials' ``kafka-python`` ``KafkaConsumer`` loop is the same
shape). The model is the archive's own: ``model.pt2`` and ``meta.json`` read out of the
``.mar``, run eagerly with torch (the exported module's forward, one torch thread, as the
benchmark's FastAPI seed runs it).

What it does not do, on purpose (it is the baseline): no validation (a poison event ends it),
no batching, no transaction (a crash loses or duplicates events), no versions or metrics. By
default each result is produced asynchronously (the client batches the sends, so an offset can
be auto-committed before its result is delivered: a crash then loses it); ``--flush-each``
waits for each result's delivery, as the tutorials that mean "at least once" write it.

    .venv/bin/python -m bench.stream_naive --bootstrap 127.0.0.1:9092 --mar model_store/realtime-classifier_1.0.mar
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import zipfile
from pathlib import Path

#: What it prints once it has subscribed (the benchmark waits for it).
STARTED = ">> naive consumer subscribed"


def load_model(mar: Path, into: Path):
    """The archive's model: its forward function and metadata (the handler's own loader)."""
    import torch

    from handler.model import METADATA_FILE, PROGRAM_FILE, ModelMetadata, load_program

    with zipfile.ZipFile(mar) as archive:
        archive.extract(PROGRAM_FILE, into)
        archive.extract(METADATA_FILE, into)
    torch.set_num_threads(1)
    return load_program(into / PROGRAM_FILE), ModelMetadata.load(into / METADATA_FILE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--mar", type=Path, required=True)
    parser.add_argument("--group", default="naive")
    parser.add_argument("--input", default="events")
    parser.add_argument("--output", default="predictions")
    parser.add_argument("--flush-each", action="store_true", help="wait for each result's delivery")
    args = parser.parse_args(argv)

    import torch
    from confluent_kafka import Consumer, Producer

    with tempfile.TemporaryDirectory() as tmp:
        model, meta = load_model(args.mar, Path(tmp))
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
        }
    )
    producer = Producer({"bootstrap.servers": args.bootstrap})
    running = True

    def stop(*_) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    consumer.subscribe([args.input])
    print(STARTED, flush=True)
    scored = 0
    while running:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        if msg.error():
            print(f"consumer error: {msg.error()}", flush=True)
            continue
        event = json.loads(msg.value())
        with torch.no_grad():
            probabilities = torch.softmax(model(torch.tensor([event["features"]])), dim=1)[0]
        cls = int(probabilities.argmax())
        result = {
            "prediction": cls,
            "label": meta.labels[cls],
            "probabilities": probabilities.tolist(),
            "model_version": meta.version,
            "source": {"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset()},
            "event_timestamp": msg.timestamp()[1],
        }
        producer.produce(args.output, key=msg.key(), value=json.dumps(result))
        if args.flush_each:
            producer.flush()
        else:
            producer.poll(0)
        scored += 1
    producer.flush(30)
    consumer.close()
    print(f">> naive consumer stopped: {scored} scored", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
