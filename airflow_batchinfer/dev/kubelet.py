"""A kubelet stand-in for a control plane (:mod:`airflow_batchinfer.dev.kube_plane`), which has none.

:class:`Kubelet` registers GPU nodes (tainted ``nvidia.com/gpu``, as GPU node pools are), and for
every pod the scheduler binds to them it starts the container's command as a local process with the
container's environment (secrets and the downward API resolved, ``$(VAR)`` expanded), on its own
127.x.y.z pod IP. It reports the pod IP, runs the readiness probe against the process, restarts
exited containers, and on deletion sends SIGTERM, waits the grace period, SIGKILLs and finalises the
delete. A pod force-deleted (grace 0) loses its process at once, as on a lost node.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import random
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PodProcess:
    namespace: str
    name: str
    uid: str
    ip: str
    port: int
    probe_path: str
    command: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    ready: bool = False
    restarts: int = 0
    started_at: str = field(default_factory=_now)
    kill_at: float | None = None  # SIGKILL after the grace period
    # each condition's (status, lastTransitionTime): the time moves only when its status does
    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)

    def spawn(self) -> None:
        out = open(self.log, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            self.command, env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=self.log.parent,
        )  # fmt: skip
        out.close()
        self.started_at = _now()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            assert self.proc is not None
            os.killpg(self.proc.pid, sig)


class Kubelet:
    """Run the pods bound to ``nodes`` GPU nodes as local processes. ``bin_dir`` provides the
    container's executables (``batchinfer``), as the image would."""

    def __init__(
        self, api: Any, workdir: Path, *, bin_dir: Path, nodes: int = 2, gpus_per_node: int = 8
    ) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.workdir = workdir.resolve()
        self.bin_dir = bin_dir.resolve()
        self.nodes = [f"gpu-node-{i}" for i in range(nodes)]
        self.gpus = gpus_per_node
        self.pods: dict[str, PodProcess] = {}
        self.net = f"127.{random.randint(100, 250)}.{random.randint(0, 250)}"
        self._next_ip = 2
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self.errors: list[str] = []
        self.ran: list[tuple[str, str]] = []  # (namespace, pod) of every pod started

    # ---------------------------------------------------------------------------------- nodes
    def register_nodes(self) -> None:
        for name in self.nodes:
            self.core.create_node({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                       "nvidia.com/gpu.present": "true"}},
            })  # fmt: skip
            # GPU node pools are tainted so only pods that tolerate it land there.
            self.core.patch_node(name, {"spec": {"taints": [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}})  # fmt: skip
            capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(self.gpus)}
            self.core.patch_node_status(name, {"status": {
                "capacity": capacity, "allocatable": capacity,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "kubelet stand-in", "lastHeartbeatTime": _now(),
                                "lastTransitionTime": _now()}],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            }})  # fmt: skip

    def start(self) -> Kubelet:
        self.register_nodes()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        for pod in self.pods.values():
            pod.signal(signal.SIGKILL)
            if pod.proc is not None:
                pod.proc.wait()

    # ----------------------------------------------------------------------------------- pods
    def process_of(self, pod_name: str) -> PodProcess:
        return next(p for p in self.pods.values() if p.name == pod_name)

    def _allocate_ip(self) -> str:
        ip = f"{self.net}.{self._next_ip}"
        self._next_ip += 1
        return ip

    def _resolve_env(self, pod: Any, container: Any, ip: str) -> dict[str, str]:
        # what a container runtime sets: PATH from the image, HOSTNAME = the pod's name
        env = {"PATH": f"{self.bin_dir}:/usr/bin:/bin", "HOSTNAME": pod.metadata.name, "LANG": "C.UTF-8"}
        if os.environ.get("PYTHONPATH"):  # the code the image would hold: the checkout under test
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        fields = {"status.podIP": ip, "metadata.name": pod.metadata.name,
                  "metadata.namespace": pod.metadata.namespace}  # fmt: skip
        for source in container.env_from or []:
            if source.secret_ref:
                data = self.core.read_namespaced_secret(source.secret_ref.name, pod.metadata.namespace).data
                env.update({k: base64.b64decode(v).decode() for k, v in (data or {}).items()})
        for var in container.env or []:
            if var.value_from is None:
                env[var.name] = self._expand(var.value or "", env)
            elif var.value_from.field_ref:
                env[var.name] = fields[var.value_from.field_ref.field_path]
            elif var.value_from.secret_key_ref:
                ref = var.value_from.secret_key_ref
                data = self.core.read_namespaced_secret(ref.name, pod.metadata.namespace).data
                env[var.name] = base64.b64decode(data[ref.key]).decode()
        return env

    @staticmethod
    def _expand(text: str, env: dict[str, str]) -> str:
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)

    def _start(self, pod: Any) -> None:
        container = pod.spec.containers[0]
        ip = self._allocate_ip()
        env = self._resolve_env(pod, container, ip)
        argv = [self._expand(a, env) for a in (container.command or []) + (container.args or [])]
        exe = self.bin_dir / argv[0]
        argv[0] = str(exe) if exe.exists() else argv[0]
        ports = {p.name: p.container_port for p in container.ports or []}
        probe = container.readiness_probe.http_get
        port = ports.get(probe.port, probe.port) if isinstance(probe.port, str) else probe.port
        log_dir = self.workdir / pod.metadata.namespace
        log_dir.mkdir(parents=True, exist_ok=True)
        proc = PodProcess(
            pod.metadata.namespace, pod.metadata.name, pod.metadata.uid, ip, int(port), probe.path,
            argv, env, log_dir / f"{pod.metadata.name}.log",
        )  # fmt: skip
        for c in pod.status.conditions or []:  # the scheduler's PodScheduled keeps its time
            if c.last_transition_time is not None:
                proc.conditions[c.type] = (c.status, c.last_transition_time.strftime("%Y-%m-%dT%H:%M:%SZ"))
        proc.spawn()
        self.pods[pod.metadata.uid] = proc
        self.ran.append((proc.namespace, proc.name))
        self._report(proc)

    def _report(self, p: PodProcess) -> None:
        ready = "True" if p.ready else "False"
        for kind, value in (
            ("Initialized", "True"),
            ("PodScheduled", "True"),
            ("ContainersReady", ready),
            ("Ready", ready),
        ):
            if p.conditions.get(kind, ("",))[0] != value:
                p.conditions[kind] = (value, _now())
        cond = [{"type": t, "status": s, "lastTransitionTime": at} for t, (s, at) in p.conditions.items()]
        status = {
            "phase": "Running", "podIP": p.ip, "podIPs": [{"ip": p.ip}], "hostIP": "127.0.0.1",
            "startTime": p.started_at, "conditions": cond,
            "containerStatuses": [{
                "name": "worker", "ready": p.ready, "restartCount": p.restarts, "started": True,
                "image": "airflow-batchinfer-worker", "imageID": "",
                "state": {"running": {"startedAt": p.started_at}},
            }],
        }  # fmt: skip
        try:
            self.core.patch_namespaced_pod_status(p.name, p.namespace, {"status": status})
        except Exception as exc:  # the pod may be gone already
            if "NotFound" not in str(exc) and "Not Found" not in str(exc):
                self.errors.append(f"status of {p.name}: {exc}")

    def _probe(self, p: PodProcess) -> bool:
        try:
            return httpx.get(f"http://{p.ip}:{p.port}{p.probe_path}", timeout=0.5).status_code == 200
        except httpx.HTTPError:
            return False

    def _finalise(self, p: PodProcess) -> None:
        try:
            self.core.delete_namespaced_pod(p.name, p.namespace, grace_period_seconds=0)
        except Exception as exc:
            if "NotFound" not in str(exc) and "Not Found" not in str(exc):
                self.errors.append(f"finalising {p.name}: {exc}")
        self.pods.pop(p.uid, None)

    def _tick(self) -> None:
        listed = {p.metadata.uid: p for p in self.core.list_pod_for_all_namespaces().items}
        for uid, gone in list(self.pods.items()):
            if uid not in listed:  # force-deleted: the process goes with it
                gone.signal(signal.SIGKILL)
                if gone.proc is not None:
                    gone.proc.wait(timeout=10)
                self.pods.pop(uid)
        for uid, pod in listed.items():
            if pod.spec.node_name not in self.nodes:
                continue
            p = self.pods.get(uid)
            if pod.metadata.deletion_timestamp is not None:
                if p is None:
                    continue
                if p.kill_at is None:
                    p.signal(signal.SIGTERM)
                    p.kill_at = time.monotonic() + (pod.metadata.deletion_grace_period_seconds or 0)
                elif p.alive and time.monotonic() > p.kill_at:
                    p.signal(signal.SIGKILL)
                if not p.alive:
                    self._finalise(p)
                continue
            if p is None:
                self._start(pod)
                continue
            if not p.alive:  # restartPolicy Always
                p.restarts += 1
                p.ready = False
                p.spawn()
                self._report(p)
                continue
            ready = self._probe(p)
            if ready != p.ready:
                p.ready = ready
                self._report(p)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # keep playing the kubelet; tests read .errors
                self.errors.append(repr(exc))
            self._stop.wait(0.2)
