"""The local Cassandra node's pure parts: its cassandra.yaml, logback configuration and JVM argv,
the ports a start takes, and what stop and status say about a run directory with no node (no
JVM here: the records tier starts the real one)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from rtserve import cli
from rtserve.errors import CassandraNodeError
from rtserve.records import foreground, local, node
from rtserve.records.node import Layout
from tests.conftest import REPO

pytestmark = pytest.mark.unit


@pytest.fixture()
def layout(tmp_path) -> Layout:
    return Layout(tmp_path / "run", tmp_path / "libs", {"native": 21042, "storage": 21000}, heap="640m")


def under(path: str | Path, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root.resolve())


def test_the_yaml_has_what_cassandra_requires_on_loopback_with_the_given_ports(layout):
    config = yaml.safe_load(node.cassandra_yaml(layout))
    for required in (
        "cluster_name",
        "partitioner",
        "endpoint_snitch",
        "commitlog_sync",
        "seed_provider",
        "commitlog_sync_period",
    ):
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
    dirs = [
        *config["data_file_directories"],
        config["commitlog_directory"],
        config["hints_directory"],
        config["saved_caches_directory"],
        config["cdc_raw_directory"],
    ]
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
    assert set(paths) == {
        "cassandra.config",
        "logback.configurationFile",
        "cassandra.logdir",
        "cassandra.storagedir",
        "cassandra.triggers_dir",
    }
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
    assert "error: no Cassandra node was started from" in capsys.readouterr().err


def test_start_without_the_jars_names_the_target_that_assembles_them(layout):
    with pytest.raises(
        CassandraNodeError,
        match=r"no Cassandra jars in .*libs: assemble them with "
        r"make cassandra-deps",
    ):
        local.start(layout)
    assert not layout.run_dir.exists()


#: The options each command needs besides the one under test.
COMMANDS = {
    "start": ["--libs", "/nowhere"],
    "run": ["--libs", "/nowhere", "--run-dir", "/nowhere", "--host", "10.244.0.7"],
}


@pytest.mark.parametrize(
    "command, option, bad, expected",
    [
        ("start", "--port", "x", "expected a port in 0-65535"),
        ("start", "--port", "70000", "expected a port in 0-65535"),
        ("start", "--storage-port", "-1", "expected a port in 0-65535"),
        ("start", "--heap", "lots", "expected a heap size such as 768m or 1g"),
        ("start", "--heap", "512", "expected a heap size such as 768m or 1g"),
        ("run", "--host", "", "expected an IP address (the pod's: status.podIP)"),
        ("run", "--host", "rtserve-cassandra-0", "expected an IP address (the pod's: status.podIP)"),
        ("run", "--port", "0", "expected a port in 1-65535"),
        ("run", "--storage-port", "65536", "expected a port in 1-65535"),
        ("run", "--heap", "1t", "expected a heap size such as 768m or 1g"),
    ],
)
def test_a_bad_option_is_refused_naming_what_it_expects(command, option, bad, expected, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["cassandra", command, *COMMANDS[command], option, bad])  # the last one counts
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert option in err and expected in err


@pytest.fixture()
def pod_layout(tmp_path) -> Layout:
    """A node as a pod runs it: on the pod's IP, the default ports, its log on the console too."""
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "cassandra-all-5.0.6.jar").write_bytes(b"")  # a name only: no JVM starts here
    return Layout(tmp_path / "volume", libs, {"native": 9042, "storage": 7000}, host="10.244.0.7", console=True)


def test_a_pods_node_listens_and_gossips_on_the_pods_ip(pod_layout):
    config = yaml.safe_load(node.cassandra_yaml(pod_layout))
    assert config["listen_address"] == config["rpc_address"] == "10.244.0.7"
    (seeds,) = config["seed_provider"]
    assert seeds["parameters"] == [{"seeds": "10.244.0.7:7000"}]
    assert pod_layout.address == "10.244.0.7:9042"
    assert "127.0.0.1" not in node.cassandra_yaml(pod_layout)
    six = Layout(pod_layout.run_dir, pod_layout.libs, pod_layout.ports, host="fd00::7")
    assert six.address == "[fd00::7]:9042"
    assert yaml.safe_load(node.cassandra_yaml(six))["seed_provider"][0]["parameters"] == [{"seeds": "[fd00::7]:7000"}]


def test_a_pods_node_logs_to_its_file_and_the_console(pod_layout, layout):
    root = ET.fromstring(node.logback_xml(pod_layout))
    appenders = {a.get("name"): a.get("class") for a in root.findall("appender")}
    assert appenders == {
        "FILE": "ch.qos.logback.core.rolling.RollingFileAppender",
        "STDOUT": "ch.qos.logback.core.ConsoleAppender",
    }
    assert [r.get("ref") for r in root.find("root").findall("appender-ref")] == ["FILE", "STDOUT"]
    assert {a.findtext("encoder/pattern") for a in root.findall("appender")} == {node.LOG_PATTERN}
    quiet = ET.fromstring(node.logback_xml(layout))  # make cassandra's: the file only
    assert [a.get("name") for a in quiet.findall("appender")] == ["FILE"]


def test_run_writes_the_configuration_then_becomes_the_jvm(pod_layout, monkeypatch):
    """``execv`` is a recorder: the process would become the JVM (the image's test is the cluster
    tier, where the node's pod runs it)."""
    became = []
    monkeypatch.chdir(pod_layout.libs)
    foreground.run(pod_layout, execv=lambda path, argv: became.append((path, argv)))
    ((path, argv),) = became
    assert argv == node.argv(pod_layout) and Path(path).name == "java" and Path(path).is_absolute()
    assert yaml.safe_load(pod_layout.config.read_text())["listen_address"] == "10.244.0.7"
    assert "STDOUT" in pod_layout.logback.read_text()
    assert all(d.is_dir() for d in pod_layout.directories().values())
    assert Path.cwd() == pod_layout.run_dir  # where a crash's hs_err file goes


def test_run_without_the_jars_or_java_says_what_is_missing(pod_layout, tmp_path, monkeypatch):
    bare = Layout(tmp_path / "other", tmp_path / "nolibs", pod_layout.ports, host="10.244.0.7")
    with pytest.raises(CassandraNodeError, match="no Cassandra jars in .*nolibs: assemble them with"):
        foreground.run(bare, execv=lambda *_: pytest.fail("no JVM without its jars"))
    javaless = Layout(pod_layout.run_dir, pod_layout.libs, pod_layout.ports, java="no-such-java-17", host="10.244.0.7")
    with pytest.raises(CassandraNodeError, match="no no-such-java-17 on PATH: the node needs Java 17"):
        foreground.run(javaless, execv=lambda *_: pytest.fail("no JVM"))


def test_the_pods_entry_command_needs_no_package_but_pyyaml():
    """The records store's image holds rtserve's code and PyYAML only (deploy/cassandra/Containerfile):
    `python -m rtserve cassandra run` imports nothing else outside the standard library."""
    script = (
        "import sys, runpy\n"
        "sys.argv = ['rtserve', 'cassandra', 'run', '--help']\n"
        "try:\n    runpy.run_module('rtserve', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "import rtserve.records.foreground\n"
        "print(sorted({n.split('.')[0] for n, m in list(sys.modules.items())\n"
        "              if 'site-packages' in (getattr(m, '__file__', None) or '')}))"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    installed = set(ast.literal_eval(done.stdout.splitlines()[-1]))
    assert installed - {"_distutils_hack"} == {"yaml"}  # (setuptools' hook, which site loads)
