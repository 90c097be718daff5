"""Issue 22, item 2: paths and references are normalised before a limit compares them. A model that
names a local path is compared as its real path, by whole segments (``/models/../anywhere`` is
``/anywhere``, not under ``/models/``); built-in names and other references as written, and a name
with a ``.``/``..`` segment not at all. Inputs, outputs and the run root go through the workers'
:class:`PrefixPolicy` (real paths, segment-bounded), and so does a model inside a mounted volume."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.spec.limits import TriggerLimits, implied_by, refusals
from airflow_batchinfer.worker.security import model_allows, normalize_model

pytestmark = pytest.mark.security

MODELS = TriggerLimits(allowed_models=("/models/", "builtin:smollm2", "Qwen/"))


@pytest.mark.parametrize(
    ("model", "resolved"),
    [
        ("/models/../anywhere", "/anywhere"),
        ("/models/../etc/passwd", "/etc/passwd"),
        ("/models/x/../../etc", "/etc"),
        ("file:///models/../etc", "/etc"),
    ],
)
def test_a_model_path_that_leaves_the_allowed_directory_is_refused(model: str, resolved: str) -> None:
    (why,) = refusals({"model": model}, MODELS)
    assert f"model {model!r} (it resolves to {resolved})" in why
    assert "allowed_models" in why  # where to widen it


def test_a_model_directory_entry_is_bounded_by_segments() -> None:
    (why,) = refusals({"model": "/models2/llama"}, MODELS)
    assert "model '/models2/llama' is not the DAG's nor allowed" in why
    exact = TriggerLimits(allowed_models=("/models/llama",))  # no trailing '/': that path only
    assert refusals({"model": "/models/llama/sub"}, exact) != []
    assert refusals({"model": "/models/llama/"}, exact) == []


@pytest.mark.parametrize(
    "model", ["/models/llama", "/models/./llama", "/models/a/../llama", "file:///models/llama", "/models"]
)
def test_model_paths_inside_the_allowed_directory_are_allowed(model: str) -> None:
    assert refusals({"model": model}, MODELS) == []


def test_a_symlink_in_the_model_directory_cannot_lead_out(tmp_path: Path) -> None:
    models, outside = tmp_path / "models", tmp_path / "outside"
    models.mkdir()
    outside.mkdir()
    (models / "llama").mkdir()
    (models / "escape").symlink_to(outside)
    limits = TriggerLimits(allowed_models=(f"{models}/",))
    assert refusals({"model": str(models / "llama")}, limits) == []
    (why,) = refusals({"model": str(models / "escape" / "weights")}, limits)
    assert f"it resolves to {outside}/weights" in why


@pytest.mark.parametrize(
    ("model", "allowed"),
    [
        ("builtin:smollm2", True),
        ("builtin:other", False),  # `builtin:smollm2` is one name, not a prefix
        ("builtin:smollm2/../x", False),
        ("Qwen/Qwen2.5-0.5B", True),  # a hub organisation entry ending in '/'
        ("qwen/Qwen2.5-0.5B", False),  # names compare as written
        ("models/llama", False),  # a relative name is not the path /models/llama
    ],
)
def test_names_compare_as_written(model: str, allowed: bool) -> None:
    assert (refusals({"model": model}, MODELS) == []) is allowed


@pytest.mark.parametrize("model", ["Qwen/../../etc/passwd", "./weights", "../models/x", "Qwen/./x"])
def test_a_name_with_a_dot_segment_is_refused_outright(model: str) -> None:
    """An engine may open such a name as a path relative to the worker's directory: no entry bounds it."""
    (why,) = refusals({"model": model}, TriggerLimits(allowed_models=("Qwen/", "./", "../")))
    assert f"model {model!r} has a '.' or '..' path segment" in why
    assert "absolute path" in why  # the remedy
    with pytest.raises(ValueError, match="path segment"):
        normalize_model(model)


def test_the_dag_default_model_is_compared_normalised_too() -> None:
    dag = implied_by({"model": "/models/llama"})
    assert refusals({"model": "/models/llama/"}, dag) == []
    assert refusals({"model": "/models/llama/../llama"}, dag) == []
    assert refusals({"model": "/models/llama/../other"}, dag) != []
    assert not model_allows("/models/", "builtin:smollm2")  # a path entry never admits a name
    assert not model_allows("builtin:", "/models/x")


def test_the_judge_pool_model_is_normalised_like_the_runs() -> None:
    params = {"judge_pool": "local://judges", "judge_model": "/models/../secrets"}
    limits = TriggerLimits(allowed_worker_pools=("local://judges",), allowed_models=("/models/",))
    (why,) = refusals(params, limits)
    assert why.startswith("judge pool: model '/models/../secrets' (it resolves to /secrets)")


def test_a_model_inside_the_model_volume_cannot_leave_it() -> None:
    """A Kubernetes pool mounts ``model_pvc`` at ``/models``: a model path is checked normalised, and
    the claim itself by its exact name."""
    dag = implied_by({"model": "/models/llama", "kubernetes": {"model_pvc": "weights"}})
    wider = dag.widen(TriggerLimits(allowed_models=("/models/",)))
    assert refusals({"model": "/models/qwen", "kubernetes": {"model_pvc": "weights"}}, wider) == []
    text = "\n".join(
        refusals(
            {"model": "/models/../secrets-of-the-node/token", "kubernetes": {"model_pvc": "weights/.."}},
            wider,
        )
    )
    assert "model '/models/../secrets-of-the-node/token' (it resolves to /secrets-of-the-node/token)" in text
    assert "kubernetes.model_pvc 'weights/..' is not allowed" in text


@pytest.mark.parametrize("what", ["input", "output_root"])
def test_inputs_and_outputs_are_compared_as_real_paths(tmp_path: Path, what: str) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "link").symlink_to(outside)
    setting = "allowed_input_prefixes" if what == "input" else "allowed_output_prefixes"
    limits = TriggerLimits.from_mapping({setting: [str(allowed)]}, "the test")
    for inside in (f"{allowed}/x", f"{allowed}/a/../x", f"file://{allowed}/x"):
        assert refusals({what: inside}, limits) == [], inside
    for escape in (f"{allowed}/../outside/x", f"{allowed}/link/x", f"{allowed}2/x"):
        (why,) = refusals({what: escape}, limits)
        assert f"{what} {escape!r} is outside" in why and setting in why


def test_the_run_root_is_compared_as_a_real_path(tmp_path: Path) -> None:
    limits = TriggerLimits(allowed_output_prefixes=(str(tmp_path / "runs"),))
    assert refusals({}, limits, run_root=str(tmp_path / "runs" / "r1")) == []
    (why,) = refusals({}, limits, run_root=str(tmp_path / "runs" / ".." / "etc"))
    assert "the run root" in why and "is outside" in why
