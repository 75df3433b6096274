"""A listener's port taken by another process before TorchServe binds it: the frontend exits
during start-up, rtserve names the listener and the reason (PortInUseError), and the tests'
``serving`` starts again on fresh ports unless the caller chose that port.

The port is held by a real listening socket of this test; only which port the helper reserves
first is chosen here (the race it stands for, another process binding a reserved port before the
JVM does, cannot be timed)."""

from __future__ import annotations

import logging
import socket
from contextlib import closing

import pytest

from rtserve.errors import PortInUseError
from rtserve.runtime import ports
from rtserve.server.startup import port_of
from rtserve.testing import server as local
from tests.conftest import MODEL_NAME

pytestmark = pytest.mark.integration


@pytest.fixture()
def taken():
    """A loopback port another process holds (a listening socket)."""
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_port_the_caller_chose_is_named_and_not_tried_again(mar_v1, tmp_path, taken, caplog):
    address = f"http://127.0.0.1:{taken}"
    with pytest.raises(PortInUseError) as failed:
        with local.serving(
            tmp_path / "run", mar_v1.parent, [f"{MODEL_NAME}={mar_v1.name}"], {"inference_address": address}
        ):
            pass
    assert failed.value.port == taken
    assert str(failed.value).splitlines()[0] == (
        f"TorchServe exited during start-up: it could not listen on {address} "
        "(inference_address): Address already in use; another process took the port"
    )
    assert "lost a port" not in caplog.text


def test_a_port_taken_after_it_was_reserved_gets_a_new_start(mar_v1, tmp_path, taken, caplog, monkeypatch):
    reserved = []

    def first_taken(count, *args, **kwargs):
        found = ports.free_ports(count, *args, **kwargs)
        if not reserved:  # the first start's inference port: taken meanwhile
            found[0] = taken
        reserved.append(found)
        return found

    monkeypatch.setattr(local, "free_ports", first_taken)
    caplog.set_level(logging.WARNING, logger=local.__name__)
    with local.serving(tmp_path / "run", mar_v1.parent, [f"{MODEL_NAME}={mar_v1.name}"]) as ts:
        assert port_of(ts.props["inference_address"]) == reserved[-1][0] != taken
        assert ts.client().ping()
    assert len(reserved) == 2
    assert (
        f"start 1 of {local.START_ATTEMPTS} lost a port, starting again on fresh ports: "
        f"TorchServe exited during start-up: it could not listen on http://127.0.0.1:{taken} "
        "(inference_address): Address already in use"
    ) in caplog.text
