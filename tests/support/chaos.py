"""Helpers for the chaos suite (tests/system/chaos): datasets, waiting on task instances, faults (a full
disk, a killed process), and the id invariant counted from storage, independently of the report.

The id invariant: every input id is in exactly one of ``results/``, the final pending set, a
quarantined shard (``round-NN/failed/<shard>.json`` names the shard's input file), the rows an
in-place round exhausted, or ``rejects/`` (malformed input lines) — 0 lost, 0 duplicated.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_batchinfer.storage import JsonlDir, JsonlFile
from airflow_batchinfer.storage.atomic import is_temp_name
from airflow_batchinfer.storage.location import resolve

SHARD_TASKS = (".lanes", ".infer_judge", ".infer", ".judge", ".in_place")  # lanes, or a judge pool's shards
BAD_ID = "bad-line"  # the id of the one malformed input line every chaos dataset carries


# ------------------------------------------------------------------------------------ datasets
def write_dataset(path: Path, n: int, prefix: str) -> list[str]:
    """``n`` records ``{id, question}`` plus one malformed line (it goes to ``rejects/``); returns
    every input id, the malformed line's included."""
    ids = [f"{prefix}-{i:04d}" for i in range(n)]
    lines = [json.dumps({"id": rid, "question": f"question {i}"}) for i, rid in enumerate(ids)]
    lines.insert(n // 2, f'{{"id": "{prefix}-{BAD_ID}", "question": "truncated')  # not JSON
    path.write_text("\n".join(lines) + "\n")
    return [*ids, f"{prefix}-{BAD_ID}"]


# ------------------------------------------------------------------------------------- waiting
def wait_until(pred: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.5) -> Any:
    """Poll ``pred`` until it returns something truthy (returned); ``TimeoutError`` naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def shard_tis(tis: Iterable[dict[str, Any]], *states: str) -> list[dict[str, Any]]:
    """The task instances that run shard jobs (lanes; a judge pool's infer and judge) in one of
    ``states`` (any if none)."""
    return [
        ti for ti in tis
        if ti["task_id"].endswith(SHARD_TASKS) and (not states or ti["state"] in states)
    ]  # fmt: skip


def ti_by_id(tis: Iterable[dict[str, Any]], task_id: str, map_index: int = -1) -> dict[str, Any] | None:
    return next((t for t in tis if t["task_id"] == task_id and t["map_index"] == map_index), None)


def ran(ti: dict[str, Any]) -> bool:
    """Whether a task instance ever started (an upstream_failed or skipped one did not)."""
    return bool(ti.get("start_date")) and ti["state"] not in ("upstream_failed", "skipped", "removed")


def lane_job(root: str, lane: int, so: dict[str, Any] | None = None, *, r: int = 0) -> Any:
    """The job lane ``lane`` of round ``r`` runs now (its document's running shard), pinned to its
    input as the lane submits it (a :class:`~airflow_batchinfer.rpc.models.JobSpec`); ``None`` when
    the lane runs none."""
    from airflow_batchinfer.rpc.fingerprint import pin_input
    from airflow_batchinfer.run.jobs import job_spec, round_kinds
    from airflow_batchinfer.state.docs import read_plan, read_run_config
    from airflow_batchinfer.state.docs.lanes import read_lane
    from airflow_batchinfer.state.layout import RunLayout

    layout = RunLayout(root)
    doc = read_lane(layout, r, lane, so)
    running = [s.shard_id for s in doc.shards if s.state == "running"] if doc is not None else []
    plan = read_plan(layout, f"round-{r:02d}", so)
    if not running or plan is None:
        return None
    shard = next(s for s in plan.shards if s.shard_id == running[-1])
    cfg = plan.effective_config(read_run_config(root, so))
    spec = job_spec(cfg, round_kinds(cfg, plan.mode)[0], r, shard)
    return pin_input(spec, JsonlFile(spec.input, storage_options=so).info())


# ---------------------------------------------------------------------------------- processes
def kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> list[int]:
    """Signal each PID (processes the test started, directly or through Airflow); returns those
    signalled."""
    done = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            done.append(pid)
    return done


# ----------------------------------------------------------------------------------- full disk
@dataclass
class SmallDisk:
    """A small tmpfs mounted at ``path`` (needs CAP_SYS_ADMIN); ``fill()`` takes all its free space
    with a ballast file, ``free()`` deletes it, ``unmount()`` ends it."""

    path: Path
    size: str = "8m"
    ballast: Path = field(init=False)

    def __post_init__(self) -> None:
        self.ballast = self.path / ".ballast"

    def mount(self) -> SmallDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0755", "tmpfs", str(self.path)],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise PermissionError(f"mount -t tmpfs on {self.path} failed: {out.stderr.strip()}")
        return self

    def fill(self) -> int:
        """Write the ballast until the disk is full; returns its size in bytes."""
        written = 0
        chunk = b"\0" * 65536
        with open(self.ballast, "ab", buffering=0) as f:
            while True:
                try:
                    written += f.write(chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    if len(chunk) == 1:
                        break
                    chunk = chunk[: len(chunk) // 2]
        return written

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.ballast.unlink()

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


# ---------------------------------------------------------------------------------- storage
def _ls(uri: str, so: dict[str, Any] | None) -> list[str]:
    loc = resolve(uri, so)
    try:
        return [p.rstrip("/").rsplit("/", 1)[-1] for p in loc.fs.ls(loc.path, detail=False, refresh=True)]
    except FileNotFoundError:
        return []


def read_doc(uri: str, so: dict[str, Any] | None = None) -> dict[str, Any] | None:
    loc = resolve(uri, so)
    try:
        with loc.fs.open(loc.path, "rb") as f:
            return dict(json.loads(f.read()))
    except FileNotFoundError:
        return None


def ids_in_dir(uri: str, so: dict[str, Any] | None, id_field: str = "id") -> list[Any]:
    files = JsonlDir(uri, storage_options=so).jsonl_files()
    return [r.get(id_field) for f in files for r in f.iter_records()]


def ids_in_file(uri: str, so: dict[str, Any] | None, id_field: str = "id") -> list[Any]:
    return [r.get(id_field) for r in JsonlFile(uri, storage_options=so).iter_records()]


def round_dirs(root: str, so: dict[str, Any] | None) -> list[str]:
    return sorted(n for n in _ls(root, so) if re.fullmatch(r"round-\d\d", n))


@dataclass
class IdCount:
    """Where each input id was found; ``ok`` when each is in exactly one place."""

    expected: list[str]
    places: dict[str, list[Any]]

    @property
    def counts(self) -> Counter[Any]:
        c: Counter[Any] = Counter()
        for ids in self.places.values():
            c.update(ids)
        return c

    @property
    def lost(self) -> list[str]:
        return sorted(set(self.expected) - set(self.counts))

    @property
    def doubled(self) -> list[Any]:
        return sorted((k for k, n in self.counts.items() if n > 1), key=str)

    @property
    def unknown(self) -> list[Any]:
        return sorted(set(self.counts) - set(self.expected), key=str)

    @property
    def ok(self) -> bool:
        return not self.lost and not self.doubled and not self.unknown

    def summary(self) -> dict[str, Any]:
        return {
            "expected": len(self.expected),
            **{k: len(v) for k, v in self.places.items()},
            "lost": self.lost[:10],
            "doubled": self.doubled[:10],
            "unknown": self.unknown[:10],
        }


def count_ids(
    root: str, expected: list[str], report: dict[str, Any], so: dict[str, Any] | None = None
) -> IdCount:
    """Find every input id in the run's storage, by reading the files themselves."""
    places: dict[str, list[Any]] = {"results": ids_in_dir(f"{root}/results", so)}
    pending_uri = report.get("remaining_pending_uri")
    places["pending"] = ids_in_dir(pending_uri, so) if pending_uri else []
    failed: list[Any] = []
    exhausted: list[Any] = []
    for rd in round_dirs(root, so):
        for name in _ls(f"{root}/{rd}/failed", so):
            if name.endswith(".json"):
                rec = read_doc(f"{root}/{rd}/failed/{name}", so) or {}
                failed += ids_in_file(rec["uri"], so)
        summary = read_doc(f"{root}/{rd}/summary.json", so) or {}
        if summary.get("mode") == "in_place":
            exhausted += ids_in_dir(f"{root}/{rd}/rejected", so)
    places["failed"] = failed
    places["exhausted_in_place"] = exhausted
    rejects = []
    for f in JsonlDir(f"{root}/rejects", storage_options=so).jsonl_files():
        for row in f.iter_records():
            m = re.search(r'"id":\s*"([^"]+)"', str(row.get("raw", "")))
            rejects.append(m.group(1) if m else row.get("raw"))
    places["rejects"] = rejects
    return IdCount(expected, places)


def partial_files(root: str, so: dict[str, Any] | None = None) -> list[str]:
    """Anything half-written under ``root``: temporary files of unfinished writes, JSONL files that
    do not decode to the end, JSON documents that do not parse. ``[]`` when everything is whole."""
    loc = resolve(root, so)
    bad: list[str] = []
    for path in loc.fs.find(loc.path):
        name = path.rsplit("/", 1)[-1]
        uri = path if loc.is_local else f"s3://{path}"
        if is_temp_name(name) or ".tmp" in name:
            bad.append(f"{uri} (temporary)")
        elif re.search(r"\.jsonl(\.zstd?)?$", name):
            try:
                sum(1 for _ in JsonlFile(uri, storage_options=so).iter_lines())
            except Exception as exc:
                bad.append(f"{uri} ({type(exc).__name__}: {exc})")
        elif name.endswith(".json"):
            try:
                with loc.fs.open(path, "rb") as f:
                    json.loads(f.read())
            except Exception as exc:
                bad.append(f"{uri} ({type(exc).__name__}: {exc})")
    return bad


BUCKET = "batchinfer-chaos"
FAILURE_TIMEOUT_S = 10
