"""Issue 22, items 5 and 6 (the desk's side): the review desk's answers stay bounded whatever a row
holds. A rejected row with a 4 MiB output, a 4 MiB record field, a 0.9 MB prompt and a 1 MiB reason:
page, random-sample and find answers cut every text to ``review_field_bytes`` while the rows are
read, say what they cut and its whole size (``truncated``), and stop a page at ``review_page_bytes``;
the ``field`` endpoint reads one value whole, under the same authorisation as ``sample/{id}``.

First without Airflow (:class:`~airflow_batchinfer.review.browse.RoundView`), then through the
api-server's app as ``tests/component/review/test_app.py`` drives it."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.review.bounds import KIB, MIB, Bounds, clip
from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.samples import field_value
from tests.support.desk_bounded import (
    CONTEXT,
    HUGE,
    OUTPUT,
    QUESTION,
    REASON,
    desk,  # noqa: F401 (a fixture, used by name)
    huge_run,
)

pytestmark = pytest.mark.security

FIELD = Bounds().field_bytes


def utf8(text: str) -> int:
    return len(text.encode())


def size(doc: Any) -> int:
    """A document's size as the desk sends it (JSON in UTF-8)."""
    return utf8(json.dumps(doc, ensure_ascii=False))


def check_cut(sample: dict[str, Any]) -> None:
    """A huge row as an answer shows it: each text's start, up to review_field_bytes, and its size."""
    assert sample["truncated"] == {
        "prompt": len(QUESTION), "output": 4 * MIB, "reason": utf8(REASON), "record.question": len(QUESTION),
        "record.context": utf8(CONTEXT),
    }  # fmt: skip
    assert OUTPUT.startswith(sample["output"]) and utf8(sample["output"]) == FIELD
    assert (
        CONTEXT.startswith(sample["record"]["context"])
        and FIELD - 1 <= utf8(sample["record"]["context"]) <= FIELD
    )
    assert sample["prompt"] == QUESTION[:FIELD] and sample["reason"] == REASON[:FIELD]
    assert sample["record"]["id"] == sample["id"]  # the small fields stay whole


# ------------------------------------------------------------------------ without Airflow
@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> RoundView:
    return RoundView(huge_run(tmp_path_factory.mktemp("huge")).run_root, 0)


def test_a_page_cuts_every_text_and_says_what_it_cut(view: RoundView) -> None:
    page = view.page(size=50)
    assert len(page.samples) == 20 and page.cursor is None and not page.capped
    assert size(page.to_dict()) < 1 * MIB  # not the ~20 MiB its two huge rows hold
    by_id = {s.id: s.to_dict() for s in page.samples}
    for sid in HUGE:
        check_cut(by_id[sid])
    assert all(not s["truncated"] for i, s in by_id.items() if i not in HUGE)


def test_random_samples_finds_and_filtered_pages_are_cut_as_well(view: RoundView) -> None:
    drawn = {s.id: s.to_dict() for s in view.sample(n=20, seed=1)}
    assert set(HUGE) <= set(drawn)
    found = view.find("r14")
    assert found is not None
    for sample in (drawn["r01"], drawn["r14"], found.to_dict()):
        check_cut(sample)
    # a text search still reads each row whole (its match is past what the page shows), then cuts it
    hit = view.page(text="<end>", size=10).samples[0]
    assert hit.id == "r01" and hit.truncated["output"] == 4 * MIB and "<end>" not in (hit.output or "")


def test_a_page_stops_at_its_byte_cap_and_its_cursor_goes_on(view: RoundView) -> None:
    bounds = Bounds(page_bytes=64 * KIB)
    seen, cursor, pages = [], None, 0
    while True:
        page = view.page(cursor, size=50, bounds=bounds)
        assert size(page.to_dict()) <= 64 * KIB or len(page.samples) == 1  # one sample: always shown
        seen += [s.id for s in page.samples]
        pages += 1
        if page.cursor is None:
            break
        cursor = page.cursor
    assert pages > 1 and sorted(seen) == sorted(s.id for s, _ in view.scan())  # nothing skipped or doubled
    assert len(view.sample(n=20, seed=1, bounds=bounds)) < 20  # a random sample is cut short too


def test_the_whole_value_of_what_was_cut(view: RoundView) -> None:
    (sample,) = [s for s in view.page(size=50).samples if s.id == "r01"]
    whole = view.at(sample.shard_id, sample.position)
    assert whole is not None and not whole.truncated
    values = {path: field_value(whole, path) for path in sample.truncated}
    assert values == {"prompt": QUESTION, "output": OUTPUT, "reason": REASON, "record.question": QUESTION,
                      "record.context": CONTEXT}  # fmt: skip
    assert field_value(whole, "record")["context"] == CONTEXT


def test_a_page_never_holds_its_huge_rows_whole(tmp_path: Path) -> None:
    """Cut while reading: a page of twelve 10 MiB rows needs no more memory than a page of one (what
    one row costs to parse is the same for both; the twelve rows whole would be some 100 MiB more)."""
    view = RoundView(huge_run(tmp_path, huge=tuple(f"r{i:02d}" for i in range(30) if i % 3)[:12]).run_root, 0)
    view.shards()  # the round's documents, read once

    def peak(size: int) -> tuple[int, Any]:
        tracemalloc.start()
        try:
            page = view.page(size=size)
            return tracemalloc.get_traced_memory()[1], page
        finally:
            tracemalloc.stop()

    one, _ = peak(1)
    twenty, page = peak(20)
    assert len(page.samples) == 20 and sum(1 for s in page.samples if s.truncated) == 12
    assert twenty - one < 8 * MIB, f"a page of 20 took {(twenty - one) / MIB:.0f} MiB more than a page of 1"


def test_a_record_of_many_fields_is_cut_as_a_whole() -> None:
    """Each field is cut, and so is the record: its later fields are left out (``record``)."""
    view = RoundView("/nonexistent", 0)
    row = {"id": "x", **{f"f{k:05d}": "v" * 100 for k in range(20_000)}, "result": "o", "judgment": {}}
    sample = view.to_sample(row).bounded(Bounds())
    assert (
        size(sample.record) <= Bounds().record_bytes + 8 * len(sample.record) and len(sample.record) < 1_000
    )
    assert sample.truncated == {"record": len(json.dumps({k: v for k, v in row.items()
                                                          if k not in ("result", "judgment")},
                                                         separators=(",", ":")))}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "limit", "head", "whole"),
    [("abc", 3, "abc", None), ("abcd", 3, "abc", 4), ("ééé", 5, "éé", 6), ("€uro", 2, "", 6)],
)
def test_a_cut_falls_on_a_character(text: str, limit: int, head: str, whole: int | None) -> None:
    assert clip(text, limit) == (head, whole)


def test_a_bad_setting_is_refused_by_name() -> None:
    from airflow_batchinfer.exceptions import ConfigError

    with pytest.raises(ConfigError, match=r"review_page_bytes = '12': .*>= 65536.*restart the api-server"):
        Bounds.from_options({"review_page_bytes": "12"}.get)
    assert Bounds.from_options({"review_field_bytes": "4096", "review_page_bytes": ""}.get) == Bounds(
        field_bytes=4096
    )


def url(suffix: str) -> str:
    return f"/batchinfer/api/gates/desk/huge{suffix}"


@pytest.mark.airflow
def test_the_desk_answers_stay_under_their_caps_and_mark_what_they_cut(desk: Any) -> None:
    page = desk.get("bob", url("/page"), params={"size": 200})
    drawn = desk.get("bob", url("/sample"), params={"n": 200, "seed": 3})
    found = desk.get("bob", url("/sample/r14"))
    for r in (page, drawn, found):
        assert r.status_code == 200, r.text
        assert len(r.content) < 1 * MIB  # the rows hold 20 MiB
    assert not page.json()["capped"] and not drawn.json()["capped"]
    check_cut(next(s for s in page.json()["samples"] if s["id"] == "r01"))
    check_cut(next(s for s in drawn.json()["samples"] if s["id"] == "r14"))
    check_cut(found.json()["sample"])


@pytest.mark.airflow
def test_the_page_cap_is_a_setting(desk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__BATCHINFER__REVIEW_PAGE_BYTES", str(64 * KIB))
    page = desk.get("bob", url("/page"), params={"size": 200}).json()
    assert page["capped"] and page["cursor"] and len(page["samples"]) < 20
    assert desk.get("bob", url("/sample"), params={"n": 200}).json()["capped"]
    monkeypatch.setenv("AIRFLOW__BATCHINFER__REVIEW_PAGE_BYTES", "12")
    r = desk.get("bob", url("/page"))
    assert r.status_code == 409 and "review_page_bytes = '12'" in r.json()["detail"]


@pytest.mark.airflow
def test_the_field_endpoint_reads_a_cut_value_whole(desk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sample = desk.get("bob", url("/sample/r01")).json()["sample"]
    where = {"shard": sample["shard_id"], "position": sample["position"]}
    for path, whole in (("output", OUTPUT), ("record.context", CONTEXT), ("prompt", QUESTION)):
        r = desk.get("bob", url("/field"), params={**where, "path": path})
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["value"] == whole and doc["bytes"] == sample["truncated"][path] == utf8(whole)
        assert (doc["path"], doc["shard_id"], doc["position"]) == (path, where["shard"], where["position"])
    assert (
        desk.get("bob", url("/field"), params={**where, "path": "record"}).json()["value"]["context"]
        == CONTEXT
    )
    r = desk.get("bob", url("/field"), params={**where, "path": "record.nope"})
    assert r.status_code == 400 and "record.<key>" in r.json()["detail"]
    r = desk.get("bob", url("/field"), params={"shard": where["shard"], "position": 999, "path": "output"})
    assert r.status_code == 404
    monkeypatch.setenv("AIRFLOW__BATCHINFER__REVIEW_WHOLE_FIELD_BYTES", str(MIB))
    r = desk.get("bob", url("/field"), params={**where, "path": "output"})
    assert r.status_code == 413 and "review_whole_field_bytes" in r.json()["detail"]


@pytest.mark.airflow
def test_the_field_endpoint_is_refused_to_whoever_may_not_read_the_sample(
    desk: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.api_fastapi.app import get_auth_manager

    am = get_auth_manager()
    real = am.is_authorized_dag
    monkeypatch.setattr(am, "is_authorized_dag",
                        lambda *, user, **kw: user.get_id() != "dave" and real(user=user, **kw))  # fmt: skip
    where = {"shard": "part-00000", "position": 0, "path": "output"}
    for suffix, params in (("/sample/r01", {}), ("/field", where)):
        assert desk.get("dave", url(suffix), params=params).status_code == 403  # the same answer
        assert desk.get(None, url(suffix), params=params).status_code == 401
        assert desk.get("bob", url(suffix), params=params).status_code == 200
    assert os.environ.get("AIRFLOW__BATCHINFER__REVIEW_PAGE_BYTES") is None
