"""The stream consumer: one prediction or dead letter per Kafka event, by TorchServe, exactly or at least once.

A continuous pipeline: polled events form micro-batches (``instances`` events or ``linger`` seconds), up
to ``concurrency`` requests are in flight, and answers are released in the order the events were polled
(so per partition in offset order). One commit at a time writes what has been released, while scoring
goes on: exactly once, a transaction with the outputs and the offsets; at least once, the outputs, then
the offsets once each output's delivery is confirmed. A transient failure drops what was not yet handed
to a commit, rewinds and retries after a backoff; a failed commit rewinds to the group's committed
offsets. The design: docs/streaming.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from requests.adapters import HTTPAdapter

from handler.errors import InvalidInput
from handler.records import ROUTE_HEADER
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
#: The longest a step waits for its commit: its transactional calls' own timeouts and a margin, since
#: a producer that lost its broker can hang past its timeout. Past this the step is given up like a
#: failed commit (the next producer, with the same transactional id, fences the stuck one).
COMMIT_DEADLINE = 3 * TXN_TIMEOUT
#: The transactional producer's first retry of a refused request (see :meth:`StreamConsumer._producer`).
RETRY_BACKOFF_MS = 5
#: Seconds a transaction waits after the previous one committed before it writes: the coordinator
#: answers CONCURRENT_TRANSACTIONS while it writes the previous one's markers, and librdkafka retries
#: AddPartitionsToTxn after a fixed 20 ms. `make bench-stream-txn` (16 records a transaction, a
#: warm broker, the machine busy): refusals per 100 transactions 1.7-3.3 with no pause, 0-1.7 with
#: 2 ms; p99 24-28 ms, 4-24 ms with 2 ms.
MARKER_GRACE = 0.002
#: The largest event scored, as TorchServe's ``max_request_size`` (``config.properties``) bounds a
#: REST request: a larger one is dead-lettered (``too_large``). A prediction echoes the event's
#: ``id``, so this also keeps every output under the producer's 1 MB record limit.
MAX_EVENT_BYTES = 65536

#: The route of the consumer's requests in their records (:data:`handler.records.ROUTE_HEADER`).
STREAM_ROUTE = "stream"
#: What a member promises per event: once in the outputs (transactions), or at least once (no
#: transactions: a crash or a rebalance between an output's delivery and its offset's commit
#: writes that output again when the event is read again).
EXACTLY_ONCE, AT_LEAST_ONCE = "exactly-once", "at-least-once"
GUARANTEES = (EXACTLY_ONCE, AT_LEAST_ONCE)
#: How long the loop waits for Kafka while work is in flight (answers to release, a commit to
#: end): its reaction time to both.
BUSY_POLL = 0.001
#: The longest :meth:`StreamConsumer.close` waits for the requests in flight before it gives them up.
DRAIN_TIMEOUT = 30.0


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
    #: Most events per poll and per commit (transaction); an idle member waits at most ``poll``
    #: seconds for the first.
    batch: int = 512
    poll: float = 0.5
    #: A micro-batch is sent once it holds ``instances`` events or its first has waited this long.
    linger: float = 0.002
    guarantee: str = EXACTLY_ONCE
    #: Requests in flight to TorchServe at once.
    concurrency: int = 16
    #: Events per request to TorchServe: a KServe v1 ``instances`` request (at most the model's
    #: ``handler.max_instances``, 64 by default); 1: one ``/predictions`` request per event.
    instances: int = 64
    #: The model's feature count (None: TorchServe checks it, its 400 names it).
    n_features: int | None = None
    #: Larger events are dead-lettered unread (at most 512 KiB: see :data:`MAX_EVENT_BYTES`).
    max_event_bytes: int = MAX_EVENT_BYTES
    backoff: float = 0.2
    max_backoff: float = 5.0
    #: A member that stops heartbeating (killed, frozen) leaves the group after this (Kafka's
    #: default, 45 s, would hold its partitions that long after a crash).
    session_timeout: float = 10.0

    def __post_init__(self) -> None:
        for name in ("batch", "concurrency", "instances"):
            if getattr(self, name) < 1:
                raise StreamError(f"stream setting {name} must be at least 1, got {getattr(self, name)}")
        if not 1 <= self.max_event_bytes <= 512 * 1024:
            raise StreamError(
                f"stream setting max_event_bytes must be within 1..524288 (an output "
                f"must fit a 1 MB record), got {self.max_event_bytes}"
            )
        if self.guarantee not in GUARANTEES:
            raise StreamError(
                f"stream setting guarantee must be one of {', '.join(GUARANTEES)}, got {self.guarantee!r}"
            )
        if not 0 <= self.linger <= 1:
            raise StreamError(f"stream setting linger must be within 0..1 s, got {self.linger}")
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


@dataclass
class Timeline:
    """When a micro-batch passed each stage of the pipeline (monotonic seconds; 0.0: not yet).

    ``waited`` is its first event's age when polled (from its Kafka timestamp; None without one).
    :meth:`StreamMetrics.stages <rtserve.stream.metrics.StreamMetrics.stages>` turns a committed
    one into the time spent in each stage.
    """

    waited: float | None
    polled: float
    sent: float = 0.0
    answered: float = 0.0
    released: float = 0.0
    handed: float = 0.0


@dataclass
class InFlight:
    """Released events being committed on the commit thread.

    Their outputs, and the commit's future: its wall-clock end (or its :class:`KafkaException`).
    """

    messages: list[Message]
    outputs: list[tuple[str, bytes]]
    commit: Future
    #: When it was handed over (monotonic): past :data:`COMMIT_DEADLINE` it is given up.
    started: float = field(default_factory=time.monotonic)
    #: The micro-batches whose last event it commits.
    timelines: list[Timeline] = field(default_factory=list)


@dataclass
class Chunk:
    """A micro-batch: events polled by ``member``, and the future of their outputs (one per event, in order)."""

    messages: list[Message]
    member: str | None
    outputs: Future
    timeline: Timeline


class Transient(StreamError):
    """HTTP 503: TorchServe could not answer now.

    The consumer retries the step; this error never leaves the consumer.
    """


class StreamConsumer:
    """One member of the consumer group ``config.group`` (see the module's docstring).

    Every Kafka call but the commit's is made on the thread that runs :meth:`run` (or :meth:`step`).
    """

    def __init__(self, config: StreamConfig, client: Client, metrics: StreamMetrics | None = None) -> None:
        self.config = config
        self.client = client
        self.counts = Counts()
        self.metrics = metrics or StreamMetrics()
        self.metrics.watch(self.counts)
        self.consumer = Consumer(
            {
                "bootstrap.servers": config.bootstrap,
                "group.id": config.group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "log_level": 4,
                "session.timeout.ms": int(config.session_timeout * 1000),
                "on_commit": self._committed,
                **self.metrics.consumer_settings(),
            }
        )
        self.producer: Producer | None = self._producer()
        self.pool = ThreadPoolExecutor(config.concurrency, thread_name_prefix="stream-score")
        #: Polled, not yet sent: the micro-batch being formed, when its first event came, and how
        #: long that event had waited to be polled (see :class:`Timeline`).
        self._forming: list[Message] = []
        self._formed_at = 0.0
        self._waited: float | None = None
        #: Sent micro-batches, in poll order; and the released events not yet committed: each with
        #: its output, the member that polled it, and, for a micro-batch's last event, its timeline.
        self._pending: deque[Chunk] = deque()
        self._released: list[tuple[Message, tuple[str, bytes], str | None, Timeline | None]] = []
        self._in_flight: InFlight | None = None
        #: When the last transaction committed (monotonic; see :data:`MARKER_GRACE`).
        self._committed_at = -float("inf")
        #: At least once: the offsets after the delivered events, per (topic, partition).
        self._delivered: dict[tuple[str, int], int] = {}
        self._failures = 0
        #: While backing off after a transient failure: when the paused partitions resume.
        self._resume_at: float | None = None
        #: A commit failed and the partitions are not yet back at the committed offsets.
        self._unsettled = False
        #: The partitions of the last rebalance, as (topic, partition), set by the polling thread's
        #: callbacks: readable from any thread (``consumer.assignment()`` waits on librdkafka's group
        #: thread with no limit).
        self.assigned: frozenset[tuple[str, int]] = frozenset()

    @property
    def client(self) -> Client:
        """TorchServe's client; its connection pool holds ``concurrency`` connections."""
        return self._client

    @client.setter
    def client(self, client: Client) -> None:
        client.session.mount("http://", HTTPAdapter(pool_maxsize=self.config.concurrency))
        client.session.headers[ROUTE_HEADER] = STREAM_ROUTE  # the records say where it came from
        self._client = client

    @property
    def transactional(self) -> bool:
        return self.config.guarantee == EXACTLY_ONCE

    def _producer(self) -> Producer:
        self.metrics.producer_starting()
        # A request to a broker that went away fails after TXN_TIMEOUT, as the transactional
        # calls' own timeouts say (librdkafka's default, 60 s, outlasts them). A transaction begun
        # right after the previous commit meets CONCURRENT_TRANSACTIONS and is retried after
        # ``retry.backoff.ms``: librdkafka's 100 ms made back-to-back transactions take 108 ms, not 15.
        settings = {
            "bootstrap.servers": self.config.bootstrap,
            "socket.timeout.ms": int(TXN_TIMEOUT * 1000),
            "retry.backoff.ms": RETRY_BACKOFF_MS,
            "log_level": 4,
        }
        if self.transactional:
            producer = Producer({**settings, "transactional.id": self.config.transactional_id, "linger.ms": 5})
            producer.init_transactions(TXN_TIMEOUT)
        else:  # idempotent: a retried send is not written twice
            producer = Producer({**settings, "enable.idempotence": True, "linger.ms": 1})
        self.metrics.producer_ready()
        return producer

    def run(self, stop: threading.Event) -> Counts:
        """Consume until ``stop`` is set; then commit what was scored and leave the group."""
        self.consumer.subscribe([self.config.input], on_assign=self._on_assign, on_revoke=self._on_revoke)
        try:
            while not stop.is_set():
                self.metrics.tick()
                self.step()
        finally:
            self.close()
        return self.counts

    def close(self) -> None:
        """Score what was polled (at most :data:`DRAIN_TIMEOUT`), commit it, then leave the group."""
        try:
            if self._resume_at is None and not self._unsettled:
                self._drain()
        finally:
            self.finish(settle=False)
            self._commit_delivered()
            self.pool.shutdown(wait=True)
            self.consumer.close()

    def step(self) -> int:
        """One turn of the loop: poll, send micro-batches, release answers in order, hand a commit over.

        Returns:
            The events whose commit ended in this turn (0 when it failed, and while backing off).
        """
        if self._resume_at is not None:
            self._hold()
            return 0
        if self._unsettled and not self._settle():
            return 0
        busy = self._forming or self._pending or self._released or self._in_flight
        messages = self._poll(self._wait(busy))
        if self._unsettled:  # a rebalance in the poll met a failed commit: read again once settled
            return 0
        self._form(messages)
        written = self.finish(wait=False)
        if written is None:  # the commit failed: every event after the committed offsets is read again
            return 0
        try:
            self._release()
        except Transient as exc:
            self._retry_later(exc)
            return written
        self._failures = 0
        if self._in_flight is None and self._released:
            self._hand_over()
        return written

    def _wait(self, busy: bool) -> float:
        """How long the next poll may wait: until the forming micro-batch is due, briefly while busy."""
        if self._forming:
            return max(0.0, min(BUSY_POLL, self._formed_at + self.config.linger - time.monotonic()))
        return BUSY_POLL if busy else self.config.poll

    def _form(self, messages: list[Message]) -> None:
        """Add polled ``messages`` to the micro-batch; send it when full or due (a full pipeline waits)."""
        if messages and not self._forming:
            self._formed_at = time.monotonic()
            self._waited = self._age(messages[0])
        self._forming.extend(messages)
        size = self.config.instances
        while len(self._forming) >= size or (
            self._forming and time.monotonic() >= self._formed_at + self.config.linger
        ):
            if len(self._pending) >= self.config.concurrency:  # backpressure: the oldest answer first
                wait_futures([self._pending[0].outputs], timeout=self.config.poll)
                return
            chunk, self._forming = self._forming[:size], self._forming[size:]
            now = time.monotonic()
            timeline = Timeline(self._waited, min(self._formed_at, now) if self._formed_at > 0 else now, sent=now)
            self._pending.append(
                Chunk(chunk, self.consumer.memberid(), self.pool.submit(self.score, chunk, timeline), timeline)
            )
            self._formed_at = now
            self._waited = self._age(self._forming[0]) if self._forming else None

    def _age(self, msg: Message) -> float | None:
        """How long ``msg`` waited from its Kafka timestamp to now (None without one)."""
        ts = _timestamp(msg)
        return None if ts is None else max(0.0, self.metrics.wall() - ts / 1000.0)

    def _release(self) -> None:
        """Move the answered micro-batches at the head of the queue (poll order) to the released events.

        Raises:
            Transient: TorchServe did not answer one now (it and everything after it are dropped by the caller).
            StreamError: a refusal no event can fix.
        """
        while self._pending and self._pending[0].outputs.done():
            chunk = self._pending[0]
            outputs = chunk.outputs.result()  # (raises what scoring raised)
            self._pending.popleft()
            chunk.timeline.released = time.monotonic()
            self._released.extend((m, o, chunk.member, None) for m, o in zip(chunk.messages, outputs))
            if outputs:  # the timeline rides on the micro-batch's last event
                m, o, member, _ = self._released[-1]
                self._released[-1] = (m, o, member, chunk.timeline)

    def _hand_over(self) -> None:
        """Commit up to ``batch`` released events on the commit thread."""
        taken, self._released = self._released[: self.config.batch], self._released[self.config.batch :]
        members = {member for _, _, member, _ in taken}  # (one, unless the member rejoined under a new id)
        now = time.monotonic()
        timelines = [t for *_, t in taken if t is not None]
        for t in timelines:
            t.handed = now
        self.commit(
            [m for m, *_ in taken],
            [o for _, o, *_ in taken],
            members.pop() if len(members) == 1 else None,
            timelines,
        )

    def _drain(self) -> None:
        """On stop: send what is forming, wait for the answers (at most :data:`DRAIN_TIMEOUT`), commit them."""
        deadline = time.monotonic() + DRAIN_TIMEOUT
        try:
            while (self._forming or self._pending) and time.monotonic() < deadline:
                self._formed_at = -float("inf")  # due now
                self._form([])
                if self._pending:
                    wait_futures([self._pending[0].outputs], timeout=max(0.0, min(0.1, deadline - time.monotonic())))
                self._release()
        except StreamError as exc:  # (read again by the next member, from the committed offsets)
            logger.warning("stopping: dropped what was not answered (%s)", exc)
        self._discard()
        while self._released and self.finish() is not None:
            self._hand_over()

    def _discard(self) -> list[Message]:
        """Drop what is forming and what was sent (their answers are not used): the events dropped."""
        dropped = [m for c in self._pending for m in c.messages] + self._forming
        for chunk in self._pending:
            chunk.outputs.cancel()
        self._pending.clear()
        self._forming = []
        return dropped

    def _poll(self, timeout: float) -> list[Message]:
        """Up to ``batch`` events: at most ``timeout`` seconds' wait for the first, then only those already fetched.

        ``consume(batch, timeout)`` would wait for a full batch, delaying each event at a low rate. Rebalance
        callbacks run here; errors are counted and logged.
        """
        messages = []
        polled = self.consumer.consume(1, timeout)
        if polled and self.config.batch > 1:
            polled += self.consumer.consume(self.config.batch - 1, 0)
        for msg in polled:
            if msg.error():
                self.counts.errors.append(str(msg.error()))
                logger.warning("consumer error: %s", msg.error())
            else:
                messages.append(msg)
        return messages

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Handle partitions about to go (a rebalance, or the member leaving).

        The commit in flight ends first, under the generation its offsets name; what was polled and not
        yet committed is dropped (the partitions' next owners read it from the committed offsets). If the
        commit failed, the member is rewound at its next step.
        """
        self.assigned = frozenset()
        self.finish(settle=False)
        self._commit_delivered()
        dropped = len(self._discard()) + len(self._released)
        self._released = []
        if dropped:
            logger.info(
                "partitions revoked: dropped %d polled events not committed (their next owner reads them)", dropped
            )

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Take a rebalance's new partitions: paused while the member backs off, else fetching.

        Paused ones resume with the rest when the backoff ends; a partition paused before it was revoked must
        not come back paused.
        """
        consumer.assign(partitions)
        self.assigned = frozenset((tp.topic, tp.partition) for tp in partitions)
        if self._resume_at is not None:
            consumer.pause(partitions)
        elif partitions:
            consumer.resume(partitions)

    def score(self, messages: list[Message], timeline: Timeline | None = None) -> list[tuple[str, bytes]]:
        """Each message's output as (topic, value), in the messages' order; ``timeline.answered`` set at the end.

        TorchServe is asked for the valid ones (:meth:`_answers`).

        Raises:
            Transient: TorchServe did not answer one now (nothing of the batch is written).
            StreamError: TorchServe refused one for a reason no event can fix (unknown model,
                token refused): the consumer stops rather than dead-letter the stream.
        """
        sources = [Source(m.topic(), m.partition(), m.offset(), _timestamp(m)) for m in messages]
        parsed: list[records.Event | bytes] = []
        for msg, source in zip(messages, sources):
            if len(msg.value() or b"") > self.config.max_event_bytes:
                parsed.append(records.too_large(source, len(msg.value()), self.config.max_event_bytes))
                continue
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
                outputs.append(
                    (
                        self.config.dead_letters,
                        records.dead_letter(
                            source, body.get("error") or str(answer), body.get("field"), answer.reason or "refused"
                        ),
                    )
                )
            else:
                outputs.append((self.config.output, records.prediction(source, event, answer)))
        if timeline is not None:
            timeline.answered = time.monotonic()
        return outputs

    def _answers(self, events: list[records.Event]) -> list[dict | TorchServeError]:
        """TorchServe's answer to each event (or its refusal), on this scoring thread.

        ``instances`` > 1: the events in one KServe v1 request; 1: one ``/predictions`` request each.
        """
        if self.config.instances == 1:
            return [self._predict(e) for e in events]
        return self._predict_many(events) if events else []

    def _predict_many(self, events: list[records.Event]) -> list[dict | TorchServeError]:
        """Ask one request for ``events``; if TorchServe refuses it as a whole (400), ask each event alone.

        So each event's refusal (e.g. a wrong feature count) is its own.
        """
        rows = [e.request["features"] if "features" in e.request else e.request for e in events]
        answer = self._ask(lambda: self.client.predict_instances(self.config.model, rows))
        if isinstance(answer, TorchServeError):
            return [self._predict(e) for e in events]
        return answer

    def _predict(self, event: records.Event) -> dict | TorchServeError:
        return self._ask(lambda: self.client.predict(self.config.model, event.request))

    def _ask(self, call: Callable[[], Any]) -> Any:
        """Return ``call``'s answer; a refusal (400, 413) is returned as the error.

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

    def commit(
        self,
        messages: list[Message],
        outputs: list[tuple[str, bytes]],
        member: str | None,
        timelines: list[Timeline] | None = None,
    ) -> bool:
        """Hand ``outputs`` and the offsets after ``messages`` to the commit thread.

        :meth:`finish` takes its outcome; none may be in flight. ``member`` is the member id the events were
        polled under: once it is no longer the consumer's (its session ended while it scored, so the broker
        would refuse the offsets), they are given up here, without the round trip. ``timelines``: those of the
        micro-batches whose last event is among ``messages``.

        Returns:
            Whether they were handed over.
        """
        assert self._in_flight is None, "one commit at a time"
        group = self.consumer.consumer_group_metadata()  # (taken before the check below)
        now = self.consumer.memberid()
        if not member or now != member:
            self._abort(
                f"member {member!r} left group {self.config.group} while it scored (now {now!r}): "
                "its partitions moved to another member",
                opened=False,
            )
            return False
        write = self._transact if self.transactional else self._deliver
        self._in_flight = InFlight(
            messages,
            outputs,
            on_daemon_thread(write, self.producer, messages, outputs, group),
            timelines=timelines or [],
        )
        return True

    def _transact(
        self, producer: Producer, messages: list[Message], outputs: list[tuple[str, bytes]], group: Any
    ) -> float:
        """On the commit thread: one transaction with ``outputs`` in offset order and the offsets after ``messages``.

        It writes at least :data:`MARKER_GRACE` after the previous one committed.

        Returns:
            When it committed (wall clock).

        Raises:
            KafkaException: the transaction failed (:meth:`finish` aborts it).
        """
        grace = self._committed_at + MARKER_GRACE - time.monotonic()
        if grace > 0:
            time.sleep(grace)
        producer.begin_transaction()
        for msg, (topic, value) in zip(messages, outputs):
            producer.produce(topic, key=msg.key(), value=value)
        producer.send_offsets_to_transaction(next_offsets(messages), group, TXN_TIMEOUT)
        producer.commit_transaction(TXN_TIMEOUT)
        self._committed_at = time.monotonic()
        return self.metrics.wall()

    def _deliver(self, producer: Producer, messages: list[Message], outputs: list[tuple[str, bytes]], _: Any) -> float:
        """On the commit thread, at least once: write ``outputs`` and wait until every one is delivered.

        :meth:`finish` then commits the offsets, on the polling thread (a commit made on another thread
        while it polls is answered to the poll, and its caller waits for ever).

        Returns:
            When the last was delivered (wall clock).

        Raises:
            KafkaException: an output was not delivered (:meth:`finish` rewinds to the committed
                offsets, and what was delivered is written again).
        """
        failed: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failed.append(err)

        for msg, (topic, value) in zip(messages, outputs):
            producer.produce(topic, key=msg.key(), value=value, on_delivery=delivered)
        left = producer.flush(TXN_TIMEOUT)
        if failed or left:
            raise KafkaException(failed[0] if failed else KafkaError(KafkaError._MSG_TIMED_OUT, f"{left} undelivered"))
        return self.metrics.wall()

    def finish(self, wait: bool = True, settle: bool = True) -> int | None:
        """Take the outcome of the commit in flight (``wait``: waiting for it; else only if it has ended).

        A commit still running :data:`COMMIT_DEADLINE` after it was handed over is given up as failed
        (a transactional call can hang past its own timeout when the broker restarts under it).

        Its events are counted, or on failure everything not committed is given up (:meth:`_abort`; with
        ``settle``, rewound to the committed offsets now, else at the next step).

        Returns:
            The events it committed (0: none in flight, or still committing), None when it failed.
        """
        done = self._in_flight
        if done is None:
            return 0
        remaining = COMMIT_DEADLINE - (time.monotonic() - done.started)
        if not (wait or done.commit.done() or remaining <= 0):
            return 0
        self._in_flight = None
        try:
            at = done.commit.result(timeout=max(0.0, remaining))
            if not self.transactional:  # the outputs are delivered: their offsets now
                self._commit_offsets(done.messages, wait)
        except KafkaException as exc:
            self._abort(str(exc.args[0]), settle=settle)
            return None
        except FutureTimeout:
            self._abort(f"the commit did not end within {COMMIT_DEADLINE:g} s", settle=settle)
            return None
        self.metrics.committed(done.messages, at)
        self.metrics.stages(done.timelines, time.monotonic())
        self.counts.transactions += 1
        for topic, _ in done.outputs:
            if topic == self.config.output:
                self.counts.predictions += 1
            else:
                self.counts.dead_letters += 1
        return len(done.messages)

    def _commit_offsets(self, messages: list[Message], wait: bool) -> None:
        """At least once: commit the offsets after ``messages`` (``wait``: synchronously, else in the background).

        In the background a failure is only logged (:meth:`_committed`): a later commit carries later
        offsets, and a member that loses its partitions first leaves those events to be written again.

        Raises:
            KafkaException: a synchronous commit failed.
        """
        offsets = next_offsets(messages)
        self._delivered.update({(tp.topic, tp.partition): tp.offset for tp in offsets})
        if not wait:
            self.consumer.commit(offsets=offsets, asynchronous=True)
            return
        for tp in self.consumer.commit(offsets=offsets, asynchronous=False) or []:
            if tp.error is not None:
                raise KafkaException(tp.error)

    def _commit_delivered(self) -> None:
        """At least once, before partitions go: commit every delivered event's offset synchronously.

        A background commit may still be on its way; this one returns once the group has them all.
        """
        if self.transactional or not self._delivered:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in self._delivered.items()]
        self._delivered = {}
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            logger.warning("offset commit failed (%s): those events are written again", exc.args[0])

    def _committed(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The answer to a background offset commit (librdkafka's, served by the poll)."""
        if err is not None:
            logger.warning("offset commit failed (%s): those events are written again if the partitions move", err)

    def _abort(self, why: str, opened: bool = True, settle: bool = True) -> None:
        """Give up everything not committed and seek back to the group's committed offsets (:meth:`_settle`).

        If a commit was ``opened``, its producer is dropped: the next one, with the same transactional id,
        fences it and aborts what it left open (a producer that lost its broker mid-way fails its next
        transaction). Without ``settle``, the seek waits for the next step.
        """
        what = "transaction" if self.transactional else "commit"
        logger.warning("%s failed (%s): aborted, rewinding to the committed offsets", what, why)
        self.counts.aborted += 1
        if opened:
            self.producer = None
        self._discard()
        self._released = []
        self._unsettled = True
        if settle:
            self._settle()

    def _settle(self) -> bool:
        """Recover from a failed commit: a new producer, then each assigned partition at its committed offset.

        The committed offset is the failed commit's real outcome (a commit that timed out may have gone
        through). While the broker cannot answer, the partitions stay paused for a backoff and the next step
        tries again.

        Returns:
            Whether it is done.
        """
        try:
            if self.producer is None:
                self.producer = self._producer()
            assigned = self._assignment()
            if assigned:
                for tp in self.consumer.committed(assigned, timeout=TXN_TIMEOUT):
                    # none committed yet: where the group starts a partition (auto.offset.reset earliest)
                    start = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                    self.consumer.seek(TopicPartition(tp.topic, tp.partition, start))
        except KafkaException as exc:
            self._back_off(f"the broker cannot settle the failed commit yet ({exc.args[0]})")
            return False
        self._unsettled = False
        return True

    def _retry_later(self, exc: Transient) -> None:
        """Drop what was polled and not yet handed to a commit, seek back to its first events, back off."""
        self.counts.retries += 1
        dropped = [m for m, *_ in self._released] + self._discard()
        self._released = []
        self._rewind(dropped)
        self._back_off(f"TorchServe did not answer now ({exc})")

    def _back_off(self, why: str) -> None:
        """Pause the assignment until a backoff (doubling with each failure in a row) has passed.

        :meth:`_hold` polls meanwhile and resumes.
        """
        self.consumer.pause(self._assignment())
        wait = min(self.config.max_backoff, self.config.backoff * 2**self._failures)
        self._failures += 1
        self._resume_at = time.monotonic() + wait
        logger.info("%s; partitions paused, retrying in %.1f s", why, wait)

    def _assignment(self) -> list[TopicPartition]:
        """The partitions the last rebalance gave, as its callbacks recorded them.

        ``consumer.assignment()`` waits on librdkafka's group thread with no limit: a member stuck
        there after a broker restart neither scored nor stopped on SIGTERM.
        """
        return [TopicPartition(topic, partition) for topic, partition in sorted(self.assigned)]

    def _rewind(self, messages: list[Message]) -> None:
        """Seek each partition of ``messages`` back to its first one."""
        for tp in first_offsets(messages):
            self.consumer.seek(tp)

    def _hold(self) -> None:
        """Poll the paused partitions once while backing off, so the member keeps its place in the group.

        :meth:`_on_assign` pauses what it gains. The commit in flight ends meanwhile. When the backoff has
        passed, the partitions assigned then resume.
        """
        self.finish(wait=False)
        remaining = self._resume_at - time.monotonic()
        if remaining > 0:
            stray = self._poll(min(remaining, self.config.poll))
            if stray:  # fetched before the pause took hold: read again after the backoff
                self._rewind(stray)
                self.consumer.pause([TopicPartition(m.topic(), m.partition()) for m in stray])
            return
        self._resume_at = None
        self.consumer.resume(self._assignment())


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


def on_daemon_thread(fn: Callable[..., Any], *args: Any) -> Future:
    """Run ``fn(*args)`` on a daemon thread of its own; its outcome is in the returned future.

    This is the commit thread (one transaction in flight at most); a daemon, because a call stuck in the Kafka
    client (see :data:`COMMIT_DEADLINE`) must never keep the process from exiting, as an executor's worker would.
    """
    future: Future = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 (handed to the waiting step)
            future.set_exception(exc)

    threading.Thread(target=run, name="stream-commit", daemon=True).start()
    return future
