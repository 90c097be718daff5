"""Issue 22, item 9 (b): two closes of one round at once (a zombie close and its retry) race on
"accept once". Both read "no accepted doc"; between their reads of the shard's manifest a second copy
of its job finished, so each would accept another attempt. Hooks force the interleaving that mixed
them before: the first close decides and promotes its attempt first, the second one's decision lands
after it (at the decision's compare-and-swap, the one way an accepted doc is written). One
accepted attempt must stand, and the promoted files must be exactly that attempt's rows (read back
and compared with the accepted doc's digests).

And a quarantine racing an accept (issue 22's review of item 9): a close's sweep never removes what
another close accepted meanwhile, nor leaves a ``failed/`` record for an accepted shard."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.run import close as round_close
from airflow_batchinfer.run import quarantine, settle
from airflow_batchinfer.run.jobs import record_job_error, round_kinds
from airflow_batchinfer.state.docs import (
    AcceptedJob,
    JobManifest,
    QuarantinedJob,
    read_accepted,
    read_job_manifest,
)
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, files, swap
from airflow_batchinfer.storage.digest import IdDigest
from tests.support.fake_jobs import IDS, finish_shard, judge_shard, make_run, plan_round, read_rows

pytestmark = pytest.mark.chaos
WAIT_S = 5.0  # each hook waits at most this long: a close that never gets there only slows the test


class Race:
    """Roles by thread: the first close to read the shard's manifest (``x``) sees attempt ``a``, the
    second (``y``) attempt ``b``. Both read the accepted doc before either decides; ``x`` decides
    first; ``x`` promotes while ``y`` waits inside its first move until a close has returned."""

    def __init__(self, layout: RunLayout, sid: str, kind: str, manifest_a: JobManifest) -> None:
        self.manifest_uri = layout.job_manifest(0, sid, kind)
        self.accepted_uri = layout.accepted(0, sid, kind)
        self.staged = layout.staged_job(0, sid, kind)
        self.manifest_a = manifest_a
        self.roles: dict[int, str] = {}
        self.lock = threading.Lock()
        self.both_read = threading.Barrier(2)
        self.read_once: set[str] = set()
        self.x_wrote = threading.Event()  # x's decision has landed
        self.y_after_x: list[bool] = []  # y's decision waited for x's (False: the wait timed out)
        self.y_at_move = threading.Event()
        self.close_done = threading.Event()

    def role(self) -> str | None:
        return self.roles.get(threading.get_ident())

    def read_manifest(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(uri: str, so: Any = None) -> Any:
            if uri != self.manifest_uri:
                return real(uri, so)
            with self.lock:
                role = self.roles.setdefault(threading.get_ident(), "xy"[len(self.roles)])
            return self.manifest_a if role == "x" else real(uri, so)

        return hooked

    def read_accepted(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(uri: str, so: Any = None) -> Any:
            doc = real(uri, so)
            role = self.role()
            if uri == self.accepted_uri and role is not None and role not in self.read_once:
                self.read_once.add(role)
                self.both_read.wait(WAIT_S)  # both closes have read "nothing accepted yet"
            return doc

        return hooked

    def decide(self, uri: str, write: Callable[[], Any]) -> Any:
        """y's decision is made after x's has landed, at whichever seam writes it."""
        role = self.role() if uri == self.accepted_uri else None
        if role == "y":
            self.y_after_x.append(self.x_wrote.wait(WAIT_S))
        out = write()
        if role == "x":
            self.x_wrote.set()
        return out

    def update(self, real: Callable[..., Any]) -> Callable[..., Any]:
        """The seam of the decision: its compare-and-swap (``run.accepted.claim``), the one way an
        accepted doc is written."""

        def hooked(loc: Any, change: Callable[[bytes | None], bytes]) -> bytes:
            return self.decide(loc.uri, lambda: real(loc, change))  # type: ignore[no-any-return]

        return hooked

    def move(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(src: str, dst: str, so: Any = None) -> None:
            role = self.role()
            if src.startswith(self.staged) and role == "x":
                self.y_at_move.wait(WAIT_S)
            elif src.startswith(self.staged) and role == "y":
                self.y_at_move.set()
                self.close_done.wait(2 * WAIT_S)
                if not Path(src).exists():  # moved (or swept) by x meanwhile: y found it gone
                    return
            real(src, dst, so)

        return hooked


def close_twice(cfg: Any, plan: Any, *done: threading.Event) -> list[dict[str, Any]]:
    """Two closes of one round at once (threads); their summaries. ``done`` events are set as each
    close returns (the races' hooks wait on them)."""
    summaries: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def close() -> None:
        try:
            summary = round_close.close_round(cfg, plan)
            assert summary is not None
            summaries.append(summary)
        except BaseException as exc:
            errors.append(exc)
        finally:
            for event in done:
                event.set()

    threads = [threading.Thread(target=close) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return summaries


def test_two_closes_at_once_accept_one_attempt_and_promote_exactly_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_run(tmp_path)  # one fused infer_judge job per shard
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    s, rest = plan.shards[0], plan.shards[1:]
    sid, kind = s.shard_id, round_kinds(cfg, "rounds")[-1]
    for x in rest:
        finish_shard(cfg, 0, x, set())
    ids = [r["id"] for r in read_rows(s.uri)]
    approve = {"a": set(ids[:3]), "b": set(ids[3:])}
    manifest_a = judge_shard(cfg, 0, s, approve["a"], token="a")
    judge_shard(cfg, 0, s, approve["b"], token="b")  # the other copy finishes: the manifest names b
    race = Race(layout, sid, kind, manifest_a)
    monkeypatch.setattr(settle, "read_job_manifest", race.read_manifest(settle.read_job_manifest))
    for mod in (settle, quarantine):  # the modules of a close that read accepted docs
        monkeypatch.setattr(mod, "read_accepted", race.read_accepted(mod.read_accepted))
    monkeypatch.setattr(swap, "update", race.update(swap.update))
    monkeypatch.setattr(files, "move", race.move(files.move))

    summaries = close_twice(cfg, plan, race.close_done)
    assert len(summaries) == 2 and sorted(race.roles.values()) == ["x", "y"]
    assert race.y_after_x == [True]  # the racing order was forced: y decided once, after x, no timeout

    doc = read_accepted(layout.accepted(0, sid, kind))
    assert isinstance(doc, AcceptedJob) and doc.attempt in approve and not doc.quarantined
    approved = [r["id"] for r in read_rows(layout.result(0, sid))]
    rejected = [r["id"] for r in read_rows(layout.rejected(0, sid))]
    assert sorted(approved) == sorted(approve[doc.attempt])  # exactly the accepted attempt's rows
    assert sorted(approved + rejected) == sorted(ids)
    assert IdDigest.of(approved) == doc.digest("approved")
    assert IdDigest.of(rejected) == doc.digest("rejected")
    assert not Path(layout.staged_job(0, sid, kind)).exists()
    assert read_job_manifest(layout.job_manifest(0, sid, kind)) is not None

    # each id once: results/ and the next pending set, counted from the files
    last = summaries[-1]
    assert last["invariant"]["ok"], last["invariant"]
    seen = [r["id"] for f in JsonlDir(layout.results).jsonl_files() for r in f.iter_records()]
    seen += [r["id"] for f in JsonlDir(layout.pending(1)).jsonl_files() for r in f.iter_records()]
    assert Counter(seen) == Counter(IDS)


class QuarantineRace:
    """One close (``x``) quarantines the shard: it read the manifest before the job's last copy wrote
    it. The other (``y``) reads the manifest after, and the accepted doc only once ``x``'s quarantine
    stands: it would accept that copy's attempt into the final URIs. ``x``'s destructive steps (the
    sweep, the orphans, its ``failed/`` record) wait until ``y`` has decided: accepted and returned
    (the code before the fix), or found the quarantine still sweeping and waits for it."""

    def __init__(self, layout: RunLayout, sid: str, kind: str) -> None:
        self.manifest_uri = layout.job_manifest(0, sid, kind)
        self.accepted_uri = layout.accepted(0, sid, kind)
        self.roles: dict[int, str] = {}
        self.lock = threading.Lock()
        self.x_claimed = threading.Event()
        self.y_decided = threading.Event()
        self.close_done = threading.Event()
        self.waits: list[tuple[str, bool]] = []  # (who waited, whether the other got there in time)

    def role(self) -> str | None:
        return self.roles.get(threading.get_ident())

    def read_manifest(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(uri: str, so: Any = None) -> Any:
            if uri != self.manifest_uri:
                return real(uri, so)
            with self.lock:  # y reads it again when it settles again
                role = self.roles.get(threading.get_ident()) or "xy"[len(self.roles)]
                self.roles[threading.get_ident()] = role
            return None if role == "x" else real(uri, so)  # x read it before the copy finished

        return hooked

    def read_accepted(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(uri: str, so: Any = None) -> Any:
            if uri == self.accepted_uri and self.role() == "y" and "y" not in dict(self.waits):
                self.waits.append(("y", self.x_claimed.wait(WAIT_S)))  # y reads x's quarantine
            return real(uri, so)

        return hooked

    def update(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(loc: Any, change: Callable[[bytes | None], bytes]) -> bytes:
            role = self.role() if loc.uri == self.accepted_uri else None
            refused: list[bool] = []

            def spy(current: bytes | None) -> bytes:
                data = change(current)
                refused.append(data is current)
                return data

            data: bytes = real(loc, spy)
            if role == "x" and not self.x_claimed.is_set():
                self.x_claimed.set()
                self.waits.append(("x", self.y_decided.wait(WAIT_S)))  # y decides before x sweeps
            elif role == "y" and refused[-1]:
                self.y_decided.set()
            return data

        return hooked

    def await_sweep(self, real: Callable[..., Any] | None) -> Callable[..., Any]:
        def hooked(*args: Any) -> Any:
            if self.role() == "y":
                self.y_decided.set()  # y waits for x's sweep: x goes on
                # and its close ends before y settles again (two recompactions at once are another matter)
                self.waits.append(("y waits", self.close_done.wait(2 * WAIT_S)))
            assert real is not None
            return real(*args)

        return hooked


def test_a_quarantine_never_removes_what_a_concurrent_close_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    s, rest = plan.shards[0], plan.shards[1:]
    sid, kind = s.shard_id, round_kinds(cfg, "rounds")[-1]
    for x in rest:
        finish_shard(cfg, 0, x, set())
    ids = [r["id"] for r in read_rows(s.uri)]
    record_job_error(cfg, 0, sid, kind, "JobFailed: worker lost", None)
    judge_shard(cfg, 0, s, set(ids[:4]), token="late")  # the task's last copy finishes meanwhile
    race = QuarantineRace(layout, sid, kind)
    monkeypatch.setattr(settle, "read_job_manifest", race.read_manifest(settle.read_job_manifest))
    for mod in (settle, quarantine):  # the modules of a close that read accepted docs
        monkeypatch.setattr(mod, "read_accepted", race.read_accepted(mod.read_accepted))
    monkeypatch.setattr(swap, "update", race.update(swap.update))
    monkeypatch.setattr(settle, "await_sweep", race.await_sweep(settle.await_sweep))
    monkeypatch.setattr(quarantine, "SWEEP_POLL_S", 0.01)

    summaries = close_twice(cfg, plan, race.y_decided, race.close_done)  # a close that returns has decided
    assert len(summaries) == 2 and sorted(race.roles.values()) == ["x", "y"]
    assert {"x", "y"} <= {who for who, _ in race.waits}  # the racing order was forced...
    assert all(in_time for _, in_time in race.waits), race.waits  # ...and no wait timed out

    # One decision stands, and the files, the failed/ record and both closes' summaries agree with it.
    doc = read_accepted(layout.accepted(0, sid, kind))
    assert doc is not None
    failed = Path(layout.failed(0), f"{sid}.json")
    finals = [Path(layout.result(0, sid)), Path(layout.rejected(0, sid))]
    if isinstance(doc, QuarantinedJob):
        assert doc.sweep == "swept" and failed.exists() and not any(f.exists() for f in finals)
    else:
        assert not failed.exists() and all(f.exists() for f in finals)
        assert sorted(r["id"] for r in read_rows(layout.result(0, sid))) == sorted(ids[:4])
    for summary in summaries:
        assert [f["shard_id"] for f in summary["failed_shards"]] == ([sid] if doc.quarantined else [])
        assert summary["invariant"]["ok"], summary["invariant"]

    judge_shard(cfg, 0, s, set(ids[:2]), token="rerun")  # the DAG run re-run: the close accepts it
    monkeypatch.undo()
    summary = round_close.close_round(cfg, plan)
    assert summary is not None and summary["failed_shards"] == [] and summary["invariant"]["ok"]
    assert not failed.exists()
    assert sorted(r["id"] for r in read_rows(layout.result(0, sid))) == sorted(ids[:2])
    seen = [r["id"] for f in JsonlDir(layout.results).jsonl_files() for r in f.iter_records()]
    seen += [r["id"] for f in JsonlDir(layout.pending(1)).jsonl_files() for r in f.iter_records()]
    assert Counter(seen) == Counter(IDS)
