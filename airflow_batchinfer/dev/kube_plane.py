"""A real Kubernetes control plane for tests and benchmarks (:mod:`airflow_batchinfer.dev.kubelet` runs its
pods).

:func:`find_control_plane` looks for one, in this order:

1. ``$BATCHINFER_TEST_K8S_BIN``: a directory with ``etcd`` and ``kube-apiserver`` (``etcd`` may also
   be on ``PATH``), plus ``kube-controller-manager`` and ``kube-scheduler`` for the tests that run
   pods;
2. ``$KUBEBUILDER_ASSETS``: the envtest convention, as ``setup-envtest`` provides it (``etcd`` and
   ``kube-apiserver``; no controller-manager or scheduler, so only the API-server tests run and the
   others skip with a message);
3. the control-plane tool beside this repository's checkout (``../shared/tools/k8s/up.sh``), where a
   workplace provides one.

Given binaries, :func:`start_control_plane` starts them itself on 127.0.0.1 (TLS, token auth, RBAC,
a random port), as the tool does.
A control plane has no kubelet: :class:`~airflow_batchinfer.dev.kubelet.Kubelet` plays one.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import re
import secrets
import shutil
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
# The fallback: a control-plane tool beside the checkout (up.sh / down.sh), where a workplace has one.
TOOLS = ROOT.parent / "shared" / "tools" / "k8s"
BIN_ENV = "BATCHINFER_TEST_K8S_BIN"
ENVTEST_ENV = "KUBEBUILDER_ASSETS"
CONTROLLERS = ("kube-controller-manager", "kube-scheduler")
HOW_TO_GET_ONE = (
    "Get one with setup-envtest (needs Go): `go install "
    "sigs.k8s.io/controller-runtime/tools/setup-envtest@latest`, then "
    "`export KUBEBUILDER_ASSETS=$(setup-envtest use -p path)` (etcd + kube-apiserver: the API-server "
    f"tests run), or set {BIN_ENV} to a directory with etcd, kube-apiserver, kube-controller-manager and "
    "kube-scheduler (every Kubernetes test runs). See docs/testing.md."
)
NO_CONTROL_PLANE = f"no Kubernetes control plane found ({BIN_ENV}, {ENVTEST_ENV} unset). {HOW_TO_GET_ONE}"
NEEDS_CONTROLLERS = (
    "needs kube-controller-manager and kube-scheduler (Deployments make pods, pods get scheduled), which "
    f"{{source}} does not provide: set {BIN_ENV} to a directory with etcd, kube-apiserver, "
    "kube-controller-manager and kube-scheduler to run it"
)


@dataclass(frozen=True)
class Found:
    """Where the control plane comes from: binaries in ``bin_dir`` (``None``: the ``up.sh`` tool)."""

    source: str  # for messages: "BATCHINFER_TEST_K8S_BIN=/x", "KUBEBUILDER_ASSETS=/y", the tool's path
    bin_dir: Path | None = None
    etcd: Path | None = None
    controllers: bool = True


def _binaries(var: str, folder: str) -> Found:
    """The binaries in ``folder`` (named by ``$var``); ``ValueError`` naming what is missing."""
    d = Path(folder).expanduser().resolve()
    etcd = d / "etcd" if (d / "etcd").is_file() else (Path(w) if (w := shutil.which("etcd")) else None)
    have = {"etcd": etcd is not None, "kube-apiserver": (d / "kube-apiserver").is_file()}
    missing = [name for name, ok in have.items() if not ok]
    if missing:
        raise ValueError(f"{var}={folder} has no {' or '.join(missing)}. {HOW_TO_GET_ONE}")
    controllers = all((d / c).is_file() for c in CONTROLLERS)
    return Found(f"{var}={folder}", d, etcd, controllers)


def find_control_plane() -> Found | None:
    """The first control plane found (see the module doc); ``None`` when there is none.
    ``ValueError`` when an environment variable names a directory without the binaries."""
    for var in (BIN_ENV, ENVTEST_ENV):
        if folder := os.environ.get(var):
            return _binaries(var, folder)
    if (TOOLS / "up.sh").exists():
        return Found(str(TOOLS))
    return None


@dataclass
class ControlPlane:
    state: Path
    kubeconfig: Path
    found: Found
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)  # what we started (binaries)

    @property
    def controllers(self) -> bool:
        """Whether the controller-manager and scheduler run (Deployments make pods, pods get bound)."""
        return self.found.controllers

    def api(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def stop(self) -> None:
        if self.found.bin_dir is None:
            subprocess.run(
                ["bash", str(TOOLS / "down.sh"), str(self.state)], capture_output=True, check=False
            )
            return
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def start_control_plane(state: Path, found: Found | None = None) -> ControlPlane:
    """Start the control plane ``found`` (default: :func:`find_control_plane`) with its files in
    ``state`` (keep the path short: etcd's unix sockets). ``RuntimeError`` (with the logs' place)
    when it does not come up, or when there is none."""
    found = found or find_control_plane()
    if found is None:
        raise RuntimeError(NO_CONTROL_PLANE)
    for attempt in range(1, PORT_TRIES + 1):
        attempt_state = state if attempt == 1 else state / f"try-{attempt}"  # short: etcd's sockets
        attempt_state.mkdir(parents=True, exist_ok=True)
        port = _free_ports()
        try:
            if found.bin_dir is not None:
                return _start_binaries(attempt_state, port, found)
            return _up_sh(attempt_state, port, found)
        except RuntimeError:
            # another process took one of the ports between the check and the bind (seen under load)
            if attempt == PORT_TRIES or not _port_taken(attempt_state):
                raise
    raise AssertionError("unreachable")


# Ports the control plane binds (the API server, etcd's client, peer and metrics ports) are drawn
# below the kernel's ephemeral range (32768-60999 here), where no client socket takes one meanwhile.
PORT_RANGE = (21000, 32000)
PORT_TRIES = 3


def _free_ports(span: int = 4) -> int:
    """The first of ``span`` consecutive ports on 127.0.0.1 that nothing listens on now."""
    import socket

    for _ in range(100):
        first = random.randint(*PORT_RANGE)
        try:
            for p in range(first, first + span):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", p))
        except OSError:
            continue
        return first
    raise RuntimeError(f"no {span} free consecutive ports in {PORT_RANGE} on 127.0.0.1")


def _port_taken(state: Path) -> bool:
    """Whether a component's log says its port was taken (``address already in use``)."""
    return any("address already in use" in log.read_text(errors="replace") for log in state.glob("*.log"))


def _up_sh(state: Path, port: int, found: Found) -> ControlPlane:
    out = subprocess.run(
        ["bash", str(TOOLS / "up.sh"), str(state), str(port)], capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        subprocess.run(["bash", str(TOOLS / "down.sh"), str(state)], capture_output=True, check=False)
        raise RuntimeError(f"up.sh failed ({out.returncode}): {out.stderr[-2000:]}; logs in {state}")
    return ControlPlane(state, state / "kubeconfig", found)


# ------------------------------------------------------------------------- starting binaries
def _pki(pki: Path) -> None:
    """A CA, the API server's serving certificate (127.0.0.1, kubernetes.default) and the service
    account signing key: what ``up.sh`` makes with openssl."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    pki.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)

    def key(name: str) -> Any:
        k = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (pki / name).write_bytes(k.private_bytes(serialization.Encoding.PEM,
                                                 serialization.PrivateFormat.TraditionalOpenSSL,
                                                 serialization.NoEncryption()))  # fmt: skip
        return k

    def cert(subject: str, k: Any, issuer: x509.Name, signer: Any, *, ca: bool, san: list[Any]) -> Any:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        b = (x509.CertificateBuilder().subject_name(name)
             .issuer_name(issuer).public_key(k.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))  # fmt: skip
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key = key("ca.key")
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "local-ca")])
    ca = cert("local-ca", ca_key, ca_name, ca_key, ca=True, san=[])
    (pki / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    srv_key = key("apiserver.key")
    san = [
        *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "10.96.0.1")),
        *(x509.DNSName(n) for n in ("localhost", "kubernetes", "kubernetes.default")),
    ]
    srv = cert("kube-apiserver", srv_key, ca_name, ca_key, ca=False, san=san)
    (pki / "apiserver.crt").write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    sa = key("sa.key")
    (pki / "sa.pub").write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _minor(binary: Path) -> int:
    """The Kubernetes minor version of a binary (``Kubernetes v1.20.2`` → 20); 99 if unknown."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    m = re.search(r"v1\.(\d+)", out.stdout + out.stderr)
    return int(m.group(1)) if m else 99


def _spawn(plane: ControlPlane, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
    with open(plane.state / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=plane.state, env=env, start_new_session=True)  # fmt: skip
    plane.procs.append(proc)
    (plane.state / f"{name}.pid").write_text(str(proc.pid))


def _wait(what: str, ok: Any, plane: ControlPlane, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in plane.procs):
            break
        try:
            if ok():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up ({plane.found.source}); logs in {plane.state}")


def _start_binaries(state: Path, api_port: int, found: Found) -> ControlPlane:
    """etcd, kube-apiserver and, when present, kube-controller-manager and kube-scheduler, on
    127.0.0.1 only, with the flags ``up.sh`` uses (those a newer version removed are left out)."""
    plane = ControlPlane(state, state / "kubeconfig", found)
    try:
        _run_binaries(plane, api_port)
    except BaseException:
        plane.stop()
        raise
    return plane


def _run_binaries(plane: ControlPlane, api_port: int) -> None:
    found, state = plane.found, plane.state
    assert found.bin_dir is not None and found.etcd is not None
    b, pki = found.bin_dir, state / "pki"
    _pki(pki)
    token = secrets.token_hex(24)
    (pki / "tokens.csv").write_text(f"{token},admin,admin,system:masters\n")
    etcd = api_port + 1
    _spawn(plane, "etcd", [
        str(found.etcd), "--name", "local", "--data-dir", str(state / "etcd"),
        "--listen-client-urls", f"http://127.0.0.1:{etcd}", "--advertise-client-urls", f"http://127.0.0.1:{etcd}",
        "--listen-peer-urls", f"http://127.0.0.1:{etcd + 1}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd + 1}",
        "--initial-cluster", f"local=http://127.0.0.1:{etcd + 1}",
        "--listen-metrics-urls", f"http://127.0.0.1:{etcd + 2}", "--quota-backend-bytes", "1073741824",
    ], env={**os.environ, "ETCD_UNSUPPORTED_ARCH": os.environ.get("ETCD_UNSUPPORTED_ARCH", "")})  # fmt: skip
    _wait("etcd", lambda: httpx.get(f"http://127.0.0.1:{etcd}/health", timeout=1).status_code == 200, plane)
    old = _minor(b / "kube-apiserver") < 24  # the insecure ports were removed in 1.24
    _spawn(plane, "apiserver", [
        str(b / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd}",
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={api_port}",
        *(["--insecure-port=0"] if old else []),
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}", f"--token-auth-file={pki / 'tokens.csv'}",
        "--authorization-mode=RBAC", "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-cluster-ip-range=10.96.0.0/16",
        "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,DefaultStorageClass,ResourceQuota,"
        "LimitRanger",
        "--allow-privileged=true", "--profiling=false", "--v=1",
    ])  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"}
    url = f"https://127.0.0.1:{api_port}/readyz"
    tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    _wait("kube-apiserver", lambda: httpx.get(url, headers=headers, verify=tls, timeout=2)
          .status_code == 200, plane, timeout_s=120)  # fmt: skip
    plane.kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: local, cluster: {{server: "https://127.0.0.1:{api_port}", '
        f'certificate-authority: "{pki / "ca.crt"}"}}}}]\n'
        f'users: [{{name: admin, user: {{token: "{token}"}}}}]\n'
        "contexts: [{name: local, context: {cluster: local, user: admin, namespace: default}}]\n"
        "current-context: local\n"
    )
    if found.controllers:
        # --port=0 turns off the insecure port of older versions; newer ones refuse the flag.
        _spawn_controller(plane, "controller-manager", [
            str(b / "kube-controller-manager"), f"--kubeconfig={plane.kubeconfig}", "--leader-elect=false",
            "--bind-address=127.0.0.1", "--secure-port=0",
            "--controllers=*,-nodelifecycle,-nodeipam,-cloud-node-lifecycle,-route,-service,-attachdetach,"
            "-persistentvolume-binder",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=false", "--v=1",
        ], ["--port=0"])  # fmt: skip
        _spawn_controller(plane, "scheduler", [
            str(b / "kube-scheduler"), f"--kubeconfig={plane.kubeconfig}", "--leader-elect=false",
            "--bind-address=127.0.0.1", "--secure-port=0", "--v=1",
        ], ["--port=0"])  # fmt: skip


def _spawn_controller(plane: ControlPlane, name: str, argv: list[str], optional: list[str]) -> None:
    """Start a controller with ``optional`` flags, or without them if this version refuses them."""
    _spawn(plane, name, argv + optional)
    time.sleep(1.0)
    proc = plane.procs[-1]
    if proc.poll() is None:
        return
    log = (plane.state / f"{name}.log").read_text(errors="replace")
    if "unknown flag" in log:
        plane.procs.remove(proc)
        _spawn(plane, name, argv)
        time.sleep(1.0)
        if plane.procs[-1].poll() is None:
            return
    raise RuntimeError(f"{name} exited at start ({plane.found.source}); logs in {plane.state}")
