"""The Kubernetes pool manager: create or adopt a pool's objects, lease and scale it, find its workers.

Everything goes through the Kubernetes API with the caller's identity (the Airflow connection's, or
the CLI's kubeconfig); the Role it needs is ``k8s/base/rbac.yaml``. Workers are found from the pods
of the Deployment (ready, not terminating, with a pod IP) and handed to the same RPC client the local
pool uses.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from airflow_batchinfer.exceptions import ConfigError, WorkerUnavailable
from airflow_batchinfer.pools.busy import worker_busy
from airflow_batchinfer.pools.kubernetes import objects
from airflow_batchinfer.pools.kubernetes.spec import DEFAULT_SCALEDOWN_TTL_S, KubernetesPoolSpec, RpcPeers
from airflow_batchinfer.pools.kubernetes.starts import observed_starts
from airflow_batchinfer.pools.tail import DELETION_COST, deletion_costs
from airflow_batchinfer.rpc.locate import Workers
from airflow_batchinfer.rpc.urls import http_url
from airflow_batchinfer.state.docs.usage import WorkerStart
from airflow_batchinfer.worker.leases import DEFAULT_LEASE_TTL_S, PoolState, ttl_annotations
from airflow_batchinfer.worker.settings import POOL_IDLE_TTL_S

log = logging.getLogger("airflow_batchinfer.pools.kubernetes")
MERGE = "application/merge-patch+json"
RBAC_REMEDY = (
    "Remedy: bind the Role in k8s/base/rbac.yaml (batchinfer-pool-manager) in this namespace to the "
    "identity Airflow or the CLI uses"
)


def api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """A client from ``kubeconfig`` (or ``$KUBECONFIG`` / ``~/.kube/config``), or the in-cluster
    service account when running in a pod without one."""
    if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ and "KUBECONFIG" not in os.environ:
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    return config.new_client_from_config(config_file=kubeconfig, context=context)


def _refused(exc: ApiException, what: str, namespace: str) -> BaseException:
    if exc.status == 403:
        return ConfigError(
            f"Kubernetes refused to {what} in namespace {namespace!r} ({exc.reason}). {RBAC_REMEDY}"
        )
    if exc.status == 401:
        return ConfigError(
            f"Kubernetes did not accept the credentials to {what}: check the kubeconfig/connection"
        )
    return exc  # type: ignore[no-any-return]


class KubernetesPool:
    """One pool: the Deployment ``name`` in ``namespace``, its headless Service and token Secret."""

    def __init__(
        self,
        api: client.ApiClient,
        name: str,
        namespace: str = "default",
        *,
        clock: Callable[[], float] = time.time,
        peers: RpcPeers | None = None,
    ) -> None:
        self.api, self.name, self.namespace, self.clock = api, name, namespace, clock
        # who may call the workers, as the pool's connection names them (the setup builds the spec)
        self.peers = peers or RpcPeers()
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)

    backend = "kubernetes"

    def __repr__(self) -> str:
        return f"KubernetesPool({self.namespace}/{self.name})"

    def __str__(self) -> str:
        return f"kubernetes://{self.namespace}/{self.name}"

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise _refused(exc, what, self.namespace) from exc

    def _get(self, what: str, fn: Callable[..., Any], *args: Any) -> Any | None:
        """``fn(*args)``, or ``None`` when the object does not exist."""
        try:
            return fn(*args)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _refused(exc, what, self.namespace) from exc

    def _create(self, resource: str, fn: Callable[..., Any], body: dict[str, Any]) -> bool:
        """Create ``body``; ``False`` when it already exists (another process was first)."""
        try:
            fn(self.namespace, body)
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise _refused(exc, f"create {resource}", self.namespace) from exc

    # -------------------------------------------------------------------------------- objects
    def ensure(self, spec: KubernetesPoolSpec, *, lease_id: str | None = None) -> str:
        """Create what is missing; adopt what exists. Returns ``created``, ``adopted``, ``updated`` or
        ``unchanged`` for the Deployment.

        A Deployment this package created carries its spec hash: when the spec changed and no other
        run holds a lease, its pod template is replaced (a rolling update); while one does, this
        refuses rather than pull workers from under a running job (``lease_id``'s own lease aside).
        A Deployment without the hash was applied by someone else (e.g. from ``k8s/``): its template
        is theirs; only its scale is ours. Concurrent setups of one pool are safe: a create that
        loses the race finds the winner's object.
        """
        if (spec.name, spec.namespace) != (self.name, self.namespace):
            raise ConfigError(f"spec is for {spec.namespace}/{spec.name}, this pool is {self}")
        ns = self.namespace
        if self._get("read secrets", self.core.read_namespaced_secret, spec.token_secret, ns) is None:
            body = objects.token_secret(spec, secrets.token_urlsafe(32))
            self._create("secrets", self.core.create_namespaced_secret, body)
        if self._get("read services", self.core.read_namespaced_service, self.name, ns) is None:
            self._create("services", self.core.create_namespaced_service, objects.worker_service(spec))
        self._ensure_disruption_budget(spec)
        self._ensure_network_policy(spec)
        dep = self._get("read deployments", self.apps.read_namespaced_deployment, self.name, ns)
        if dep is None:
            body = objects.worker_deployment(spec, replicas=0)
            body["metadata"]["annotations"].update(self._state(0, {}, spec).annotations())
            if self._create("deployments", self.apps.create_namespaced_deployment, body):
                log.info("%s: created (image %s, %d GPU per worker)", self, spec.image, spec.gpus)
                return "created"
            dep = self._deployment()
        ttls = ttl_annotations(spec.idle_ttl_s, spec.scaledown_ttl_s)
        for _ in range(20):
            annotations = dep.metadata.annotations or {}
            have = annotations.get(objects.SPEC_HASH)
            if have is None or have == spec.key():
                if any(annotations.get(k) != v for k, v in ttls.items()):
                    self._call(
                        "patch deployments",
                        self.apps.patch_namespaced_deployment,
                        self.name,
                        ns,
                        {"metadata": {"annotations": ttls}},
                        _content_type=MERGE,
                    )
                if have is None:
                    log.info(
                        "%s: adopted a Deployment this package did not create; its template is kept", self
                    )
                    return "adopted"
                return "unchanged"
            holders = sorted(set(self._state(0, annotations).live(self.clock())) - {lease_id})
            if holders:
                raise ConfigError(
                    f"{self} runs other settings (image, model or engine) and is leased by {holders}. "
                    "Remedy: use another pool name for these settings, or wait for those runs to finish"
                )
            patch = {  # guarded by resourceVersion: no lease may arrive between the check and the patch
                "metadata": {
                    "resourceVersion": dep.metadata.resource_version,
                    "annotations": {objects.SPEC_HASH: spec.key(), **ttls},
                },
                "spec": {"template": objects.template_patch(spec)},
            }
            try:
                self.apps.patch_namespaced_deployment(self.name, ns, patch, _content_type=MERGE)
            except ApiException as exc:
                if exc.status != 409:
                    raise _refused(exc, "patch deployments", ns) from exc
                dep = self._deployment()
                continue
            log.info("%s: settings changed; replacing its workers", self)
            return "updated"
        raise WorkerUnavailable(f"{self}: the Deployment kept changing; try again")

    def _ensure_disruption_budget(self, spec: KubernetesPoolSpec) -> None:
        versions = [v.version for v in client.PolicyApi(self.api).get_api_group().versions]
        if "v1" not in versions:  # policy/v1 arrived in Kubernetes 1.21
            log.info("%s: the API server serves policy %s, not v1: no PodDisruptionBudget", self, versions)
            return
        policy = client.PolicyV1Api(self.api)
        read = policy.read_namespaced_pod_disruption_budget
        if self._get("read poddisruptionbudgets", read, self.name, self.namespace) is None:
            self._create(
                "poddisruptionbudgets",
                policy.create_namespaced_pod_disruption_budget,
                objects.disruption_budget(spec),
            )

    def _ensure_network_policy(self, spec: KubernetesPoolSpec) -> None:
        """Create the pool's NetworkPolicy, or bring its rules to this spec's (``rpc_from``, port):
        who may call the workers follows the DAG's settings, and a stale port would cut Airflow off."""
        net, ns = client.NetworkingV1Api(self.api), self.namespace
        body = objects.network_policy(spec)
        name = body["metadata"]["name"]
        have = self._get("read networkpolicies", net.read_namespaced_network_policy, name, ns)
        if have is None:
            if self._create("networkpolicies", net.create_namespaced_network_policy, body):
                return
            have = self._call("read networkpolicies", net.read_namespaced_network_policy, name, ns)
        if self.api.sanitize_for_serialization(have.spec) != body["spec"]:
            body["metadata"]["resourceVersion"] = have.metadata.resource_version
            self._call("update networkpolicies", net.replace_namespaced_network_policy, name, ns, body)
            log.info("%s: NetworkPolicy %s updated (who may call the workers, or their port)", self, name)

    def token(self) -> str:
        secret = self._get(
            "read secrets", self.core.read_namespaced_secret, f"{self.name}-token", self.namespace
        )
        if secret is None or not (secret.data or {}).get("token"):
            raise ConfigError(
                f"{self}: no RPC token (Secret {self.name}-token, key 'token'). Remedy: run the pool setup "
                "task or `batchinfer pool up --backend kubernetes`, or create the Secret"
            )
        return base64.b64decode(secret.data["token"]).decode().strip()

    # ------------------------------------------------------------------------- leases & scale
    @staticmethod
    def _state(
        replicas: int, annotations: dict[str, str] | None, spec: KubernetesPoolSpec | None = None
    ) -> PoolState:
        """The lease state on a Deployment; TTLs from ``spec`` where given (they are the caller's to set)."""
        state = PoolState.from_annotations(
            replicas, annotations, idle_ttl_s=POOL_IDLE_TTL_S, scaledown_ttl_s=DEFAULT_SCALEDOWN_TTL_S
        )
        if spec is not None:
            state.idle_ttl_s, state.scaledown_ttl_s = spec.idle_ttl_s, spec.scaledown_ttl_s
        return state

    def _deployment(self) -> Any:
        dep = self._get("read deployments", self.apps.read_namespaced_deployment, self.name, self.namespace)
        if dep is None:
            raise ConfigError(
                f"{self} does not exist. Remedy: run the pool setup task or "
                f"`batchinfer pool up --backend kubernetes --name {self.name} --namespace {self.namespace}`"
            )
        return dep

    def _update(self, change: Callable[[PoolState, float], object], what: str) -> tuple[int, PoolState]:
        """Read the Deployment, apply ``change`` to its lease state, decide the replica count and
        write both in one patch guarded by ``resourceVersion`` (retried on a conflict)."""
        ranked = False
        for _ in range(20):
            dep = self._deployment()
            now = self.clock()
            state = self._state(dep.spec.replicas or 0, dep.metadata.annotations)
            change(state, now)
            target = state.decide(now)
            if 0 < target < state.replicas and not ranked:  # (to zero: every pod goes)
                ranked = True
                try:
                    self._rank_pods(dep)  # before the ReplicaSet picks which pods go
                except Exception as exc:  # best effort: the scale-down goes on, ranked as it was
                    log.warning("%s: pods not ranked for the scale-down (%s)", self, exc)
            patch = {
                "metadata": {
                    "resourceVersion": dep.metadata.resource_version,
                    "annotations": state.annotations(),
                },
                "spec": {"replicas": target},
            }
            try:
                self.apps.patch_namespaced_deployment(self.name, self.namespace, patch, _content_type=MERGE)
            except ApiException as exc:
                if exc.status == 409:  # someone else updated it meanwhile: read again
                    continue
                raise _refused(exc, "patch deployments", self.namespace) from exc
            if target != state.replicas:
                log.info("%s: %s; replicas %d -> %d", self, what, state.replicas, target)
            return target, state
        raise WorkerUnavailable(f"{self}: the Deployment kept changing under {what}; try again")

    def _rank_pods(self, dep: Any) -> None:
        """Annotate the pods with their ``pod-deletion-cost``
        (:func:`~airflow_batchinfer.pools.tail.deletion_costs`): the ReplicaSet removes idle workers
        before those running a job. Best effort: a pod that cannot be asked keeps its cost, and one
        removed anyway drains (its jobs are handed back)."""
        pods, port = self._pods(dep)
        token = self._token()
        live = [p for p in pods if p.metadata.deletion_timestamp is None]

        def ask(pod: Any) -> bool | None:  # a pod not Ready (starting, dropped by its probe): not asked
            return worker_busy(http_url(pod.status.pod_ip, port), token) if self._ready(pod) else None

        # asked at once: a reaper Job of a large pool must not spend its deadline on one pod after another
        with ThreadPoolExecutor(max_workers=min(32, len(live) or 1)) as ex:
            busy = dict(zip((p.metadata.name for p in live), ex.map(ask, live), strict=True))
        have = {p.metadata.name: (p.metadata.annotations or {}).get(DELETION_COST) for p in pods}
        for name, cost in deletion_costs(busy).items():
            if have.get(name) == cost:
                continue
            body = {"metadata": {"annotations": {DELETION_COST: cost}}}
            try:
                self.core.patch_namespaced_pod(name, self.namespace, body, _content_type=MERGE)
            except ApiException as exc:  # gone meanwhile, or the Role lacks pods/patch: logged
                log.warning("%s: pod %s keeps its deletion cost (%s %s)", self, name, exc.status, exc.reason)

    def _token(self) -> str | None:
        try:
            return self.token()
        except ConfigError:
            return None

    def want(self, lease_id: str, replicas: int | None = None) -> int:
        """Set ``lease_id``'s demand (``None``: its ceiling); fewer replicas after ``scaledown_ttl_s``
        (idle pods first), more at once. Returns the replica count."""
        asked = "its ceiling" if replicas is None else str(replicas)
        return self._update(
            lambda s, now: s.want(lease_id, replicas, now=now), f"lease {lease_id} wants {asked}"
        )[0]

    def acquire(self, lease_id: str, replicas: int, *, ttl_s: float = DEFAULT_LEASE_TTL_S) -> int:
        """Hold the pool for ``lease_id`` with ``replicas`` workers; returns the replica count."""
        return self._update(
            lambda s, now: s.acquire(lease_id, replicas, now=now, ttl_s=ttl_s),
            f"lease {lease_id} wants {replicas}",
        )[0]

    def renew(self, lease_id: str, *, ttl_s: float = DEFAULT_LEASE_TTL_S) -> bool:
        """Keep ``lease_id`` alive another ``ttl_s``; ``False`` if it has lapsed or was released."""
        renewed: list[bool] = []
        self._update(
            lambda s, now: renewed.append(s.renew(lease_id, now=now, ttl_s=ttl_s)),
            f"lease {lease_id} renewed",
        )
        return renewed[-1]

    def keep(self, lease_id: str, *, ttl_s: float = DEFAULT_LEASE_TTL_S) -> str | None:
        """Renew ``lease_id`` (lane tasks and review gates); the Deployment restarts dead pods
        itself. Returns a warning when the lease has lapsed (it is not resurrected: the replica
        count it wanted is the setup task's to decide)."""
        lease = self._state(0, self._deployment().metadata.annotations).leases.get(lease_id)
        if lease is not None and lease.expires - self.clock() > ttl_s / 2:
            return None  # fresh enough: a read, not a write, for each of a round's many lane tasks
        if self.renew(lease_id, ttl_s=ttl_s):
            return None
        return (
            f"this run's lease {lease_id} on {self} has lapsed; the pool may scale down under it. "
            "Remedy: raise the setup task's lease_ttl_s, or re-run pool_setup"
        )

    def release(self, lease_id: str, *, stop: bool = False) -> int:
        """Drop ``lease_id``; the pool stays warm for ``idle_ttl_s`` unless others still hold it, or
        scales to zero now with ``stop`` when nobody else does. Returns the replica count."""
        replicas = self._update(lambda s, now: s.release(lease_id, now=now), f"lease {lease_id} released")[0]
        if stop and replicas:
            with contextlib.suppress(ConfigError):  # other runs still hold it: they keep their workers
                replicas = self.scale_to_zero()
        return replicas

    def reconcile(self) -> int:
        """Apply the lease rules now (expired leases, idle_ttl, scaledown_ttl): the reaper's job."""
        return self._update(lambda s, now: None, "reconcile")[0]

    def scale_to_zero(self, *, force: bool = False) -> int:
        """Stop every worker now. Refuses while runs hold leases, unless ``force`` (drops them)."""

        def change(state: PoolState, now: float) -> None:
            live = sorted(state.live(now))
            if live and not force:
                raise ConfigError(
                    f"{self} is leased by {live}: they would lose their workers. Remedy: --force"
                )
            state.leases.clear()
            state.last_used = now - state.idle_ttl_s  # idle long enough: decide() scales to zero

        return self._update(change, "scaled to zero")[0]

    def delete(self) -> None:
        """Remove the pool's objects (Deployment, Service, budget, NetworkPolicy, token Secret)."""
        self.scale_to_zero()
        policy = client.PolicyV1Api(self.api)
        net, network_policy = client.NetworkingV1Api(self.api), objects.network_policy_name(self.name)
        for what, fn, name in (
            ("delete deployments", self.apps.delete_namespaced_deployment, self.name),
            ("delete services", self.core.delete_namespaced_service, self.name),
            ("delete poddisruptionbudgets", policy.delete_namespaced_pod_disruption_budget, self.name),
            ("delete secrets", self.core.delete_namespaced_secret, f"{self.name}-token"),
            # last: pods still terminating stay closed to everyone but Airflow
            ("delete networkpolicies", net.delete_namespaced_network_policy, network_policy),
        ):
            self._get(what, fn, name, self.namespace)

    # ----------------------------------------------------------------------------- discovery
    def _pods(self, dep: Any = None) -> tuple[list[Any], int]:
        """The Deployment's pods and the workers' RPC port (``dep``: already read, or read now)."""
        dep = dep or self._deployment()
        match = dep.spec.selector.match_labels or {}
        port = next(
            (
                p.container_port
                for c in dep.spec.template.spec.containers
                for p in (c.ports or [])
                if p.name == "rpc"
            ),
            8000,
        )
        sel = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
        pods = self._call(
            "list pods", self.core.list_namespaced_pod, self.namespace, label_selector=sel
        ).items
        return pods, port

    @staticmethod
    def _ready(pod: Any) -> bool:
        conds = pod.status.conditions or []
        return (
            pod.metadata.deletion_timestamp is None
            and bool(pod.status.pod_ip)
            and any(c.type == "Ready" and c.status == "True" for c in conds)
        )

    @staticmethod
    def _may_run(pod: Any) -> bool:
        """Whether the pod's worker may still run a job it took: the pod exists, has not ended and
        has an IP. A pod that is not Ready (a slow or paused worker the readiness probe dropped) or
        is terminating (draining its jobs for up to ``drain_timeout_s``) still counts."""
        return pod.status.phase not in ("Succeeded", "Failed") and bool(pod.status.pod_ip)

    def endpoints(self, lease_id: str | None = None) -> list[str]:
        """URLs of the ready workers (sorted, so every caller sees the same order)."""
        return list(self.workers(lease_id).submit)

    def workers(self, lease_id: str | None = None) -> Workers:
        """The ready workers, and every worker that may still run a job (:meth:`_may_run`), from one
        list of the Deployment's pods (sorted, so every caller sees the same order)."""
        pods, port = self._pods()

        def urls(keep: Callable[[Any], bool]) -> tuple[str, ...]:
            return tuple(sorted(http_url(p.status.pod_ip, port) for p in pods if keep(p)))

        return Workers(submit=urls(self._ready), may_run=urls(self._may_run))

    def rollout(self) -> dict[str, Any]:
        """What a readiness check needs beyond the ready pods, in one read of the Deployment:
        ``spec_key``, the spec hash it carries (``None`` for an adopted one), and ``current_ready``,
        its ready pods of the current template, 0 while the controller has not seen the latest
        change or pods of an older template remain (they could still take jobs)."""
        dep = self._deployment()
        st = dep.status
        seen = (st.observed_generation or 0) >= (dep.metadata.generation or 0)
        updated = st.updated_replicas or 0
        stale = (st.replicas or 0) > updated  # pods of an older template are still there
        current = min(updated, st.ready_replicas or 0) if seen and not stale else 0
        return {"spec_key": (dep.metadata.annotations or {}).get(objects.SPEC_HASH), "current_ready": current}

    def problems(self, pods: list[Any] | None = None) -> list[str]:
        """Why workers are not ready, in the scheduler's and kubelet's words (for error messages)."""
        out = []
        for pod in self._pods()[0] if pods is None else pods:
            name = pod.metadata.name
            for c in pod.status.conditions or []:
                if c.type == "PodScheduled" and c.status == "False":
                    out.append(f"{name}: not scheduled: {c.message} (GPUs, node selector or tolerations?)")
            for cs in pod.status.container_statuses or []:
                waiting = cs.state.waiting if cs.state else None
                if waiting and waiting.reason not in (None, "ContainerCreating"):
                    out.append(f"{name}: {waiting.reason}: {waiting.message or ''}".rstrip(": "))
                if cs.restart_count:
                    out.append(f"{name}: restarted {cs.restart_count} times (kubectl logs --previous {name})")
        return out

    def starts(self, since: float) -> list[WorkerStart]:
        """The pods created since ``since``: scheduled, container started, model loaded (asked of
        each worker), Ready (:mod:`~airflow_batchinfer.pools.kubernetes.starts`)."""
        pods, port = self._pods()
        token = None
        with contextlib.suppress(ConfigError):  # without the token the load marks stay unknown
            token = self.token()
        return observed_starts(self.api, pods, port, token, since)

    def wait_ready(self, replicas: int, *, timeout_s: float = 900.0, poll_s: float = 1.0) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            urls = self.endpoints()
            if len(urls) >= replicas:
                return urls
            if time.monotonic() > deadline:
                why = "; ".join(self.problems()) or "pods still starting (model loading?)"
                raise WorkerUnavailable(
                    f"{self}: {len(urls)} of {replicas} workers ready after {timeout_s:.0f} s: {why}"
                )
            time.sleep(poll_s)

    def status(self) -> dict[str, Any]:
        dep = self._deployment()
        now = self.clock()
        state = self._state(dep.spec.replicas or 0, dep.metadata.annotations)
        pods, port = self._pods(dep)
        return {
            "name": self.name,
            "namespace": self.namespace,
            "backend": "kubernetes",
            "replicas": dep.spec.replicas or 0,
            "ready": dep.status.ready_replicas or 0,
            "image": dep.spec.template.spec.containers[0].image,
            "managed": objects.SPEC_HASH in (dep.metadata.annotations or {}),
            **state.describe(now),
            "workers": [
                {
                    "pod": p.metadata.name,
                    "node": p.spec.node_name,
                    "url": http_url(p.status.pod_ip, port) if p.status.pod_ip else None,
                    "phase": p.status.phase,
                    "ready": self._ready(p),
                    "terminating": p.metadata.deletion_timestamp is not None,
                }
                for p in sorted(pods, key=lambda p: p.metadata.name)
            ],
            "problems": self.problems(pods),
        }
