"""The stream consumer: events in, one prediction or dead letter out per event, exactly once with
Kafka transactions, each event scored through the running TorchServe (:mod:`rtserve.client`).

One step: poll up to ``batch`` events (waiting only for the first: a batch never waits to fill);
validate each (:mod:`rtserve.stream.records`) and send the valid ones to TorchServe, ``instances``
events per request (KServe v1) and those requests concurrently, so that its batching forms real
batches; only then open a transaction, write the outputs in offset order, add the consumed
offsets to it (``send_offsets_to_transaction``) and commit. No transaction is open while
TorchServe answers. A transient failure (no answer, 502/503/504, a lost worker) writes nothing:
the consumer seeks back to the step's first offsets and retries with backoff; it never
dead-letters one. A transaction that fails is aborted (a fenced producer is made anew) and the
consumer seeks back to its group's committed offsets, so the events are scored again and
written once.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from requests.adapters import HTTPAdapter

from handler.errors import InvalidInput
from rtserve.client.rest import Client
from rtserve.errors import StreamError, TorchServeError
from rtserve.stream import records
from rtserve.stream.metrics import StreamMetrics
from rtserve.stream.records import Source

logger = logging.getLogger(__name__)

#: TorchServe's answers that say "not now" (retried) rather than "never" (dead-lettered: 400, 413).
TRANSIENT = {0, 408, 429, 502, 503, 504, 507}
REFUSED = {400, 413}
TXN_TIMEOUT = 30.0


@dataclass(frozen=True)
class StreamConfig:
    """The consumer's settings, checked once (:class:`StreamError` names a bad one)."""

    bootstrap: str
    model: str = "realtime-classifier"
    group: str = "rtserve-stream"
    input: str = "events"
    output: str = "predictions"
    dead_letters: str = "events.dlq"
    transactional_id: str = "rtserve-stream"
    #: Most events per poll (and per transaction); the first is waited for at most ``poll``
    #: seconds, the others are those already fetched.
    batch: int = 512
    poll: float = 0.5
    #: Requests in flight to TorchServe at once.
    concurrency: int = 16
    #: Events per request to TorchServe: a KServe v1 ``instances`` request (at most the model's
    #: ``handler.max_instances``, 64 by default); 1: one ``/predictions`` request per event.
    instances: int = 64
    #: The model's feature count (None: TorchServe checks it, its 400 names it).
    n_features: int | None = None
    backoff: float = 0.2
    max_backoff: float = 5.0
    #: A member that stops heartbeating (killed, frozen) leaves the group after this (Kafka's
    #: default, 45 s, would hold its partitions that long after a crash).
    session_timeout: float = 10.0

    def __post_init__(self) -> None:
        for name in ("batch", "concurrency", "instances"):
            if getattr(self, name) < 1:
                raise StreamError(f"stream setting {name} must be at least 1, got {getattr(self, name)}")
        for name in ("poll", "backoff", "max_backoff", "session_timeout"):
            if not getattr(self, name) > 0:
                raise StreamError(f"stream setting {name} must be positive, got {getattr(self, name)}")
        if len({self.input, self.output, self.dead_letters}) != 3:
            raise StreamError("the input, output and dead-letter topics must differ")


@dataclass
class Counts:
    """What the consumer did so far."""

    predictions: int = 0
    dead_letters: int = 0
    transactions: int = 0
    aborted: int = 0
    retries: int = 0
    errors: list[str] = field(default_factory=list)


class Transient(StreamError):
    """HTTP 503: TorchServe could not answer now (the consumer retries the step; it never
    leaves the consumer)."""


class StreamConsumer:
    """One member of the consumer group ``config.group`` (see the module's docstring)."""

    def __init__(self, config: StreamConfig, client: Client, metrics: StreamMetrics | None = None) -> None:
        self.config = config
        self.client = client
        self.counts = Counts()
        self.metrics = metrics or StreamMetrics()
        self.metrics.watch(self.counts)
        self.consumer = Consumer({
            "bootstrap.servers": config.bootstrap, "group.id": config.group,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "isolation.level": "read_committed", "log_level": 4,
            "session.timeout.ms": int(config.session_timeout * 1000),
            **self.metrics.consumer_settings(),
        })
        self.producer = self._producer()
        self.pool = ThreadPoolExecutor(config.concurrency, thread_name_prefix="stream-score")
        self._failures = 0

    @property
    def client(self) -> Client:
        """TorchServe's client; its connection pool holds ``concurrency`` connections."""
        return self._client

    @client.setter
    def client(self, client: Client) -> None:
        client.session.mount("http://", HTTPAdapter(pool_maxsize=self.config.concurrency))
        self._client = client

    def _producer(self) -> Producer:
        self.metrics.producer_starting()
        producer = Producer({"bootstrap.servers": self.config.bootstrap,
                             "transactional.id": self.config.transactional_id,
                             "linger.ms": 5, "log_level": 4})
        producer.init_transactions(TXN_TIMEOUT)
        self.metrics.producer_ready()
        return producer

    def run(self, stop: threading.Event) -> Counts:
        """Consume until ``stop`` is set; then leave the group."""
        self.consumer.subscribe([self.config.input])
        try:
            while not stop.is_set():
                self.metrics.tick()
                self.step()
        finally:
            self.close()
        return self.counts

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.consumer.close()

    def step(self) -> int:
        """Poll, score and commit one batch; returns the events written (0 after a retry)."""
        messages = []
        for msg in self._consume():
            if msg.error():
                self.counts.errors.append(str(msg.error()))
                logger.warning("consumer error: %s", msg.error())
            else:
                messages.append(msg)
        if not messages:
            return 0
        try:
            outputs = self.score(messages)
        except Transient as exc:
            self._retry_later(messages, exc)
            return 0
        self._failures = 0
        if not self.commit(messages, outputs):
            return 0
        return len(messages)

    def _consume(self) -> list[Message]:
        """Up to ``batch`` events: at most ``poll`` seconds' wait for the first, then only those
        already fetched (``consume(batch, poll)`` would wait for a full batch: at a low rate each
        event would wait ``poll`` seconds or for ``batch - 1`` more)."""
        first = self.consumer.consume(1, self.config.poll)
        if not first or self.config.batch == 1:
            return first
        return first + self.consumer.consume(self.config.batch - 1, 0)

    def score(self, messages: list[Message]) -> list[tuple[str, bytes]]:
        """Each message's output as (topic, value), in the messages' order; TorchServe is asked
        for the valid ones (:meth:`_answers`).

        Raises:
            Transient: TorchServe did not answer one now (nothing of the batch is written).
            StreamError: TorchServe refused one for a reason no event can fix (unknown model,
                token refused): the consumer stops rather than dead-letter the stream.
        """
        sources = [Source(m.topic(), m.partition(), m.offset(), _timestamp(m)) for m in messages]
        parsed: list[records.Event | bytes] = []
        for msg, source in zip(messages, sources):
            try:
                parsed.append(records.parse_event(msg.value(), self.config.n_features))
            except InvalidInput as exc:
                parsed.append(records.refused(source, exc))
        valid = [i for i, e in enumerate(parsed) if isinstance(e, records.Event)]
        answers = dict(zip(valid, self._answers([parsed[i] for i in valid])))
        outputs = []
        for i, (event, source) in enumerate(zip(parsed, sources)):
            if i not in answers:
                outputs.append((self.config.dead_letters, event))
                continue
            answer = answers[i]
            if isinstance(answer, TorchServeError):
                body = answer.body if isinstance(answer.body, dict) else {}
                outputs.append((self.config.dead_letters, records.dead_letter(
                    source, body.get("error") or str(answer), body.get("field"), answer.reason or "refused")))
            else:
                outputs.append((self.config.output, records.prediction(source, event, answer)))
        return outputs

    def _answers(self, events: list[records.Event]) -> list[dict | TorchServeError]:
        """TorchServe's answer to each event (or its refusal), asked concurrently: ``instances``
        events per KServe v1 request, or one ``/predictions`` request each (``instances`` 1)."""
        size = self.config.instances
        if size == 1:
            futures = [self.pool.submit(self._predict, e) for e in events]
            return [f.result() for f in futures]
        futures = [self.pool.submit(self._predict_many, events[i:i + size]) for i in range(0, len(events), size)]
        return [answer for f in futures for answer in f.result()]

    def _predict_many(self, events: list[records.Event]) -> list[dict | TorchServeError]:
        """One request for ``events``; when TorchServe refuses it as a whole (one event's count
        is wrong: 400), each event is asked on its own, so that each refusal is its own."""
        rows = [e.request["features"] for e in events]
        answer = self._ask(lambda: self.client.predict_instances(self.config.model, rows))
        if isinstance(answer, TorchServeError):
            return [self._predict(e) for e in events]
        return answer

    def _predict(self, event: records.Event) -> dict | TorchServeError:
        return self._ask(lambda: self.client.predict(self.config.model, event.request))

    def _ask(self, call: Callable[[], Any]) -> Any:
        """``call``'s answer; a refusal (400, 413) as the error, returned.

        Raises:
            Transient: no answer now (retried).
            StreamError: a refusal no event can fix.
        """
        try:
            return call()
        except TorchServeError as exc:
            if exc.status in REFUSED:
                return exc
            if exc.status in TRANSIENT or exc.status >= 500:
                raise Transient(str(exc)) from exc
            raise StreamError(f"TorchServe refused {self.config.model} for every event: {exc}") from exc

    def commit(self, messages: list[Message], outputs: list[tuple[str, bytes]]) -> bool:
        """Write ``outputs`` and the consumed offsets in one transaction; on failure abort and
        seek back to the committed offsets. Returns whether it committed."""
        producer = self.producer
        try:
            producer.begin_transaction()
            for msg, (topic, value) in zip(messages, outputs):
                producer.produce(topic, key=msg.key(), value=value)
            producer.send_offsets_to_transaction(next_offsets(messages),
                                                 self.consumer.consumer_group_metadata(), TXN_TIMEOUT)
            producer.commit_transaction(TXN_TIMEOUT)
        except KafkaException as exc:
            self._abort(exc.args[0])
            return False
        self.metrics.committed(messages)
        self.counts.transactions += 1
        for topic, _ in outputs:
            if topic == self.config.output:
                self.counts.predictions += 1
            else:
                self.counts.dead_letters += 1
        return True

    def _abort(self, error: KafkaError) -> None:
        logger.warning("transaction failed (%s): aborted, rewinding to the committed offsets", error)
        self.counts.aborted += 1
        if error.fatal():  # fenced by a newer member with the same id, or timed out for good
            self.producer = self._producer()
        else:
            try:
                self.producer.abort_transaction(TXN_TIMEOUT)
            except KafkaException:
                self.producer = self._producer()
        assigned = self.consumer.assignment()
        if assigned:
            for tp in self.consumer.committed(assigned, timeout=TXN_TIMEOUT):
                if tp.offset >= 0:
                    self.consumer.seek(tp)

    def _retry_later(self, messages: list[Message], exc: Transient) -> None:
        """Seek back to each partition's first event of the step and wait before polling again."""
        self.counts.retries += 1
        for tp in first_offsets(messages):
            self.consumer.seek(tp)
        wait = min(self.config.max_backoff, self.config.backoff * 2 ** self._failures)
        self._failures += 1
        logger.info("TorchServe did not answer now (%s); retrying in %.1f s", exc, wait)
        time.sleep(wait)


def next_offsets(messages: list[Message]) -> list[TopicPartition]:
    """Per partition, the offset after its last message: what the group commits."""
    last: dict[tuple[str, int], int] = {}
    for m in messages:
        last[(m.topic(), m.partition())] = max(last.get((m.topic(), m.partition()), -1), m.offset())
    return [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]


def first_offsets(messages: list[Message]) -> list[TopicPartition]:
    """Per partition, its first message's offset: where a retry starts again."""
    first: dict[tuple[str, int], int] = {}
    for m in messages:
        first.setdefault((m.topic(), m.partition()), m.offset())
    return [TopicPartition(t, p, o) for (t, p), o in first.items()]


def _timestamp(msg: Message) -> int | None:
    kind, value = msg.timestamp()
    return value if kind != 0 else None  # 0: TIMESTAMP_NOT_AVAILABLE

