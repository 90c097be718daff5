"""Accounting benchmark (printed, not asserted): the id invariant check at 1M and 20M ids.

For each size a run directory is built cheaply but for real: the input is generated and sharded by
``shard_dataset`` (20,000 records per shard, copied: descriptors with id digests); round 0 is
planned by ``propose_slot``; each shard's round jobs (``infer_judge``: the judge on the run's pool)
are finished as a worker would (outputs are file copies of the shard, manifests carry the real job
id, fingerprint and id digests: every tenth shard is rejected whole, one shard never finishes and
is quarantined); ``close_round`` closes the round (accepting, promoting, recompacting
the rejected rows into round 1's pending set) and the tail's plan stops the run. The final pending
set, the results and the quarantined shard then all count in the check.

Then, each in a fresh process whose peak RSS (``wait4``) and wall time are measured:

* ``close``        the real ``close_round`` (while building; digests, so no id list);
* ``baseline``     Python, the imports and the documents the report reads, without a check;
* ``after``        ``report.check_invariant`` as it is: from the digests in manifests and summaries;
* ``before``       the check as it was before digests (every id of input, results and the pending
                   set in lists, a Counter and a set): that one function of ``OLD_REF``'s report
                   module, from ``git show``; by default only up to ``--before-up-to`` ids (it
                   needs several GB at 20M).

Target: ``after`` peak RSS flat (within 10%) from 1M to 20M ids.

Run: ``python bench/accounting.py [--sizes 1000000 20000000] [--before-up-to 1000000]``.
Built run directories are kept under ``bench/out/accounting/`` and reused (``--rebuild`` redoes them).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

RECORDS_PER_SHARD = 20_000
ENGINE = {"engine": "simulated", "model": "simulated"}
OLD_REF = "caac0d1"  # the last commit before digests (report.check_invariant read every id)


# ------------------------------------------------------------------------------------- building
def generate(path: Path, n: int) -> None:
    with path.open("wb") as f:
        step = 1_000_000
        for lo in range(0, n, step):
            f.write(
                b"".join(
                    b'{"id":"q%010d","question":"what is %d?"}\n' % (i, i)
                    for i in range(lo, min(n, lo + step))
                )
            )


def prepare(run_root: Path, n: int) -> dict[str, Any]:
    """The run directory for ``n`` ids up to round 0's close: input, plan and finished jobs."""
    from airflow_batchinfer.rpc.fingerprint import fingerprint, pin_input
    from airflow_batchinfer.run.jobs import inferred_shard, job_spec, round_kinds
    from airflow_batchinfer.run.plan import propose_slot
    from airflow_batchinfer.state.config import RunConfig
    from airflow_batchinfer.state.docs import JobManifest, write_job_manifest, write_plan, write_run_config
    from airflow_batchinfer.state.layout import RunLayout, staged_output
    from airflow_batchinfer.storage import JsonlFile, shard_dataset

    shutil.rmtree(run_root.parent, ignore_errors=True)
    run_root.parent.mkdir(parents=True)
    data = run_root.parent / "data.jsonl"
    t0 = time.perf_counter()
    generate(data, n)
    cfg = RunConfig.of(
        input=str(data),
        run_root=str(run_root),
        prompt_template="{{ question }}",
        judge={"type": "llm"},
        records_per_shard=RECORDS_PER_SHARD,
        max_rounds=1,
    )
    t1 = time.perf_counter()
    layout = RunLayout(cfg.run_root)
    # Copied shards, not prepare_run's byte ranges of the input: their descriptors carry the ids'
    # digests (a range's are known only once a job reads it), and the check as it was before
    # digests reads the ids of input/'s files.
    cfg = cfg.replace(
        id_field=shard_dataset(
            cfg.data.input, layout.input, records_per_shard=RECORDS_PER_SHARD, rejects=layout.rejects
        ).id_field,
    )
    write_run_config(cfg)
    shard_s = time.perf_counter() - t1
    data.unlink()
    plan = propose_slot(cfg, "round-00").plan
    write_plan(layout, plan)

    def finish(
        kind: str,
        r: int,
        src: Any,
        outputs: dict[str, str | None],
        ids: dict[str, Any],
        counts: dict[str, Any],  # the manifest's Tally, as stored
    ) -> None:
        spec = job_spec(cfg, kind, r, src)  # type: ignore[arg-type]
        info = JsonlFile(spec.input).info()
        pinned = pin_input(spec, info)
        token = uuid.uuid4().hex
        committed = {}
        for name, copy_of in outputs.items():
            if "staging" in spec.outputs:
                uri = committed[name] = staged_output(
                    spec.outputs["staging"], spec.outputs["manifest"], token, name
                )
            else:
                uri = spec.outputs[name]
            Path(uri).parent.mkdir(parents=True, exist_ok=True)
            if copy_of is None:
                with JsonlFile(uri).writer_sync():
                    pass  # an output without rows
            else:
                shutil.copyfile(copy_of, uri)
        manifest: dict[str, Any] = {
            "job_id": pinned.job_id, "kind": kind, "state": "succeeded", "input": spec.input,
            "outputs": spec.outputs, "attempt": token, "counts": counts, "ids": ids,
            "tokens": {"prompt": 1, "completion": 1}, "round": r,
            "fingerprint": fingerprint(pinned, ENGINE, info), "engine": ENGINE, "worker": "w1",
            "timings": {"started_at": 0.0, "finished_at": 1.0, "run_s": 1.0}, "batcher": {},
        }  # fmt: skip
        if committed:
            manifest["committed"] = committed
        write_job_manifest(spec.outputs["manifest"], JobManifest.model_validate(manifest))

    empty = {"count": 0, "sum": "0" * 32}
    kinds = round_kinds(cfg, "rounds")  # infer_judge: the judge runs on the run's pool, fused
    for i, shard in enumerate(plan.shards):
        if i == 1:
            continue  # never finishes: quarantined by close
        ids, n_rows = shard.to_json()["ids"], shard.records
        judged = shard
        if kinds[0] == "infer":
            inferred = {"input": ids, "inferred": ids}
            finish("infer", 0, shard, {"inferred": shard.uri}, inferred, {"generated": {"ok": n_rows}})
            judged = inferred_shard(cfg, 0, shard)
        rejected = i % 10 == 0
        copy, none = (None, judged.uri) if rejected else (judged.uri, None)
        inference = {"generated": {"ok": n_rows}} if kinds[-1] == "infer_judge" else {}
        finish(
            kinds[-1], 0, judged, {"approved": copy, "rejected": none},
            {"input": ids, "approved": empty if rejected else ids, "rejected": ids if rejected else empty},
            {"outcomes": {"rejected" if rejected else "approved": n_rows}, **inference},
        )  # fmt: skip
    jobs_s = time.perf_counter() - t1 - shard_s
    return {"generate_s": round(t1 - t0, 1), "shard_s": round(shard_s, 1), "jobs_s": round(jobs_s, 1)}


def build(run_root: Path, n: int) -> dict[str, Any]:
    """Each step in its own process: a child's peak RSS counts its parent's at the fork (Linux keeps
    the high-water mark across exec), so this process stays small and measures only children."""
    _, _, built = child(["prepare", str(run_root), str(n)])
    close_s, close_rss, out = child(["close", str(run_root)])
    child(["stop", str(run_root)])
    (run_root.parent / "built.json").write_text(json.dumps({"n": n}))
    return {**built, "close_s": round(close_s, 2), "close_rss_mb": round(close_rss, 1), **out}


# --------------------------------------------------------------------------------------- checking
def report_args(run_root: str) -> tuple[Any, ...]:
    """What ``build_report`` hands ``check_invariant`` (the same reads, in the same order)."""
    from airflow_batchinfer.run.plan import ACCEPTED_BY_REVIEW, pending_shards
    from airflow_batchinfer.state.docs import read_plan, read_run_config, read_summary, slots
    from airflow_batchinfer.state.layout import RunLayout

    cfg = read_run_config(run_root)
    layout = RunLayout(cfg.run_root)
    plans = [p for s in slots(cfg.retries.max_rounds) if (p := read_plan(layout, s))]
    ran = [p for p in plans if p.mode != "skip"]
    rounds = [s for p in ran if (s := read_summary(layout, p.round))]
    stop = next((p.stop for p in plans if p.stop), None)
    in_place_ran = any(p.mode == "in_place" for p in ran)
    failed = [f for s in rounds for f in s.failed_shards]
    r_next = sum(1 for p in ran if p.mode == "rounds")
    final_pending = [] if in_place_ran or stop == ACCEPTED_BY_REVIEW else pending_shards(layout, r_next)
    return layout, cfg.data.id_field or "id", final_pending, rounds, failed, plans


def old_check(path: Path) -> Any:
    """``check_invariant`` from the report module as it was at :data:`OLD_REF`, alone: the rest of that
    module imports modules that have moved since. It names only storage readers and the stdlib."""
    from collections import Counter

    from airflow_batchinfer.storage import JsonlDir, JsonlFile

    tree = ast.parse(path.read_text())
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check_invariant")
    module = ast.Module(body=[ast.parse("from __future__ import annotations").body[0], func], type_ignores=[])
    namespace: dict[str, Any] = {"Any": Any, "Counter": Counter, "JsonlDir": JsonlDir, "JsonlFile": JsonlFile}
    exec(compile(module, str(path), "exec"), namespace)
    return namespace["check_invariant"]


def run_child(argv: list[str]) -> None:
    what, run_root = argv[0], argv[1]
    out: dict[str, Any] = {}
    if what == "prepare":
        out = prepare(Path(run_root), int(argv[2]))
    elif what == "stop":
        from airflow_batchinfer.run.plan import propose_slot
        from airflow_batchinfer.state.docs import read_run_config, write_plan
        from airflow_batchinfer.state.layout import RunLayout

        cfg = read_run_config(run_root)
        # max_rounds: round 1's pending set stays
        write_plan(RunLayout(run_root), propose_slot(cfg, "tail").plan)
    elif what == "close":
        from airflow_batchinfer.run.close import close_round
        from airflow_batchinfer.state.docs import read_plan, read_run_config
        from airflow_batchinfer.state.layout import RunLayout

        cfg = read_run_config(run_root)
        plan = read_plan(RunLayout(run_root), "round-00")
        assert plan is not None
        summary = close_round(cfg, plan)
        assert summary is not None
        out = {"close_invariant": summary["invariant"] | {"opened": len(summary["invariant"]["opened"])}}
    else:
        layout, id_field, pending, rounds, failed, plans = report_args(run_root)
        if what == "after":
            from airflow_batchinfer.run.report.invariant import check_invariant

            out = check_invariant(layout, id_field, pending, rounds, failed, plans=plans)
        elif what == "before":
            check = old_check(Path(argv[2]))
            # the old check reads the stored forms
            out = check(
                layout, id_field, pending, [s.to_json() for s in rounds], [f.to_json() for f in failed]
            )
    print(json.dumps(out, default=str))


def child(argv: list[str]) -> tuple[float, float, dict[str, Any]]:
    """Wall seconds, peak RSS (MB) and the JSON output of this script run as ``--child ARGV``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", *argv], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child {argv} failed ({os.waitstatus_to_exitcode(status)})")
    lines = output.decode().strip().splitlines()
    return wall, usage.ru_maxrss / 1024, json.loads(lines[-1]) if lines else {}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        run_child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 20_000_000])
    parser.add_argument(
        "--before-up-to", type=int, default=1_000_000, help="largest size the old check runs at"
    )
    parser.add_argument("--workdir", type=Path, default=Path(__file__).parent / "out" / "accounting")
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    repo = Path(__file__).resolve().parent.parent
    old_src = subprocess.run(
        ["git", "show", f"{OLD_REF}:airflow_batchinfer/report.py"], cwd=repo, check=True, capture_output=True
    ).stdout
    args.workdir.mkdir(parents=True, exist_ok=True)
    old_module = args.workdir / "report_before.py"
    old_module.write_bytes(old_src)

    rows, builds = [], {}
    for n in args.sizes:
        run_root = args.workdir / f"{n}" / "run"
        if args.rebuild or not (run_root.parent / "built.json").exists():
            print(f"building {n:,} ids ...", flush=True)
            builds[n] = build(run_root, n)
            rows.append({"ids": n, "step": "close", "wall_s": builds[n]["close_s"],
                         "peak_rss_mb": builds[n]["close_rss_mb"], "ok": builds[n]["close_invariant"]["ok"],
                         "checked": "digests"})  # fmt: skip
        for what in ("baseline", "after", "before"):
            if what == "before" and n > args.before_up_to:
                continue
            wall, rss, out = child([what, str(run_root), str(old_module)])
            checked = out.get("checked", "ids" if what == "before" else "")
            rows.append({"ids": n, "step": what, "wall_s": round(wall, 2), "peak_rss_mb": round(rss, 1),
                         "ok": out.get("ok"), "checked": checked})  # fmt: skip

    keys = ("ids", "step", "wall_s", "peak_rss_mb", "ok", "checked")
    print("\n" + " ".join(f"{k:>12}" for k in keys))
    for r in rows:
        print(" ".join(f"{r[k]!s:>12}" for k in keys))
    after = {r["ids"]: r["peak_rss_mb"] for r in rows if r["step"] == "after"}
    if len(after) > 1:
        lo, hi = min(after), max(after)
        print(f"\nafter: peak RSS {after[hi]} MB at {hi:,} ids vs {after[lo]} MB at {lo:,} "
              f"({after[hi] / after[lo] - 1:+.1%}; target within ±10%)")  # fmt: skip
    print(json.dumps({"bench": "accounting", "rows": rows, "builds": builds}))


if __name__ == "__main__":
    main()
