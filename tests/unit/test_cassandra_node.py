"""The local Cassandra node's pure parts: its cassandra.yaml, logback configuration and JVM argv,
the ports a start takes, and what stop and status say about a run directory with no node (no
JVM here: the records tier starts the real one)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from rtserve import cli
from rtserve.errors import CassandraNodeError
from rtserve.records import local, node
from rtserve.records.node import Layout

pytestmark = pytest.mark.unit


@pytest.fixture()
def layout(tmp_path) -> Layout:
    return Layout(tmp_path / "run", tmp_path / "libs", {"native": 21042, "storage": 21000}, heap="640m")


def under(path: str | Path, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root.resolve())


def test_the_yaml_has_what_cassandra_requires_on_loopback_with_the_given_ports(layout):
    config = yaml.safe_load(node.cassandra_yaml(layout))
    for required in ("cluster_name", "partitioner", "endpoint_snitch", "commitlog_sync", "seed_provider",
                     "commitlog_sync_period"):
        assert config[required], required
    assert config["listen_address"] == config["rpc_address"] == "127.0.0.1"
    assert config["native_transport_port"] == 21042 and config["storage_port"] == 21000
    (seeds,) = config["seed_provider"]
    assert seeds["parameters"] == [{"seeds": "127.0.0.1:21000"}]  # its own seed: a ring of one
    assert layout.address == "127.0.0.1:21042"
    assert config["num_tokens"] == 1 and config["auto_bootstrap"] is False
    # nothing listens beyond loopback: no other address anywhere in the file
    text = node.cassandra_yaml(layout)
    assert "0.0.0.0" not in text and "localhost" not in text


def test_every_directory_lies_under_the_run_directory(layout):
    config = yaml.safe_load(node.cassandra_yaml(layout))
    dirs = [*config["data_file_directories"], config["commitlog_directory"], config["hints_directory"],
            config["saved_caches_directory"], config["cdc_raw_directory"]]
    assert len(set(dirs)) == 5
    assert all(under(d, layout.run_dir / "data") for d in dirs), dirs
    assert set(layout.directories().values()) == {Path(d) for d in dirs}


def test_the_log_is_one_rolling_size_bounded_file_under_logs(layout):
    root = ET.fromstring(node.logback_xml(layout))
    (appender,) = root.findall("appender")
    assert appender.get("class") == "ch.qos.logback.core.rolling.RollingFileAppender"
    assert appender.findtext("file") == str(layout.logs / "system.log")
    assert appender.find("triggeringPolicy").findtext("maxFileSize") == node.LOG_MAX_SIZE
    policy = appender.find("rollingPolicy")
    assert policy.findtext("fileNamePattern") == f"{layout.logs / 'system.log'}.%i"
    assert int(policy.findtext("maxIndex")) == node.LOG_FILES
    assert root.find("root").get("level") == "INFO"


def test_the_jvm_runs_the_daemon_in_the_foreground_from_the_assembled_classpath(layout):
    argv = node.argv(layout)
    assert argv[0] == "java" and argv[-1] == "org.apache.cassandra.service.CassandraDaemon"
    assert argv[argv.index("-cp") + 1] == str(layout.libs / "*")
    assert "-Xms640m" in argv and "-Xmx640m" in argv
    assert "-Dcassandra-foreground=yes" in argv
    for flag in node.JDK17_ACCESS + node.FAST_START:
        assert flag in argv
    props = dict(a[2:].split("=", 1) for a in argv if a.startswith("-D") and "=" in a)
    assert props["cassandra.config"] == f"file://{layout.config}"
    paths = {k: v.removeprefix("file://") for k, v in props.items() if v.startswith(("/", "file://"))}
    assert set(paths) == {"cassandra.config", "logback.configurationFile", "cassandra.logdir",
                          "cassandra.storagedir", "cassandra.triggers_dir"}
    assert all(under(path, layout.run_dir) for path in paths.values()), paths
    assert props["cassandra.skip_wait_for_gossip_to_settle"] == "0"
    # no JMX port: the node listens on its two ports only
    assert not any("jmx" in a for a in argv)


def test_ports_given_then_recorded_then_free(tmp_path):
    run_dir = tmp_path / "run"
    fresh = local.resolve_ports(run_dir, {})
    assert set(fresh) == {"native", "storage"} and fresh["native"] != fresh["storage"]
    assert local.resolve_ports(run_dir, {"native": 9042})["native"] == 9042
    run_dir.mkdir()
    (run_dir / node.STATE_FILE).write_text(json.dumps({"ports": {"native": 23042, "storage": 23000}}))
    assert local.resolve_ports(run_dir, {}) == {"native": 23042, "storage": 23000}
    assert local.resolve_ports(run_dir, {"storage": 7000}) == {"native": 23042, "storage": 7000}


def test_no_node_in_a_run_directory(tmp_path, capsys):
    assert local.stop(tmp_path) is None
    with pytest.raises(CassandraNodeError, match=r"no Cassandra node was started from .* \(make cassandra\)"):
        local.status(tmp_path)
    assert cli.main(["cassandra", "stop", "--run-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f">> no Cassandra node runs from {tmp_path}\n"
    assert cli.main(["cassandra", "status", "--run-dir", str(tmp_path)]) == 1
    assert cli.main(["cassandra", "address", "--run-dir", str(tmp_path)]) == 1
    assert "error: no Cassandra node was started from" in capsys.readouterr().out


def test_start_without_the_jars_names_the_target_that_assembles_them(layout):
    with pytest.raises(CassandraNodeError, match=r"no Cassandra jars in .*libs: assemble them with "
                                                 r"make cassandra-deps"):
        local.start(layout)
    assert not layout.run_dir.exists()


@pytest.mark.parametrize("option, bad, expected", [
    ("--port", "x", "expected a port in 0-65535"),
    ("--port", "70000", "expected a port in 0-65535"),
    ("--storage-port", "-1", "expected a port in 0-65535"),
    ("--heap", "lots", "expected a heap size such as 768m or 1g"),
    ("--heap", "512", "expected a heap size such as 768m or 1g"),
])
def test_a_bad_option_is_refused_naming_what_it_expects(option, bad, expected, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["cassandra", "start", "--libs", "/nowhere", option, bad])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert option in err and expected in err
