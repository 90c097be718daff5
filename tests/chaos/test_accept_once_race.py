"""Issue 22, item 9 (b): two closes of one round at once (a zombie close and its retry) race on
"accept once". Both read "no accepted doc"; between their reads of the shard's manifest a second copy
of its job finished, so each would accept another attempt. Hooks force the interleaving that mixed
them before: the first close decides and promotes its attempt first, the second one's decision lands
after it. One accepted attempt must stand, and the promoted files must be exactly that attempt's
rows (read back and compared with the accepted doc's digests)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer import rounds
from airflow_batchinfer.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, files
from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.worker.manifest import read_job_manifest
from tests.support.fake_jobs import IDS, finish_shard, judge_shard, make_run, plan_round, read_rows

pytestmark = pytest.mark.chaos
WAIT_S = 5.0  # each hook waits at most this long: a close that never gets there only slows the test


class Race:
    """Roles by thread: the first close to read the shard's manifest (``x``) sees attempt ``a``, the
    second (``y``) attempt ``b``. Both read the accepted doc before either decides; ``x`` decides
    first; ``x`` promotes while ``y`` waits inside its first move until a close has returned."""

    def __init__(self, layout: RunLayout, sid: str, kind: str, manifest_a: dict[str, Any]) -> None:
        self.manifest_uri = layout.job_manifest(0, sid, kind)
        self.accepted_uri = layout.accepted(0, sid, kind)
        self.staged = layout.staged_job(0, sid, kind)
        self.manifest_a = manifest_a
        self.roles: dict[int, str] = {}
        self.lock = threading.Lock()
        self.both_read = threading.Barrier(2)
        self.read_once: set[str] = set()
        self.x_wrote = threading.Event()  # x's plain write of its decision (the code before the fix)
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

    def read_doc(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(uri: str, what: str, so: Any = None) -> Any:
            doc = real(uri, what, so)
            role = self.role()
            if uri == self.accepted_uri and role is not None and role not in self.read_once:
                self.read_once.add(role)
                self.both_read.wait(WAIT_S)  # both closes have read "nothing accepted yet"
            return doc

        return hooked

    def write_doc(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(uri: str, data: dict[str, Any], so: Any = None) -> None:
            if uri == self.accepted_uri and self.role() == "y":
                self.x_wrote.wait(WAIT_S)  # a plain write of y's decision lands after x's
            real(uri, data, so)
            if uri == self.accepted_uri and self.role() == "x":
                self.x_wrote.set()

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


def test_two_closes_at_once_accept_one_attempt_and_promote_exactly_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_run(tmp_path)  # one fused infer_judge job per shard
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    s, rest = plan.shards[0], plan.shards[1:]
    sid, kind = s["shard_id"], rounds.round_kinds(cfg, "rounds")[-1]
    for x in rest:
        finish_shard(cfg, 0, x, set())
    ids = [r["id"] for r in read_rows(s["uri"])]
    approve = {"a": set(ids[:3]), "b": set(ids[3:])}
    manifest_a = judge_shard(cfg, 0, s, approve["a"], token="a")
    judge_shard(cfg, 0, s, approve["b"], token="b")  # the other copy finishes: the manifest names b
    race = Race(layout, sid, kind, manifest_a)
    monkeypatch.setattr(rounds, "read_job_manifest", race.read_manifest(rounds.read_job_manifest))
    monkeypatch.setattr(rounds, "read_doc", race.read_doc(rounds.read_doc))
    monkeypatch.setattr(rounds, "write_doc", race.write_doc(rounds.write_doc))
    monkeypatch.setattr(files, "move", race.move(files.move))

    summaries: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def close() -> None:
        try:
            summary = rounds.close_round(cfg, plan)
            assert summary is not None
            summaries.append(summary)
        except BaseException as exc:
            errors.append(exc)
        finally:
            race.close_done.set()

    threads = [threading.Thread(target=close) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(summaries) == 2 and sorted(race.roles.values()) == ["x", "y"]

    doc = rounds.read_doc(layout.accepted(0, sid, kind), "accepted job")
    assert doc is not None and doc["attempt"] in approve and not doc["quarantined"]
    approved = [r["id"] for r in read_rows(layout.result(0, sid))]
    rejected = [r["id"] for r in read_rows(layout.rejected(0, sid))]
    assert sorted(approved) == sorted(approve[doc["attempt"]])  # exactly the accepted attempt's rows
    assert sorted(approved + rejected) == sorted(ids)
    assert IdDigest.of(approved).to_dict() == doc["ids"]["approved"]
    assert IdDigest.of(rejected).to_dict() == doc["ids"]["rejected"]
    assert not Path(layout.staged_job(0, sid, kind)).exists()
    assert read_job_manifest(layout.job_manifest(0, sid, kind)) is not None

    # each id once: results/ and the next pending set, counted from the files
    last = summaries[-1]
    assert last["invariant"]["ok"], last["invariant"]
    seen = [r["id"] for f in JsonlDir(layout.results).jsonl_files() for r in f.iter_records()]
    seen += [r["id"] for f in JsonlDir(layout.pending(1)).jsonl_files() for r in f.iter_records()]
    assert Counter(seen) == Counter(IDS)
