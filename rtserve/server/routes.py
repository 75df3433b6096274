"""Every route a caller can reach: who answers it, in which process, in which file.

The one declared list (docs/routes.md shows it: ``python -m rtserve.server.routes`` prints that
page's generated part); :mod:`rtserve.gateway.nginx` builds its locations from :data:`ROUTES`.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from itertools import product

# The processes a request crosses.
NGINX = "nginx gateway (pod)"
FRONTEND = "TorchServe frontend (JVM)"
AGENT = "TorchServe frontend (JVM) + rtserve agent"
WORKER = "Python worker (handler)"
OIP_SIDECAR = "OIP sidecar"
EXPORTER = "metrics exporter"
ENTRY_POINT = "the pod's main process (`rtserve server run`)"


@dataclass(frozen=True)
class Api:
    """A listener: its address locally (``make serve``) and in the pod, and the setting for it."""

    name: str
    local: str
    pod: str
    setting: str
    note: str = ""


GATEWAY = Api("gateway", "none", ":8080", "GatewaySettings.listen")
GATEWAY_HEALTH = Api("gateway health", "none", ":8086", "GatewaySettings.health_listen")
PROBES = Api("probes", "none", ":8087", "rtserve server run --probes")
INFERENCE = Api("inference", "127.0.0.1:8080", "127.0.0.1:8090", "inference_address")
MANAGEMENT = Api("management", "127.0.0.1:8081", ":8081", "management_address")
METRICS = Api(
    "metrics",
    "127.0.0.1:8082",
    ":8082",
    "metrics_address",
    "(the exporter's: `rtserve_metrics_address` of the effective config)",
)
TORCHSERVE_METRICS = Api(
    "TorchServe metrics",
    "127.0.0.1:free",
    "127.0.0.1:free",
    "metrics_address",
    "of the effective config (moved to a free port)",
)
OIP = Api("OIP sidecar", "127.0.0.1:free", "127.0.0.1:free", "rtserve_oip_address", "of the effective config")
GRPC_INFERENCE = Api("gRPC inference", "127.0.0.1:7070", "127.0.0.1:7070", "grpc_inference_port")
GRPC_MANAGEMENT = Api("gRPC management", "127.0.0.1:7071", "127.0.0.1:7071", "grpc_management_port")
APIS = (
    GATEWAY,
    GATEWAY_HEALTH,
    PROBES,
    INFERENCE,
    MANAGEMENT,
    METRICS,
    TORCHSERVE_METRICS,
    OIP,
    GRPC_INFERENCE,
    GRPC_MANAGEMENT,
)


@dataclass(frozen=True)
class Route:
    """One route.

    Attributes:
        method: the HTTP method(s), ``any``, or ``rpc`` for a gRPC call.
        path: the path; ``{name}`` is a variable segment, ``[...]`` an optional part and a
            trailing ``*`` any rest (an nginx prefix location); a gRPC route is ``Service/Rpc``.
        api: the listener that receives it.
        answered_by: what answers it, in a few words.
        processes: the processes that take part, the one that receives it first.
        files: the repository files that answer it or set it up (none: TorchServe's own code).
        forwards_to: the listener the route is passed on to, if any.
    """

    method: str
    path: str
    api: Api
    answered_by: str
    processes: tuple[str, ...]
    files: tuple[str, ...] = ()
    forwards_to: Api | None = None

    @property
    def location(self) -> str:
        """The nginx location of the path: a prefix for ``/x/*``, exact otherwise."""
        return self.path[:-1] if self.path.endswith("*") else f"= {self.path}"

    def variants(self) -> tuple[str, ...]:
        """The path with each optional ``[...]`` part left out or put in."""
        parts = re.split(r"\[([^\]]*)\]", self.path)
        choices = [(part,) if i % 2 == 0 else ("", part) for i, part in enumerate(parts)]
        return tuple("".join(chosen) for chosen in product(*choices))


_GATEWAY_PASS = "nginx: 401 without a gateway token, else passed on with this pod's key"
_GATEWAY_FILES = ("rtserve/gateway/nginx.py", "deploy/k8s/base/gateway-nginx.conf")
_HANDLER = (
    "agent/src/rtserve/agent/Greedy.java",
    "handler/worker_io.py",
    "handler/rtserve_handler.py",
    "handler/schema.py",
    "handler/model.py",
)
_PROTOCOLS = (
    "agent/src/rtserve/agent/Greedy.java",
    "handler/worker_io.py",
    "handler/rtserve_handler.py",
    "handler/protocols.py",
    "handler/model.py",
)
_EXPLAIN = _HANDLER + ("handler/explain.py",)
_QUEUED = (FRONTEND, WORKER)
_TS = "TorchServe's own"
_NOT_PASSED = "(not passed by the gateway)"


def _gateway(path: str) -> Route:
    return Route("any", path, GATEWAY, _GATEWAY_PASS, (NGINX,), _GATEWAY_FILES, INFERENCE)


ROUTES = (
    # The pod's gateway: nginx.py builds its locations from these rows, in this order.
    _gateway("/ping"),
    _gateway("/predictions/*"),
    _gateway("/explanations/*"),
    _gateway("/v1/models/*"),
    _gateway("/v2"),
    _gateway("/v2/*"),
    Route("any", "/*", GATEWAY, "nginx: 404 (any other path)", (NGINX,), _GATEWAY_FILES),
    Route("GET", "/livez", GATEWAY_HEALTH, "nginx: 200 while nginx runs (liveness)", (NGINX,), _GATEWAY_FILES),
    Route(
        "GET",
        "/readyz",
        GATEWAY_HEALTH,
        "nginx: /ping with this pod's key; 503 once draining",
        (NGINX, FRONTEND),
        _GATEWAY_FILES,
        INFERENCE,
    ),
    Route("any", "/*", GATEWAY_HEALTH, "nginx: 404", (NGINX,), _GATEWAY_FILES),
    # The kubelet's probes of the rtserve container, answered by its main process.
    Route(
        "GET",
        "/ready",
        PROBES,
        "not draining, warmed up, /ping healthy and a prediction answered: 200, else 503 (readiness, startup)",
        (ENTRY_POINT, FRONTEND, WORKER),
        ("rtserve/server/probe.py",),
        INFERENCE,
    ),
    Route(
        "GET",
        "/live",
        PROBES,
        "the frontend answers /ping with any status: 200, else 503 (liveness)",
        (ENTRY_POINT, FRONTEND),
        ("rtserve/server/probe.py",),
        INFERENCE,
    ),
    Route("any", "/*", PROBES, "404", (ENTRY_POINT,), ("rtserve/server/probe.py",)),
    # TorchServe's inference listener (loopback; in the pod behind the gateway).
    Route("GET", "/ping", INFERENCE, f"{_TS} health; the probes ask it", (FRONTEND,), ("rtserve/server/probe.py",)),
    Route(
        "POST",
        "/predictions/{model}",
        INFERENCE,
        "the handler; the agent's live routes may copy it to a shadow or send it to a canary",
        (AGENT, WORKER),
        ("agent/src/rtserve/agent/Router.java", *_HANDLER),
    ),
    Route(
        "POST", "/predictions/{model}/{version}", INFERENCE, "the handler, that version's workers", _QUEUED, _HANDLER
    ),
    Route(
        "POST",
        "/explanations/{model}[/{version}]",
        INFERENCE,
        "the handler (Captum Integrated Gradients)",
        _QUEUED,
        _EXPLAIN,
    ),
    Route("POST", "/v1/models/{model}:predict", INFERENCE, "the handler (KServe v1 body)", _QUEUED, _PROTOCOLS),
    Route("POST", "/v1/models/{model}:explain", INFERENCE, 'the handler (`{"features"}` body only)', _QUEUED, _EXPLAIN),
    Route("GET", "/v2", INFERENCE, f"{_TS} OIP server metadata", (FRONTEND,), ("config.properties",)),
    Route("GET", "/v2/health/live", INFERENCE, f"{_TS} OIP liveness", (FRONTEND,), ("config.properties",)),
    Route("GET", "/v2/health/ready", INFERENCE, f"{_TS} OIP readiness", (FRONTEND,), ("config.properties",)),
    Route(
        "GET",
        "/v2/models/{name}[/versions/{version}][/ready]",
        INFERENCE,
        "the agent's `ModelRoutes.next`, after the token check",
        (AGENT, OIP_SIDECAR),
        ("agent/src/rtserve/agent/ModelRoutes.java", "rtserve/server/oip.py"),
        OIP,
    ),
    Route(
        "POST",
        "/v2/models/{model}/infer",
        INFERENCE,
        "the handler (OIP body, JSON or binary tensors); `/versions/{v}/infer`: TorchServe's 501",
        _QUEUED,
        _PROTOCOLS,
    ),
    Route("POST", "/v2/models/{model}/explain", INFERENCE, 'the handler (`{"features"}` body only)', _QUEUED, _EXPLAIN),
    Route("OPTIONS", "/", INFERENCE, f"{_TS} OpenAPI description {_NOT_PASSED}", (FRONTEND,)),
    Route("GET", "/api-description", INFERENCE, f"{_TS} OpenAPI description {_NOT_PASSED}", (FRONTEND,)),
    Route("POST", "/invocations", INFERENCE, f"{_TS} SageMaker form, to the handler {_NOT_PASSED}", _QUEUED, _HANDLER),
    Route(
        "POST",
        "/models/{model}/invoke",
        INFERENCE,
        f"{_TS} SageMaker form, to the handler {_NOT_PASSED}",
        _QUEUED,
        _HANDLER,
    ),
    Route("POST", "/wfpredict/{workflow}", INFERENCE, f"{_TS} workflows: none registered {_NOT_PASSED}", (FRONTEND,)),
    # rtserve's OIP sidecar: only the agent calls it.
    Route(
        "GET",
        "/v2/models/{name}[/versions/{version}]",
        OIP,
        "`ModelRoutes.answer`: the archive's metadata; 404 for another model or version",
        (OIP_SIDECAR,),
        ("rtserve/server/oip.py", "rtserve/model/archive.py", "handler/signature.py"),
    ),
    Route(
        "GET",
        "/v2/models/{name}[/versions/{version}]/ready",
        OIP,
        "`ModelRoutes.answer`: 200 when not draining and the workers are READY, else 400",
        (OIP_SIDECAR, FRONTEND),
        ("rtserve/server/oip.py", "rtserve/server/readiness.py"),
        MANAGEMENT,
    ),
    # TorchServe's management listener.
    Route("GET", "/models", MANAGEMENT, f"{_TS}: the registered models", (FRONTEND,), ("rtserve/client/rest.py",)),
    Route(
        "GET",
        "/models/{model}[/{version}]",
        MANAGEMENT,
        f"{_TS}: a model's versions and workers",
        (FRONTEND,),
        ("rtserve/client/rest.py", "rtserve/server/readiness.py"),
    ),
    Route(
        "POST",
        "/models?url={archive}",
        MANAGEMENT,
        f"{_TS}: register a version (the model API: off in the pod)",
        (FRONTEND,),
        ("rtserve/client/rest.py", "rtserve/promotion/rollout.py"),
    ),
    Route(
        "PUT",
        "/models/{model}[/{version}]?min_worker={n}",
        MANAGEMENT,
        f"{_TS}: scale workers",
        (FRONTEND,),
        ("rtserve/client/rest.py",),
    ),
    Route(
        "PUT",
        "/models/{model}/{version}/set-default",
        MANAGEMENT,
        f"{_TS}: promote or roll back",
        (FRONTEND,),
        ("rtserve/client/rest.py", "rtserve/promotion/rollout.py"),
    ),
    Route(
        "DELETE",
        "/models/{model}/{version}",
        MANAGEMENT,
        f"{_TS}: unregister (the model API: off in the pod)",
        (FRONTEND,),
        ("rtserve/client/rest.py",),
    ),
    Route("GET", "/v1/models/{model}", MANAGEMENT, f"{_TS} KServe v1 model readiness", (FRONTEND,)),
    Route(
        "GET",
        "/token?type={inference|management}",
        MANAGEMENT,
        f"{_TS}: a new key, asked with the API key",
        (FRONTEND,),
        ("rtserve/client/rest.py",),
    ),
    Route("GET", "/workflows", MANAGEMENT, f"{_TS} workflow API: none registered", (FRONTEND,)),
    # Metrics: the exporter on the configured address, TorchServe's own listener moved aside.
    Route(
        "GET",
        "/metrics",
        METRICS,
        "the exporter: TorchServe's scrape, the workers' metrics files, the latency histogram",
        (EXPORTER, FRONTEND),
        ("rtserve/observability/exporter.py", "rtserve/observability/request_latency.py", "handler/telemetry.py"),
        TORCHSERVE_METRICS,
    ),
    Route(
        "GET",
        "/metrics",
        TORCHSERVE_METRICS,
        f"{_TS} frontend metrics (only the exporter asks)",
        (FRONTEND,),
        ("rtserve/server/properties.py",),
    ),
    # gRPC (loopback, locally and in the pod).
    Route("rpc", "InferenceAPIsService/Ping", GRPC_INFERENCE, f"{_TS} health", (FRONTEND,)),
    Route(
        "rpc",
        "InferenceAPIsService/Predictions",
        GRPC_INFERENCE,
        "the handler (any of the three bodies)",
        _QUEUED,
        _PROTOCOLS,
    ),
    Route(
        "rpc",
        "GRPCInferenceService/ServerLive, ServerReady, ModelReady, ModelMetadata",
        GRPC_INFERENCE,
        f"{_TS} OIP gRPC",
        (FRONTEND,),
    ),
    Route(
        "rpc",
        "GRPCInferenceService/ModelInfer",
        GRPC_INFERENCE,
        "the handler (OIP tensors; an error is a BYTES output named `error`)",
        _QUEUED,
        _PROTOCOLS,
    ),
    Route("rpc", "ManagementAPIsService/*", GRPC_MANAGEMENT, f"{_TS} management RPCs", (FRONTEND,)),
)


@dataclass(frozen=True)
class Step:
    """One step of a request's path.

    Attributes:
        process: where it runs.
        file: the repository file, or None for TorchServe's own code.
        function: the function or method (``Class.method``), or the nginx location.
        does: what happens there.
    """

    process: str
    file: str | None
    function: str
    does: str


#: ``POST /predictions/<model>`` from the client and back (the first step only in the pod).
PREDICTION_PATH = (
    Step(
        NGINX,
        "rtserve/gateway/nginx.py",
        "render_nginx_conf",
        "`location /predictions/`: 401 without a gateway token; else passed on to "
        "127.0.0.1:8090 with this pod's inference key (the map files `KeySync.sync` writes)",
    ),
    Step(
        FRONTEND,
        None,
        "TokenAuthorizationHandler.handleRequest",
        "checks the inference key (400 InvalidKeyException without it)",
    ),
    Step(
        FRONTEND,
        None,
        "InferenceRequestHandler.handlePredictions",
        "makes the request a job (its body, its headers, `explain: False`, `url_path`)",
    ),
    Step(
        AGENT,
        "agent/src/rtserve/agent/Router.java",
        "Router.addJob",
        "patched into `ApiUtils.addRESTInferenceJob`: with live routes, a canary's sticky share "
        "goes to the candidate, a shadow's share is also copied there; then "
        "`ModelManager.addJob` queues the job (503 when the queue is full)",
    ),
    Step(
        AGENT,
        "agent/src/rtserve/agent/Greedy.java",
        "Greedy.poll",
        "patched into `Model.pollBatch`: a free worker takes what is queued, up to batchSize, "
        "without waiting for more; the batch goes over the worker's socket",
    ),
    Step(
        WORKER,
        "handler/worker_io.py",
        "BufferedReader.inference_msg",
        "reads the batch with one `recv()` per chunk and parses it where it lies (lean worker)",
    ),
    Step(WORKER, None, "ts.service.Service.predict", "calls the handler's `handle`"),
    Step(
        WORKER,
        "handler/rtserve_handler.py",
        "RealTimeHandler.preprocess",
        "each request's route from its headers; its body parsed and validated "
        "(`handler/schema.py`, `handler/protocols.py`); a bad one gets its own 400",
    ),
    Step(
        WORKER,
        "handler/rtserve_handler.py",
        "RealTimeHandler.inference",
        "the exported program's forward pass (`handler/model.py`) over the valid rows",
    ),
    Step(
        WORKER,
        "handler/rtserve_handler.py",
        "RealTimeHandler.postprocess",
        "one answer per request, with its own status",
    ),
    Step(
        WORKER,
        "handler/rtserve_handler.py",
        "RealTimeHandler.handle",
        "metrics, drift and audit (`handler/telemetry.py`), the request's record into the spool (`handler/records.py`)",
    ),
    Step(
        WORKER, "handler/worker_io.py", "predict_response", "encodes the answers' frame in one join and sends it back"
    ),
    Step(
        FRONTEND,
        None,
        "RestJob.response",
        "answers the client and writes the access log line (the exporter's latency histogram "
        "reads it: `rtserve/observability/request_latency.py`)",
    ),
)


def gateway_locations() -> tuple[str, ...]:
    """The nginx locations the gateway passes on to TorchServe, in :data:`ROUTES`' order."""
    return tuple(r.location for r in ROUTES if r.api is GATEWAY and r.forwards_to is INFERENCE)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`"


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def markdown() -> str:
    """The generated part of docs/routes.md: the listeners, the prediction's path, the routes."""
    lines = [
        "## Listeners",
        "",
        _row("listener", "locally (`make serve`)", "in the pod", "setting"),
        _row(*["---"] * 4),
    ]
    lines += [_row(a.name, a.local, a.pod, " ".join(filter(None, (_code(a.setting), a.note)))) for a in APIS]
    lines += [
        "",
        "## The path of `POST /predictions/<model>`",
        "",
        _row("step", "process", "file", "function", "what happens"),
        _row(*["---"] * 5),
    ]
    for number, s in enumerate(PREDICTION_PATH, 1):
        lines.append(
            _row(str(number), s.process, _code(s.file) if s.file else "TorchServe", _code(s.function), _cell(s.does))
        )
    lines += [
        "",
        "## Every route",
        "",
        _row("route", "method", "listener", "answered by", "processes", "files"),
        _row(*["---"] * 6),
    ]
    for r in ROUTES:
        answer = r.answered_by + (f" → {r.forwards_to.name}" if r.forwards_to else "")
        files = ", ".join(map(_code, r.files)) or "TorchServe"
        lines.append(_row(_code(_cell(r.path)), r.method, r.api.name, _cell(answer), " → ".join(r.processes), files))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
