"""rtserve.settings: the RTSERVE_* variables read once into one typed object."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtserve.errors import SettingsError
from rtserve.settings import PACKAGE_HOME, Settings, log_config

pytestmark = pytest.mark.unit


def test_defaults_are_the_checkouts_and_an_empty_variable_is_unset():
    s = Settings.from_env({"RTSERVE_RUN_DIR": "", "RTSERVE_MODELS": "  "})
    assert (s.run_dir, s.model_store, s.config) == (PACKAGE_HOME / ".run",
                                                    PACKAGE_HOME / "model_store", None)
    assert s.torchserve_config == PACKAGE_HOME / "config.properties"
    assert s.models == () and s.model == "realtime-classifier" and s.gateway_dir is None
    assert s.agent_jar == PACKAGE_HOME / "build" / "agent" / "rtserve-agent.jar"
    assert s.run.history == PACKAGE_HOME / ".run" / "rollout-history.jsonl"
    assert log_config().read_text().lstrip().startswith("<?xml")


def test_the_environment_then_the_command_line():
    env = {"RTSERVE_RUN_DIR": "/srv/run", "RTSERVE_MODELS": "a=a_1.mar b=b_2.mar",
           "RTSERVE_CONFIG": "/etc/rtserve/config.properties", "RTSERVE_GATEWAY_DIR": "/gw",
           "RTSERVE_METRICS_DIR": "/dev/shm/m", "RTSERVE_MODEL": "a"}
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
