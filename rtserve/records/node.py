"""Pure builders of one Cassandra node: its layout, cassandra.yaml, logback configuration and JVM argv.

One node, its own seed, on one address (127.0.0.1, or the pod's IP) with a CQL and a storage port, no JMX;
every file lives under the run directory, the classpath is what ``make cassandra-deps`` fills. Nothing here
starts a process (:mod:`rtserve.records.local` and :mod:`rtserve.records.foreground` do).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import yaml

HOST = "127.0.0.1"
#: The ports of one node: CQL clients' (native protocol) and the node-to-node storage port.
PORT_NAMES = ("native", "storage")
MAIN_CLASS = "org.apache.cassandra.service.CassandraDaemon"
CLUSTER_NAME = "rtserve"
#: The files of a run directory.
STATE_FILE = "state.json"
PID_FILE = "cassandra.pid"
CONFIG_FILE = "cassandra.yaml"
LOGBACK_FILE = "logback.xml"
#: The JVM's own output (what it prints before logging starts, and a crash's last words).
OUT_FILE = "cassandra.out"
#: The node's log, rolled over at ``LOG_MAX_SIZE`` with ``LOG_FILES`` old files kept.
LOG_FILE = "system.log"
LOG_MAX_SIZE = "20MB"
LOG_FILES = 3
#: Each log line: level, thread, time, logger, message.
LOG_PATTERN = "%-5level [%thread] %date{ISO8601} %logger{0} - %msg%n"
#: The data directories under ``data/``, as cassandra.yaml names them.
DIRECTORIES = {
    "data_file_directories": "data",
    "commitlog_directory": "commitlog",
    "hints_directory": "hints",
    "saved_caches_directory": "saved_caches",
    "cdc_raw_directory": "cdc_raw",
}
#: Where Cassandra looks for trigger jars (none: an empty directory, so it does not warn).
TRIGGERS = "triggers"


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class Layout:
    """Where one node lives and how it runs.

    Attributes:
        run_dir: the node's directory: config, data (``data/``), logs (``logs/``), PID file, state.
        libs: the classpath directory (every jar in it).
        ports: ``native`` and ``storage`` ports on ``host``.
        heap: the JVM's heap (minimum and maximum), as ``-Xmx`` takes it (``512m``: the node
            takes 100,000 records at its full write rate and reads them back; its resident
            memory is then about 1 GB, Cassandra locking all of it with mlockall).
        java: the ``java`` program (Java 17).
        host: the address the node listens on, gives its clients and gossips as its own seed
            (the pod's IP in a pod, where clients come from other pods).
        console: the log goes to the standard output too (a pod's node: ``kubectl logs``).
    """

    run_dir: Path
    libs: Path
    ports: dict[str, int]
    heap: str = "512m"
    java: str = "java"
    host: str = HOST
    console: bool = False

    @property
    def address(self) -> str:
        """What CQL clients connect to: ``<host>:<native port>``."""
        return host_port(self.host, self.ports["native"])

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
    def logback(self) -> Path:
        return self.run_dir / LOGBACK_FILE

    def directories(self) -> dict[str, Path]:
        """cassandra.yaml's directory settings, each a directory under ``data/``."""
        return {key: self.data / name for key, name in DIRECTORIES.items()}

    @property
    def triggers(self) -> Path:
        return self.data / TRIGGERS


def cassandra_yaml(layout: Layout) -> str:
    """The node's ``cassandra.yaml``.

    The settings Cassandra 5.0 refuses to start without, its address and ports, the directories, and a few
    single-node choices (commented).
    """
    dirs = {key: str(path) for key, path in layout.directories().items()}
    dirs["data_file_directories"] = [dirs["data_file_directories"]]
    settings = {
        # Required: Cassandra names each one missing at start.
        "cluster_name": CLUSTER_NAME,
        "partitioner": "org.apache.cassandra.dht.Murmur3Partitioner",
        "endpoint_snitch": "SimpleSnitch",
        "commitlog_sync": "periodic",
        "commitlog_sync_period": "10000ms",
        "seed_provider": [
            {
                "class_name": "org.apache.cassandra.locator.SimpleSeedProvider",
                "parameters": [{"seeds": host_port(layout.host, layout.ports["storage"])}],
            }
        ],
        **dirs,
        # One address (loopback for make cassandra, the pod's IP in a pod), the given ports.
        "listen_address": layout.host,
        "rpc_address": layout.host,
        "storage_port": layout.ports["storage"],
        "native_transport_port": layout.ports["native"],
        "start_native_transport": True,
        # One token: a ring of one owns everything; token allocation for vnodes is skipped.
        "num_tokens": 1,
        # A node that is its own seed never bootstraps (said, not inferred).
        "auto_bootstrap": False,
        # No client authentication: the node listens on loopback only, or in a pod whose
        # NetworkPolicy admits only the rtserve pods.
        "authenticator": "AllowAllAuthenticator",
        "authorizer": "AllowAllAuthorizer",
        # A dropped or truncated table is gone (no snapshot kept on disk).
        "auto_snapshot": False,
        # The store writes unlogged batches of up to about 35 KiB (rtserve.records.store), the
        # records_by_id ones across the partitions this node holds: on a ring of one they cost
        # nothing extra, so neither is worth a warning per batch (defaults: 5 KiB, 10 partitions).
        "batch_size_warn_threshold": "64KiB",
        "unlogged_batch_across_partitions_warn_threshold": 1000,
    }
    return "# Written by rtserve (rtserve/records/node.py) at each start; edits are lost.\n" + yaml.safe_dump(
        settings, sort_keys=False
    )


def logback_xml(layout: Layout) -> str:
    """The node's logback configuration: INFO and above into ``logs/system.log``, and to stdout with ``console``.

    The log rolls over at ``LOG_MAX_SIZE`` with ``LOG_FILES`` older files kept, so the logs stay bounded.
    """
    log = escape(str(layout.logs / LOG_FILE))
    encoder = f"<encoder>\n      <pattern>{LOG_PATTERN}</pattern>\n    </encoder>"
    console = (
        f"""
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    {encoder}
  </appender>"""
        if layout.console
        else ""
    )
    console_ref = '\n    <appender-ref ref="STDOUT"/>' if layout.console else ""
    return f"""<!-- Written by rtserve (rtserve/records/node.py) at each start; edits are lost. -->
<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.rolling.RollingFileAppender">
    <file>{log}</file>
    <rollingPolicy class="ch.qos.logback.core.rolling.FixedWindowRollingPolicy">
      <fileNamePattern>{log}.%i</fileNamePattern>
      <minIndex>1</minIndex>
      <maxIndex>{LOG_FILES}</maxIndex>
    </rollingPolicy>
    <triggeringPolicy class="ch.qos.logback.core.rolling.SizeBasedTriggeringPolicy">
      <maxFileSize>{LOG_MAX_SIZE}</maxFileSize>
    </triggeringPolicy>
    {encoder}
  </appender>{console}
  <root level="INFO">
    <appender-ref ref="FILE"/>{console_ref}
  </root>
</configuration>
"""


#: What Java 17 must open to Cassandra 5.0's unnamed module (FileUtils' direct buffer cleaner,
#: NativeLibrary's file descriptors): a start without them exits at once naming the package.
JDK17_ACCESS = (
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-exports=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
)
#: System properties that shorten a single node's start.
FAST_START = (
    # Gossip's wait for the ring's state to settle (at least 5 s when it runs): a ring of one
    # has no one to hear from.
    "-Dcassandra.skip_wait_for_gossip_to_settle=0",
    # The memtable's per-row heap overhead, otherwise estimated at each start by building
    # 100,000 rows (about 4 s on 2 cores); 180 bytes is what that estimate finds on this JVM.
    "-Dcassandra.memtable.row_overhead_size=180",
)


def argv(layout: Layout) -> list[str]:
    """The node's JVM command line, the main class in the foreground.

    A fixed heap, G1, Java 17's module access, the fast-start properties, its config and logback files and
    its directories.
    """
    return [
        layout.java,
        f"-Xms{layout.heap}",
        f"-Xmx{layout.heap}",
        "-XX:+UseG1GC",
        # A node out of memory stops (Cassandra warns at start without one of these).
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        *JDK17_ACCESS,
        *FAST_START,
        "-Dcassandra-foreground=yes",
        f"-Dcassandra.config=file://{layout.config}",
        f"-Dlogback.configurationFile={layout.logback}",
        f"-Dcassandra.logdir={layout.logs}",
        f"-Dcassandra.storagedir={layout.data}",
        f"-Dcassandra.triggers_dir={layout.triggers}",
        "-cp",
        str(layout.libs / "*"),
        MAIN_CLASS,
    ]
