"""Review desk benchmark (printed, not asserted): browsing a round of 1,000,000 rejected rows.

The round is built cheaply but for real: the input (``--records`` records with a question and a
context) is planned as range shards by ``prepare_run`` (``--shards`` shards); round 0 is planned by
``propose_slot``; each shard's ``infer_judge`` job is finished as a worker would (every row rejected:
the record plus a ~200-character ``result`` and a judgment whose reason comes from 30 templates with
numbers and quoted values, e.g. "expected 14, got 5"; the staged rejected file, a manifest with the
real job id, fingerprint, read counts, id digests and the ``reason_groups`` a worker counts); then
the real ``close_round`` accepts, promotes and recompacts the round. One rare reason occurs only in
the last three shards.

Then, in a fresh process (its peak RSS is the browsing's, not the build's), each step timed:

* ``first page``    ``RoundView`` construction (listing, one accepted doc per shard) and page 1;
* ``middle page``   a page at a cursor in the middle of the round (the shard decompressed up to it);
* ``groups``        the round's reason groups from the manifests;
* ``sample(20)``    a seeded random sample over the whole round;
* ``group page``    the first filtered page of a common group, and of the rare one (shards whose
                    manifests count none of it are skipped unread);
* ``text page``     the first page of a text search (~1% of prompts match), and of one that matches
                    nothing (it stops at ``scan_limit``, 200,000 rows, and returns a cursor);
* ``find``          a sample by id in the last shard (only lines holding the id are parsed);
* ``tally``         with group decisions (from the manifests), with ids named too (the round's ids
                    read, no row parsed but theirs), and with a text filter (the round read once).

Target: the first page of the 1M-row round in under 1 s.

Run: ``python bench/review.py [--records 1000000] [--shards 100] [--rebuild]``. The built run is kept
under ``bench/out/review/<records>/`` and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TOPICS = ["rivers", "prime numbers", "the French revolution", "protein folding", "tax law", "sorting",
          "volcanoes", "jazz", "compilers", "tides", "bread", "orbits"]  # fmt: skip
RARE_WORD = "photosynthesis"  # in ~1% of the questions
RARE_REASON = "safety filter tripped on token {a}"  # only in the last three shards, 1 row in 200
WORDS = ("answer", "value", "unit", "field", "label", "date", "name", "city", "total", "step")
# (weight, template): {a} {b} integers, {f} a decimal, {w} a quoted word; weights roughly Zipf.
REASONS: list[tuple[int, str]] = [
    (300, "expected {a}, got {b}"), (160, "the final answer {a} does not match the reference {b}"),
    (110, "missing field {w}"), (80, "too long ({a} > {b} chars)"), (60, "too short ({a} < {b} chars)"),
    (50, "score {f} below threshold 0.7"), (40, "wrong unit: expected {w}, got {w}"),
    (35, "inference_error: timeout after {a}s"),
    (30, "output is not JSON: Expecting value: line {a} column {b}"),
    (25, "step {a} contradicts step {b}"), (20, "hallucinated citation [{a}]"), (18, "repeats the question"),
    (16, "answer in the wrong language ({w})"), (14, "arithmetic slip at step {a}"),
    (12, "schema: {w} is a required property"), (10, "refused to answer"), (9, "off by {a}"),
    (8, "date {a}-{b}-{a} is not a valid date"), (7, "mentions {w} which is not in the context"),
    (6, "truncated after {a} tokens"), (5, "pattern not found"), (5, "contains {a} spelling errors"),
    (4, "inference_error: CUDA out of memory (tried to allocate {a} MiB)"), (4, "no number in the output"),
    (3, "empty output"), (3, "formatting: {a} unclosed brackets"), (2, "judge_error: ValueError: {w}"),
    (2, "lists {a} items, {b} expected"), (1, "uses {w} instead of {w}"), (1, ""),
]  # fmt: skip


# ------------------------------------------------------------------------------------- building
def question(i: int) -> str:
    rng = random.Random(i)
    topic = RARE_WORD if i % 97 == 13 else rng.choice(TOPICS)
    return (
        f"Question {i}: explain {topic} in {rng.randint(2, 9)} sentences, citing {rng.randint(1, 5)} facts."
    )


def generate(path: Path, n: int) -> None:
    context = "Background: " + "lorem ipsum dolor sit amet " * 5
    with path.open("wb") as f:
        for lo in range(0, n, 100_000):
            f.write(b"".join(
                json.dumps({"id": f"s{i:09d}", "question": question(i), "context": context}).encode() + b"\n"
                for i in range(lo, min(n, lo + 100_000))
            ))  # fmt: skip


def reason_for(rng: random.Random, rare: bool) -> str:
    if rare and rng.random() < 0.005:
        template = RARE_REASON
    else:
        template = rng.choices([t for _, t in REASONS], weights=[w for w, _ in REASONS])[0]
    return template.format(
        a=rng.randint(0, 5000), b=rng.randint(0, 5000), f=round(rng.random(), 3), w=f'"{rng.choice(WORDS)}"'
    )


def finish_shard(cfg: Any, shard: dict[str, Any], rare: bool) -> int:
    """The shard's infer_judge job, finished as a worker would: every row rejected."""
    import uuid

    from airflow_batchinfer.judges.reasons import ReasonGroups
    from airflow_batchinfer.rpc.fingerprint import fingerprint, pin_input
    from airflow_batchinfer.run.jobs import job_spec
    from airflow_batchinfer.state.docs import JobManifest, write_job_manifest
    from airflow_batchinfer.state.layout import staged_output
    from airflow_batchinfer.state.tally import Outcomes, Read, Tally
    from airflow_batchinfer.storage import JsonlFile
    from airflow_batchinfer.storage.digest import IdDigest
    from airflow_batchinfer.storage.ranges import read_range

    spec = job_spec(cfg, "infer_judge", 0, shard)  # type: ignore[arg-type]
    info = JsonlFile(spec.input).info()
    pinned = pin_input(spec, info)
    token = uuid.uuid4().hex
    staged = {name: staged_output(spec.outputs["staging"], spec.outputs["manifest"], token, name)
              for name in ("approved", "rejected")}  # fmt: skip
    with JsonlFile(staged["approved"]).writer_sync():
        pass  # no row approved
    rng = random.Random(shard.shard_id)
    ids, groups = IdDigest(), ReasonGroups()
    n = 0
    bad_lines = JsonlFile(spec.outputs["input_rejects"]).writer_sync()
    reader = read_range(shard, id_field="id", assign_ids=False, rejects=bad_lines)
    with bad_lines, JsonlFile(staged["rejected"]).writer_sync() as out:
        block = []
        for record in reader:
            reason = reason_for(rng, rare)
            groups.add(reason)
            result = (f"Here is my answer about {record['question'][12:40]}: " + "the result follows from "
                      f"the facts given, {rng.randint(1, 99)} of them, " * 3)[:200]  # fmt: skip
            judgment = {"approved": False, "reason": reason, "score": round(rng.random() / 2, 3)}
            block.append({**record, "result": result, "status": "rejected", "error": None,
                          "judgment": judgment, "attempts": 1, "round": 0})  # fmt: skip
            if len(block) == 2_000:
                out.write_many(block)
                ids.add_many(r["id"] for r in block)
                n += len(block)
                block = []
        out.write_many(block)
        ids.add_many(r["id"] for r in block)
        n += len(block)
    engine = {"engine": "simulated", "model": "simulated"}
    manifest = {
        "job_id": pinned.job_id, "kind": "infer_judge", "state": "succeeded", "input": spec.input,
        "outputs": spec.outputs, "attempt": token,
        "counts": Tally(outcomes=Outcomes(rejected=n), read=Read.of(reader.policy.stats)),
        "ids": {"input": ids.to_dict(), "approved": IdDigest().to_dict(), "rejected": ids.to_dict()},
        "tokens": {"prompt": 1, "completion": 1}, "round": 0,
        "fingerprint": fingerprint(pinned, engine, info), "engine": engine, "worker": "w1",
        "timings": {"started_at": 0.0, "finished_at": 1.0, "run_s": 1.0}, "batcher": {},
        "reason_groups": groups.as_dict(), "committed": staged,
    }  # fmt: skip
    write_job_manifest(spec.outputs["manifest"], JobManifest.model_validate(manifest))
    return n


def build(run_root: Path, n: int, shards: int) -> dict[str, Any]:
    from concurrent.futures import ProcessPoolExecutor

    from airflow_batchinfer.run.close import close_round
    from airflow_batchinfer.run.plan import propose_slot
    from airflow_batchinfer.run.prepare import prepare_run
    from airflow_batchinfer.state.config import RunConfig
    from airflow_batchinfer.state.docs import write_plan
    from airflow_batchinfer.state.layout import RunLayout

    shutil.rmtree(run_root.parent, ignore_errors=True)
    run_root.parent.mkdir(parents=True)
    data = run_root.parent / "data.jsonl"
    t0 = time.perf_counter()
    generate(data, n)
    cfg = RunConfig.of(
        input=str(data), run_root=str(run_root), judge={"type": "llm"}, max_rounds=2,
        prompt_template="{{ question }}\n\n{{ context }}", system="Answer briefly and cite your facts.",
        records_per_shard=-(-n // shards),
    )  # fmt: skip
    t1 = time.perf_counter()
    prepare_run(cfg)
    plan = propose_slot(cfg, "round-00").plan
    write_plan(RunLayout(cfg.run_root), plan)
    t2 = time.perf_counter()
    last = len(plan.shards) - 3
    with ProcessPoolExecutor(os.cpu_count() or 2) as ex:
        rows = sum(ex.map(finish_shard, [cfg] * len(plan.shards), plan.shards,
                          [i >= last for i in range(len(plan.shards))]))  # fmt: skip
    t3 = time.perf_counter()
    summary = close_round(cfg, plan)
    assert summary is not None and summary["invariant"]["ok"] and summary["rejected"] == rows == n, summary
    t4 = time.perf_counter()
    return {"generate_s": round(t1 - t0, 1), "shard_s": round(t2 - t1, 1), "jobs_s": round(t3 - t2, 1),
            "close_s": round(t4 - t3, 1), "shards": len(plan.shards), "rejected": rows}  # fmt: skip


# --------------------------------------------------------------------------------------- timing
def measure(run_root: str) -> dict[str, Any]:
    import resource

    from airflow_batchinfer.review.browse import RoundView
    from airflow_batchinfer.review.decisions import Decision, tally

    steps: list[dict[str, Any]] = []

    def step(name: str, fn: Any) -> Any:
        t = time.perf_counter()
        out = fn()
        wall = time.perf_counter() - t
        info = {"step": name, "wall_s": round(wall, 3)}
        if hasattr(out, "samples"):
            info.update(samples=len(out.samples), scanned=out.scanned, more=out.cursor is not None)
        elif isinstance(out, list):
            info.update(samples=len(out))
        steps.append(info)
        return out

    t = time.perf_counter()
    view = RoundView(run_root, 0)
    first = view.page(size=50)
    wall = round(time.perf_counter() - t, 3)
    steps.append({"step": "first page (incl. construction)", "wall_s": wall, "samples": len(first.samples),
                  "scanned": first.scanned, "more": first.cursor is not None})  # fmt: skip
    shards = view.shards()
    middle = f"s{len(shards) // 2}:{shards[len(shards) // 2].rows // 2}"
    step("middle page", lambda: view.page(middle, size=50))
    step("next page", lambda: view.page(first.cursor, size=50))
    groups = step("groups (manifests)", view.groups)
    step("sample(20)", lambda: view.sample(20, seed=1))
    common = next(iter(groups))
    rare = next(g for g in groups if g.startswith("safety filter"))
    step("page: common group", lambda: view.page(size=50, group=common))
    step("page: rare group", lambda: view.page(size=50, group=rare))
    step("page: text (~1% match)", lambda: view.page(size=50, text=RARE_WORD.upper()))
    step("page: text (no match)", lambda: view.page(size=50, text="zzz-nowhere"))
    last_id = view.page(f"s{len(shards) - 1}:{shards[-1].rows - 1}", size=1).samples[0].id
    step("find (last shard)", lambda: view.find(last_id))

    def decide(**kw: Any) -> Decision:
        return Decision.make(0, kw.pop("action"), "bench", **kw)

    by_group = [
        decide(action="accept", filter={"group": common}),
        decide(action="drop", filter={"group": rare}),
    ]
    ids = [s.id for s in view.sample(1_000, seed=2)]
    step("tally: group filters", lambda: tally(by_group, view))
    step("tally: + 1,000 ids", lambda: tally([*by_group, decide(action="drop", ids=ids)], view))
    step(
        "tally: text filter",
        lambda: tally([*by_group, decide(action="drop", filter={"text": RARE_WORD})], view),
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"steps": steps, "total": view.total(), "shards": len(shards), "groups": len(groups),
            "peak_rss_mb": round(peak, 1)}  # fmt: skip


def child(argv: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", *argv], check=True, stdout=subprocess.PIPE)
    return dict(json.loads(out.stdout.decode().strip().splitlines()[-1]))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        what, run_root = sys.argv[2], sys.argv[3]
        if what == "build":
            out = build(Path(run_root), int(sys.argv[4]), int(sys.argv[5]))
        else:
            out = measure(run_root)
        print(json.dumps(out))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--workdir", type=Path, default=Path(__file__).parent / "out" / "review")
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    run_root = args.workdir / str(args.records) / "run"
    built_doc = run_root.parent / "built.json"
    built: dict[str, Any] = {}
    planned = {"records": args.records, "shards": args.shards}
    if args.rebuild or not built_doc.exists() or json.loads(built_doc.read_text()).get("planned") != planned:
        print(f"building a round of {args.records:,} rejected rows in {args.shards} shards ...", flush=True)
        built = child(["build", str(run_root), str(args.records), str(args.shards)])
        built_doc.write_text(json.dumps({**built, "planned": planned}))
        print(" ".join(f"{k}={v}" for k, v in built.items()), flush=True)
    else:
        built = json.loads(built_doc.read_text())
        built.pop("planned", None)
    result = child(["measure", str(run_root)])
    keys = ("step", "wall_s", "samples", "scanned", "more")
    print(
        f"\n{result['total']:,} rejected rows in {result['shards']} shards, {result['groups']} reason groups"
    )
    print(f"{'step':<32} {'wall_s':>8} {'samples':>8} {'scanned':>9} {'more':>6}")
    for r in result["steps"]:
        print(
            f"{r['step']:<32} "
            + " ".join(f"{r.get(k, '')!s:>{w}}" for k, w in zip(keys[1:], (8, 8, 9, 6), strict=True))
        )
    print(f"peak RSS (browsing process): {result['peak_rss_mb']} MB")
    first = result["steps"][0]["wall_s"]
    print(f"first page: {first:.3f} s (target < 1 s: {'met' if first < 1 else 'MISSED'})")
    print(json.dumps({"bench": "review", "records": args.records, "build": built, **result}))


if __name__ == "__main__":
    main()
