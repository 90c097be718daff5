"""Part (b) of ``bench/scale.py``: the workload through the factory DAG on a real local Airflow.

One plain JSONL input file, the DAG from :func:`~airflow_batchinfer.dag_factory.build_batch_inference_dag`
(simulated engine with the latency model, a rule judge, one round), an Airflow pool of
``replicas × concurrency`` slots with ``include_deferred``, a local warm pool started beforehand
with the very spec the DAG's ``pool_setup`` asks for (so ``pool_setup`` finds it warm) or, with
``cold``, no worker before the trigger (``pool_setup`` starts them, inside the clock), then
trigger → success through the REST API. Airflow parses the DAG file again at its default intervals
(:data:`PARSING`), not the test harness's 5 s. Parts (c) and (e) of ``bench/scale.py`` run this
with other shard sizes and ``cold``. Measured:

- wall trigger → success (the trigger's call to the run's ``end_date`` as the scheduler set it; the
  run's state is polled once a second), the bound, efficiency; the engines' busy fraction and batches (the
  workers' ``/v1/stats`` before and after);
- per task type (matched by the task id's last part, so round groups may change inside): count,
  duration median / p90 / max / sum, queue wait, deferrals (the task's ``*.trigger.*.log`` files);
- per shard-job task: its duration minus its job's ``run_s`` (the job manifests), i.e. the
  orchestration overhead a shard pays; per lane task (a round mapped per lane, ``round_00.lanes``):
  its duration minus the ``run_s`` of the jobs of the shards it took (its lane document);
- a timeline of the run's phases: its singleton tasks and each mapped task type's first start and
  last end (seconds from the trigger);
- the round's tail: from the first lane that ran out of shards (its last shard's ``ended_at``, the
  lane documents ``round-NN/lanes/lane-*.json``) to the round's last job end; a round mapped per
  shard has no lane documents, and its tail starts at the first job end after the last job start
  (a slot freed with no shard left), from the job manifests;
- peak RSS of every Airflow task process (``airflow worker -- <ti id>``, below the scheduler),
  sampled every ``sample_s`` from /proc with psutil, and of the executor's supervisor processes;
  the workers' peak RSS (``VmHWM``);
- CPU seconds over the run of the scheduler, dag-processor, triggerer and api-server (each with
  its helper processes, task processes apart).

Nothing here is asserted; every figure is printed next to the load average.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import psutil

from airflow_batchinfer.dev.local_airflow import LocalAirflow
from airflow_batchinfer.pools import LocalPool, LocalPoolSpec

DAG_ID = "bench_scale"
POOL = "bench_scale"
WAIT_POLL_S = 1.0  # how often the run's state is asked while it runs
# How often the DAG file is parsed again: Airflow's defaults, as a deployment runs it (the test
# harness's 5 s, for tests that add DAG files, cost the dag-processor ~1 CPU-s per parse: 60 CPU-s
# at 1M, on the cores the workers share; the bench writes its one DAG file before Airflow starts).
PARSING = {
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "300",
    "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "30",
}
TASK_TITLE = "airflow worker -- "  # a task runner's process title: ``airflow worker -- <ti id>``
DAG_FILE = """
from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag({dag_id!r}, max_rounds=1, airflow_pool={pool!r}, defaults={defaults!r},
                          poll_interval_s={poll!r})
"""


def is_task(title: str) -> bool:
    """A task runner's title (``airflow worker -- <ti id>``); its supervisor, an executor worker, is
    titled ``airflow worker -- LocalExecutor: <ti id>`` (and the runner too, until it retitles)."""
    return title.startswith(TASK_TITLE) and not title.startswith(TASK_TITLE + "LocalExecutor")


def ts(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


def ran(ti: dict[str, Any]) -> tuple[float | None, float | None]:
    """A task instance's start and end; none for one that never ran (skipped: a skip stamps both)."""
    if ti.get("state") == "skipped":
        return None, None
    return ts(ti.get("start_date")), ts(ti.get("end_date"))


def load() -> str:
    return "load avg " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def kind_of(task_id: str) -> str:
    """A task's type: the last part of its id (``round_00.infer`` → ``infer``), so figures do not
    depend on how round groups nest their tasks."""
    return task_id.rsplit(".", 1)[-1]


def counted(values: Any) -> dict[str, int]:
    return dict(sorted(Counter(map(str, values)).items()))


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)
    return {
        "n": len(v),
        "median": round(statistics.median(v), 2),
        "p90": round(v[int(0.9 * (len(v) - 1))], 2),
        "max": round(v[-1], 2),
        "sum": round(sum(v), 1),
    }


# --------------------------------------------------------------------------------- sampling
class ProcessSampler(threading.Thread):
    """Every ``interval_s``: the processes below each Airflow component, their RSS (peak seen, and
    ``VmHWM``) and CPU times. Task runners are told apart by their title."""

    def __init__(self, components: dict[str, int], interval_s: float = 0.2) -> None:
        super().__init__(daemon=True, name="rss-sampler")
        self.components = components
        self.interval_s = interval_s
        self.stop_event = threading.Event()
        self.procs: dict[int, dict[str, Any]] = {}  # pid -> {component, title, rss, cpu0, cpu}
        self.samples = 0

    def _sample(self) -> None:
        for component, root_pid in self.components.items():
            try:
                root = psutil.Process(root_pid)
                found = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for proc in found:
                try:
                    with proc.oneshot():
                        rss = proc.memory_info().rss
                        cpu = sum(proc.cpu_times()[:2])
                    entry = self.procs.get(proc.pid)
                    if entry is None:
                        entry = self.procs[proc.pid] = {
                            "component": component, "title": "", "rss": 0, "hwm": 0, "ppid": proc.ppid(),
                            # a process alive at the first sample counts from then, a later one from 0
                            "cpu0": cpu if self.samples == 0 else 0.0, "cpu": cpu,
                        }  # fmt: skip
                    if not is_task(entry["title"]):  # a forked runner retitles itself
                        entry["title"] = " ".join(proc.cmdline())
                    entry["rss"] = max(entry["rss"], rss)
                    entry["cpu"] = cpu
                    hwm = _vm_hwm(proc.pid)
                    entry["hwm"] = max(entry["hwm"], hwm)
                except psutil.Error:
                    continue
        self.samples += 1

    def run(self) -> None:
        while not self.stop_event.is_set():
            t0 = time.monotonic()
            self._sample()
            self.stop_event.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def stop(self) -> None:
        self.stop_event.set()
        self.join(10)
        self._sample()

    def task_rss(self) -> dict[str, float]:
        """ti id -> peak RSS (MB) of its task runner process(es)."""
        out: dict[str, float] = {}
        busy = TASK_TITLE + "LocalExecutor: "
        for e in self.procs.values():
            parent = str(self.procs.get(e["ppid"], {}).get("title"))
            if is_task(e["title"]):
                ti = e["title"][len(TASK_TITLE) :].strip()
            elif e["title"].startswith(busy) and parent.startswith(busy):
                ti = e["title"][len(busy) :].strip()  # a runner seen only before it retitled itself
            else:
                continue
            out[ti] = max(out.get(ti, 0.0), max(e["rss"], e["hwm"]) / 2**20)
        return out

    def supervisors_rss(self) -> list[float]:
        """Peak RSS (MB) of the task runners' parents (the executor's supervisors)."""
        parents = {e["ppid"] for e in self.procs.values() if is_task(e["title"])}
        return sorted(
            round(max(self.procs[p]["rss"], self.procs[p]["hwm"]) / 2**20, 1)
            for p in parents
            if p in self.procs
        )

    def cpu(self) -> dict[str, dict[str, float]]:
        """CPU seconds over the run per component: its own process, its helpers, its task runners."""
        out: dict[str, dict[str, float]] = defaultdict(lambda: {"own": 0.0, "helpers": 0.0, "tasks": 0.0})
        for pid, e in self.procs.items():
            used = max(0.0, e["cpu"] - e["cpu0"])
            part = (
                "own"
                if pid == self.components.get(e["component"])
                else "tasks"
                if is_task(e["title"])
                else "helpers"
            )
            out[e["component"]][part] += used
        return {k: {p: round(v, 1) for p, v in d.items()} for k, d in out.items()}


def _vm_hwm(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _events(log: str, words: tuple[str, ...]) -> list[str]:
    """The events of a task's (JSON lines) log that mention one of ``words``, with their times."""
    out = []
    for line in log.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        text = str(event.get("event", ""))
        if any(w in text for w in words):
            out.append(f"{str(event.get('timestamp', ''))[11:23]} {text[:160]}")
    return out[-3:]


def worker_stats(pool: LocalPool) -> dict[str, dict[str, Any]]:
    token = pool.token()
    out = {}
    for url in pool.endpoints():
        r = httpx.get(f"{url}/v1/stats", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        out[url] = r.json()["batcher"]
    return out


def worker_pids(pool: LocalPool) -> list[int]:
    state = json.loads(pool.state_file.read_text())
    return [int(w["pid"]) for gen in state["generations"].values() for w in gen.get("workers", [])]


# ------------------------------------------------------------------------------------ analysis
def job_manifests(root: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """(shard id, job kind) -> completion manifest, from every round folder of the run."""
    out = {}
    for path in root.glob("*/jobs/*.json"):
        if path.name.endswith(".accepted.json"):
            continue
        try:
            m = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if "timings" in m and "kind" in m:
            out[(path.name.split(".", 1)[0], str(m["kind"]))] = m
    return out


def lane_docs(root: Path) -> list[dict[str, Any]]:
    """The first round's lane documents (``round-00/lanes/lane-*.json``), ``[]`` for a round mapped
    per shard (a release before lanes has no :mod:`airflow_batchinfer.state.docs.lanes`)."""
    try:
        from airflow_batchinfer.state.docs.lanes import read_lanes
        from airflow_batchinfer.state.layout import RunLayout
    except ImportError:
        return []
    return [doc.model_dump() for doc in read_lanes(RunLayout(str(root)), 0)]


def round_tail(
    lanes: list[dict[str, Any]], manifests: dict[tuple[str, str], dict[str, Any]]
) -> dict[str, Any]:
    """The round's tail (see the module doc): lanes from their documents, else from the manifests."""
    ends = [float(m["timings"]["finished_at"]) for m in manifests.values()]
    if not ends:
        return {}
    last_end = max(ends)
    if lanes:
        taken = [[x for x in d["shards"] if x.get("ended_at")] for d in lanes]
        outs = [max(float(x["ended_at"]) for x in t) for t in taken if t]  # a lane's last shard end
        idle = sum(1 for t in taken if not t)
        per_lane = sorted(len(t) for t in taken)
        return {
            "source": "lane documents",
            "tail_s": round(last_end - min(outs), 2) if outs else None,
            "lanes": len(lanes),
            "lanes_without_shards": idle,
            "shards_per_lane_min_max": [per_lane[0], per_lane[-1]] if per_lane else None,
            "lane_ends_spread_s": round(max(outs) - min(outs), 2) if outs else None,
        }
    starts = [float(m["timings"]["started_at"]) for m in manifests.values()]
    last_start = max(starts)
    freed = min(e for e in ends if e >= last_start)  # the first slot freed with no shard left
    return {"source": "job manifests", "tail_s": round(last_end - freed, 2)}


def planned_shards(root: Path) -> list[str]:
    """Shard ids in map-index order, from the (single) round's plan."""
    for path in sorted(root.glob("*/plan.json")):
        shards = json.loads(path.read_text()).get("shards") or []
        if shards:
            return [str(s.get("shard_id", "")) for s in shards]
    return []


def analyse(
    tis: list[dict[str, Any]],
    manifests: dict[tuple[str, str], dict[str, Any]],
    shard_ids: list[str],
    deferrals: dict[str, int],
    rss: dict[str, float],
    t_trigger: float,
    lanes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Per task type: durations, queue wait, deferrals, RSS; per shard-job or lane task: overhead."""
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    overhead: dict[str, list[float]] = defaultdict(list)
    lane_shards = {int(d["lane"]): [x["shard_id"] for x in d["shards"]] for d in lanes or []}
    for ti in tis:
        kind = kind_of(ti["task_id"])
        start, end = ran(ti)
        queued = ts(ti.get("queued_when"))
        row = {
            "task_id": ti["task_id"], "map_index": ti["map_index"], "state": ti["state"],
            "duration": (end - start) if start and end else None,
            "queue_wait": (start - queued) if start and queued else None,
            "start": start - t_trigger if start else None, "end": end - t_trigger if end else None,
            "deferrals": deferrals.get(f"{ti['task_id']}/{ti['map_index']}", 0),
            "rss_mb": rss.get(ti["id"]),
            "try": int(ti.get("try_number") or 0),
        }  # fmt: skip
        by_kind[kind].append(row)
        if kind == "lanes":  # a lane's map index is its lane, not a shard: its shards are in its doc
            if row["duration"] is not None and ti["map_index"] in lane_shards:
                mine = set(lane_shards[ti["map_index"]])
                run_s = sum(float(m["timings"]["run_s"]) for (s, _), m in manifests.items() if s in mine)
                overhead[kind].append(row["duration"] - run_s)
        elif ti["map_index"] >= 0 and ti["map_index"] < len(shard_ids) and row["duration"] is not None:
            sid = shard_ids[ti["map_index"]]
            # the job of this task: same kind, or the jobs whose kinds make up the task's (a fused task)
            jobs = [m for (s, k), m in manifests.items() if s == sid and (k == kind or k in kind.split("_"))]
            if jobs:
                run_s = sum(float(m["timings"]["run_s"]) for m in jobs)
                overhead[kind].append(row["duration"] - run_s)
    kinds = {}
    for kind, rows in by_kind.items():
        durs = [r["duration"] for r in rows if r["duration"] is not None]
        # a task resumed after a deferral is queued again: its queued_when is then after its start
        waits = [r["queue_wait"] for r in rows if r["queue_wait"] is not None and r["queue_wait"] >= 0]
        rsss = [r["rss_mb"] for r in rows if r["rss_mb"] is not None]
        kinds[kind] = {
            "duration": quantiles(durs),
            "queue_wait": quantiles(waits),
            "deferrals": sum(r["deferrals"] for r in rows),
            "deferred_tasks": sum(1 for r in rows if r["deferrals"]),
            "overhead": quantiles(overhead.get(kind, [])),
            "rss_mb_max": round(max(rsss), 1) if rsss else None,
            "rss_mb_median": round(statistics.median(rsss), 1) if rsss else None,
            "rss_sampled": len(rsss),
            "first_start": min((r["start"] for r in rows if r["start"] is not None), default=None),
            "last_end": max((r["end"] for r in rows if r["end"] is not None), default=None),
            "states": counted(r["state"] for r in rows),
            "retried": sum(1 for r in rows if r["try"] > 1),
        }  # fmt: skip
    return kinds


def count_deferrals(logs: Path, dag_id: str, run_id: str) -> dict[str, int]:
    """``task_id/map_index`` -> how many times it deferred (one trigger log per deferral)."""
    base = logs / f"dag_id={dag_id}" / f"run_id={run_id}"
    out: dict[str, int] = defaultdict(int)
    for path in base.rglob("*.log"):
        if ".trigger." not in path.name:
            continue
        rel = path.relative_to(base).parts
        task = next((p.split("=", 1)[1] for p in rel if p.startswith("task_id=")), "?")
        mi = next((p.split("=", 1)[1] for p in rel if p.startswith("map_index=")), "-1")
        out[f"{task}/{mi}"] += 1
    return dict(out)


# ------------------------------------------------------------------------------------------ run
def setup_prefixes(defaults: dict[str, Any]) -> tuple[str, ...]:
    """The ``allowed_prefixes`` the DAG's ``pool_setup`` asks for (rendered from its templates over
    the params), so the warm pool started here has the very spec of the DAG's pool (a generation)."""
    import jinja2

    from airflow_batchinfer.dag_factory import DEFAULTS, build_batch_inference_dag
    from airflow_batchinfer.spec.limits import implied_by

    dag = build_batch_inference_dag(DAG_ID, max_rounds=1, airflow_pool=POOL, defaults=defaults)
    params = {**DEFAULTS, **defaults}
    env = jinja2.Environment()
    setup = dag.get_task("pool_setup")
    # the templates read the params the run's pin task returned (its XCom)
    ti = SimpleNamespace(xcom_pull=lambda task_ids: {"params": params, "run_root": ""})
    rendered = [
        p for t in setup.allowed_prefixes if (p := env.from_string(str(t)).render(params=params, ti=ti))
    ]
    # pool_setup adds the allowed input prefixes (here the DAG's default input, as written)
    return tuple(dict.fromkeys([*rendered, *implied_by(params).allowed_input_prefixes]))


def part_b(
    args: Any,
    work: Path,
    data: Path,
    total_tokens: int,
    records: int,
    bound: float,
    ideal_batches: int,
    *,
    cold: bool = False,
    records_per_shard: int | None = None,
    name: str = "b",
) -> dict[str, Any]:
    """The factory DAG on a real local Airflow, trigger → success (see the module doc). ``cold``: no
    worker before the trigger, ``pool_setup`` starts them; ``records_per_shard`` overrides the
    arguments' shard size; ``name`` keeps each call's Airflow, pool and run folders apart."""
    shards_per_round = getattr(args, "shards_per_round", None)
    per_shard = math.ceil(records / shards_per_round) if shards_per_round else args.records_per_shard
    per_shard = records_per_shard or per_shard
    n_shards = math.ceil(records / per_shard)
    slots = args.gpus * args.dag_concurrency
    work = work / name
    work.mkdir(parents=True, exist_ok=True)
    output_root = str(work / "runs")
    engine_options = {
        "latency_base_s": args.a,
        "latency_per_token_s": args.b,
        "completion_tokens": 0,  # latency = a + b·prompt tokens (+ max_tokens = 1), as in part (a)
        "approval_rate": 1.0,
    }
    defaults = {
        "input": str(data), "output_root": output_root, "run_name": "b", "engine": "simulated",
        "model": None, "engine_options": engine_options, "prompt_template": "{{ text }}",
        "sampling": {"max_tokens": 1}, "judge": {"type": "length", "min_chars": 1},
        "records_per_shard": per_shard, "chunk_size": min(2000, per_shard), "worker_pool": "local://bench-scale",
        "replicas": args.gpus, "concurrency": args.dag_concurrency, "idle_ttl_s": 900,
        "preflight_records": args.preflight_records, "target_batch_tokens": args.target_batch_tokens,
        "max_rounds": 1,
    }  # fmt: skip
    dags = work / "dags"
    dags.mkdir(exist_ok=True)
    (dags / "bench_scale.py").write_text(
        DAG_FILE.format(dag_id=DAG_ID, pool=POOL, defaults=defaults, poll=args.dag_poll)
    )
    cache = work / "cache"
    env = {"BATCHINFER_CACHE": str(cache), "BATCHINFER_WORKER_MAX_BATCH_SIZE": str(args.max_batch_size)}
    os.environ.update(env)  # the warm pool started here: same state dir, same worker flags
    pool = LocalPool("bench-scale")
    spec = LocalPoolSpec(
        engine="simulated", model=None, engine_options=engine_options, replicas=args.gpus,
        concurrency=args.dag_concurrency, idle_ttl_s=900,
        allowed_prefixes=setup_prefixes(defaults), target_batch_tokens=args.target_batch_tokens,
    )  # fmt: skip
    af = LocalAirflow(
        home=work / "airflow", dags_folder=dags, parallelism=args.dag_parallelism, env={**env, **PARSING}
    )
    print(
        f"\n({name}) starting {'Airflow (cold pool: pool_setup starts the' if cold else 'the warm pool ('}"
        f" {args.gpus} workers x {args.dag_concurrency}){'' if cold else ' and Airflow'}; {per_shard:,} "
        f"records per shard ...",
        flush=True,
    )
    try:
        if not cold:
            pool.up(spec)
        t0 = time.monotonic()
        af.start(pools={POOL: slots})
        af.wait_for_dag(DAG_ID)
        print(f"    Airflow up and DAG parsed in {time.monotonic() - t0:.1f} s; {load()}", flush=True)
        # a cold pool has no worker yet: its workers' counters start at zero inside the clock
        before = {} if cold else worker_stats(pool)
        warm_specs = (
            {}
            if cold
            else {k: g["spec"] for k, g in json.loads(pool.state_file.read_text())["generations"].items()}
        )
        sampler = ProcessSampler({name: af.pid(name) for name in af.procs}, interval_s=args.sample_s)
        sampler.start()
        time.sleep(max(0.5, args.sample_s * 2))
        load0 = os.getloadavg()
        t_trigger = time.time()
        t0 = time.monotonic()
        run_id = af.trigger(DAG_ID)
        # polled once a second (ten times a second cost the api-server a core's tenth, in the
        # clock); the wall ends where the scheduler marked the run's end
        state = af.wait_run(DAG_ID, run_id, timeout_s=args.dag_timeout, poll_s=WAIT_POLL_S)
        polled = time.monotonic() - t0
        load1 = os.getloadavg()
        sampler.stop()
        after = worker_stats(pool)
        tis = af.task_instances(DAG_ID, run_id)
        run = af.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")
        ended = ts(run.get("end_date"))
        wall = ended - t_trigger if ended else polled
        deferrals = count_deferrals(af.home / "logs", DAG_ID, run_id)
        workers_rss = [round(_vm_hwm(p) / 2**20, 1) for p in worker_pids(pool) if psutil.pid_exists(p)]
        gens = {k: g["spec"] for k, g in json.loads(pool.state_file.read_text())["generations"].items()}
        generations = len(gens)
        if not cold and set(gens) != set(
            warm_specs
        ):  # pool_setup asked for other settings than the warm pool's
            for key, spec_now in gens.items():
                for old_key, old in warm_specs.items():
                    diff = {f: (old.get(f), spec_now.get(f)) for f in set(old) | set(spec_now)
                            if old.get(f) != spec_now.get(f)}  # fmt: skip
                    print(f"    pool generation {old_key} -> {key}: {diff}", flush=True)
        setup_log = af.task_log(DAG_ID, run_id, "pool_setup")
    finally:
        af.stop()
        pool.down()
    root = Path(output_root) / "b"
    manifests = job_manifests(root)
    planned = planned_shards(root)
    lanes = lane_docs(root)
    kinds = analyse(tis, manifests, planned, deferrals, sampler.task_rss(), t_trigger, lanes)
    cpu = sampler.cpu()
    airflow_cpu = round(sum(sum(c.values()) for c in cpu.values()), 1)
    n_planned = len(planned) or n_shards
    zero = {"busy_time_s": 0.0, "total_batches": 0}
    busy = [after[u]["busy_time_s"] - before.get(u, zero)["busy_time_s"] for u in after]
    batches = sum(after[u]["total_batches"] - before.get(u, zero)["total_batches"] for u in after)
    jobs = list(manifests.values())
    starts = [float(m["timings"]["started_at"]) for m in jobs]
    ends = [float(m["timings"]["finished_at"]) for m in jobs]
    run_start, run_end = ts(run.get("start_date")), ts(run.get("end_date"))
    rss_all = sampler.task_rss()
    return {
        "records": records,
        "name": name,
        "cold_pool": cold,
        "shards": n_planned,  # as planned (byte-range shards hold about per_shard records)
        "records_per_shard": per_shard,
        "gpus": args.gpus,
        "slots": slots,
        "state": state,
        "wall_s": round(wall, 2),
        "run_start_to_end_s": round(run_end - run_start, 2) if run_start and run_end else None,
        "bound_s": round(bound, 2),
        "efficiency": round(bound / wall, 3),
        "engine_busy_fraction": [round(b / wall, 3) for b in busy],
        "batches": batches,
        "ideal_batches": ideal_batches,
        "jobs": len(jobs),
        "job_kinds": counted(m["kind"] for m in jobs),
        "to_first_job_s": round(min(starts) - t_trigger, 2) if starts else None,
        "after_last_job_s": round(t_trigger + wall - max(ends), 2) if ends else None,
        "jobs_span_s": round(max(ends) - min(starts), 2) if starts else None,
        "job_run_s_sum": round(sum(float(m["timings"]["run_s"]) for m in jobs), 1),
        "kinds": kinds,
        "deferrals_total": sum(deferrals.values()),
        "task_rss_mb_max": round(max(rss_all.values()), 1) if rss_all else None,
        "task_processes_sampled": len(rss_all),
        "supervisor_rss_mb": sampler.supervisors_rss()[-3:],
        "workers_peak_rss_mb": workers_rss,
        "cpu_s": cpu,
        "airflow_cpu_s": airflow_cpu,
        "airflow_cpu_ms_per_shard": round(1000 * airflow_cpu / n_planned, 1),
        "mapped_tasks": sum(1 for ti in tis if ti["map_index"] >= 0),
        "mapped_by_type": counted(kind_of(ti["task_id"]) for ti in tis if ti["map_index"] >= 0),
        "tail": round_tail(lanes, manifests),
        "timeline": timeline(tis, t_trigger),
        "pool_generations": generations,
        "pool_setup_log": _events(setup_log, ("warm", "ready", "waiting")),
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in load1],
        "sampler_samples": sampler.samples,
    }  # fmt: skip


ORDER = ["shard", "pool_setup", "plan", "lanes", "infer", "judge", "infer_judge", "in_place", "close",
         "report", "pool_teardown"]  # fmt: skip


def timeline(tis: list[dict[str, Any]], t_trigger: float) -> list[dict[str, Any]]:
    """The run's phases by start: each task (a mapped one: all its map indexes) with its count,
    first start and last end (s from the trigger); tasks that never ran (skipped) are left out."""
    spans: dict[str, list[float]] = {}
    count: Counter[str] = Counter()
    retried: Counter[str] = Counter()  # a retried task's start is its last try's
    for ti in tis:
        start, end = ran(ti)
        if start is None or end is None:
            continue
        count[ti["task_id"]] += 1
        retried[ti["task_id"]] += int(ti.get("try_number") or 0) > 1
        first, last = spans.get(ti["task_id"], (start, end))
        spans[ti["task_id"]] = [min(first, start), max(last, end)]
    return [
        {"task": task, "n": count[task], "start": round(a - t_trigger, 2), "end": round(b - t_trigger, 2),
         "span": round(b - a, 2), "retried": retried[task]}
        for task, (a, b) in sorted(spans.items(), key=lambda kv: (kv[1][0], kv[1][1]))
    ]  # fmt: skip


def print_timeline(r: dict[str, Any]) -> None:
    print("\nphases, s from the trigger (task, its task instances, first start -> last end, span):")
    for p in r["timeline"]:
        again = f"; {p['retried']} retried" if p.get("retried") else ""
        print(f"{p['task']:>26}: {p['n']:>5}  {p['start']:>7.2f} -> {p['end']:>7.2f}  ({p['span']} s{again})")
    print(f"{'success':>26}:        {'':>11}{r['wall_s']:>7.2f}")


def print_b(r: dict[str, Any], title: str = "(b) factory DAG on local Airflow") -> None:
    print(
        f"\n== {title}, SIMULATED engine: {r['records']:,} records in {r['shards']} shards "
        f"(records_per_shard {r['records_per_shard']:,}, the last ones tapered), {r['gpus']} workers, "
        f"Airflow pool {r['slots']} slots; "
        f"run {r['state']} =="
    )
    rows = [
        ("wall trigger->success", f"{r['wall_s']} s (DAG run start->end {r['run_start_to_end_s']} s)"),
        ("ideal bound", f"{r['bound_s']} s"),
        ("efficiency", f"{r['efficiency']}"),
        ("engine busy / wall", ", ".join(map(str, r["engine_busy_fraction"]))),
        ("batches / ideal", f"{r['batches']} / {r['ideal_batches']}"),
        ("jobs", f"{r['jobs']} {r['job_kinds']}; span {r['jobs_span_s']} s"),
        ("trigger->first job", f"{r['to_first_job_s']} s; last job end->success {r['after_last_job_s']} s"),
        ("deferrals", f"{r['deferrals_total']} in all"),
        (
            "task RSS",
            f"max {r['task_rss_mb_max']} MB over {r['task_processes_sampled']} task processes; "
            f"supervisors (largest) {r['supervisor_rss_mb']} MB",
        ),
        ("workers peak RSS", ", ".join(f"{m} MB" for m in r["workers_peak_rss_mb"])),
        ("load avg", f"{r['load_before']} before, {r['load_after']} after"),
        ("pool_setup said", " | ".join(r["pool_setup_log"]) or "-"),
    ]
    for k, v in rows:
        print(f"{k:>22}: {v}")
    head = [("task type", -14), ("n", 5), ("dur med", 9), ("p90", 8), ("max", 8), ("sum", 9),
            ("queue med", 10), ("ovh med", 9), ("ovh p90", 9), ("defer", 7), ("RSS max", 9), ("start", 8),
            ("end", 8)]  # fmt: skip
    print("\n" + "".join(f"{h:<{-w}}" if w < 0 else f"{h:>{w}}" for h, w in head) + "  states")
    kinds = r["kinds"]
    for kind in sorted(kinds, key=lambda k: (ORDER.index(k) if k in ORDER else 99, k)):
        k = kinds[kind]
        d, q, o = k["duration"], k["queue_wait"], k["overhead"]

        def f(x: Any, w: int = 8) -> str:
            return f"{x:>{w}.2f}" if isinstance(x, (int, float)) else f"{'-':>{w}}"

        print(f"{kind:<14}{d.get('n', 0):>5}{f(d.get('median'), 9)}{f(d.get('p90'))}{f(d.get('max'))}"
              f"{f(d.get('sum'), 9)}{f(q.get('median'), 10)}{f(o.get('median'), 9)}{f(o.get('p90'), 9)}"
              f"{k['deferrals']:>7}{f(k['rss_mb_max'], 9)}{f(k['first_start'])}{f(k['last_end'])}  "
              f"{k['states']}")  # fmt: skip
    print("\nCPU seconds over the run (own process / helper processes / task runners below it):")
    for comp, c in sorted(r["cpu_s"].items()):
        print(f"{comp:>22}: {c['own']} / {c['helpers']} / {c['tasks']}")
