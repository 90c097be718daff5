"""Resume inside a shard (issue 24 item 1): infer, judge and infer_judge jobs commit their output in
chunk segments (``worker/segments.py``), and a later attempt continues after the last committed one.

The jobs run as a worker runs them (the worker's registry and job code, the SIMULATED engine,
deterministic: answers and verdicts hash the record id), on real files. A "lost worker" is a job
cancelled while its engine holds a batch of a later chunk (:class:`GateEngine`), so which segments
exist at that moment is known without timing anything."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.engines.base import GenerationRequest, GenerationResult
from airflow_batchinfer.engines.simulated import SimulatedEngine
from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.rpc.fingerprint import pin_input, spec_key
from airflow_batchinfer.rpc.models import JobKind, JobSpec
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.jobs import job_spec, judge_input, round_kinds
from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.run.prepare import prepare_run
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import JobManifest, Plan, read_job_manifest, write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.params import parse_params
from airflow_batchinfer.state.tally import Outcomes, Resume, Tally
from airflow_batchinfer.storage import JsonlFile, files
from airflow_batchinfer.storage.digest import IdDigest, file_digest
from airflow_batchinfer.storage.id_hash_files import hashes_beside
from airflow_batchinfer.storage.shard_ref import ShardRef
from airflow_batchinfer.worker.jobs.chunks import FIRST_CHUNK
from airflow_batchinfer.worker.registry import JobRegistry
from airflow_batchinfer.worker.runtime import Runtime
from airflow_batchinfer.worker.segments import ChunkFigures, JobKey, SegmentDoc, SegmentLog, doc_name
from tests.support.worker_jobs import run_jobs

N = 1_000  # records of the shard
CHUNK = 100  # chunk_size: the first chunk has min(CHUNK, FIRST_CHUNK) = CHUNK records too
CHUNKS = N // CHUNK
assert CHUNK <= FIRST_CHUNK


class GateEngine(SimulatedEngine):
    """The SIMULATED engine, counting the requests it answers; with ``stop_at`` it holds (until
    :meth:`release`) any batch with a request for a record of that chunk or later: the job cannot
    get past it, as if its worker were lost there."""

    def __init__(self, stop_at: int | None = None, **kw: Any) -> None:
        super().__init__(latency_base_s=0.0, latency_per_token_s=0.0, approval_rate=0.6, **kw)
        self.stop_at = stop_at
        self.requests = 0
        self.held = asyncio.Event()
        self._go = asyncio.Event()

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        chunks = [int(str(r.metadata["record_id"])[1:]) // CHUNK for r in requests]
        if self.stop_at is not None and max(chunks) >= self.stop_at:
            self.held.set()
            await self._go.wait()
        self.requests += len(requests)
        return await super().generate(requests)

    def release(self) -> None:
        self._go.set()


# ------------------------------------------------------------------------------------- the runs
def make_run(root: Path, *, bad: tuple[int, ...] = (), **settings: Any) -> tuple[RunConfig, ShardRef]:
    """One round-0 range shard of ``N`` records (``bad``: line numbers that are malformed instead)."""
    root.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": f"r{i:04d}", "question": f"q {i}"}) for i in range(N)]
    for i in bad:
        lines[i] = "{bad"
    (root / "data.jsonl").write_text("\n".join(lines) + "\n")
    cfg = RunConfig.of(
        input=str(root / "data.jsonl"), run_root=str(root / "run"), prompt_template="{{ question }}",
        judge={"type": "llm"}, records_per_shard=2 * N, chunk_size=CHUNK, **settings,
    )  # fmt: skip
    (shard,) = prepare_run(cfg).shards
    assert shard.is_range
    plan = propose_slot(cfg, "round-00").plan
    write_plan(RunLayout(cfg.run_root), plan)
    return cfg, plan.shards[0]


def spec_for(cfg: RunConfig, kind: JobKind, shard: ShardRef) -> JobSpec:
    src = judge_input(cfg, 0, shard) if kind == "judge" else shard
    spec = job_spec(cfg, kind, 0, src)
    return pin_input(spec, JsonlFile(spec.input).info())


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(20_000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never met")


def run(spec: JobSpec, engine: GateEngine, *, lose_after: int | None = None) -> tuple[str, GateEngine]:
    """Run ``spec`` on a fresh worker runtime. ``lose_after``: the job is cancelled (its worker
    lost) once segment ``lose_after`` is committed and ``engine`` holds a later chunk's batch."""

    async def main() -> str:
        runtime = Runtime(engine, batch_timeout_s=0.001)
        await runtime.start()
        registry = JobRegistry(runtime, concurrency=2, worker_name="w1")
        try:
            registry.submit(spec, parse_params(spec.kind, spec.params))
            task = registry.jobs[spec.job_id].task
            assert task is not None
            if lose_after is not None:
                await _until(lambda: committed(spec) > lose_after and engine.held.is_set())
                registry.cancel(spec.job_id)
            await asyncio.wait({task})
            status = registry.status(spec.job_id)
            assert status is not None
            return status.state
        finally:
            engine.release()
            await runtime.close()

    return asyncio.run(main()), engine


def committed(spec: JobSpec) -> int:
    """Segment documents in the job's segments directory."""
    return sum(1 for n in files.names(spec.outputs["segments"], None) if n.endswith(".json"))


def manifest(spec: JobSpec) -> JobManifest:
    m = read_job_manifest(spec.outputs["manifest"])
    assert m is not None
    return m


def figures(m: JobManifest) -> dict[str, Any]:
    """What an undisturbed and a resumed run of a job must agree on."""
    return {
        "counts": m.counts.model_copy(update={"resume": Resume()}),  # the only counts a resume changes
        "ids": m.ids,
        "tokens": m.tokens,
        "reason_groups": m.reason_groups,
    }


def rows_of(m: JobManifest) -> dict[str, list[Any]]:
    """Each output's rows, from the files the manifest names, checked against its digests."""
    out = {}
    for name, uri in (m.committed or {}).items():
        f = JsonlFile(uri)
        assert m.ids is not None and file_digest(f, "id") == m.ids[name].digest(), name
        out[name] = list(f.iter_records())
    return out


def undisturbed(root: Path, kind: JobKind, **settings: Any) -> tuple[JobManifest, int]:
    cfg, shard = make_run(root, **settings)
    if kind == "judge":
        assert run(spec_for(cfg, "infer", shard), GateEngine())[0] == "succeeded"
    spec = spec_for(cfg, kind, shard)
    state, engine = run(spec, GateEngine())
    assert state == "succeeded"
    return manifest(spec), engine.requests


# ------------------------------------------------------------------------------ resume equals
@pytest.mark.parametrize("kind", ["infer", "judge", "infer_judge"])
def test_a_lost_job_resumes_after_its_segments_and_writes_what_an_undisturbed_one_does(
    tmp_path: Path, kind: JobKind
) -> None:
    expected, calls = undisturbed(tmp_path / "a", kind, judge_pool="judges" if kind == "judge" else None)
    per_record = calls // N  # engine requests per record: 1 (infer, judge) or 2 (infer_judge)

    cfg, shard = make_run(tmp_path / "b", judge_pool="judges" if kind == "judge" else None)
    if kind == "judge":
        assert run(spec_for(cfg, "infer", shard), GateEngine())[0] == "succeeded"
    spec = spec_for(cfg, kind, shard)
    state, _ = run(spec, GateEngine(stop_at=6), lose_after=3)
    assert state == "cancelled" and read_job_manifest(spec.outputs["manifest"]) is None
    kept = committed(spec)
    assert 4 <= kept <= 6  # chunks 0..3 at least; chunk 6 never got past the engine

    state, engine = run(spec, GateEngine())  # the job resubmitted: a new attempt, a new worker
    assert state == "succeeded"
    m = manifest(spec)
    assert m.counts.resume.records == kept * CHUNK
    assert m.counts.resume.segments == CHUNKS - kept
    assert engine.requests == (N - kept * CHUNK) * per_record  # resumed chunks were not inferred
    assert figures(m) == figures(expected)
    got = rows_of(m)
    assert got == rows_of(expected)  # the same rows, in the same order
    assert sorted(r["id"] for rows in got.values() for r in rows) == [f"r{i:04d}" for i in range(N)]
    assert not os.listdir(spec.outputs["segments"])  # the manifest is written: they have served


def test_a_range_job_resumed_still_writes_its_complete_rejects_and_id_hashes(tmp_path: Path) -> None:
    bad = (7, 333, 951)

    def outputs(cfg: RunConfig, spec: JobSpec) -> tuple[list[Any], bytes]:
        sid = spec.params["input_range"]["shard_id"]
        rejects = list(JsonlFile(spec.outputs["input_rejects"]).iter_records())
        return rejects, Path(hashes_beside(spec.outputs["manifest"], sid)).read_bytes()

    cfg_a, shard_a = make_run(tmp_path / "a", bad=bad)
    spec_a = spec_for(cfg_a, "infer_judge", shard_a)
    assert run(spec_a, GateEngine())[0] == "succeeded"

    cfg, shard = make_run(tmp_path / "b", bad=bad)
    spec = spec_for(cfg, "infer_judge", shard)
    assert run(spec, GateEngine(stop_at=8), lose_after=5)[0] == "cancelled"
    assert run(spec, GateEngine())[0] == "succeeded"
    m, expected = manifest(spec), manifest(spec_a)
    assert m.counts.resume.records >= 6 * CHUNK
    assert figures(m) == figures(expected)
    assert m.counts.read is not None and (m.counts.read.quarantined, m.counts.read.lines) == (3, N)
    rejects, hashes = outputs(cfg, spec)
    rejects_a, hashes_a = outputs(cfg_a, spec_a)
    assert [r["line_in_range"] for r in rejects] == [r["line_in_range"] for r in rejects_a] and len(
        rejects
    ) == 3
    assert hashes == hashes_a


def test_without_a_segments_output_a_job_streams_its_outputs_as_before(tmp_path: Path) -> None:
    expected, _ = undisturbed(tmp_path / "a", "infer_judge")
    cfg, shard = make_run(tmp_path / "b")
    spec = spec_for(cfg, "infer_judge", shard)
    spec.outputs.pop("segments")
    assert run(spec, GateEngine())[0] == "succeeded"
    m = manifest(spec)
    assert m.counts.resume == Resume()
    assert figures(m) == figures(expected) and rows_of(m) == rows_of(expected)
    assert not os.path.exists(RunLayout(cfg.run_root).segments(0, shard.shard_id, "infer_judge"))


def test_a_chunk_that_no_longer_matches_its_segment_is_recomputed_with_every_later_one(
    tmp_path: Path,
) -> None:
    """A committed segment whose chunk now reads other ids is discarded, and the ones after it: the
    job recomputes from there (and the documents it discarded are gone)."""
    expected, _ = undisturbed(tmp_path / "a", "infer")
    cfg, shard = make_run(tmp_path / "b")
    spec = spec_for(cfg, "infer", shard)
    state, _ = run(spec, GateEngine(stop_at=8), lose_after=5)
    assert state == "cancelled"
    seg = Path(spec.outputs["segments"])
    (doc3,) = seg.glob("chunk-000003.*.json")
    data = json.loads(doc3.read_text())
    data["input"] = {"count": CHUNK, "sum": "0" * 32}  # as if chunk 3 had held other records
    data["outputs"]["inferred"]["ids"] = data["input"]
    doc3.write_text(json.dumps(data))
    later = sorted(p.name for p in seg.glob("chunk-*.json") if int(p.name[6:12]) >= 3)

    mismatched: list[str] = []

    def discard(self: SegmentLog, docs: list[SegmentDoc]) -> None:
        mismatched.extend(doc_name(d.chunk, d.attempt) for d in docs)
        original(self, docs)

    original = SegmentLog.discard
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SegmentLog, "discard", discard)
        mp.setattr(SegmentLog, "clear", lambda self: None)  # keep the directory to look at it
        state, engine = run(spec, GateEngine())
    assert state == "succeeded"
    m = manifest(spec)
    assert m.counts.resume.records == 3 * CHUNK and engine.requests == N - 3 * CHUNK
    assert sorted(mismatched) == later and not any((seg / n).exists() for n in later)
    assert figures(m) == figures(expected) and rows_of(m) == rows_of(expected)


# ---------------------------------------------------------------------------------- the segment log
def key(tmp_path: Path, final: str = "out.jsonl.zst", **kw: Any) -> JobKey:
    outputs = {"approved": str(tmp_path / "a" / final), "rejected": str(tmp_path / "r" / final)}
    fields: dict[str, Any] = {"job_id": "j1", "fingerprint": "f1", "chunk_size": 2, "outputs": outputs}
    return JobKey(**{**fields, "what": "job j1 (shard part-00000)", **kw})


def tally(rows: list[dict[str, Any]]) -> ChunkFigures:
    t = ChunkFigures()
    t.count_ids("input", (r["id"] for r in rows))
    for name in ("approved", "rejected"):
        t.count_ids(name, (r["id"] for r in rows if r["status"] == name))
    t.tally.outcomes.approved += sum(1 for r in rows if r["status"] == "approved")
    t.tally.outcomes.rejected += sum(1 for r in rows if r["status"] == "rejected")
    t.tokens["prompt"] += 3 * len(rows)
    for r in rows:
        if r["status"] == "rejected":
            t.reason_groups.add(f"too short: {len(r['id'])} chars")
    return t


def split(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {n: [r for r in rows if r["status"] == n] for n in ("approved", "rejected")}


CHUNK_ROWS = [
    [{"id": "a", "status": "approved"}, {"id": "b", "status": "rejected"}],
    [{"id": "c", "status": "approved"}, {"id": "d", "status": "approved"}],
    [{"id": "e", "status": "rejected"}, {"id": "f", "status": "approved"}],
    [{"id": "g", "status": "rejected"}],
]


def commit_all(log: SegmentLog, chunks: list[int] | None = None) -> list[SegmentDoc]:
    return [
        log.commit(k, len(CHUNK_ROWS[k]), CHUNK_ROWS[k], split, tally(CHUNK_ROWS[k]))
        for k in (chunks if chunks is not None else range(len(CHUNK_ROWS)))
    ]


@pytest.mark.parametrize("final", ["out.jsonl.zst", "out.jsonl"])
def test_segments_round_trip_into_outputs_encoded_like_the_final_ones(tmp_path: Path, final: str) -> None:
    seg = tmp_path / "seg"
    log = SegmentLog(str(seg), key(tmp_path, final), "t1", None)
    docs = commit_all(log)
    assert log.committed == 4
    stored = json.loads((seg / doc_name(1, "t1")).read_text())
    assert stored["schema_version"] == 2 and stored["chunk"] == 1 and stored["records"] == 2
    assert stored["outputs"]["rejected"] == {"rows": 0, "ids": {"count": 0, "sum": "0" * 32}, "file": None}
    suffix = ".jsonl.zst" if final.endswith(".zst") else ".jsonl"
    assert (seg / f"chunk-000000.t1.approved{suffix}").exists()

    again = SegmentLog(str(seg), key(tmp_path, final), "t2", None).load()
    assert [d.model_dump() for d in again] == [d.model_dump() for d in docs]
    folded = ChunkFigures()
    for d in again:
        t = ChunkFigures.of(d)
        folded.tally += t.tally
        folded.reason_groups.merge(t.reason_groups)
        for n, dig in t.ids.items():
            folded.ids[n] = folded.ids.get(n, IdDigest()) + dig
    assert folded.tally == Tally(outcomes=Outcomes(approved=4, rejected=3))
    assert folded.reason_groups.as_dict() == {"too short: # chars": 3}
    for name, target in key(tmp_path, final).outputs.items():
        log.assemble(again, name, target)
        rows = list(JsonlFile(target).iter_records())  # several zstd frames: one stream
        assert rows == [r for chunk in CHUNK_ROWS for r in chunk if r["status"] == name]
        assert file_digest(JsonlFile(target), "id") == folded.ids[name]
    if suffix == ".jsonl.zst":
        frames = Path(key(tmp_path, final).outputs["approved"]).read_bytes().count(b"\x28\xb5\x2f\xfd")
        assert frames == 3  # one per chunk with approved rows


def test_resume_takes_the_longest_committed_prefix_of_this_jobs_segments(tmp_path: Path) -> None:
    seg = tmp_path / "seg"
    log = SegmentLog(str(seg), key(tmp_path), "t1", None)
    commit_all(log)
    (seg / doc_name(2, "t1")).unlink()  # chunk 2's files stay, without their document
    assert [d.chunk for d in log.load()] == [0, 1]  # a gap stops the prefix; chunk 3 is not used

    other = SegmentLog(str(seg), key(tmp_path, job_id="j0"), "t0", None)  # another job's
    other.commit(2, 2, CHUNK_ROWS[2], split, tally(CHUNK_ROWS[2]))
    assert [d.chunk for d in log.load()] == [0, 1]
    assert [d.chunk for d in SegmentLog(str(seg), key(tmp_path, chunk_size=3), "t", None).load()] == []

    (seg / "chunk-000000.t1.approved.jsonl.zst").unlink()  # a document whose file is gone
    assert log.load() == []


def test_of_two_attempts_segments_for_one_chunk_the_smallest_usable_token_is_chosen(tmp_path: Path) -> None:
    seg = tmp_path / "seg"
    for token in ("bbb", "aaa"):
        commit_all(SegmentLog(str(seg), key(tmp_path), token, None), [0, 1])
    log = SegmentLog(str(seg), key(tmp_path), "ccc", None)
    assert [d.attempt for d in log.load()] == ["aaa", "aaa"]
    (seg / "chunk-000001.aaa.approved.jsonl.zst").unlink()
    assert [d.attempt for d in log.load()] == ["aaa", "bbb"]
    (seg / doc_name(0, "aaa")).write_text('{"schema_version": 99}')  # unreadable here: not used
    assert [d.attempt for d in log.load()] == ["bbb", "bbb"]


def test_a_chosen_segment_file_that_vanished_fails_the_assembly_with_the_reason(tmp_path: Path) -> None:
    seg = tmp_path / "seg"
    log = SegmentLog(str(seg), key(tmp_path), "t1", None)
    commit_all(log)
    docs = log.load()
    log.clear()  # as the round's close would, or a person deleting the directory
    target = key(tmp_path).outputs["approved"]
    with pytest.raises(StorageError, match="the round's close settled the shard meanwhile") as exc:
        log.assemble(docs, "approved", target)
    assert "job j1 (shard part-00000)" in str(exc.value) and "chunk 0, attempt t1" in str(exc.value)
    assert not os.path.exists(target) and not os.listdir(os.path.dirname(target))  # no temp left


def test_a_finished_copy_leaves_the_segments_another_live_copy_still_reads(tmp_path: Path) -> None:
    """Two copies of one job at once (an Airflow retry while the first still runs): the first to
    finish keeps the directory (the second is marked live and reads its own and the first's files);
    the last deletes it. A killed attempt's mark stays: the directory then waits for the close."""
    seg = tmp_path / "seg"
    first, second = (SegmentLog(str(seg), key(tmp_path), t, None) for t in ("t1", "t2"))
    assert first.load() == []
    commit_all(first, [0, 1])
    docs = second.load()  # resumes after the first's two chunks, while the first goes on
    assert [d.attempt for d in docs] == ["t1", "t1"]
    commit_all(first, [2, 3])
    first.clear()  # the first finished: the second is live, so nothing is deleted
    assert sorted(p.name for p in seg.glob("*.live")) == ["attempt-t2.live"]
    docs += commit_all(second, [2, 3])
    target = key(tmp_path).outputs["approved"]
    second.assemble(docs, "approved", target)
    assert [r["id"] for r in JsonlFile(target).iter_records()] == [
        r["id"] for rows in CHUNK_ROWS for r in rows if r["status"] == "approved"
    ]
    second.clear()
    assert list(seg.iterdir()) == []  # the empty directory is the close's to remove


def test_a_copy_that_starts_while_another_clears_keeps_the_segments_it_chose(tmp_path: Path) -> None:
    """The second copy marks itself live and lists the directory just after the finishing first
    copy listed it (no mark yet): the first deletes the documents, sees the mark, and keeps the
    files the second chose. A copy listing after the documents are gone chooses nothing."""
    seg = tmp_path / "seg"
    first, second, third = (SegmentLog(str(seg), key(tmp_path), t, None) for t in ("t1", "t2", "t3"))
    first.load()
    commit_all(first)
    listed = first.names
    chosen: list[list[SegmentDoc]] = []

    def names() -> list[str]:
        held = listed()
        if not chosen:
            chosen.append(second.load())  # between the first's listing and its deletions
        return held

    first.names = names  # type: ignore[method-assign]
    first.clear()
    assert [d.attempt for d in chosen[0]] == ["t1"] * 4
    assert not list(seg.glob("*.json")) and sorted(p.name for p in seg.glob("*.live")) == ["attempt-t2.live"]
    assert third.load() == []  # no documents left to choose
    third.leave()
    target = key(tmp_path).outputs["approved"]
    second.assemble(chosen[0], "approved", target)
    assert [r["id"] for r in JsonlFile(target).iter_records()] == [
        r["id"] for rows in CHUNK_ROWS for r in rows if r["status"] == "approved"
    ]
    second.clear()
    assert list(seg.iterdir()) == []

    killed, later = (SegmentLog(str(seg), key(tmp_path), t, None) for t in ("t3", "t4"))
    killed.load()
    commit_all(killed, [0])  # then SIGKILL: no leave(), its mark stays
    later.load()
    later.leave()  # a failed or cancelled attempt unmarks itself and keeps its segments
    assert sorted(p.name for p in seg.glob("*.live")) == ["attempt-t3.live"]
    later.load()
    later.clear()
    assert (seg / doc_name(0, "t3")).exists()  # kept for the round's close


# ------------------------------------------------------------------------------ the run's side
def test_job_specs_name_a_segments_directory_that_leaves_job_ids_as_they_were(tmp_path: Path) -> None:
    """Adding the output must not make a finished job's manifest stale (its job id is recomputed at
    close): the segments directory is not part of the job id."""
    cfg, shard = make_run(tmp_path, judge_pool="judges")
    layout = RunLayout(cfg.run_root)
    for kind in ("infer", "judge", "infer_judge"):
        spec = job_spec(cfg, kind, 0, shard)
        assert spec.outputs["segments"] == layout.segments(0, shard.shard_id, kind)
        assert spec.outputs["segments"].startswith(
            os.path.join(cfg.run_root, "checkpoints", "round-00", "segments")
        )
        older = spec.model_copy(
            update={"outputs": {k: v for k, v in spec.outputs.items() if k != "segments"}}
        )
        assert spec_key(spec) == spec_key(older) and spec.job_id.endswith(spec_key(older))
    assert "segments" not in job_spec(cfg, "in_place", 0, shard).outputs


def test_close_removes_a_settled_shards_segments_and_keeps_a_quarantined_ones(tmp_path: Path) -> None:
    root = tmp_path
    lines = [json.dumps({"id": f"r{i:02d}", "question": f"q {i}"}) for i in range(30)]
    (root / "data.jsonl").write_text("\n".join(lines) + "\n")
    cfg = RunConfig.of(
        input=str(root / "data.jsonl"), run_root=str(root / "run"), prompt_template="{{ question }}",
        judge={"type": "llm"}, records_per_shard=10,
    )  # fmt: skip
    prepare_run(cfg)
    plan: Plan = propose_slot(cfg, "round-00").plan
    layout = RunLayout(cfg.run_root)
    write_plan(layout, plan)
    kinds = round_kinds(cfg, "rounds")
    run_jobs(cfg, [(k, 0, s) for k in kinds for s in plan.shards[:-1]])
    left = {}
    for s in plan.shards:  # as a job whose cleanup never ran leaves them
        left[s.shard_id] = d = Path(layout.segments(0, s.shard_id, kinds[-1]))
        d.mkdir(parents=True, exist_ok=True)
        (d / doc_name(0, "t")).write_text("{}")
    summary = close_round(cfg, plan)
    assert summary is not None and [f["shard_id"] for f in summary["failed_shards"]] == [
        plan.shards[-1].shard_id
    ]
    assert [sid for sid, d in left.items() if d.exists()] == [plan.shards[-1].shard_id]


def test_a_resumed_judge_job_holds_back_the_spot_checks_an_undisturbed_one_would(tmp_path: Path) -> None:
    """Spot checks (``spot_check_approved``) are a pure function of the run's seed and a row's id: a
    job lost after some chunks and resumed holds back exactly the approved rows the selection picks
    over the whole shard, and counts every judged row once per stratum."""
    from airflow_batchinfer.judges.spot_check import selected
    from airflow_batchinfer.run.prepare import run_key

    cfg, shard = make_run(tmp_path, spot_check_approved=100)
    rate = shard.spot_check_rate
    assert rate == 0.1
    spec = spec_for(cfg, "infer_judge", shard)
    assert run(spec, GateEngine(stop_at=6), lose_after=3)[0] == "cancelled"
    assert run(spec, GateEngine())[0] == "succeeded"
    m = manifest(spec)
    assert m.counts.resume.records >= 4 * CHUNK
    rows = rows_of(m)
    held = {r["id"] for r in rows["rejected"] if r["judgment"].get("spot_check")}
    approved = {r["id"] for r in rows["approved"]} | held
    assert held == {i for i in approved if selected(i, rate=rate, seed=run_key(cfg.run_root))}
    outcomes = m.counts.outcomes
    assert outcomes.spot_checks == len(held) > 0 and outcomes.approved == len(approved) - len(held)
    strata = sum(n for buckets in m.counts.strata.values() for n in buckets.values())
    assert strata == N - outcomes.inference_errors - m.counts.truncated
