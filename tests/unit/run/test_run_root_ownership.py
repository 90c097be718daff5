"""Issue 22, item 1: a run root belongs to the DAG that created it. Someone who may trigger only DAG
``scratch`` names DAG ``finance``'s ``output_root``/``run_name``: the claim is refused whatever state
``finance``'s run is in (before: a finished or deleted owner run was taken over), nothing is written,
and the review desk shows a root only to readers of the DAG that created it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.spec.limits import TriggerLimits
from airflow_batchinfer.state.owner import (
    CREATOR,
    OWNER_VERSION,
    RunIdentity,
    claim,
    decide,
    read_owner,
)
from tests.support.owners import write_owner

pytestmark = pytest.mark.security

FINANCE = RunIdentity("finance", "scheduled__2026-01-01T00:00:00+00:00")
SCRATCH = RunIdentity("scratch", "manual__2026-01-02T00:00:00+00:00")
OPS = RunIdentity("ops", "manual__2026-01-03T00:00:00+00:00")
STATES = [None, "success", "failed", "queued", "running"]  # None: the owner run no longer exists


def record(run: RunIdentity, creator: str | None = None) -> dict[str, Any]:
    return {
        "schema_version": OWNER_VERSION,
        "dag_id": run.dag_id,
        "run_id": run.run_id,
        CREATOR: creator or run.dag_id,
    }


# ------------------------------------------------------------------------------------- decide
@pytest.mark.parametrize("state", STATES)
def test_another_dag_is_refused_whatever_the_owner_runs_state(state: str | None) -> None:
    d = decide(record(FINANCE), SCRATCH, state, run_root="s3://runs/finance/q1")
    assert d.action == "refuse" and d.owner == FINANCE and d.creator == "finance"
    assert "s3://runs/finance/q1 belongs to DAG 'finance', which created it" in d.reason
    assert "another run_name or output_root" in d.reason and "shared_run_root_dags" in d.reason


@pytest.mark.parametrize("state", [None, "success", "failed"])
def test_dags_the_deployment_lets_share_take_over_finished_roots(state: str | None) -> None:
    shared = ("finance", "scratch")
    d = decide(record(FINANCE), SCRATCH, state, shared_dags=shared)
    assert d.action == "claim" and d.creator == "finance"  # the creator stays the creator
    assert decide(record(FINANCE), SCRATCH, "running", shared_dags=shared).action == "refuse"  # still live
    # both DAGs must be listed: the creator's and the taker's
    assert decide(record(FINANCE), SCRATCH, state, shared_dags=("scratch",)).action == "refuse"
    # a root scratch took over is still finance's: ops, which shares only with scratch, may not take it
    taken = record(SCRATCH, creator="finance")
    assert decide(taken, OPS, state, shared_dags=("scratch", "ops")).action == "refuse"
    assert decide(taken, OPS, state, shared_dags=("finance", "ops")).action == "claim"
    assert decide(taken, FINANCE, state).action == "claim"  # the creating DAG takes its root back


def test_the_sharing_limit_comes_from_the_deployments_places() -> None:
    """One description (limit_settings.SETTINGS): the DAG's limits=, [batchinfer] and the pool connection."""
    config = TriggerLimits.from_mapping({"shared_run_root_dags": "finance, scratch"}, "[batchinfer]")
    extra = TriggerLimits.from_mapping({"shared_run_root_dags": ["ops"]}, "connection 'gpu_pool'")
    limits = TriggerLimits().widen(config).widen(extra)
    assert limits.shared_run_root_dags == ("finance", "scratch", "ops")
    from airflow_batchinfer.get_provider_info import get_provider_info

    info = get_provider_info()
    assert "shared_run_root_dags" in info["config"]["batchinfer"]["options"]


# -------------------------------------------------------------------------------------- claim
class States:
    def __init__(self, state: str | None) -> None:
        self.state, self.asked = state, []  # type: ignore[var-annotated]

    def __call__(self, run: RunIdentity) -> str | None:
        self.asked.append(run)
        return self.state


@pytest.mark.parametrize("state", [None, "success"])
def test_a_refused_claim_writes_nothing_and_asks_nothing_about_the_other_dag(
    tmp_path: Path, state: str | None
) -> None:
    root = tmp_path / "finance" / "q1"
    write_owner(str(root), FINANCE)
    before = (root / "owner.json").read_bytes()
    states = States(state)
    d = claim(str(root), SCRATCH, states)
    assert d.action == "refuse" and "belongs to DAG 'finance'" in d.reason
    assert states.asked == []  # another DAG's run states are none of this run's business
    assert (root / "owner.json").read_bytes() == before
    assert sorted(p.name for p in root.iterdir()) == [".owner.json.lock", "owner.json"]


def test_a_shared_takeover_records_the_creator(tmp_path: Path) -> None:
    root = str(tmp_path / "run")
    write_owner(root, FINANCE)
    d = claim(root, SCRATCH, States("success"), shared_dags=("finance", "scratch"))
    assert d.action == "claim"
    stored = read_owner(root)
    assert stored is not None and (stored["dag_id"], stored[CREATOR]) == ("scratch", "finance")
    assert claim(root, OPS, States("success"), shared_dags=("scratch", "ops")).action == "refuse"


class FakeTI:
    def __init__(self, run: RunIdentity, state: str | None) -> None:
        self.dag_id, self.run_id, self.try_number, self.state = run.dag_id, run.run_id, 1, state

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str | None:
        return self.state


def test_the_shard_task_refuses_another_dags_root_before_writing_anything(tmp_path: Path) -> None:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_batchinfer.operators.shard import ShardDatasetOperator

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "q": "x"}) + "\n" for i in range(12)))
    run_root = tmp_path / "runs" / "q1"
    config = {"input": str(data), "run_root": str(run_root), "prompt_template": "{{ q }}",
              "judge": {"type": "llm"}, "records_per_shard": 5}  # fmt: skip
    limits = TriggerLimits(allowed_input_prefixes=(str(tmp_path),), allowed_output_prefixes=(str(tmp_path),))
    ShardDatasetOperator(task_id="shard", config=config, limits=limits).execute({"ti": FakeTI(FINANCE, None)})
    before = {p: p.stat().st_mtime_ns for p in run_root.rglob("*")}
    op = ShardDatasetOperator(task_id="shard", config=config, limits=limits)
    with pytest.raises(
        AirflowFailException, match=r"belongs to DAG 'finance'.*another run_name or output_root"
    ):
        op.execute({"ti": FakeTI(SCRATCH, "success")})  # finance's run has finished: still refused
    assert {p: p.stat().st_mtime_ns for p in run_root.rglob("*")} == before
    # the DAG's limits= let the two DAGs share: the shard task passes the allowance to the claim
    shared = dataclasses.replace(limits, shared_run_root_dags=("finance", "scratch"))
    op = ShardDatasetOperator(task_id="shard", config=config, limits=shared)
    assert op.execute({"ti": FakeTI(SCRATCH, "success")})
    stored = read_owner(str(run_root))
    assert stored is not None and (stored["dag_id"], stored[CREATOR]) == ("scratch", "finance")


# ------------------------------------------------------------------------------ the review desk
class FakeAuthManager:
    """Airflow's auth manager as the desk asks it: which user may read which DAG."""

    def __init__(self, readable: dict[str, set[str]]) -> None:
        self.readable, self.asked = readable, []  # type: ignore[var-annotated]

    def is_authorized_dag(self, *, method: str, access_entity: Any, details: Any, user: Any) -> bool:
        self.asked.append((user.get_id(), details.id))
        return method == "GET" and details.id in self.readable.get(user.get_id(), set())


class User:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_id(self) -> str:
        return self.name

    def get_name(self) -> str:
        return self.name


@pytest.fixture
def desk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The desk's run_context over a gate of SCRATCH's run whose root (shared) finance created, asked
    through the plugin's Airflow access (its auth manager faked, its database's gate given)."""
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow_batchinfer.plugin import desk as airflow_desk
    from airflow_batchinfer.review.gate import Gate
    from airflow_batchinfer.review.routes import context

    root = str(tmp_path / "run")
    write_owner(root, SCRATCH, creator="finance")
    gate = Gate(SCRATCH.dag_id, SCRATCH.run_id, "round_01.plan", -1, "s", None, [], "deferred", True,
                rendered={"run_root": root})  # fmt: skip

    class Access(airflow_desk.AirflowAccess):
        def gates(self, **kw: Any) -> list[Gate]:
            return [gate]

    no_teams = staticmethod(lambda dag_ids, session=None: {})
    monkeypatch.setattr(airflow_desk.DagModel, "get_dag_id_to_team_name_mapping", no_teams)
    auth = FakeAuthManager({"both": {"finance", "scratch"}, "scratch_only": {"scratch"}})
    monkeypatch.setattr(airflow_desk, "get_auth_manager", lambda: auth)
    return context, Access, auth


def test_the_desk_refuses_a_reader_who_may_not_read_the_creating_dag(desk: Any) -> None:
    from fastapi import HTTPException

    context, access, auth = desk
    with pytest.raises(HTTPException) as refused:
        context.run_context(access(None, User("scratch_only")), SCRATCH.dag_id, SCRATCH.run_id)
    assert refused.value.status_code == 403
    assert "may not read DAG 'finance', which created the run root" in str(refused.value.detail)
    assert ("scratch_only", "finance") in auth.asked
    ctx = context.run_context(access(None, User("both")), SCRATCH.dag_id, SCRATCH.run_id)
    assert (ctx.dag_id, ctx.round) == ("scratch", 0)


# ---------------------------- issue 22 round two, should-fix 5: an input inside another DAG's root
def test_the_input_walk_covers_its_ancestors_within_the_widest_allowed_prefix(tmp_path: Path) -> None:
    from airflow_batchinfer.state.owner import input_root_candidates

    runs = tmp_path / "runs"
    part = runs / "finance" / "q1" / "results" / "round00-part-00000.jsonl.zst"
    assert input_root_candidates(str(part), [str(runs / "finance"), str(tmp_path)]) == [
        str(runs / "finance" / "q1" / "results"), str(runs / "finance" / "q1"), str(runs / "finance"),
        str(runs), str(tmp_path),
    ]  # fmt: skip
    assert input_root_candidates(str(part), [str(part)]) == []  # the DAG's default itself: nothing above
    assert input_root_candidates(str(part), ["/elsewhere/"]) == []  # no prefix admits it: the DAG's code
    assert input_root_candidates("s3a://b/runs/q1/results/p.jsonl", ["s3://b/runs/"]) == [
        "s3://b/runs/q1/results", "s3://b/runs/q1", "s3://b/runs"]  # fmt: skip
    assert input_root_candidates("s3://b/x/p.jsonl", ["s3://b"]) == ["s3://b/x", "s3://b"]
    # symlinks resolved, as the prefix checks resolve them: a link into a run root is the run root
    (runs / "finance" / "q1").mkdir(parents=True)
    (tmp_path / "mine").symlink_to(runs / "finance" / "q1")
    linked = input_root_candidates(str(tmp_path / "mine" / "in.jsonl"), [str(tmp_path)])
    assert linked[0] == str(runs / "finance" / "q1")


def test_an_input_decision_follows_the_run_roots_creator() -> None:
    from airflow_batchinfer.state.owner import decide_input

    args = {"input_uri": "s3://runs/finance/q1/results/p.jsonl", "run_root": "s3://runs/finance/q1"}
    why = decide_input(record(FINANCE), SCRATCH, **args)
    assert why is not None and "lies inside the run root s3://runs/finance/q1, which DAG 'finance'" in why
    assert "name an input outside that run root" in why and "shared_run_root_dags" in why
    assert decide_input(record(FINANCE), RunIdentity("finance", "later"), **args) is None  # its own DAG
    assert decide_input(record(FINANCE), SCRATCH, shared_dags=("finance", "scratch"), **args) is None
    assert decide_input(record(SCRATCH, creator="finance"), SCRATCH, **args) is not None  # taken over


def test_the_shard_task_refuses_an_input_inside_another_dags_run_root(tmp_path: Path) -> None:
    """Before: ``scratch`` could name ``finance``'s ``results/`` as its input (inside
    ``allowed_input_prefixes``) and read finance's rows on its own review desk."""
    pytest.importorskip("airflow", reason="needs the airflow extra")
    import zstandard
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_batchinfer.operators.shard import ShardDatasetOperator

    finance_root = tmp_path / "runs" / "finance-q1"
    write_owner(str(finance_root), FINANCE)
    results = finance_root / "results" / "round00-part-00000.jsonl.zst"
    results.parent.mkdir(parents=True)
    rows = "".join(json.dumps({"id": i, "q": "salary", "result": "secret"}) + "\n" for i in range(6))
    results.write_bytes(zstandard.ZstdCompressor().compress(rows.encode()))
    limits = TriggerLimits(allowed_input_prefixes=(str(tmp_path),), allowed_output_prefixes=(str(tmp_path),))

    def shard(run: RunIdentity, name: str, data: Path = results, shared: tuple[str, ...] = ()) -> Any:
        config = {"input": str(data), "run_root": str(tmp_path / "runs" / name),
                  "prompt_template": "{{ q }}", "judge": {"type": "llm"}, "records_per_shard": 5}  # fmt: skip
        in_force = dataclasses.replace(limits, shared_run_root_dags=shared)
        return ShardDatasetOperator(task_id="shard", config=config, limits=in_force).execute(
            {"ti": FakeTI(run, None)}
        )

    with pytest.raises(AirflowFailException) as err:
        shard(SCRATCH, "scratch-1")
    assert f"lies inside the run root {finance_root}, which DAG 'finance' created" in str(err.value)
    assert not (tmp_path / "runs" / "scratch-1").exists()  # refused before the claim: nothing written
    # a link into finance's root is finance's root (symlinks resolved)
    (tmp_path / "mine.jsonl.zst").symlink_to(results)
    with pytest.raises(AirflowFailException, match="which DAG 'finance' created"):
        shard(SCRATCH, "scratch-2", tmp_path / "mine.jsonl.zst")
    # finance's own later run may read its results; so may scratch where the deployment lets them share
    assert shard(RunIdentity("finance", "later"), "finance-q2")
    assert shard(SCRATCH, "scratch-3", shared=("finance", "scratch"))


def test_an_owner_record_the_check_cannot_read_refuses_the_input_and_the_run_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail closed: on S3 without list permission a missing key is a 403, and an unreadable record
    may be another DAG's."""
    from airflow_batchinfer.exceptions import ConfigError
    from airflow_batchinfer.state import owner as run_owner

    def forbidden(root: str, so: Any = None) -> None:
        raise PermissionError(13, "Access Denied")

    monkeypatch.setattr(run_owner, "read_owner", forbidden)
    data = str(tmp_path / "in" / "a.jsonl")
    with pytest.raises(ConfigError, match=r"cannot read .*owner.json to check that input .* Remedy: let"):
        run_owner.input_refusal(data, SCRATCH, prefixes=[str(tmp_path)])
    assert run_owner.input_refusal(data, SCRATCH, prefixes=[]) is None  # no prefix admits it: not walked
    # a new run root's nesting check reads owner records the same way, and refuses the same way
    nested = r"cannot read .*owner.json to check that the run root .* nests in no other DAG's run root"
    with pytest.raises(ConfigError, match=nested + r".* Remedy: let .* or name another output_root"):
        run_owner.nesting_refusal(str(tmp_path / "runs" / "r"), SCRATCH, prefixes=[str(tmp_path)])


# ----------------------------------------------------------------------------- nested run roots
def test_a_new_run_root_may_not_nest_with_another_dags_run_root(tmp_path: Path) -> None:
    """Issue 37, item 10: before, ``scratch`` could create its run root inside ``finance``'s (adding
    its directories there), or around it (so that finance's later runs nested in it were refused).
    Both are refused by the shard task before anything is written; its own DAG's and a sharing DAG's
    runs may nest."""
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_batchinfer.operators.shard import ShardDatasetOperator

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "q": "x"}) + "\n" for i in range(6)))
    finance_root = tmp_path / "runs" / "fin" / "q1"
    write_owner(str(finance_root), FINANCE)
    limits = TriggerLimits(allowed_input_prefixes=(str(tmp_path),), allowed_output_prefixes=(str(tmp_path),))

    def shard(run: RunIdentity, root: Path, shared: tuple[str, ...] = ()) -> Any:
        config = {"input": str(data), "run_root": str(root), "prompt_template": "{{ q }}",
                  "judge": {"type": "llm"}, "records_per_shard": 5}  # fmt: skip
        in_force = dataclasses.replace(limits, shared_run_root_dags=shared)
        return ShardDatasetOperator(task_id="shard", config=config, limits=in_force).execute(
            {"ti": FakeTI(run, None)}
        )

    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(AirflowFailException) as inside:
        shard(SCRATCH, finance_root / "results" / "mine")
    assert f"lies inside the run root {finance_root}, which DAG 'finance' created" in str(inside.value)
    assert "another run_name or output_root" in str(inside.value)
    with pytest.raises(AirflowFailException) as around:
        shard(SCRATCH, tmp_path / "runs" / "fin")
    assert f"would hold the run root {finance_root}, which DAG 'finance' created" in str(around.value)
    assert sorted(tmp_path.rglob("*")) == before  # nothing written
    assert shard(RunIdentity("finance", "later"), finance_root / "sub")  # its own DAG's root
    assert shard(SCRATCH, finance_root / "shared", shared=("finance", "scratch"))
    assert shard(SCRATCH, tmp_path / "runs" / "scratch-q1")  # beside it: as before


# ------------------------------------------------- a glob or directory input reaching into a run root
def test_a_glob_input_reaching_into_another_dags_run_root_is_refused(tmp_path: Path) -> None:
    """Before: only the ancestors of the input's string were checked, and for
    ``<shared>/**/results/*.jsonl.zst`` none holds ``owner.json``: ``scratch`` read ``finance``'s
    results. Now every directory holding a listed part is walked up to the prefix."""
    from airflow_batchinfer.state.owner import input_refusal, parts_refusal
    from airflow_batchinfer.storage.input_parts import list_input

    shared = tmp_path / "shared"
    write_owner(str(shared / "finance-q1"), FINANCE)
    for folder in ("finance-q1/results", "plain/results"):
        (shared / folder).mkdir(parents=True, exist_ok=True)
        (shared / folder / "part-0.jsonl").write_text('{"id": 1, "q": "salary"}\n')
    prefixes = [str(tmp_path)]
    glob = f"{shared}/**/results/*.jsonl"
    assert input_refusal(glob, SCRATCH, prefixes=prefixes) is None  # the string's ancestors hold none
    why = parts_refusal(list_input(glob), SCRATCH, prefixes=prefixes)
    assert why is not None and f"lies inside the run root {shared / 'finance-q1'}, which DAG 'finance'" in why
    # a recursive glob from above the run root reaches into it too
    assert parts_refusal(list_input(f"{shared}/**/*.jsonl"), SCRATCH, prefixes=prefixes) is not None
    # plain data, the creator's own DAG, and DAGs the deployment lets share are accepted
    assert parts_refusal(list_input(f"{shared}/plain/**/*.jsonl"), SCRATCH, prefixes=prefixes) is None
    assert parts_refusal(list_input(glob), RunIdentity("finance", "later"), prefixes=prefixes) is None
    shared_dags = ("finance", "scratch")
    assert parts_refusal(list_input(glob), SCRATCH, prefixes=prefixes, shared_dags=shared_dags) is None


def test_the_shard_task_refuses_a_glob_into_another_dags_run_root(tmp_path: Path) -> None:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_batchinfer.operators.shard import ShardDatasetOperator

    write_owner(str(tmp_path / "runs" / "finance-q1"), FINANCE)
    for folder in ("runs/finance-q1/results", "data/a"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        rows = "".join(json.dumps({"id": f"{folder}-{i}", "q": "x"}) + "\n" for i in range(6))
        (tmp_path / folder / "part-0.jsonl").write_text(rows)
    limits = TriggerLimits(allowed_input_prefixes=(str(tmp_path),), allowed_output_prefixes=(str(tmp_path),))

    def shard(glob: str, name: str) -> Any:
        config = {"input": glob, "run_root": str(tmp_path / "mine" / name),
                  "prompt_template": "{{ q }}", "judge": {"type": "llm"}, "records_per_shard": 5}  # fmt: skip
        return ShardDatasetOperator(task_id="shard", config=config, limits=limits).execute(
            {"ti": FakeTI(SCRATCH, None)}
        )

    with pytest.raises(AirflowFailException, match="which DAG 'finance' created"):
        shard(f"{tmp_path}/*/*/results/*.jsonl", "refused")
    assert not (tmp_path / "mine" / "refused").exists()  # refused before the claim: nothing written
    assert shard(f"{tmp_path}/data/*/*.jsonl", "plain")["shards"] == 2
