"""The pipeline on Airflow as users deploy it (the ``deployment`` fixture: PostgreSQL, Redis, Celery,
FAB, two triggerers and two Celery workers that share no disk). Every scenario ends with a successful
DAG run and the id invariant (0 lost, 0 doubled), from the report and counted again from the files on
S3; a pool that cannot work in this topology is refused at ``pool_setup``, within seconds, with the
reason and the remedy, and the remedy's run then succeeds."""

from __future__ import annotations

import contextlib
import json
import random
import time
import urllib.parse
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.support.chaos import count_ids, lane_job, read_doc, shard_tis, ti_by_id, wait_until
from tests.support.deployment import (
    BUCKET,
    CELERY_WORKERS,
    FAILURE_TIMEOUT_S,
    TRIGGERERS,
    DeployedAirflow,
    StaticPools,
    kill_component,
)
from tests.support.seaweedfs import S3Server
from tests.support.workers import WorkerProcess

pytestmark = [pytest.mark.deployment, pytest.mark.airflow, pytest.mark.slow, pytest.mark.timeout(600)]
RUN_TIMEOUT_S = 300
REVIEW_DELAY_S = 10  # Airflow 3.3.2 can fail a gate answered within a few seconds of opening


@dataclass
class Run:
    af: DeployedAirflow
    dag_id: str
    run_id: str
    root: str
    ids: list[str]
    so: dict[str, Any]

    def tis(self) -> list[dict[str, Any]]:
        return self.af.task_instances(self.dag_id, self.run_id)

    def state(self) -> str:
        return self.af.run_state(self.dag_id, self.run_id)

    def report(self) -> dict[str, Any]:
        return read_doc(f"{self.root}/report/summary.json", self.so) or {}

    def explain(self) -> str:
        """The task states, and the logs of the tasks that failed (from the hosts that ran them)."""
        tis = self.tis()
        lines = [f"{t['task_id']}[{t['map_index']}] {t['state']} try {t['try_number']}" for t in tis]
        for t in tis:
            if t["state"] in ("failed", "up_for_retry"):
                lines.append(self.af.task_log(self.dag_id, self.run_id, t["task_id"], t["map_index"])[-3000:])
        return "\n".join(lines)


def start(af: DeployedAirflow, s3: S3Server, dag_id: str, name: str, n: int, **conf: Any) -> Run:
    """Write ``n`` records to S3 and trigger a run over them; the run root is on S3 too."""
    import fsspec

    so = s3.storage_options()
    ids = [f"{name}-{i:03d}" for i in range(n)]
    uri = f"s3://{BUCKET}/data/{name}.jsonl"
    body = "".join(json.dumps({"id": rid, "question": f"question {i}"}) + "\n" for i, rid in enumerate(ids))
    fsspec.filesystem("s3", **so).pipe(uri, body.encode())
    run_id = af.trigger(dag_id, {"input": uri, "run_name": name, **conf})
    return Run(af, dag_id, run_id, f"s3://{BUCKET}/runs/{name}", ids, so)


def stop_at_gates(detail: dict[str, Any]) -> str:
    return "Stop"


def succeed(run: Run, **wait: Any) -> dict[str, Any]:
    state = run.af.wait_run(run.dag_id, run.run_id, timeout_s=RUN_TIMEOUT_S, poll_s=1.0, **wait)
    assert state == "success", f"{run.dag_id}/{run.run_id} ended {state}:\n{run.explain()}"
    report = run.report()
    assert report["invariant"]["ok"], report["invariant"]
    found = count_ids(run.root, run.ids, report, run.so)
    assert found.ok, found.summary()  # every id once, counted from the files themselves
    return report


def refused(run: Run) -> tuple[dict[str, Any], str]:
    """The run's failed ``pool_setup`` (the run failed with it) and its log."""
    state = run.af.wait_run(run.dag_id, run.run_id, timeout_s=RUN_TIMEOUT_S, poll_s=1.0)
    setup = ti_by_id(run.tis(), "pool_setup")
    assert state == "failed" and setup is not None and setup["state"] == "failed", run.explain()
    return setup, run.af.task_log(run.dag_id, run.run_id, "pool_setup")


def hosts_of(run: Run, task_id: str = "round_00.lanes") -> dict[str, list[int]]:
    """Celery worker -> the map indexes of ``task_id`` it ran (any try)."""
    out: dict[str, list[int]] = {w: [] for w in CELERY_WORKERS}
    for ti in run.tis():
        if ti["task_id"] == task_id:
            for worker in run.af.ran_on(run.dag_id, run.run_id, task_id, ti["map_index"]):
                out[worker].append(ti["map_index"])
    return out


def jobs_taken(workers: list[WorkerProcess]) -> int:
    """Jobs the workers have taken since they started, in any state."""
    total = 0
    for w in workers:
        with w.client() as c:
            total += sum(c.stats().jobs.values())
    return total


# ---------------------------------------------------------------------------- a. static pool + FAB desk
def sign_in_fab(page: Any, af: DeployedAirflow, username: str, next_path: str) -> None:
    """The FAB auth manager's login page: username, password, submit."""
    page.goto(f"{af.url}/auth/login/?next={urllib.parse.quote(af.url + next_path, safe='')}")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", af.users[username])
    page.press("input[name=password]", "Enter")
    page.wait_for_url(lambda url: "/auth/" not in url, timeout=60_000)


def desk(af: DeployedAirflow, username: str, method: str, path: str, **kw: Any) -> httpx.Response:
    """A review desk API call with ``username``'s session cookie, as the UI's iframe sends it."""
    return httpx.request(
        method, f"{af.url}/batchinfer{path}", cookies={"_token": af.token_for(username)}, timeout=60, **kw
    )


def test_a_static_pool_and_a_gate_decided_on_the_desk_by_a_fab_reviewer(
    deployment: DeployedAirflow, deploy_s3: S3Server, static_pools: StaticPools
) -> None:
    from playwright.sync_api import expect

    from tests.support.browser import Shots, chromium
    from tests.support.browser import missing as no_browser

    if why := no_browser():
        pytest.skip(why)
    af = deployment
    run = start(af, deploy_s3, "deploy_review", "review", 40)
    gate = wait_until(
        lambda: next(iter(af.pending_reviews(run.dag_id, run.run_id)), None),
        RUN_TIMEOUT_S,
        "the review gate after round 0",
    )
    assert gate["task_instance"]["task_id"] == "round_01.plan"
    base = f"/api/gates/{run.dag_id}/{urllib.parse.quote(run.run_id, safe='')}"

    # someone without the DAG's HITL permissions sees and decides nothing
    assert desk(af, "outsider", "GET", f"{base}/page").status_code == 403
    assert (
        desk(
            af,
            "outsider",
            "POST",
            f"{base}/decisions",
            json={"action": "accept", "ids": [run.ids[0]], "note": ""},
        ).status_code
        == 403
    )

    shots = Shots("deployment_fab_review")
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        query = urllib.parse.urlencode({"dag_id": run.dag_id, "run_id": run.run_id})
        sign_in_fab(page, af, "reviewer", f"/batchinfer/review/?{query}")
        expect(page.get_by_test_id("gate-subject")).to_be_visible(timeout=60_000)
        expect(page.get_by_test_id("status")).to_have_text("", timeout=60_000)
        rows = page.get_by_test_id("sample-row")
        expect(rows.first).to_be_visible()
        shots.take(page, "desk")
        accepted = [r.get_attribute("data-sample-id") for r in rows.all()[:2]]
        for rid in accepted:
            page.locator(
                f"[data-testid=sample-row][data-sample-id='{rid}'] [data-testid=select-sample]"
            ).check()
        page.get_by_test_id("decide-accept").click()
        expect(page.get_by_test_id("status")).to_contain_text("Recorded: Accept 2 samples")
        shots.take(page, "desk-decided")

        # the gate, answered on its Required Actions page by the same person
        page.goto(f"{af.url}/dags/{run.dag_id}/runs/{run.run_id}/tasks/round_01.plan/required_actions")
        option = page.get_by_test_id("hitl-option-Continue")
        expect(option).to_be_enabled(timeout=60_000)
        opened = datetime.fromisoformat(gate["created_at"]).timestamp()
        time.sleep(max(0.0, opened + REVIEW_DELAY_S - time.time()))
        with page.expect_response(lambda r: r.request.method == "PATCH" and "/hitlDetails" in r.url) as sent:
            option.click()
        assert sent.value.status == 200, sent.value.text()
        shots.take(page, "gate-answered")
        context.close()

    report = succeed(run, on_review=stop_at_gates, review_delay_s=REVIEW_DELAY_S)
    by_review = [r for r in _rows(run, "results", "reviewed-") if r.get("accepted_by_review")]
    assert sorted(r["id"] for r in by_review) == sorted(accepted)
    assert {r["judgment"]["person"]["by"] for r in by_review} == {"reviewer"}  # the FAB user's name
    assert report["accepted_by_review"] == 2
    ports = {w.rsplit(":", 1)[1] for r in report["rounds"] for w in r.get("workers", {})}  # HOST:PORT
    assert ports == {w.url.rsplit(":", 1)[1] for w in static_pools.fast}, ports


def _rows(run: Run, sub: str, prefix: str) -> list[dict[str, Any]]:
    from airflow_batchinfer.storage import JsonlDir

    files = JsonlDir(f"{run.root}/{sub}", storage_options=run.so).jsonl_files()
    return [row for f in files if f.uri.rsplit("/", 1)[-1].startswith(prefix) for row in f.iter_records()]


# ----------------------------------------------------------------- b. Kubernetes pool over both workers
def test_b_a_kubernetes_pool_with_shard_tasks_on_both_celery_workers(
    deployment: DeployedAirflow, deploy_s3: S3Server, kube: Any
) -> None:
    from kubernetes import client

    af = deployment
    ns = kube.namespace()
    # the workers' S3 credentials: a Secret the pool's pods read (storage_secret), as IRSA would give them
    client.CoreV1Api(kube.api).create_namespaced_secret(
        ns, {"metadata": {"name": "s3-env"}, "stringData": deploy_s3.env()}
    )
    kubeconfig = kube.plane.kubeconfig.read_text()  # in the connection: no host reads a shared file
    af.api(
        "POST",
        "/connections",
        json={
            "connection_id": f"deploy_kube_{ns}",
            "conn_type": "kubernetes",
            "extra": json.dumps({"kube_config": kubeconfig}),
        },
    )
    af.api(
        "POST",
        "/connections",
        json={
            "connection_id": "deploy_k8s",
            "conn_type": "batchinfer_pool",
            "extra": json.dumps(
                {
                    "backend": "kubernetes",
                    "namespace": ns,
                    "pool": "deploy",
                    "kubernetes_conn_id": f"deploy_kube_{ns}",
                }
            ),
        },
    )
    settings = {
        "gpus": 1,
        "cpu": "1",
        "memory": "1Gi",
        "port": random.randint(20000, 40000),
        "drain_timeout_s": 5,
        "storage_secret": "s3-env",
    }
    # jobs of 2 s, the lanes in their tasks (the AWS connection): 2 pods x concurrency 4 make 8 lanes,
    # which cannot all sit on one Celery worker's 4 slots
    engine = {"approval_rate": 0.5, "latency_base_s": 2.0}
    run = start(
        af,
        deploy_s3,
        "deploy_rounds",
        "k8s",
        120,
        worker_pool="deploy_k8s",
        kubernetes=settings,
        engine_options=engine,
        concurrency=4,
    )
    report = succeed(run)
    pods = {name for where, name in kube.kubelet.ran if where == ns}
    workers = {w.rsplit(":", 1)[0] for r in report["rounds"] for w in r.get("workers", {})}
    assert len(workers) == 2 and workers <= pods, (workers, pods)
    spread = hosts_of(run)
    assert all(spread.values()), f"lane tasks ran on one Celery worker only: {spread}"
    assert sorted({i for indexes in spread.values() for i in indexes}) == list(range(8))  # 8 lanes
    assert report["rounds"][0]["shards"] == 12


# -------------------------------------------------------------------------- c. a triggerer SIGKILLed
def test_c_a_triggerer_killed_while_shard_tasks_are_deferred(
    deployment: DeployedAirflow, deploy_s3: S3Server
) -> None:
    af = deployment
    run = start(af, deploy_s3, "deploy_deferred", "triggerer", 40)
    deferred = wait_until(
        lambda: len(d := shard_tis(run.tis(), "deferred")) >= 2 and d,
        120,
        "lane tasks deferred on the triggerers (their lanes run there)",
    )
    # the triggerer that runs the first deferred task's trigger (its job's hostname is the component)

    def now(ti: dict[str, Any]) -> dict[str, Any]:  # the task instance as it is now (its trigger's triggerer)
        return ti_by_id(run.tis(), ti["task_id"], ti["map_index"]) or ti

    # a deferred task's trigger is given to a triggerer a moment after the deferral
    victim = wait_until(
        lambda: af.triggerer_of(now(deferred[0])), 60, "a triggerer to take the first trigger"
    )
    held = [t for t in map(now, deferred) if af.triggerer_of(t) == victim]
    survivor = next(t for t in TRIGGERERS if t != victim)
    kill_component(af, victim)
    try:
        still = [ti_by_id(run.tis(), t["task_id"], t["map_index"]) for t in held]
        assert all(t and t["state"] == "deferred" for t in still), f"ended before the kill: {still}"
        report = succeed(run)
    finally:
        af.start_component(victim)
    assert report["rounds"][0]["shards"] == 4
    # the killed triggerer's deferred lanes ended on the survivor, in their first try: each took its
    # running shard back and followed the job
    for t in held:
        done = ti_by_id(run.tis(), t["task_id"], t["map_index"])
        assert done is not None and done["state"] == "success" and done["try_number"] == t["try_number"], done
    assert held and survivor in {j["hostname"] for j in _alive_triggerers(af)}


def _alive_triggerers(af: DeployedAirflow) -> list[dict[str, Any]]:
    params = {"job_type": "TriggererJob", "is_alive": True, "limit": 100}
    return list(af.api("GET", "/jobs", params=params)["jobs"])


# ------------------------------------------------------------------------ d. a Celery worker SIGKILLed
def test_d_a_celery_worker_killed_mid_task_and_the_retry_follows_the_job(
    deployment: DeployedAirflow, deploy_s3: S3Server, static_pools: StaticPools
) -> None:
    af = deployment
    before = jobs_taken(static_pools.slow)
    run = start(af, deploy_s3, "deploy_inline", "celery", 20)

    def running_task() -> tuple[dict[str, Any], dict[str, int], str] | None:
        for ti in shard_tis(run.tis(), "running"):
            try:
                procs = af.task_processes(run.dag_id, run.run_id, ti["task_id"], ti["map_index"])
            except LookupError:
                continue
            component = af.component_of(procs["task"])
            if (
                component in CELERY_WORKERS
                and _job_state(run, ti["map_index"], static_pools.slow) == "running"
            ):
                return ti, procs, component
        return None

    victim, procs, worker = wait_until(
        running_task, 120, "a lane task running its lane on a Celery worker with its job"
    )
    other = next(w for w in CELERY_WORKERS if w != worker)
    kill_component(af, worker)  # the worker, its task supervisors and task processes: a lost host

    def retried() -> dict[str, Any] | None:
        t = ti_by_id(run.tis(), victim["task_id"], victim["map_index"])
        return (
            t
            if t and t["try_number"] > procs["try_number"] and t["state"] in ("running", "success")
            else None
        )

    try:
        wait_until(retried, FAILURE_TIMEOUT_S * 8, "the killed task's retry")
        report = succeed(run)
    finally:
        af.start_component(worker)
    tries = af.ran_on(run.dag_id, run.run_id, victim["task_id"], victim["map_index"])
    assert procs["try_number"] in tries.get(worker, []) and tries.get(other), tries
    # the retry's lane took its shard back and followed the job its first try left running: one job
    # per shard, none twice
    assert jobs_taken(static_pools.slow) - before == report["rounds"][0]["shards"] == 2


def _job_state(run: Run, lane: int, workers: list[WorkerProcess]) -> str | None:
    """The state of the job round 0's lane ``lane`` runs now on whichever of ``workers`` has it."""
    spec = lane_job(run.root, lane, run.so)
    if spec is None:
        return None
    for w in workers:
        with contextlib.suppress(Exception), w.client() as c:
            return str(c.status(spec.job_id).state)
    return None


# ----------------------------------------------------------------- e. a local pool in this topology
def test_e_a_local_pool_is_refused_at_setup_within_seconds(
    deployment: DeployedAirflow, deploy_s3: S3Server
) -> None:
    af = deployment
    run = start(af, deploy_s3, "deploy_rounds", "local", 10, worker_pool="local://deploy-local")
    setup, log = refused(run)
    took = (
        datetime.fromisoformat(setup["end_date"]) - datetime.fromisoformat(setup["start_date"])
    ).total_seconds()
    assert took < 30, f"pool_setup took {took:.0f} s to refuse a local pool"
    assert setup["try_number"] == 1  # a refusal is not retried
    assert "CeleryExecutor" in log and "need the tasks, the triggerer and the workers on one host" in log, log
    assert "static pool" in log and "kubernetes://" in log, log  # the remedy
    tokens = [p for c in (*af.components, "cli") for p in af.host(c).glob("cache/pools/*/token")]
    assert not tokens, f"a local pool token was written: {tokens}"
    # the remedy: the same input on a static pool
    report = succeed(start(af, deploy_s3, "deploy_rounds", "local-fixed", 10))
    assert report["rounds"][0]["shards"] == 1


# -------------------------------------------------------------- f. a static pool behind one shared URL
def test_f_a_static_pool_url_shared_by_several_workers_is_refused(
    deployment: DeployedAirflow, deploy_s3: S3Server, static_pools: StaticPools
) -> None:
    af = deployment
    run = start(af, deploy_s3, "deploy_rounds", "shared", 10, worker_pool="deploy_shared")
    setup, log = refused(run)
    assert static_pools.shared.url in log and "answered by several workers" in log, log
    assert "each worker's own URL" in log, log  # the remedy
    assert setup["try_number"] == 1
    # the remedy: the connection that lists each worker's own URL
    report = succeed(start(af, deploy_s3, "deploy_rounds", "shared-fixed", 10))
    assert report["rounds"][0]["shards"] == 1
