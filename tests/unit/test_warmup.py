"""Warm-up requests (handler.warmup, rtserve.server.warmup): the handler answers them and records
nothing for them; the settings, the rows sent and the readiness they gate."""

from __future__ import annotations

import json
import zipfile

import pytest

from handler.rtserve_handler import RealTimeHandler
from handler.warmup import HEADER, KEY_ENV
from rtserve.errors import WrongAnswers
from rtserve.server.probe import ready
from rtserve.server.warmup import Rows, WarmupConfig, WarmupError
from rtserve.settings import WARM_FILE
from tests.helpers import MODEL_YAML, features, json_row, make_context, record_batches, route_headers, start_batch

pytestmark = pytest.mark.unit

KEY = "k" * 43


@pytest.fixture()
def warm_handler(trained_dir, server_env, monkeypatch):
    """The handler in a worker whose server gave it a warm-up key (as rtserve.server does)."""
    monkeypatch.setenv(KEY_ENV, KEY)
    ctx = make_context(trained_dir, MODEL_YAML)
    handler = RealTimeHandler()
    handler.initialize(ctx)
    yield handler, ctx
    handler.telemetry.close()


def handle(handler, ctx, keys: list[str | None]) -> list[dict]:
    """One batch of predictions, request i with the warm-up header ``keys[i]`` (None: without)."""
    headers = [{**route_headers(False), **({HEADER: k} if k is not None else {})} for k in keys]
    start_batch(ctx, len(keys), headers)
    out = handler.handle([json_row({"features": features(value=i)}) for i in range(len(keys))], ctx)
    return [json.loads(o) for o in out]


def requests_seen(handler) -> float:
    return (
        handler.telemetry.metrics.registry.get_sample_value(
            "rtserve_handler_requests_total", {"model_name": "realtime-classifier", "model_version": "1.0"}
        )
        or 0.0
    )


def test_a_warm_up_batch_is_answered_but_not_recorded(warm_handler, server_env):
    handler, ctx = warm_handler
    answers = handle(handler, ctx, [KEY, KEY, KEY])
    assert [a["model_version"] for a in answers] == ["1.0"] * 3
    assert all(len(a["probabilities"]) == 3 for a in answers)
    assert requests_seen(handler) == 0
    assert handler.telemetry.buffer._rows == 0 and handler.telemetry.drift.rows == 0
    assert record_batches(server_env / "records") == []


@pytest.mark.parametrize(
    "keys",
    [
        [KEY, None],  # shares a batch with a client request: all recorded
        ["x" * 43],  # a client guessing: recorded
        [KEY[:-1] + "x", KEY],  # one character off
        [None],
    ],
)
def test_anything_else_is_recorded(warm_handler, server_env, keys):
    handler, ctx = warm_handler
    handle(handler, ctx, keys)
    assert requests_seen(handler) == len(keys)
    assert record_batches(server_env / "records") == [(len(keys), len(keys), 0)]


def test_without_a_key_from_the_server_nothing_is_a_warm_up(trained_dir, server_env, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    ctx = make_context(trained_dir, MODEL_YAML)
    handler = RealTimeHandler()
    handler.initialize(ctx)
    try:
        assert handler.warmup_key is None
        handle(handler, ctx, [KEY, ""])
        assert requests_seen(handler) == 2
    finally:
        handler.telemetry.close()


def test_settings_from_config_properties():
    assert WarmupConfig.from_props({}) == WarmupConfig(300, 2.0, 4)
    assert WarmupConfig.from_props({"rtserve_warmup_requests": "0"}).requests == 0
    got = WarmupConfig.from_props(
        {"rtserve_warmup_requests": "50", "rtserve_warmup_seconds": "0.5", "rtserve_warmup_concurrency": "1"}
    )
    assert got == WarmupConfig(50, 0.5, 1)


def test_the_defaults_are_what_the_shipped_configs_run_with():
    """WarmupConfig owns the defaults: the pod's config.properties sets no warm-up key, and the
    checkout's states the same values."""
    from rtserve.server.properties import read_properties
    from tests.conftest import REPO

    pod = read_properties(REPO / "deploy" / "k8s" / "base" / "config.properties")
    assert not [key for key in pod if key.startswith("rtserve_warmup_")]
    assert WarmupConfig.from_props(read_properties(REPO / "config.properties")) == WarmupConfig()


@pytest.mark.parametrize(
    "props,message",
    [
        ({"rtserve_warmup_requests": "many"}, "must be whole numbers"),
        ({"rtserve_warmup_requests": "-1"}, r"rtserve_warmup_requests must be in \[0, 10000\], got -1"),
        ({"rtserve_warmup_seconds": "nan"}, r"rtserve_warmup_seconds must be in \[0.1, 60\]"),
        ({"rtserve_warmup_seconds": "0"}, r"rtserve_warmup_seconds must be in \[0.1, 60\], got 0.0"),
        ({"rtserve_warmup_concurrency": "0"}, r"rtserve_warmup_concurrency must be in \[1, 64\], got 0"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(props, message):
    with pytest.raises(WarmupError, match=message):
        WarmupConfig.from_props(props)


def test_rows_are_the_archives_golden_set_or_zeros_of_its_width(tmp_path, trained_dir):
    meta = json.loads((trained_dir / "meta.json").read_text())
    mar = tmp_path / "m.mar"
    with zipfile.ZipFile(mar, "w") as zf:
        zf.writestr("meta.json", json.dumps(meta))
    rows = Rows.from_mar(mar)
    assert rows.features == meta["golden"]["features"] and len(rows.features) > 100
    assert rows.probabilities == meta["golden"]["probabilities"]
    bare = tmp_path / "bare.mar"
    with zipfile.ZipFile(bare, "w") as zf:
        zf.writestr("meta.json", json.dumps({**meta, "golden": {}}))
    assert Rows.from_mar(bare) == Rows([[0.0] * 32], None)
    with pytest.raises(WarmupError, match="cannot read meta.json from"):
        Rows.from_mar(tmp_path / "missing.mar")


def test_the_probe_is_not_ready_before_the_warm_up_is_done(tmp_path):
    (tmp_path / "key_file.json").write_text("{}")
    result = ready(tmp_path, "realtime-classifier")
    assert not result.ok
    assert result.message == "warming up: the server has not finished its start-up warm-up"
    (tmp_path / WARM_FILE).write_text("1\n")
    assert ready(tmp_path, "realtime-classifier").message.startswith("not ready:")  # no server here


def test_a_wrong_answer_stops_the_warm_up():
    """Each warm-up answer must be a 200 with the golden row's class and probabilities."""
    from rtserve.client.rest import Client
    from rtserve.server.warmup import _Sender

    rows = Rows([[0.0, 1.0]], [[0.2, 0.8]])
    sender = _Sender(Client("http://127.0.0.1:9", "http://127.0.0.1:9"), "m", KEY, rows, deadline=0)
    sender._check(0, 200, b'{"prediction": 1, "probabilities": [0.2, 0.8000001]}')
    for body in (b'{"prediction": 1, "probabilities": [0.3, 0.7]}', b'{"prediction": 0, "probabilities": [0.2, 0.8]}'):
        with pytest.raises(
            WrongAnswers,
            match=r"m answered golden row 0 of its archive with .* "
            r"the served model is not the one packaged",
        ):
            sender._check(0, 200, body)
    with pytest.raises(WarmupError, match="warm-up request to m answered 503"):
        sender._check(0, 503, b'{"code": 503}')
    unchecked = _Sender(
        Client("http://127.0.0.1:9", "http://127.0.0.1:9"), "m", KEY, Rows([[0.0, 1.0]], None), deadline=0
    )
    unchecked._check(0, 200, b'{"prediction": 4}')  # no golden set: only the answer's form
    with pytest.raises(WarmupError, match="answered 200"):
        unchecked._check(0, 200, b'{"error": "x"}')


def test_wrong_answers_stop_the_foreground_server_instead_of_retrying():
    """A model that answers its golden rows wrongly will never do better: the container's server
    stops (exit 1) rather than trying again forever behind a failing readiness probe."""
    import threading

    from rtserve.server.torchserve import _ready_in_background

    class Wrong:
        model_names = ["m"]
        calls = 0

        def wait_ready(self, models):
            self.calls += 1
            raise WrongAnswers("m answered golden row 3 of its archive with ...")

    server, stopping, wrong = Wrong(), threading.Event(), threading.Event()
    _ready_in_background(server, stopping, wrong, pause=0.01)
    assert server.calls == 1 and wrong.is_set() and stopping.is_set()
