"""The local Kafka broker's pure parts: its server.properties, the argv of its two steps, the
ports a start takes, and what stop and status say about a run directory with no broker (no
broker, no JVM: the stream tier starts the real one)."""

from __future__ import annotations

import base64
import json

import pytest

from rtserve import cli
from rtserve.errors import StreamError
from rtserve.stream import broker, local
from rtserve.stream.broker import Layout

pytestmark = pytest.mark.unit


@pytest.fixture()
def layout(tmp_path) -> Layout:
    return Layout(
        tmp_path / "run", tmp_path / "libs", {"broker": 21001, "controller": 21002}, heap="384m", partitions=3
    )


def properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


def test_one_node_on_loopback_with_its_data_under_the_run_directory(layout):
    props = properties(broker.server_properties(layout))
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:21002"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:21001,CONTROLLER://127.0.0.1:21002"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:21001"
    assert props["log.dirs"] == str(layout.run_dir / "data")
    assert props["num.partitions"] == "3"
    assert props["auto.create.topics.enable"] == "false"
    # transactions and consumer offsets on one node: their internal topics at replication 1
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
    ):
        assert props[key] == "1", key
    assert layout.bootstrap == "127.0.0.1:21001"


def test_the_format_step_and_the_broker_run_the_assembled_classpath(layout):
    fmt = broker.format_argv(layout, "abc")
    assert fmt[0] == "java" and "-Xmx256m" in fmt
    assert fmt[fmt.index("-cp") + 1] == str(layout.libs / "*")
    assert fmt[fmt.index(broker.STORAGE_TOOL) :] == [
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        "abc",
        "--config",
        str(layout.config),
    ]
    run = broker.broker_argv(layout)
    assert "-Xmx384m" in run and run[-2:] == ["kafka.Kafka", str(layout.config)]
    assert f"-Dlog4j2.configurationFile={layout.log4j}" in run


def test_a_cluster_id_is_sixteen_random_bytes_in_url_safe_base64():
    ids = {broker.new_cluster_id() for _ in range(20)}
    assert len(ids) == 20
    for cid in ids:
        assert len(cid) == 22 and "=" not in cid
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch):
    """(The storage tool read ``--cluster-id -...`` as a missing value: a CI run's broker failed
    to format.) An id drawn with a leading ``-`` is drawn again."""
    import uuid

    drawn = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=bytes(range(16)))])
    monkeypatch.setattr(broker.uuid, "uuid4", lambda: next(drawn))
    assert base64.urlsafe_b64encode(b"\xf8" + bytes(15)).decode().startswith("-")
    assert broker.new_cluster_id() == base64.urlsafe_b64encode(bytes(range(16))).decode().rstrip("=")


def test_ports_given_then_recorded_then_free(tmp_path):
    run_dir = tmp_path / "run"
    fresh = local.resolve_ports(run_dir, {})
    assert set(fresh) == {"broker", "controller"} and fresh["broker"] != fresh["controller"]
    assert local.resolve_ports(run_dir, {"broker": 9092})["broker"] == 9092
    run_dir.mkdir()
    (run_dir / broker.STATE_FILE).write_text(json.dumps({"ports": {"broker": 23001, "controller": 23002}}))
    assert local.resolve_ports(run_dir, {}) == {"broker": 23001, "controller": 23002}
    assert local.resolve_ports(run_dir, {"controller": 9093}) == {"broker": 23001, "controller": 9093}


def test_no_broker_in_a_run_directory(tmp_path, capsys):
    assert local.stop(tmp_path) is None
    with pytest.raises(StreamError, match=r"no Kafka broker was started from .* \(make kafka\)"):
        local.status(tmp_path)
    assert cli.main(["kafka", "stop", "--run-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f">> no Kafka broker runs from {tmp_path}\n"
    assert cli.main(["kafka", "status", "--run-dir", str(tmp_path)]) == 1


def test_start_without_the_jars_names_the_target_that_assembles_them(layout):
    with pytest.raises(StreamError, match=r"no Kafka jars in .*libs: assemble them with make kafka-deps"):
        local.start(layout)
    assert not layout.run_dir.exists()


@pytest.mark.parametrize("bad", ["zookeeper=2181", "broker=x", "broker=70000", "broker"])
def test_a_bad_port_option_is_refused_naming_the_ports(bad, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["kafka", "start", "--libs", "/nowhere", "--port", bad])
    assert exit_.value.code == 2
    assert "expected NAME=PORT with NAME one of broker, controller" in capsys.readouterr().err


def test_a_pods_broker_listens_and_advertises_its_ip_and_keeps_the_controller_on_loopback(tmp_path):
    """`kafka run` in deploy/k8s/components/kafka: clients of other pods connect to the pod's IP,
    which the broker gives them in its metadata; the quorum stays inside the pod."""
    pod = Layout(tmp_path, tmp_path / "libs", {"broker": 9092, "controller": 9093}, host="10.244.0.7", console=True)
    props = properties(broker.server_properties(pod))
    assert props["listeners"] == "PLAINTEXT://10.244.0.7:9092,CONTROLLER://127.0.0.1:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://10.244.0.7:9092"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert pod.bootstrap == "10.244.0.7:9092" and pod.log is None and pod.ready == tmp_path / broker.READY_FILE
    six = Layout(tmp_path, tmp_path, {"broker": 9092, "controller": 9093}, host="fd00::7")
    assert six.bootstrap == "[fd00::7]:9092" and six.log == tmp_path / "logs" / broker.LOG_FILE


@pytest.mark.parametrize(
    ("option", "bad", "says"),
    [
        ("--host", "rtserve-kafka-0", "expected an IP address (the pod's: status.podIP), got 'rtserve-kafka-0'"),
        ("--port", "0", "expected a port in 1-65535, got '0'"),
        ("--controller-port", "65536", "expected a port in 1-65535, got '65536'"),
        ("--partitions", "0", "expected a positive whole number, got '0'"),
        ("--heap", "512", "expected a heap size such as 768m or 1g, got '512'"),
    ],
)
def test_run_refuses_a_bad_option_naming_it(tmp_path, capsys, option, bad, says):
    args = {"--libs": str(tmp_path), "--run-dir": str(tmp_path), "--host": "10.0.0.1", option: bad}
    with pytest.raises(SystemExit) as exit_:
        cli.main(["kafka", "run", *[x for pair in args.items() for x in pair]])
    assert exit_.value.code == 2
    assert f"argument {option}: {says}" in capsys.readouterr().err


def test_run_with_one_port_for_both_listeners_or_without_the_jars_says_why(tmp_path, capsys):
    base = ["kafka", "run", "--libs", str(tmp_path / "libs"), "--run-dir", str(tmp_path / "run"), "--host", "10.0.0.1"]
    assert cli.main([*base, "--port", "9093"]) == 1
    assert "error: --port and --controller-port are both 9093: give two ports" in capsys.readouterr().err
    assert cli.main(base) == 1
    assert "error: no Kafka jars in" in capsys.readouterr().err
    assert not (tmp_path / "run" / broker.READY_FILE).exists()
