"""``batchinfer run``: the whole round pipeline on a worker pool, without Airflow.

shard → per round: infer → judge → recompact the rejected set into the next round's pending set —
or, in place, retry each sample on the worker until approved or ``max_attempts``; ``hybrid`` starts
with rounds and switches to in place once rounds stop shrinking the pending set enough. The quick way
to try a model, prompts and a judge before writing a DAG; the Airflow DAGs run the same jobs.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_batchinfer.exceptions import ConfigError, JobFailed
from airflow_batchinfer.layout import RunLayout
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.storage import JsonlDir, JsonlFile, ShardDescriptor, recompact, shard_dataset
from airflow_batchinfer.storage.json_doc import write_json
from airflow_batchinfer.storage.location import resolve

STRATEGIES = ("rounds", "in_place", "hybrid")


@dataclass
class PipelineConfig:
    input: str
    run_root: str
    prompt_template: str | None
    judge: dict[str, Any]
    system: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    strategy: str = "rounds"
    max_rounds: int = 3
    max_attempts: int = 3
    records_per_shard: int = 2_000
    chunk_size: int = 500
    id_field: str | None = None
    assign_ids: bool = False
    hybrid_min_shrink: float = 0.3
    job_retries: int = 2

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy {self.strategy!r}: choose one of {', '.join(STRATEGIES)}")
        if self.max_rounds < 1 or self.max_attempts < 1:
            raise ConfigError("max_rounds and max_attempts must be >= 1")


Progress = Callable[[str, int, int], None]  # (phase, records done, records total)


async def _run_all(
    pool: PoolClient, specs: list[JobSpec], retries: int, progress: Progress | None, phase: str, total: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run jobs on the pool; a job that fails is retried, then reported (never silently dropped)."""
    done = 0

    async def one(spec: JobSpec) -> dict[str, Any]:
        nonlocal done
        error: str | None = None
        for _ in range(retries + 1):
            try:
                manifest = await pool.run(spec)
            except JobFailed as exc:
                error = exc.error
                continue
            done += int(spec.params.get("input_records") or 0)
            if progress:
                progress(phase, done, total)
            return manifest
        return {"failed": True, "shard": spec.input, "phase": spec.kind, "error": error}

    results = await asyncio.gather(*(one(s) for s in specs))
    return [r for r in results if not r.get("failed")], [r for r in results if r.get("failed")]


def _write_json(uri: str, data: Any) -> None:
    write_json(resolve(uri), data)


async def run_pipeline(
    cfg: PipelineConfig, pool: PoolClient, *, progress: Progress | None = None
) -> dict[str, Any]:
    layout = RunLayout(cfg.run_root)
    # Job ids name one job: the run is part of them, so warm workers shared by runs never confuse two.
    run_key = hashlib.sha256(resolve(cfg.run_root).uri.encode()).hexdigest()[:10]
    t0 = time.monotonic()
    sharded = await asyncio.to_thread(
        shard_dataset,
        cfg.input,
        layout.input,
        records_per_shard=cfg.records_per_shard,
        id_field=cfg.id_field,
        assign_ids=cfg.assign_ids,
        rejects=layout.rejects,
    )
    id_field = sharded.id_field
    common = {
        "prompt_template": cfg.prompt_template,
        "system": cfg.system,
        "sampling": cfg.sampling,
        "chunk_size": cfg.chunk_size,
        "id_field": id_field,
    }
    pending: list[ShardDescriptor] = list(sharded.shards)
    rounds: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    in_place = cfg.strategy == "in_place"
    for r in range(cfg.max_rounds):
        n_pending = sum(s["records"] for s in pending)
        if not pending or n_pending == 0:
            break
        started = time.monotonic()
        summary: dict[str, Any] = {
            "round": r,
            "mode": "in_place" if in_place else "rounds",
            "pending": n_pending,
        }
        if in_place:
            specs = [
                JobSpec(
                    job_id=f"{run_key}-r{r:02d}-{s['shard_id']}-in_place",
                    kind="in_place",
                    input=s["uri"],
                    outputs={
                        "approved": layout.result(r, s["shard_id"], tail=True),
                        "rejected": layout.rejected(r, s["shard_id"]),
                        "checkpoints": layout.checkpoints(r, s["shard_id"]),
                        "manifest": layout.job_manifest(r, s["shard_id"], "in_place"),
                    },
                    params={
                        **common,
                        "judge": cfg.judge,
                        "max_attempts": cfg.max_attempts,
                        "round": r,
                        "input_records": s["records"],
                    },
                )
                for s in pending
            ]
            done, bad = await _run_all(
                pool, specs, cfg.job_retries, progress, f"round {r} in place", n_pending
            )
            summary["approved"] = sum(m["counts"].get("approved", 0) for m in done)
            summary["exhausted"] = sum(
                m["counts"].get("max_attempts", 0) + m["counts"].get("error", 0) for m in done
            )
            summary["attempts"] = sum(m["counts"].get("attempts", 0) for m in done)
            failed += [{**b, "round": r} for b in bad]
            pending = []
        else:
            infer = [
                JobSpec(
                    job_id=f"{run_key}-r{r:02d}-{s['shard_id']}-infer",
                    kind="infer",
                    input=s["uri"],
                    outputs={
                        "inferred": layout.inferred(r, s["shard_id"]),
                        "manifest": layout.job_manifest(r, s["shard_id"], "infer"),
                    },
                    params={**common, "round": r, "input_records": s["records"]},
                )
                for s in pending
            ]
            inferred, bad = await _run_all(
                pool, infer, cfg.job_retries, progress, f"round {r} infer", n_pending
            )
            failed += [{**b, "round": r} for b in bad]
            judge = [
                JobSpec(
                    job_id=f"{run_key}-r{r:02d}-{_sid(m)}-judge",
                    kind="judge",
                    input=m["outputs"]["inferred"],
                    outputs={
                        "approved": layout.result(r, _sid(m)),
                        "rejected": layout.rejected(r, _sid(m)),
                        "manifest": layout.job_manifest(r, _sid(m), "judge"),
                    },
                    params={
                        "judge": cfg.judge,
                        "chunk_size": cfg.chunk_size,
                        "id_field": id_field,
                        "round": r,
                        "input_records": sum(m["counts"].values()),
                    },
                )
                for m in inferred
            ]
            judged, bad = await _run_all(
                pool, judge, cfg.job_retries, progress, f"round {r} judge", n_pending
            )
            failed += [{**b, "round": r} for b in bad]
            summary["approved"] = sum(m["counts"].get("approved", 0) for m in judged)
            summary["rejected"] = sum(m["counts"].get("rejected", 0) for m in judged)
            summary["inference_errors"] = sum(m["counts"].get("inference_errors", 0) for m in judged)
            counts = {_sid(m): m["counts"].get("rejected", 0) for m in judged}
            compacted = await asyncio.to_thread(
                recompact,
                layout.rejected_dir(r),
                layout.pending(r + 1),
                records_per_shard=cfg.records_per_shard,
                counts=counts,
                overwrite=True,
            )
            pending = [s for s in compacted.shards if s["records"]]
            if cfg.strategy == "hybrid" and summary["rejected"] > (1 - cfg.hybrid_min_shrink) * n_pending:
                in_place = True  # rounds stopped paying off: finish the tail in place
        summary["failed_shards"] = len([f for f in failed if f["round"] == r])
        summary["seconds"] = round(time.monotonic() - started, 3)
        rounds.append(summary)
        await asyncio.to_thread(_write_json, layout.summary(r), summary)
    for f in failed:  # one record per shard that exhausted its retries: {shard, phase, error}
        name = str(f["shard"]).rsplit("/", 1)[-1].split(".", 1)[0]
        await asyncio.to_thread(_write_json, f"{layout.failed(f['round'])}/{name}.{f['phase']}.json", f)

    approved = sum(x.get("approved", 0) for x in rounds)
    remaining = sum(s["records"] for s in pending)
    exhausted = sum(x.get("exhausted", 0) for x in rounds)
    result = {
        "run_root": cfg.run_root,
        "strategy": cfg.strategy,
        "input": sharded.counts,
        "rounds": rounds,
        "approved": approved,
        "remaining_pending": remaining,
        "exhausted_in_place": exhausted,
        "failed_shards": failed,
        # exhaustion is reported as such, never as a normal completion
        "stop_reason": "max_rounds reached"
        if pending
        else "in-place retry finished"
        if rounds and rounds[-1]["mode"] == "in_place"
        else "nothing pending",
        "seconds": round(time.monotonic() - t0, 3),
    }
    result["invariant"] = await asyncio.to_thread(check_invariant, layout, id_field, pending, rounds, failed)
    await asyncio.to_thread(_write_json, f"{layout.report}/summary.json", result)
    return result


def _sid(manifest: dict[str, Any]) -> str:
    return str(manifest["input"]).rsplit("/", 1)[-1].split(".", 1)[0]


def check_invariant(
    layout: RunLayout,
    id_field: str,
    pending: list[ShardDescriptor],
    rounds: list[dict[str, Any]],
    failed: list[dict[str, Any]],
) -> dict[str, Any]:
    """Every input id is in exactly one of: results, the final pending set, an in-place round's
    exhausted rows, or (by shard) a failed job. Returns the counts and any ids lost or doubled."""

    def ids(directory: str) -> list[Any]:
        return [r.get(id_field) for f in JsonlDir(directory).jsonl_files() for r in f.iter_records()]

    expected = ids(layout.input)
    seen: list[Any] = ids(layout.results)
    for s in pending:
        seen += [r.get(id_field) for r in JsonlFile(s["uri"]).iter_records()]
    for x in rounds:
        if x["mode"] == "in_place":
            seen += ids(f"{layout.round(x['round'])}/rejected")
    for f in failed:  # a failed shard job accounts for its whole input shard
        seen += [r.get(id_field) for r in JsonlFile(f["shard"]).iter_records()]

    counts = Counter(seen)
    doubled = sorted((k for k, n in counts.items() if n > 1), key=str)[:20]
    lost = sorted(set(expected) - set(counts), key=str)[:20]
    return {
        "input": len(expected),
        "accounted": len(seen),
        "lost": lost,
        "doubled": doubled,
        "ok": not doubled and not lost and len(seen) == len(expected),
    }
