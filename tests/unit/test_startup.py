"""rtserve.server.startup: why a frontend exited during start-up, from its console output (the
lines below are TorchServe 0.12.0's, from starts whose listeners' ports were taken)."""

from __future__ import annotations

import pytest

from rtserve.server.startup import bind_failure, exit_reason, listener_ports, port_of

pytestmark = pytest.mark.unit

#: The metrics listener's port was the inference listener's (REST listeners bind in that order).
REST = """\
[rtserve-agent] greedy batching ON: patched org/pytorch/serve/wlm/Model.pollBatch
java.io.IOException: Failed to bind to address: http://127.0.0.1:20402
\tat org.pytorch.serve.ModelServer.initializeServer(ModelServer.java:354)
\tat org.pytorch.serve.ModelServer.main(ModelServer.java:105)
Caused by: io.netty.channel.unix.Errors$NativeIoException: bind(..) failed: Address already in use
Exception in thread "Thread-0" java.util.concurrent.RejectedExecutionException: event executor terminated
"""
#: A gRPC listener's port was taken (gRPC prints the address without the colon and the scheme).
GRPC = (
    "java.io.IOException: Failed to bind to address /127.0.0.1:14057\n"
    "Caused by: io.grpc.netty.shaded.io.netty.channel.unix.Errors$NativeIoException: "
    "bind(..) failed: Address already in use\n"
)
PROPS = {
    "inference_address": "http://127.0.0.1:20401",
    "management_address": "http://127.0.0.1:21138",
    "metrics_address": "http://127.0.0.1:20402",
    "grpc_inference_port": "14056",
    "grpc_management_port": "14057",
    "rtserve_metrics_address": "http://127.0.0.1:20403",
    "rtserve_oip_address": "http://127.0.0.1:20404",
    "initial_worker_port": "9000",
}


def test_each_listener_port_is_found_with_its_key():
    assert port_of("http://127.0.0.1:8080") == port_of("/127.0.0.1:8080") == port_of("8080") == 8080
    assert listener_ports(PROPS) == {
        20401: ["inference_address"],
        21138: ["management_address"],
        20402: ["metrics_address"],
        14056: ["grpc_inference_port"],
        14057: ["grpc_management_port"],
        20403: ["rtserve_metrics_address"],
        20404: ["rtserve_oip_address"],
    }
    assert listener_ports({"inference_address": "http://h:1", "metrics_address": "http://h:1"}) == {
        1: ["inference_address", "metrics_address"]
    }


def test_a_taken_port_is_named_with_its_listener():
    failure = bind_failure(REST)
    assert (failure.address, failure.port, failure.in_use) == ("http://127.0.0.1:20402", 20402, True)
    assert exit_reason(REST, PROPS) == (
        "it could not listen on http://127.0.0.1:20402 "
        "(metrics_address): Address already in use; "
        "another process took the port"
    )
    assert exit_reason(GRPC, PROPS) == (
        "it could not listen on /127.0.0.1:14057 "
        "(grpc_management_port): Address already in use; "
        "another process took the port"
    )
    shared = {**PROPS, "metrics_address": PROPS["inference_address"]}
    assert exit_reason(REST.replace("20402", "20401"), shared).endswith(
        "(inference_address, metrics_address): Address already in use; that port is configured for 2 listeners"
    )


def test_other_exits_name_the_frontends_error_or_nothing():
    assert bind_failure("Model server started.\n") is None
    assert exit_reason("Invalid configuration: bad port\n", {}) == (
        "the frontend failed: Invalid configuration: bad port"
    )
    died = "starting\njava.lang.IllegalStateException: no model store\n\tat a.B.c\n"
    assert exit_reason(died, {}) == "the frontend failed: java.lang.IllegalStateException: no model store"
    assert exit_reason("Warning: TorchServe is using non-default JVM parameters\n", PROPS) == ""
