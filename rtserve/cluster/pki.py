"""The cluster's certificates and keys, made with the ``openssl`` command.

``ca`` signs every serving and client certificate; ``front-proxy-ca`` (as in kubeadm) only the API server's
client certificate towards aggregated API servers. Service-account tokens have their own key pair. Keys are
ECDSA P-256 (fast to make, accepted by every component). :func:`commands` is pure; :func:`make` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rtserve.cluster import addons, netpol
from rtserve.runtime.process import run

DAYS = 365
LOCAL_SANS = ("IP:127.0.0.1", "DNS:localhost")
CAS = ("ca", "front-proxy-ca")
#: The common name the API server's request-header authentication accepts.
FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass(frozen=True)
class Cert:
    """A certificate signed by the cluster's CA: ``<name>.crt`` and ``<name>.key``."""

    name: str
    common_name: str
    organisation: str = ""
    sans: tuple[str, ...] = ()
    ca: str = "ca"

    @property
    def subject(self) -> str:
        return f"/CN={self.common_name}" + (f"/O={self.organisation}" if self.organisation else "")

    @property
    def usage(self) -> str:
        return "serverAuth,clientAuth" if self.sans else "clientAuth"


def certificates(service_ip: str, node: str, node_ip: str) -> tuple[Cert, ...]:
    """Every certificate the cluster uses.

    ``service_ip``: the ``kubernetes`` Service's; ``node`` and ``node_ip``: the node's name and address.
    """
    node_sans = (f"IP:{node_ip}",) + LOCAL_SANS
    api_sans = (
        LOCAL_SANS
        + (f"IP:{service_ip}",)
        + tuple(
            f"DNS:{n}"
            for n in (
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            )
        )
    )
    return (
        Cert("etcd", "etcd", sans=LOCAL_SANS),
        Cert("apiserver", "kube-apiserver", sans=api_sans),
        Cert("apiserver-etcd-client", "kube-apiserver-etcd-client"),
        Cert("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"),
        Cert("admin", "kubernetes-admin", "system:masters"),
        Cert("controller-manager", "system:kube-controller-manager", sans=LOCAL_SANS),
        Cert("scheduler", "system:kube-scheduler", sans=LOCAL_SANS),
        Cert("front-proxy-client", FRONT_PROXY_CLIENT, ca="front-proxy-ca"),
        # The node: the kubelet towards the API server (the Node authorizer's name and group),
        # its serving certificate (the API server checks it), kube-proxy, and the add-ons.
        Cert("node", f"system:node:{node}", "system:nodes"),
        Cert("kubelet", node, sans=node_sans),
        Cert("kube-proxy", "system:kube-proxy"),
        Cert("coredns", addons.COREDNS_USER),
        Cert("kube-router", netpol.USER),
        # metrics-server serves on the node's address; the API server checks its Service's name.
        Cert("metrics-server", addons.METRICS_SERVER_USER, sans=node_sans + (f"DNS:{addons.METRICS_SERVER_DNS}",)),
        # Prometheus lists the pods it scrapes; prometheus-adapter serves on the node's address, as metrics-server.
        Cert("prometheus", addons.PROMETHEUS_USER),
        Cert("prometheus-adapter", addons.ADAPTER_USER, sans=node_sans + (f"DNS:{addons.ADAPTER_DNS}",)),
    )


def _new_key(out: Path) -> list[str]:
    return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(out)]


def commands(pki: Path, certs: tuple[Cert, ...]) -> list[list[str]]:
    """The openssl commands that make the CAs, the service-account key pair and ``certs`` in ``pki``."""
    argv = [
        [
            "openssl",
            "req",
            "-x509",
            *_new_key(pki / f"{ca}.key"),
            "-out",
            str(pki / f"{ca}.crt"),
            "-days",
            str(DAYS),
            "-subj",
            f"/CN=rtserve-local-cluster-{ca}",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        ]
        for ca in CAS
    ]
    argv += [
        [
            "openssl",
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-out",
            str(pki / "sa.key"),
        ],
        ["openssl", "pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")],
    ]
    for cert in certs:
        one = [
            "openssl",
            "req",
            "-x509",
            "-CA",
            str(pki / f"{cert.ca}.crt"),
            "-CAkey",
            str(pki / f"{cert.ca}.key"),
            *_new_key(pki / f"{cert.name}.key"),
            "-out",
            str(pki / f"{cert.name}.crt"),
            "-days",
            str(DAYS),
            "-subj",
            cert.subject,
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-addext",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            "-addext",
            f"extendedKeyUsage={cert.usage}",
        ]
        if cert.sans:
            one += ["-addext", "subjectAltName=" + ",".join(cert.sans)]
        argv.append(one)
    return argv


def make(pki: Path, certs: tuple[Cert, ...]) -> None:
    """Make the CA, keys and certificates in ``pki`` (private: mode 0700)."""
    pki.mkdir(parents=True, exist_ok=True)
    pki.chmod(0o700)
    for argv in commands(pki, certs):
        run(argv, timeout=1800, apart=True)
