"""Pure builders of the local Kafka broker: layout, server.properties, log config, format and broker argv.

One JVM is both KRaft controller and broker, a one-voter quorum: clients' listener on 127.0.0.1 (``make kafka``)
or on a pod's IP (``python -m rtserve kafka run`` in deploy/k8s/components/kafka), the controller's always on
127.0.0.1; its classpath is what ``make kafka-deps`` fills. Nothing here starts a process
(:mod:`rtserve.stream.local` does).
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
#: The ports of one node: clients' listener and the controller's (the KRaft quorum).
PORT_NAMES = ("broker", "controller")
#: The node's id in the quorum (one node: it is the only voter).
NODE_ID = 1
#: The topics ``make kafka`` creates: the stream's input, its output and its dead letters.
TOPICS = ("events", "predictions", "events.dlq")
#: Main classes in ``kafka_2.13``: the storage format step and the broker itself.
STORAGE_TOOL = "kafka.tools.StorageTool"
BROKER_MAIN = "kafka.Kafka"
#: The files of a run directory.
STATE_FILE = "state.json"
PID_FILE = "kafka.pid"
CONFIG_FILE = "server.properties"
LOG4J_FILE = "log4j2.properties"
LOG_FILE = "kafka.log"
#: Written once the broker answers and its topics are led (a pod's readiness probe reads it).
READY_FILE = "ready"


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class Layout:
    """Where one broker lives and how it runs.

    Attributes:
        run_dir: the node's directory: config, data (``data/``), logs (``logs/``), PID file, state.
        libs: the classpath directory (every jar in it).
        ports: ``broker`` port (on ``host``) and ``controller`` port (on 127.0.0.1).
        heap: the JVM's maximum heap, as ``-Xmx`` takes it (``512m``).
        partitions: the partitions of each topic the target creates (and the default of others).
        java: the ``java`` program.
        host: the address clients' listener binds and advertises (a pod's IP in a pod, where
            clients come from other pods).
        console: the JVM's output goes to this process's standard output (a pod's broker:
            ``kubectl logs``), not to ``logs/kafka.log``.
    """

    run_dir: Path
    libs: Path
    ports: dict[str, int]
    heap: str = "512m"
    partitions: int = 4
    java: str = "java"
    host: str = HOST
    console: bool = False

    @property
    def bootstrap(self) -> str:
        """What clients connect to: ``<host>:<broker port>``."""
        return host_port(self.host, self.ports["broker"])

    @property
    def data(self) -> Path:
        return self.run_dir / "data"

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    @property
    def config(self) -> Path:
        return self.run_dir / CONFIG_FILE

    @property
    def log4j(self) -> Path:
        return self.run_dir / LOG4J_FILE

    @property
    def log(self) -> Path | None:
        """The JVM's output file; None in ``console`` mode (it shares this process's output)."""
        return None if self.console else self.logs / LOG_FILE

    @property
    def ready(self) -> Path:
        """The file :data:`READY_FILE`, present while the broker runs with its topics."""
        return self.run_dir / READY_FILE

    def formatted(self) -> bool:
        """Whether the data directory holds a formatted node (its ``meta.properties``)."""
        return (self.data / "meta.properties").is_file()


def new_cluster_id() -> str:
    """A random cluster id as Kafka writes one: 16 bytes, URL-safe base64 without padding.

    Never starting with ``-`` (as Kafka's own ``Uuid.randomUuid``): the storage tool's argument parser reads
    ``--cluster-id -x...`` as a missing value.
    """
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found


def server_properties(layout: Layout) -> str:
    """The broker's ``server.properties``: one node, clients' listener on ``host``, data under the run directory.

    The internal topics (offsets, transactions) get replication 1 and a few partitions: their defaults
    (3 replicas, 50 partitions) cannot be met or cost seconds on a single small node.
    """
    controller = host_port(HOST, layout.ports["controller"])
    settings = {
        "process.roles": "broker,controller",
        "node.id": NODE_ID,
        "controller.quorum.voters": f"{NODE_ID}@{controller}",
        "listeners": f"PLAINTEXT://{layout.bootstrap},CONTROLLER://{controller}",
        "advertised.listeners": f"PLAINTEXT://{layout.bootstrap}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": layout.data,
        "num.partitions": layout.partitions,
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": 1,
        "offsets.topic.num.partitions": 4,
        "transaction.state.log.replication.factor": 1,
        "transaction.state.log.min.isr": 1,
        "transaction.state.log.num.partitions": 4,
        "share.coordinator.state.topic.replication.factor": 1,
        "share.coordinator.state.topic.min.isr": 1,
        # A consumer group's first member starts at once (the default waits 3 s for others).
        "group.initial.rebalance.delay.ms": 0,
        # Two cores: few threads.
        "num.network.threads": 2,
        "num.io.threads": 2,
        "background.threads": 2,
    }
    lines = [f"{key}={value}" for key, value in settings.items()]
    return "# Written by rtserve (rtserve/stream/broker.py) at each start; edits are lost.\n" + "\n".join(lines) + "\n"


def log4j_config() -> str:
    """The JVM's log configuration (log4j2 properties): one line per event on stdout.

    :func:`rtserve.runtime.process.spawn` appends stdout to ``logs/kafka.log``; each config class's dump of
    every setting at start (hundreds of lines) is kept out (WARN only).
    """
    return "\n".join(
        (
            "status = warn",
            "appender.out.type = Console",
            "appender.out.name = out",
            "appender.out.layout.type = PatternLayout",
            "appender.out.layout.pattern = [%d] %p %m (%c)%n",
            "rootLogger.level = INFO",
            "rootLogger.appenderRef.out.ref = out",
            "logger.config.name = org.apache.kafka.common.config.AbstractConfig",
            "logger.config.level = WARN",
            "",
        )
    )


def _jvm(layout: Layout, heap: str) -> list[str]:
    return [
        layout.java,
        f"-Xmx{heap}",
        "-Xms64m",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={layout.log4j}",
        "-cp",
        str(layout.libs / "*"),
    ]


def format_argv(layout: Layout, cluster_id: str) -> list[str]:
    """The storage format step: writes ``meta.properties`` and the bootstrap metadata into the data directory.

    Once per data directory; the broker refuses an unformatted one.
    """
    return [*_jvm(layout, "256m"), STORAGE_TOOL, "format", "--cluster-id", cluster_id, "--config", str(layout.config)]


def broker_argv(layout: Layout) -> list[str]:
    """The broker and controller in one JVM."""
    return [*_jvm(layout, layout.heap), BROKER_MAIN, str(layout.config)]
