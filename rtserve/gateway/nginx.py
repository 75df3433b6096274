"""The pod's authenticating gateway: nginx in front of TorchServe's loopback inference listener.

TorchServe 0.12 draws a random token key per pod, so nginx checks a shared token instead (``401`` otherwise), passes
only :data:`ROUTES` (``404`` otherwise) and proxies with this pod's inference key. Its config is static
(:func:`render_nginx_conf`); :class:`KeySync` writes the two secret map files it includes and sends nginx SIGHUP
when they change. docs/kubernetes.md describes the setup.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rtserve.errors import GatewayError
from rtserve.runtime.process import PidFile, run
from rtserve.server.routes import gateway_locations
from rtserve.settings import Settings

logger = logging.getLogger(__name__)

CLIENT_TOKENS = "client-tokens.map"
UPSTREAM_KEY = "upstream-key.map"
PID_FILE = "nginx.pid"
#: While this file exists in the gateway directory, every answer closes its client's connection
#: (``Connection: close``): a draining pod's clients reconnect, to a ready pod, after their
#: answer, instead of meeting a keep-alive connection that nginx closes under them.
CLOSING = "closing"
#: While this file exists in the gateway directory, the kubelet's readiness check (``/readyz``)
#: answers 503: a draining pod leaves its Service's serving endpoints. Its rtserve container's
#: exec probe cannot say so: the kubelet cancels exec probes of a terminating pod (their result
#: is unknown, the last one stands), and kube-proxy keeps routing to a terminating endpoint that
#: still serves when no other is ready (as when every pod stops at once).
DRAINING = "draining"
#: Shared tokens: URL-safe characters only (nothing nginx or a regex could read differently),
#: and long enough to be unguessable (``secrets.token_urlsafe(32)`` gives 43).
TOKEN = re.compile(r"^[A-Za-z0-9_-]{32,256}$")
#: TorchServe's keys are base64 of 6 random bytes (``TokenAuthorization.generateKey``).
POD_KEY = re.compile(r"^[A-Za-z0-9_+/=-]{4,256}$")
#: The nginx locations the gateway passes on, declared in :data:`rtserve.server.routes.ROUTES`:
#: TorchServe's inference API, KServe v1 (``/v1/models/{m}:predict|:explain``) and the Open
#: Inference Protocol REST routes (``/v2...``, the model metadata and readiness routes included:
#: rtserve's agent answers them in TorchServe).
ROUTES = gateway_locations()


@dataclass(frozen=True)
class GatewaySettings:
    """Where nginx listens, where TorchServe is, and where the shared files live.

    Attributes:
        listen: nginx ``listen`` value of the public (Service) listener, e.g. ``8080``.
        health_listen: ``listen`` value of the kubelet's probe listener (``/livez``, ``/readyz``).
        upstream: TorchServe's inference listener, ``host:port`` on loopback.
        gateway_dir: the shared directory with the map files and nginx's PID file.
        tmp_dir: nginx's temp paths (an emptyDir in the pod).
        access_log: ``access_log`` target; error_log: ``error_log`` target.
        max_body: the largest request body, as TorchServe's ``max_request_size``.
    """

    listen: str = "8080"
    health_listen: str = "8086"
    upstream: str = "127.0.0.1:8090"
    gateway_dir: str = "/var/run/rtserve-gateway"
    tmp_dir: str = "/tmp"
    access_log: str = "/dev/stdout"
    error_log: str = "stderr"
    max_body: int = 65536


#: The pod's settings: deploy/k8s/base/gateway-nginx.conf is ``render_nginx_conf(POD)``.
POD = GatewaySettings()


def render_nginx_conf(s: GatewaySettings) -> str:
    """Nginx's main config for the gateway (no secrets in it: those come from the map files)."""
    d, t = s.gateway_dir.rstrip("/"), s.tmp_dir.rstrip("/")
    proxy = """proxy_pass http://torchserve;
            proxy_set_header Authorization $rtserve_upstream_authorization;"""
    routes = "\n".join(
        f"""        location {route} {{
            if (-f {d}/{CLOSING}) {{ return 418; }}
            {proxy}
        }}"""
        for route in ROUTES
    )
    return f"""# rtserve gateway: written by `python -m rtserve gateway conf` (rtserve/gateway/nginx.py); no
# secrets in here. The shared tokens and this pod's TorchServe key are in the map files that
# rtserve writes to {d}/ and reloads nginx for.
worker_processes 1;
pid {d}/{PID_FILE};
error_log {s.error_log} notice;
events {{ worker_connections 1024; }}
http {{
    server_tokens off;
    default_type application/json;
    access_log {s.access_log};
    client_body_temp_path {t}/client_body;
    proxy_temp_path {t}/proxy;
    fastcgi_temp_path {t}/fastcgi;
    uwsgi_temp_path {t}/uwsgi;
    scgi_temp_path {t}/scgi;
    # TorchServe's max_request_size; bodies stay in memory.
    client_max_body_size {s.max_body};
    client_body_buffer_size {s.max_body};
    proxy_max_temp_file_size 0;
    proxy_connect_timeout 2s;
    proxy_read_timeout 60s;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_next_upstream off;

    # 1 when the client sent one of the shared tokens (none until rtserve wrote the file).
    # Keys are "Bearer " + up to 256 characters: the default 64-byte buckets are too small.
    map_hash_bucket_size 512;
    map $http_authorization $rtserve_client_ok {{
        default 0;
        include {d}/client-tokens*.map;
    }}
    # "Bearer <this pod's TorchServe inference key>" (empty until rtserve wrote the file).
    map $pid $rtserve_upstream_authorization {{
        include {d}/upstream-key*.map;
    }}
    upstream torchserve {{
        server {s.upstream};
        keepalive 8;
    }}

    server {{  # the Service's inference port
        listen {s.listen};
        if ($rtserve_client_ok = 0) {{ rewrite ^ /@unauthorized last; }}
        error_page 413 /@too-large;
        error_page 502 504 /@unavailable;
        # Draining (the file {CLOSING} exists): the same request, answered with Connection: close.
        error_page 418 = @closing;
{routes}
        location @closing {{
            keepalive_timeout 0;
            recursive_error_pages on;
            {proxy}
        }}
        location / {{
            return 404 '{{"error": "not found: the gateway passes /ping, /predictions/, /explanations/, /v1/models/ and /v2 only"}}\\n';
        }}
        location = /@unauthorized {{
            internal;
            add_header WWW-Authenticate 'Bearer realm="rtserve"' always;
            return 401 '{{"error": "missing or wrong token: send Authorization: Bearer <gateway token>"}}\\n';
        }}
        location = /@too-large {{
            internal;
            return 413 '{{"error": "request body larger than {s.max_body} bytes"}}\\n';
        }}
        location = /@unavailable {{
            internal;
            return 502 '{{"error": "TorchServe is not answering in this pod"}}\\n';
        }}
    }}

    server {{  # the kubelet's probes; the NetworkPolicy opens no port here to other pods
        listen {s.health_listen};
        access_log off;
        location = /livez {{ return 200 '{{"status": "nginx up"}}\\n'; }}
        # TorchServe's /ping with this pod's key: the gateway can reach and authenticate;
        # 503 once the pod drains (the file {DRAINING} exists).
        location = /readyz {{
            if (-f {d}/{DRAINING}) {{ return 503 '{{"status": "draining"}}\\n'; }}
            proxy_pass http://torchserve/ping;
            proxy_set_header Authorization $rtserve_upstream_authorization;
        }}
        location / {{ return 404 '{{"error": "not found"}}\\n'; }}
    }}
}}
"""


def parse_tokens(text: str) -> list[str]:
    """The shared tokens of the Secret's file: one per line; blank lines and ``#`` lines ignored.

    Raises:
        GatewayError: no token, or a line that is not a token (which line, never its value).
    """
    tokens = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not TOKEN.match(line):
            raise GatewayError(
                f"tokens line {number}: a token is 32-256 characters of "
                "A-Z a-z 0-9 _ - (e.g. python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))')"
            )
        tokens.append(line)
    if not tokens:
        raise GatewayError("tokens: no token in the file: the gateway would refuse everyone")
    return tokens


def render_client_tokens(tokens: list[str]) -> str:
    """``client-tokens.map``: the map lines that accept each shared token."""
    for token in tokens:
        if not TOKEN.match(token):
            raise GatewayError("not a valid token")
    return "# shared gateway tokens (from the Secret); written by rtserve.gateway\n" + "".join(
        f'"Bearer {token}" 1;\n' for token in tokens
    )


def render_upstream_key(key: str) -> str:
    """``upstream-key.map``: the header value nginx sends to this pod's TorchServe."""
    if not POD_KEY.match(key):
        raise GatewayError("TorchServe's inference key has unexpected characters")
    return f'# this pod\'s TorchServe inference key; written by rtserve.gateway\ndefault "Bearer {key}";\n'


def inference_key(key_file: Path) -> str | None:
    """The inference key in TorchServe's ``key_file.json``; None while it is missing or partial."""
    try:
        return (json.loads(key_file.read_text()).get("inference") or {}).get("key")
    except (OSError, ValueError):
        return None


def write_private(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` atomically with mode 0600; False when it was already so."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)
    return True


def closing(gateway_dir: Path, on: bool) -> bool:
    """Turn on (or off) the gateway's closing of each client connection after its answer.

    The switch is the file :data:`CLOSING`, which nginx checks per request. A draining pod turns it on once its
    endpoints are gone; the pod's main process turns it off when it starts (a restarted
    container keeps the shared directory). Returns whether anything changed.
    """
    return _flag(
        gateway_dir / CLOSING,
        on,
        "draining: every answer closes its connection",
        "each answer now closes its client connection (draining)",
        "client connections are kept alive again",
    )


def draining(gateway_dir: Path, on: bool) -> bool:
    """Turn on (or off) the gateway's readiness answer of a draining pod.

    The switch is the file :data:`DRAINING` (``/readyz`` answers 503). The drain turns it on first; the pod's main
    process turns it off when it starts. Returns whether anything changed.
    """
    return _flag(
        gateway_dir / DRAINING,
        on,
        "draining: /readyz answers 503",
        "/readyz now answers 503 (draining)",
        "/readyz answers from TorchServe's /ping again",
    )


def _flag(flag: Path, on: bool, text: str, said_on: str, said_off: str) -> bool:
    if on:
        if flag.exists():
            return False
        flag.write_text(text + "\n")
        logger.info("gateway: %s", said_on)
        return True
    try:
        flag.unlink()
    except FileNotFoundError:
        return False
    logger.info("gateway: %s", said_off)
    return True


def close_client_connections(gateway_dir: Path) -> int | None:
    """Make the gateway's nginx close its clients' idle keep-alive connections.

    A graceful reload (SIGHUP to the master named by the PID file in ``gateway_dir``), whose old workers finish the
    requests in flight and close the idle connections. A draining pod calls it once its endpoints are gone: a
    client's connection opened before would otherwise keep reaching this pod (kube-proxy routes only new
    connections) until TorchServe stops, and get 502s. Returns the PID signalled, or None (no gateway running).
    """
    pid = PidFile(gateway_dir / PID_FILE).read()
    if pid is None or not reload(pid, "to close its idle client connections"):
        return None
    return pid


def reload(pid: int, why: str) -> bool:
    """SIGHUP the nginx master ``pid`` (a graceful reload); whether it was signalled.

    ``why`` says what for, in the log.
    """
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        logger.warning("gateway: cannot signal nginx (pid %d) %s: %s", pid, why, exc)
        return False
    logger.info("gateway: nginx (pid %d) reloads %s", pid, why)
    return True


@dataclass
class KeySync:
    """Keeps the gateway's map files equal to the Secret's tokens and the pod's key.

    Args:
        gateway_dir: the shared directory nginx includes the maps from (and keeps its PID file in).
        key_file: TorchServe's ``key_file.json``.
        tokens_file: the Secret's file of shared tokens.
    """

    gateway_dir: Path
    key_file: Path
    tokens_file: Path
    signalled_pid: int | None = None
    _last_error: str | None = None

    def sync(self) -> bool:
        """Rewrite what changed; SIGHUP nginx after a change or when its master is new.

        Returns:
            Whether nginx was signalled to reload.
        """
        changed = False
        try:
            tokens = parse_tokens(self.tokens_file.read_text())
            changed |= write_private(self.gateway_dir / CLIENT_TOKENS, render_client_tokens(tokens))
            self._report(None)
        except (OSError, GatewayError) as exc:  # keep what nginx has; say so once
            self._report(f"gateway tokens not updated: {exc}")
        key = inference_key(self.key_file)
        if key:
            changed |= write_private(self.gateway_dir / UPSTREAM_KEY, render_upstream_key(key))
        pid = self.nginx_pid()
        if pid is None or not (changed or pid != self.signalled_pid):
            return False
        if not reload(pid, "the updated keys" if changed else "the keys (new nginx master)"):
            return False
        self.signalled_pid = pid
        return True

    def nginx_pid(self) -> int | None:
        """The nginx master's PID from its PID file in the shared directory, if any."""
        return PidFile(self.gateway_dir / PID_FILE).read()

    def _report(self, error: str | None) -> None:
        if error and error != self._last_error:
            logger.error("%s", error)
        self._last_error = error


def key_sync(settings: Settings) -> KeySync | None:
    """The pod's :class:`KeySync` when the settings name a gateway directory, else None.

    The directory is ``$RTSERVE_GATEWAY_DIR``, the tokens ``$RTSERVE_GATEWAY_TOKENS``; none is set for a local
    ``make serve``, which has no gateway.
    """
    if settings.gateway_dir is None:
        return None
    return KeySync(settings.gateway_dir, settings.run.key_file, settings.gateway_tokens)


def find_nginx() -> str | None:
    """The nginx binary (``PATH`` first, then Debian's ``/usr/sbin/nginx``), or None."""
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


def nginx_check(conf: Path, binary: str | None = None) -> subprocess.CompletedProcess:
    """``nginx -t`` on ``conf`` (error log beside it); the completed process, output in stdout."""
    binary = binary or find_nginx()
    if not binary:
        raise FileNotFoundError("nginx is not installed: run `make nginx-deps`")
    return run([binary, "-t", "-c", str(conf), "-e", str(conf.with_suffix(".err"))], timeout=30, check=False)
