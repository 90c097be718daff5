"""Retries that use feedback (issue 26, item 1): the one decision of what an attempt is sent with,
``previous`` from a row, the retry settings in the one description of the settings (params, CLI,
docs), their refusals, and job ids and fingerprints of runs without them."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest

from airflow_batchinfer.cli import build_parser
from airflow_batchinfer.engines.base import SamplingParams
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.truncation import TruncationPolicy, decide
from airflow_batchinfer.prompts.build import PromptBuilder
from airflow_batchinfer.prompts.retries import Previous, RetrySettings, attempt_seed, previous_of, sent_with
from airflow_batchinfer.rpc.fingerprint import fingerprint
from airflow_batchinfer.run.jobs import job_spec
from airflow_batchinfer.run.preflight import retry_warnings, same_retries
from airflow_batchinfer.spec.limits import TriggerLimits, refusals
from airflow_batchinfer.spec.settings import param_schemas, reference_table, run_settings_from_args, setting
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.worker.jobs.infer import fed_back

KEYS = ("retry_template", "retry_system", "retry_sampling")
SHARD = PlannedShard.of({"shard_id": "part-00000", "uri": "/data/in/part-00000.jsonl.zst", "records": 10})
INFO = {"size": 100, "mtime": 1.0}
ENGINE = {"engine": "simulated"}
BASE = SamplingParams(max_tokens=64, temperature=0.7, seed=7)
RETRY = "{{ q }}\nYour last answer: {{ previous.result }}\nRejected: {{ previous.reason }}"


def config(**settings: Any) -> RunConfig:
    defaults = {"prompt_template": "{{ q }}", "sampling": {"temperature": 0.7, "seed": 7}}
    return RunConfig.of(
        input="/data/in.jsonl", run_root="/runs/r", judge={"type": "llm"}, **{**defaults, **settings}
    )


# ------------------------------------------------------------------------------------ the decision
def test_the_first_attempt_is_sent_with_the_runs_template_system_and_sampling() -> None:
    retry = RetrySettings(RETRY, "Be careful.", ((2, {"temperature": 1.0}),))
    sent = sent_with(retry, attempt=1, template="{{ q }}", system="Sys", sampling=BASE)
    assert (sent.template, sent.system, sent.sampling, sent.retry) == ("{{ q }}", "Sys", BASE, False)


def test_later_attempts_take_the_retry_template_system_and_their_sampling_entry() -> None:
    ramp = ((2, {"temperature": 0.9}), (4, {"temperature": 1.2, "max_tokens": 128}))
    retry = RetrySettings(RETRY, "Be careful.", ramp)
    got = {
        k: sent_with(retry, attempt=k, template="{{ q }}", system="Sys", sampling=BASE) for k in (2, 3, 4, 7)
    }
    assert {(s.template, s.system, s.retry) for s in got.values()} == {(RETRY, "Be careful.", True)}
    # attempt k runs with the entry of the highest attempt at most k, over the run's sampling
    assert [got[k].sampling.temperature for k in (2, 3, 4, 7)] == [0.9, 0.9, 1.2, 1.2]
    assert [got[k].sampling.max_tokens for k in (2, 3, 4, 7)] == [64, 64, 128, 128]
    # every attempt has its own seed, the same each time it is decided
    assert [got[k].sampling.seed for k in (2, 3, 4, 7)] == [attempt_seed(BASE, k).seed for k in (2, 3, 4, 7)]
    assert len({got[k].sampling.seed for k in got}) == 4 and got[2] == sent_with(
        retry, attempt=2, template="{{ q }}", system="Sys", sampling=BASE
    )
    # only a system message for retries: the run's template stays
    only = sent_with(
        RetrySettings(system="Again."), attempt=2, template="{{ q }}", system=None, sampling=BASE
    )
    assert (only.template, only.system, only.retry) == ("{{ q }}", "Again.", True)


def test_without_retry_settings_an_attempt_is_what_it_always_was() -> None:
    """The same template and system message, the per-attempt seed and the truncation decision's
    max_tokens: the requests (and so the outputs) of runs without the settings do not change."""
    for attempt in (1, 2, 5):
        sent = sent_with(RetrySettings(), attempt=attempt, template="{{ q }}", system="S", sampling=BASE)
        assert (sent.template, sent.system, sent.retry) == ("{{ q }}", "S", False)
        assert sent.sampling == attempt_seed(BASE, attempt)


def test_the_truncation_decision_raises_max_tokens_and_never_lowers_it() -> None:
    policy = TruncationPolicy(max_tokens_cap=200)
    cut = Previous(attempt=1, result="half", finish_reason="length", max_tokens=64)
    least = decide(cut.finish_reason, cut.attempt, cut.max_tokens, policy).max_tokens
    sent = sent_with(
        RetrySettings(), attempt=2, template="t", system=None, sampling=BASE, least_max_tokens=least
    )
    assert least == 128 and sent.sampling.max_tokens == 128
    more = RetrySettings(sampling=((2, {"max_tokens": 180}),))
    assert (
        sent_with(
            more, attempt=2, template="t", system=None, sampling=BASE, least_max_tokens=least
        ).sampling.max_tokens
        == 180
    )


def test_an_entry_that_does_not_combine_with_the_sampling_is_refused_naming_it() -> None:
    candidates = SamplingParams(n=4, temperature=0.8)
    retry = RetrySettings(sampling=((2, {"temperature": 0}),))
    with pytest.raises(ConfigError, match="n 4 with temperature 0"):
        sent_with(retry, attempt=2, template="t", system=None, sampling=candidates)
    with pytest.raises(
        ConfigError, match=r"retry_sampling\.2 over the run's sampling: n 4 with temperature 0"
    ):
        RetrySettings.from_params({"retry_sampling": {"2": {"temperature": 0}}}, candidates)


# ------------------------------------------------------------------------------------ previous
def test_previous_is_the_attempt_a_row_records_and_none_for_an_input_record() -> None:
    assert previous_of({"id": "a", "q": "2+2", "attempts": 3}) is None  # not run: no finish_reason
    row = {
        "id": "a", "q": "2+2", "result": "5", "status": "rejected", "attempts": 2, "round": 1,
        "finish_reason": "stop", "max_tokens": 64,
        "judgment": {"approved": False, "reason": "expected 4, got 5", "score": 0.2},
    }  # fmt: skip
    assert previous_of(row) == Previous(2, "5", "expected 4, got 5", 0.2, None, "stop", 64)
    assert Previous.from_dict(previous_of(row).as_dict()) == previous_of(row)  # type: ignore[union-attr]
    # an inference error: no result, the error's reason
    failed = {
        **row,
        "result": None,
        "status": "error",
        "judgment": {"approved": False, "reason": "inference_error: x"},
    }
    assert (previous_of(failed).result, previous_of(failed).reason) == (None, "inference_error: x")  # type: ignore[union-attr]


def test_the_reviewers_note_is_told_to_the_attempt_after_the_one_it_was_sent_back_on() -> None:
    row = {"id": "a", "result": "5", "attempts": 1, "round": 0, "finish_reason": "stop",
           "judgment": {"approved": False, "reason": "wrong"}}  # fmt: skip
    sent_back = {
        **row,
        "sent_back": {"by": "ann", "at": "2026-12-01T00:00:00+00:00", "note": "carry the one", "round": 0},
    }
    assert previous_of(sent_back).note == "carry the one"  # type: ignore[union-attr]
    assert previous_of({**row, "sent_back": {"by": "ann", "note": ""}}).note is None  # type: ignore[union-attr]
    # an accepted or dropped row's review is not a retry's note (nor a record's own field of that name)
    assert previous_of({**row, "review": {"action": "retry", "note": "x"}}).note is None  # type: ignore[union-attr]
    # the next attempt's row is a new generation: it no longer carries the decision
    from airflow_batchinfer.worker.jobs.infer import output_row

    assert "sent_back" not in output_row(sent_back, result="6", attempts=2, round=1)


def test_a_retry_prompt_reads_previous_and_a_first_one_sees_none() -> None:
    builder = PromptBuilder(
        "{% if previous %}again {% endif %}{{ q }}", retry=RetrySettings(RETRY), sampling=BASE
    )
    first = builder.build({"id": "a", "q": "2+2"}, request_id="a")
    assert first.messages == [{"role": "user", "content": "2+2"}]
    told = Previous(1, "5", "expected 4, got 5")
    second = builder.build({"id": "a", "q": "2+2"}, request_id="a", attempt=2, previous=told)
    assert second.messages == [
        {"role": "user", "content": "2+2\nYour last answer: 5\nRejected: expected 4, got 5"}
    ]
    assert builder.shows_previous(1) and builder.shows_previous(2)
    assert not PromptBuilder("{{ q }}").shows_previous(2)
    # a judge's prompt is not a retry's: previous is not its variable
    judge = PromptBuilder("{{ previous }}")
    with pytest.raises(Exception, match="previous"):
        judge.build({"id": "a"}, request_id="a", role="judge")


# -------------------------------------------------------------------------------------- settings
def test_the_settings_are_described_once_for_params_cli_and_docs() -> None:
    schemas = param_schemas()
    assert setting("retry_sampling").default == {} and setting("retry_template").default is None
    ramp = {"2": {"temperature": 0.7}, "3": {"temperature": 1.0, "max_tokens": 512}}
    jsonschema.validate(ramp, schemas["retry_sampling"])
    for bad in ({"1": {"temperature": 0.7}}, {"x": {}}, {"2": {"n": 3}}, {"2": {"temperature": 9}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schemas["retry_sampling"])
    flags = [
        "--retry-template",
        RETRY,
        "--retry-system",
        "Again.",
        "--retry-sampling",
        '{"2": {"temperature": 1}}',
    ]
    got = run_settings_from_args(build_parser().parse_args(["run", "d.jsonl", "/runs/r", *flags]))
    assert [got[k] for k in KEYS] == [RETRY, "Again.", {"2": {"temperature": 1}}]
    assert {f"``{k}``" for k in KEYS} <= {row[0] for row in reference_table()[1]}


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"retry_sampling": {"1": {"temperature": 1}}}, r"retry_sampling key '1': an attempt number >= 2"),
        ({"retry_sampling": {"2": {}, "02": {}}}, "names attempt 2 twice"),
        ({"retry_sampling": {"2": {"n": 3}}}, r"retry_sampling\.2\.n is refused: candidates per record"),
        ({"retry_sampling": {"3": {"logprobs": True}}}, r"retry_sampling\.3\.logprobs is refused"),
        # the run's own value too: a retry's rows are shaped as the run's (n 1 on an n 4 run)
        ({"retry_sampling": {"2": {"n": 1}}}, r"retry_sampling\.2\.n is refused"),
        ({"retry_sampling": {"2": {"logprobs": False}}}, r"retry_sampling\.2\.logprobs is refused"),
        ({"retry_sampling": {"\u00b2": {}}}, r"retry_sampling key '\u00b2': an attempt number >= 2"),
        (
            {"retry_sampling": {"2": {"temprature": 1}}},
            r"retry_sampling\.2: sampling\.temprature is not a field",
        ),
        ({"retry_sampling": {"2": {"temperature": 5}}}, r"retry_sampling\.2: .*temperature"),
        ({"retry_sampling": ["2"]}, "retry_sampling must be an object"),
        ({"retry_template": ""}, "retry_template must be text"),
        (
            {"retry_sampling": {"2": {"max_tokens": 900}}, "max_tokens_cap": 512},
            r"retry_sampling\.2\.max_tokens 900 is above max_tokens_cap 512",
        ),
    ],
)
def test_a_bad_retry_setting_is_refused_naming_it(settings: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        config(**settings)


def test_validate_checks_the_retry_template_and_the_entries_over_the_runs_sampling() -> None:
    with pytest.raises(ConfigError, match="invalid prompt template"):
        config(retry_template="{{ previous.result").validate()
    with pytest.raises(ConfigError, match=r"retry_sampling\.2 over the run's sampling: n 3"):
        config(sampling={"n": 3, "temperature": 0.9}, retry_sampling={"2": {"temperature": 0}}).validate()
    config(retry_template=RETRY, retry_sampling={"2": {"temperature": 1.1}}).validate()
    # over the run's sampling, not the defaults: min_tokens 300 fits its max_tokens 512 (not 256)
    config(sampling={"max_tokens": 512}, retry_sampling={"2": {"min_tokens": 300}}).validate()
    with pytest.raises(ConfigError, match=r"retry_sampling\.2 over the run's sampling: .*min_tokens 300"):
        config(retry_sampling={"2": {"min_tokens": 300}})


def test_an_engine_that_does_not_honour_an_entry_is_named_and_the_deployments_cap_holds() -> None:
    cfg = config(retry_sampling={"2": {"presence_penalty": 0.5}})
    assert cfg.engine_refusal("vllm") is None
    assert "retry_sampling.2: sampling.presence_penalty" in (cfg.engine_refusal("transformers") or "")
    # a worker building the job says the same per record
    builder = PromptBuilder("{{ q }}", engine="transformers", retry=cfg.retry())
    assert builder.build({"id": "a", "q": "x"}, request_id="a").sampling.presence_penalty == 0
    with pytest.raises(Exception, match=r"retry_sampling\.2\.presence_penalty is refused"):
        builder.build({"id": "a", "q": "x"}, request_id="a", attempt=2)
    limits = TriggerLimits(max_max_tokens=300)
    (why,) = refusals({"retry_sampling": {"3": {"max_tokens": 400}}}, limits)
    assert why.startswith("retry_sampling.3.max_tokens 400 is more than max_max_tokens 300 (lower it")
    assert refusals({"retry_sampling": {"3": {"temperature": 1}}}, limits) == []


# ----------------------------------------------------------------------- job ids and fingerprints
def test_without_the_settings_job_ids_and_fingerprints_are_what_they_were() -> None:
    """Pinned as computed before the settings existed: a finished job of such a run still serves."""
    pinned = {
        "infer": ("8b415d7dcc", "42c11f0e2c661b7ea559d54207513c37bc9d3c8cba14959f401d3d9e81b56ca6"),
        "infer_judge": ("9360e6ce2b", "3ee29bb4c1eba6bc1444332335be5949bc1a683953497ac24e8fad7f1910bedd"),
        "in_place": ("057771f91f", "05cd8047db9b63ea710f58a5465511bae4e9ebed5a8deb20d1f753b99a7db278"),
    }
    for kind, (key, print_) in pinned.items():
        spec = job_spec(config(), kind, 1, SHARD)
        assert not set(KEYS) & set(spec.params), kind
        assert spec.job_id.endswith(f"-{kind}-{key}") and fingerprint(spec, ENGINE, INFO) == print_, kind
    base = job_spec(config(), "infer_judge", 1, SHARD)
    for changed in (
        {"retry_template": RETRY},
        {"retry_system": "Again."},
        {"retry_sampling": {"2": {"seed": 3}}},
    ):
        other = job_spec(config(**changed), "infer_judge", 1, SHARD)
        assert other.params.items() >= changed.items()
        assert other.job_id != base.job_id and fingerprint(other, ENGINE, INFO) != fingerprint(
            base, ENGINE, INFO
        )
    assert "retry_template" in job_spec(config(retry_template=RETRY), "in_place", 1, SHARD).params
    judge = job_spec(config(retry_template=RETRY, judge_pool="local://j"), "judge", 1, SHARD)
    assert not set(KEYS) & set(judge.params)  # the judge's job is not what a retry is sent with


# ------------------------------------------------------------------------------------ pre-flight
def test_the_preflight_warns_when_every_retry_would_produce_the_same_text() -> None:
    greedy = config(sampling={})
    warning = same_retries(greedy)
    assert warning is not None and warning.startswith("every retry would produce the same text")
    assert "temperature 0" in warning and "retry_template" in warning
    assert retry_warnings(greedy) == [warning]
    seeded_greedy = config(sampling={"temperature": 0, "seed": 11})  # a seed changes no greedy answer
    assert same_retries(seeded_greedy) is not None
    assert same_retries(config(sampling={"top_k": 1, "temperature": 0.8})) is not None
    assert same_retries(config(sampling={}, retry_sampling={"2": {"seed": 5, "max_tokens": 512}})) is not None
    # what makes a retry differ: sampling, a retry entry that samples, a prompt that changes
    for differs in (
        config(),  # temperature 0.7: each retry samples with its own seed
        config(sampling={}, retry_sampling={"2": {"temperature": 0.8}}),
        config(sampling={}, retry_template=RETRY),
        config(sampling={}, retry_system="Think again."),
        config(
            sampling={}, prompt_template="{{ q }}{% if previous %} (not {{ previous.result }}){% endif %}"
        ),
        config(sampling={}, max_rounds=1),  # no retries at all
        config(sampling={}, strategy="in_place", max_attempts=1, max_rounds=1),
        config(sampling={}, prompt_template=None),  # OpenAI batch records: their own sampling
    ):
        assert same_retries(differs) is None, differs
    assert same_retries(config(sampling={}, strategy="in_place", max_rounds=1)) is not None


def test_a_rows_previous_leaves_the_reasoning_fields_out_at_their_defaults() -> None:
    shows = SimpleNamespace(shows_previous=lambda attempt: True)
    plain = Previous(1, "5", "wrong", None, None, "stop", 64)
    row = fed_back(shows, 2, plain)  # type: ignore[arg-type]
    assert row == {"previous": {"attempt": 1, "result": "5", "reason": "wrong", "score": None, "note": None,
                                "finish_reason": "stop", "max_tokens": 64}}  # fmt: skip
    thought = replace(plain, finish_reason="length", truncated_in_thinking=True, thinking_token_budget=32)
    stored = fed_back(shows, 2, thought)["previous"]  # type: ignore[arg-type]
    assert (stored["truncated_in_thinking"], stored["thinking_token_budget"]) == (True, 32)
    # both forms read back; the template's previous keeps every field
    assert Previous.from_dict(row["previous"]) == plain and Previous.from_dict(stored) == thought
    assert plain.as_dict()["truncated_in_thinking"] is False
