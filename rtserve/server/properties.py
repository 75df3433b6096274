"""TorchServe's ``config.properties``: reading and writing it, and the effective config a server starts with.

Listeners on given ports, the metrics listener made private, rtserve's agent.

Pure functions over dicts and files: no process is started here.
"""

from __future__ import annotations

from pathlib import Path

from rtserve.errors import ServerError
from rtserve.settings import RunDir

#: The config.properties key that switches greedy batching off (``false``); on by default.
GREEDY_KEY = "rtserve_greedy_batching"
#: In an effective config: the metrics address clients scrape (the metrics exporter,
#: :mod:`rtserve.observability.exporter`, listens there; ``metrics_address`` is then
#: TorchServe's own, private listener).
PUBLIC_METRICS_KEY = "rtserve_metrics_address"
#: In an effective config: where the OIP model metadata and readiness routes answer
#: (:mod:`rtserve.server.oip`, a free loopback port; the agent sends those routes there from the
#: inference port).
OIP_KEY = "rtserve_oip_address"

#: The server settings of the records (docs/records.md): the store's contact points (empty: no
#: store, the spool is kept locally), its keyspace and the records' time to live in days.
RECORDS_STORE_KEY = "rtserve_records_store"
RECORDS_KEYSPACE_KEY = "rtserve_records_keyspace"
RECORDS_TTL_KEY = "rtserve_records_ttl_days"


def read_properties(path: str | Path) -> dict[str, str]:
    """Read a Java-style properties file (``key=value`` lines, ``#`` comments)."""
    props: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


def write_properties(path: str | Path, props: dict[str, str]) -> None:
    """Write ``props`` as a properties file."""
    Path(path).write_text("".join(f"{k}={v}\n" for k, v in props.items()))


def port_overrides(ports: list[int]) -> dict[str, str]:
    """Config overrides that move all six listeners (three HTTP, two gRPC, workers) to ``ports``."""
    inference, management, metrics, grpc_inf, grpc_mgmt, worker = ports
    return {
        "inference_address": f"http://127.0.0.1:{inference}",
        "management_address": f"http://127.0.0.1:{management}",
        "metrics_address": f"http://127.0.0.1:{metrics}",
        "grpc_inference_port": str(grpc_inf),
        "grpc_management_port": str(grpc_mgmt),
        "initial_worker_port": str(worker),
    }


def configured(config: Path, model_store: Path, overrides: dict[str, str]) -> dict[str, str]:
    """The configuration a server runs with.

    The base file, then the model store, then ``overrides``; read back from an effective config, ``metrics_address``
    is the public one.
    """
    props = read_properties(config)
    props["model_store"] = str(model_store)
    metrics_config = props.get("metrics_config")
    if metrics_config and not Path(metrics_config).is_absolute():
        props["metrics_config"] = str(Path(config).resolve().parent / metrics_config)
    props.update(overrides)
    if PUBLIC_METRICS_KEY in props:  # read back from an effective config
        props["metrics_address"] = props.pop(PUBLIC_METRICS_KEY)
    return props


def greedy(props: dict[str, str]) -> bool:
    """Whether the frontend runs with rtserve's greedy-batching agent (:data:`GREEDY_KEY`).

    Raises:
        ServerError: the setting is neither ``true`` nor ``false``.
    """
    value = props.get(GREEDY_KEY, "true").strip().lower()
    if value not in ("true", "false"):
        raise ServerError(f"{GREEDY_KEY} must be true or false, not {value!r}")
    return value == "true"


def routes_file(run_dir: str | Path) -> Path:
    """The live routes file the agent of the server in ``run_dir`` follows; usually absent, which is no routes.

    It holds the shadow and canary of a candidate version (docs/versions-and-promotion.md).
    """
    return RunDir(Path(run_dir)).live_routes.resolve()


def effective_props(
    props: dict[str, str],
    private_metrics_port: int,
    oip_port: int,
    agent_jar: Path,
    run_dir: str | Path,
    live_log_bytes: int | None = None,
) -> dict[str, str]:
    """What the frontend is started with.

    ``props``, with TorchServe's metrics listener moved to ``private_metrics_port`` on loopback (the metrics
    exporter serves the configured address), the OIP model routes on ``oip_port``, and rtserve's agent in
    ``vmargs``: it sends the OIP model routes there, follows the live routes file of ``run_dir``
    (:func:`routes_file`), keeps its live log within ``live_log_bytes`` (with its one backup) and, unless
    ``rtserve_greedy_batching=false``, makes batching greedy (no wait for further requests of a batch). ``vmargs``
    that load an agent already are left as they are.

    Raises:
        ServerError: the agent was not built, or the run directory's path has a comma (the
            agent's options are comma-separated).
    """
    props = dict(props)
    is_greedy = greedy(props)
    props[PUBLIC_METRICS_KEY] = props["metrics_address"]
    props["metrics_address"] = f"http://127.0.0.1:{private_metrics_port}"
    props[OIP_KEY] = f"http://127.0.0.1:{oip_port}"
    if "-javaagent:" not in props.get("vmargs", ""):
        if not Path(agent_jar).is_file():
            raise ServerError(
                f"{agent_jar} is missing (greedy batching, the OIP model routes): build it with `make agent`"
            )
        routes = routes_file(run_dir)
        if "," in str(routes):
            raise ServerError(
                f"the run directory {Path(run_dir).resolve()} has a comma in its path: "
                "the agent's options cannot carry it"
            )
        options = ",".join(
            [f"oip={props[OIP_KEY]}"]
            + ([] if is_greedy else ["greedy=off"])
            + [f"routes={routes}"]
            + ([f"live-log-bytes={live_log_bytes}"] if live_log_bytes else [])
        )
        props["vmargs"] = f"{props.get('vmargs', '')} -javaagent:{agent_jar}={options}".strip()
    return props
