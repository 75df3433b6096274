"""A real nginx load balancer in front of TorchServe replicas, for the rolling-update rehearsal.

:class:`Nginx` runs Debian's nginx as a foreground child process with its own config, PID
file, logs and temp paths in one run directory, listening on free loopback ports, and changes
its upstreams with ``nginx -s reload`` (confirmed: :meth:`Nginx.apply` waits until the new
workers answer with the new config generation). It is started and stopped (by its own PID, never
by name) through :mod:`rtserve.runtime.process`.

Token authorization stays on at every hop. Each TorchServe replica writes its own random
inference key, and an nginx upstream group cannot send a different header per member, so each
replica gets a *hop*: a small nginx ``server`` on its own loopback port that proxies to that
replica only and sets ``Authorization: Bearer <that replica's key>`` (the role a per-pod sidecar
plays in Kubernetes). The public listener balances over the hops. Clients authenticate to the
balancer with a gateway key (random, written to ``RUN_DIR/gateway_key``, mode 0600); the public
listener refuses a missing or wrong key with 401, and every hop checks the same key again, so no
loopback port serves predictions without a token. The config file holds keys: mode 0600.
TorchServe keys expire after ``token_expiration_min`` (60): long enough for a rehearsal; a
long-lived hop would re-read ``key_file.json`` (rtserve's client does) or renew the key.

Nothing is retried after a request was sent upstream (nginx never retries a POST that reached a
server); only a refused connect moves on to the next hop (``proxy_next_upstream error timeout``).

Open-source nginx changes upstreams only by reloading, and a reload closes the old workers' idle
keep-alive client connections: a client that sends on one at that instant gets "Remote end closed
connection without response" although nginx never read its request (seen once in 4757 requests
before this setting). So the public listener closes each connection after its response
(``keepalive_timeout 0``); the listening socket itself survives reloads, so connects never fail.
In Kubernetes, ingress-nginx applies endpoint changes without a reload.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from rtserve.errors import ProcessError
from rtserve.gateway.nginx import find_nginx  # noqa: F401 - re-exported for the tests
from rtserve.runtime.process import spawn, stop_process

logger = logging.getLogger(__name__)

GENERATION_PATH = "/balancer-generation"


class BalancerError(RuntimeError):
    """nginx is missing, refused its config, did not start, or did not take a reload."""


@dataclass(frozen=True)
class Backend:
    """One replica as the balancer sees it: where it listens, its key, and its hop's port."""

    name: str
    inference_url: str
    key: str
    hop_port: int


def render_config(
    run_dir: Path, port: int, gateway_key: str, backends: list[Backend], in_rotation: list[str], generation: int
) -> str:
    """The nginx config: the public listener over the hops in rotation, one hop per backend.

    Raises:
        BalancerError: nothing in rotation, or a name in rotation has no backend.
    """
    names = {b.name for b in backends}
    if not in_rotation or not set(in_rotation) <= names:
        raise BalancerError(f"rotation {in_rotation} must be a non-empty subset of {sorted(names)}")
    tmp = run_dir / "tmp"
    upstream = "\n".join(
        f"        server 127.0.0.1:{b.hop_port};  # {b.name}" for b in backends if b.name in in_rotation
    )
    hops = "\n".join(
        f"""
    server {{  # hop to {b.name}: only this replica, with its own inference key
        listen 127.0.0.1:{b.hop_port};
        location / {{
            if ($gateway_ok = 0) {{ return 401 '{{"error": "missing or wrong gateway token"}}\\n'; }}
            proxy_pass {b.inference_url};
            proxy_set_header Authorization "Bearer {b.key}";
        }}
    }}"""
        for b in backends
    )
    return f"""# Written by bench/balancer.py (generation {generation}); keys inside: mode 0600.
worker_processes 1;
daemon off;
pid {run_dir}/nginx.pid;
error_log {run_dir}/error.log notice;
events {{ worker_connections 1024; }}
http {{
    log_format rehearsal '$time_iso8601 "$request" $status upstream=$upstream_addr '
                         'upstream_status=$upstream_status rt=$request_time';
    access_log {run_dir}/access.log rehearsal;
    default_type application/json;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    # Bodies up to TorchServe's own limit stay in memory: workers never write to disk.
    client_max_body_size 64k;
    client_body_buffer_size 64k;
    proxy_max_temp_file_size 0;
    proxy_connect_timeout 2s;
    proxy_read_timeout 60s;
    map $http_authorization $gateway_ok {{
        default 0;
        "Bearer {gateway_key}" 1;
    }}
    upstream replicas {{
{upstream}
    }}
    server {{  # public listener
        listen 127.0.0.1:{port};
        # One request per client connection: a reload closes the old workers' idle keep-alive
        # connections, and a client that sends on one at that instant gets no answer.
        keepalive_timeout 0;
        # No token here: it answers only the config generation (how a reload is confirmed).
        location = {GENERATION_PATH} {{ return 200 "{generation}\\n"; }}
        location / {{
            if ($gateway_ok = 0) {{ return 401 '{{"error": "missing or wrong gateway token"}}\\n'; }}
            proxy_pass http://replicas;
            proxy_next_upstream error timeout;
        }}
    }}
{hops}
}}
"""


class Nginx:
    """One nginx process (master + 1 worker) serving ``render_config``'s config from ``run_dir``."""

    def __init__(self, run_dir: Path, port: int, binary: str | None = None) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.port = port
        self.binary = binary or find_nginx()
        if not self.binary:
            raise BalancerError("nginx is not installed: run `make nginx-deps` (apt-get install nginx)")
        self.gateway_key = secrets.token_urlsafe(24)
        self.generation = 0
        self.proc: subprocess.Popen | None = None  # nginx's master, started by spawn()
        self.backends: list[Backend] = []
        self.in_rotation: list[str] = []

    @property
    def url(self) -> str:
        """The public listener."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def config_path(self) -> Path:
        """The config file nginx runs from."""
        return self.run_dir / "nginx.conf"

    def _cli(self, *args: str) -> subprocess.CompletedProcess:
        cmd = [
            self.binary,
            "-p",
            str(self.run_dir),
            "-c",
            str(self.config_path),
            "-e",
            str(self.run_dir / "error.log"),
            *args,
        ]
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)

    def _write(self, backends: list[Backend], in_rotation: list[str]) -> None:
        self.generation += 1
        text = render_config(self.run_dir, self.port, self.gateway_key, backends, in_rotation, self.generation)
        tmp = self.config_path.with_suffix(".new")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        test = subprocess.run(
            [self.binary, "-t", "-p", str(self.run_dir), "-c", str(tmp), "-e", str(self.run_dir / "error.log")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=30,
        )
        if test.returncode != 0:
            raise BalancerError(f"nginx refused generation {self.generation}:\n{test.stdout}")
        os.replace(tmp, self.config_path)
        self.backends, self.in_rotation = list(backends), list(in_rotation)

    def start(self, backends: list[Backend], in_rotation: list[str], timeout: float = 20.0) -> None:
        """Write the config and start nginx; returns when the public listener answers.

        Raises:
            BalancerError: the config was refused or nginx did not come up.
        """
        (self.run_dir / "tmp").mkdir(parents=True, exist_ok=True)
        os.chmod(self.run_dir, 0o700)
        key_file = self.run_dir / "gateway_key"
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.gateway_key + "\n")
        self._write(backends, in_rotation)
        (self.run_dir / "nginx.out").unlink(missing_ok=True)
        try:
            self.proc = spawn(
                [
                    self.binary,
                    "-p",
                    str(self.run_dir),
                    "-c",
                    str(self.config_path),
                    "-e",
                    str(self.run_dir / "error.log"),
                ],
                self.run_dir / "nginx.out",
            )
        except ProcessError as exc:
            raise BalancerError(str(exc)) from exc
        self._wait_generation(timeout)

    def apply(self, backends: list[Backend], in_rotation: list[str], timeout: float = 20.0) -> float:
        """Reload with new upstreams (``nginx -s reload``); returns seconds until it took effect.

        Raises:
            BalancerError: the config was refused, the reload failed or did not take effect.
        """
        started = time.monotonic()
        self._write(backends, in_rotation)
        done = self._cli("-s", "reload")
        if done.returncode != 0:
            raise BalancerError(f"nginx -s reload failed:\n{done.stdout}")
        self._wait_generation(timeout)
        return time.monotonic() - started

    def _wait_generation(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BalancerError(f"nginx exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:  # a new connection each time: it reaches a worker of the newest generation
                resp = requests.get(self.url + GENERATION_PATH, timeout=2, headers={"Connection": "close"})
                if resp.text.strip() == str(self.generation):
                    return
                last = f"generation {resp.text.strip()}"
            except requests.RequestException as exc:
                last = str(exc)
            time.sleep(0.05)
        raise BalancerError(
            f"nginx generation {self.generation} not live after {timeout:.0f}s ({last}):\n{self.log_tail()}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGQUIT to the master PID), then SIGKILL to its own workers and itself."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        if stop_process(proc.pid, timeout, signal.SIGQUIT, tree=True):
            logger.warning("nginx pid %d ignored SIGQUIT for %.0fs; killed it", proc.pid, timeout)

    def log_tail(self, lines: int = 30) -> str:
        """The end of nginx's error log."""
        path = self.run_dir / "error.log"
        if not path.exists():
            return "(no error log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
