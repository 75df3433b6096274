"""rtserve.settings: the RTSERVE_* variables read once into one typed object."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtserve.errors import SettingsError
from rtserve.settings import PACKAGE_HOME, Settings, log_config

pytestmark = pytest.mark.unit


def test_defaults_are_the_checkouts_and_an_empty_variable_is_unset():
    s = Settings.from_env({"RTSERVE_RUN_DIR": "", "RTSERVE_MODELS": "  "})
    assert (s.run_dir, s.model_store, s.config) == (PACKAGE_HOME / ".run", PACKAGE_HOME / "model_store", None)
    assert s.torchserve_config == PACKAGE_HOME / "config.properties"
    assert s.models == () and s.model == "realtime-classifier" and s.gateway_dir is None
    assert s.agent_jar == PACKAGE_HOME / "build" / "agent" / "rtserve-agent.jar"
    assert s.run.history == PACKAGE_HOME / ".run" / "rollout-history.jsonl"
    assert log_config().read_text().lstrip().startswith("<?xml")


def test_the_environment_then_the_command_line():
    env = {
        "RTSERVE_RUN_DIR": "/srv/run",
        "RTSERVE_MODELS": "a=a_1.mar b=b_2.mar",
        "RTSERVE_CONFIG": "/etc/rtserve/config.properties",
        "RTSERVE_GATEWAY_DIR": "/gw",
        "RTSERVE_METRICS_DIR": "/dev/shm/m",
        "RTSERVE_MODEL": "a",
    }
    s = Settings.from_env(env, run_dir=None, model_store=Path("/store"), models=["c=c_3.mar"])
    assert s.run_dir == Path("/srv/run") and s.model_store == Path("/store")  # None: not given
    assert s.models == ("c=c_3.mar",) and s.model == "a"
    assert s.torchserve_config == Path("/etc/rtserve/config.properties")
    assert (s.gateway_dir, s.metrics_dir) == (Path("/gw"), Path("/dev/shm/m"))
    assert s.run.key_file == Path("/srv/run/key_file.json")


def test_unusable_settings_are_refused_when_read():
    with pytest.raises(SettingsError, match="'=x.mar' is not NAME=FILE.mar"):
        Settings.from_env({"RTSERVE_MODELS": "=x.mar"})
    with pytest.raises(SettingsError, match="no such setting: rundir"):
        Settings.from_env({}, rundir="/x")


def test_docs_configuration_lists_every_setting():
    """docs/configuration.md cannot drift: every Settings field and every variable from_env
    reads, every rtserve_* key the server defines or ships, every handler and records key of
    the model config and every key of the gate's file appear in its tables."""
    import ast
    import dataclasses
    import re

    import yaml

    from handler.config import HandlerConfig
    from handler.records import RecordsConfig
    from rtserve.promotion.kinds import KIND_KEYS
    from rtserve.server import disk, properties, warmup
    from rtserve.server.properties import read_properties

    doc = (PACKAGE_HOME / "docs" / "configuration.md").read_text()
    source = (PACKAGE_HOME / "rtserve" / "settings.py").read_text()
    (from_env,) = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "from_env"]
    variables = {
        n.value
        for n in ast.walk(from_env)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"[A-Z][A-Z0-9_]+", n.value)
    }
    assert {"RTSERVE_RUN_DIR", "LOG_LOCATION"} <= variables  # the walk sees them
    names = variables | {f.name for f in dataclasses.fields(Settings)}
    keys = {
        v
        for m in (disk, properties, warmup)
        for k, v in vars(m).items()
        if k.endswith("_KEY") and isinstance(v, str) and v.startswith("rtserve_")
    }
    keys |= {k for k in read_properties(PACKAGE_HOME / "config.properties") if k.startswith("rtserve_")}
    names |= keys
    names |= {f"handler.{f.name}" for f in dataclasses.fields(HandlerConfig)}
    names |= {f"records.{f.name}" for f in dataclasses.fields(RecordsConfig)}
    gate = yaml.safe_load((PACKAGE_HOME / "config" / "gate.yaml").read_text())
    sections = {"live", *KIND_KEYS}
    names |= {k for k in gate if k not in sections}
    names |= {f"live.{section}.{k}" for section, values in gate["live"].items() for k in values}
    names |= {f"{section}.{k}" for section, keys in KIND_KEYS.items() for k in keys}  # each one, shipped or not
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, f"docs/configuration.md does not list: {', '.join(missing)}"
