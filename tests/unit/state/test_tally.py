"""The Tally a job counts into: parts that add up (and, for close's left-out repeats, subtract down to
0) field by field, a stored form without empties that reads back as it was, and unknown keys (the
flat string keys of manifests before version 2) refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from airflow_batchinfer.judges.base import Verdict
from airflow_batchinfer.judges.candidates import select
from airflow_batchinfer.state.tally import AdapterTally, Generated, Outcomes, Read, Tally


def a_chunk() -> Tally:
    t = Tally(generated=Generated(ok=3, error=1))
    t.outcomes.approved, t.outcomes.rejected, t.truncated = 2, 2, 1
    t.count_adapter("sql", "approved")
    t.count_adapter("sql", "approved", spot_checked=True)
    t.count_stratum("approved", 0.95)
    members = ({"name": "a", "approved": True}, {"name": "b", "approved": False})
    t.jury.count(Verdict(False, "", 0.5, members))
    t.candidates.count(2, select([Verdict(True, ""), Verdict(False, "")]))
    return t


def test_tallies_add_up_field_by_field_and_sum_from_zero() -> None:
    one, other = a_chunk(), a_chunk()
    other.count_adapter("base", "rejected")
    total = sum([one, other])
    assert isinstance(total, Tally) and total == sum([one, other], Tally())
    assert (total.generated, total.outcomes.approved, total.truncated) == (Generated(ok=6, error=2), 4, 2)
    assert total.adapters == {
        "sql": AdapterTally(approved=2, spot_checks=2),
        "base": AdapterTally(rejected=1),
    }
    assert total.strata == {"approved": {"0.9": 2}} and total.jury.voted == total.jury.split == 2
    assert total.candidates.by_index == {0: 2} and total.candidates.by_record == {2: {1: 2}}
    assert one == a_chunk() and total.adapters["sql"] is not one.adapters["sql"]  # + makes a new one


def test_less_is_floored_at_zero_and_ignores_what_it_lacks() -> None:
    row = Tally(outcomes=Outcomes(rejected=1, for_review=1), adapters={"other": AdapterTally(rejected=1)})
    less = a_chunk() - row - row - row
    assert (less.outcomes.rejected, less.outcomes.for_review) == (0, 0)
    assert "other" not in less.adapters and less.outcomes.approved == 2


def test_the_stored_form_leaves_out_empties_and_reads_back() -> None:
    assert Tally().model_dump(mode="json") == {}
    stored = a_chunk().model_dump(mode="json")
    assert stored["generated"] == {"ok": 3, "error": 1} and "resume" not in stored and "read" not in stored
    assert stored["candidates"] == {"by_index": {"0": 1}, "by_record": {"2": {"1": 1}}}
    assert Tally.model_validate(stored) == a_chunk()
    read = Tally(read=Read())  # a range job that read nothing still read its range
    assert Tally.model_validate(read.model_dump(mode="json")) == read


@pytest.mark.parametrize("flat", [{"approved": 3}, {"adapter:sql:approved": 1}, {"outcomes": {"ok": 1}}])
def test_flat_string_keys_are_refused(flat: dict[str, int]) -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        Tally.model_validate(flat)


def test_a_worker_counts_records_by_outcome_for_its_metrics() -> None:
    assert a_chunk().by_outcome() == {"ok": 3, "error": 1, "approved": 2, "rejected": 2, "truncated": 1}
