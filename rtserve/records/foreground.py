"""Run one Cassandra node in the foreground as a pod's main process: write its configuration, become its JVM.

``python -m rtserve cassandra run`` in deploy/k8s/components/cassandra; the kubelet then signals the JVM itself.
Imports only the standard library and :mod:`rtserve.records.node` (the image holds no driver); ``make
cassandra`` (:mod:`rtserve.records.local`) uses :func:`prepare` too.
"""

from __future__ import annotations

import os
import shutil

from rtserve.errors import CassandraNodeError
from rtserve.records import node
from rtserve.records.node import Layout


def prepare(layout: Layout, fresh: bool = False) -> None:
    """Make the node's directories and write its configuration (cassandra.yaml, logback.xml).

    With ``fresh``, delete its data (every record) first.

    Raises:
        CassandraNodeError: the classpath lacks Cassandra (nothing is deleted then).
    """
    if not any(layout.libs.glob("cassandra-all-*.jar")):
        raise CassandraNodeError(f"no Cassandra jars in {layout.libs}: assemble them with make cassandra-deps")
    if fresh:
        shutil.rmtree(layout.data, ignore_errors=True)
    for directory in (layout.logs, layout.triggers, *layout.directories().values()):
        directory.mkdir(parents=True, exist_ok=True)
    layout.config.write_text(node.cassandra_yaml(layout))
    layout.logback.write_text(node.logback_xml(layout))


def run(layout: Layout, execv=os.execv) -> None:
    """Run the node in the foreground: :func:`prepare`, then replace this process with its JVM (``execv``).

    So the JVM receives the container's signals itself (SIGTERM: it drains).

    Raises:
        CassandraNodeError: the classpath lacks Cassandra, or ``java`` cannot be found.
    """
    prepare(layout)
    argv = node.argv(layout)
    java = shutil.which(argv[0])
    if java is None:
        raise CassandraNodeError(f"no {argv[0]} on PATH: the node needs Java 17")
    os.chdir(layout.run_dir)  # where the JVM writes a crash's hs_err file
    execv(java, argv)
