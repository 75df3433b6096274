"""What rtserve asks a Kafka broker through its Admin API: whether it answers, its topics, creating topics."""

from __future__ import annotations

import socket
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from rtserve.errors import StreamError


def listening(bootstrap: str, timeout: float = 1.0) -> bool:
    """Whether a TCP connection to ``bootstrap`` (``host:port``) is accepted.

    Asked before any Kafka client connects, so that a broker still starting does not fill the output with
    librdkafka's refused connections.
    """
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def client(bootstrap: str) -> AdminClient:
    """An Admin API client of ``bootstrap``."""
    # librdkafka's informational lines (level 6, e.g. a closing client's purged queue) stay out
    # of the commands' output; warnings and errors still show.
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})


def topics(bootstrap: str, timeout: float = 10.0) -> dict[str, int]:
    """The broker's topics (internal ``__*`` ones left out), each with its partition count.

    As its metadata answer says; every partition has a leader.

    Raises:
        StreamError: no metadata answer within ``timeout``, or a topic or partition without a
            leader (the message names it).
    """
    try:
        meta = client(bootstrap).list_topics(timeout=timeout)
    except KafkaException as exc:
        raise StreamError(f"the broker at {bootstrap} gave no metadata in {timeout:.0f} s: {exc.args[0]}") from None
    found = {}
    for name, topic in meta.topics.items():
        if name.startswith("__"):
            continue
        if topic.error is not None:
            raise StreamError(f"topic {name} at {bootstrap}: {topic.error.str()}")
        leaderless = [p for p, part in topic.partitions.items() if part.leader < 0]
        if leaderless:
            raise StreamError(f"topic {name} at {bootstrap}: partitions {leaderless} have no leader")
        found[name] = len(topic.partitions)
    return found


def answers(bootstrap: str, timeout: float = 5.0) -> bool:
    """Whether the broker listens and answers a metadata request naming at least one broker."""
    if not listening(bootstrap):
        return False
    try:
        return bool(client(bootstrap).list_topics(timeout=timeout).brokers)
    except KafkaException:
        return False


def create_topics(
    bootstrap: str, names: Iterable[str], partitions: int, timeout: float = 30.0, config: dict[str, str] | None = None
) -> list[str]:
    """Create the topics of ``names`` the broker lacks; returns those created.

    Each gets ``partitions`` partitions, replication 1 and the topic settings ``config`` (e.g.
    ``max.message.bytes``).

    Raises:
        StreamError: the broker refused one (the message names it and says why).
    """
    missing = [n for n in names if n not in topics(bootstrap)]
    if not missing:
        return []
    kafka = client(bootstrap)  # kept until every answer came (its end cancels them)
    futures = kafka.create_topics(
        [NewTopic(n, num_partitions=partitions, replication_factor=1, config=config or {}) for n in missing],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise StreamError(f"topic {name} could not be created at {bootstrap}: {error.str()}") from None
    return created
