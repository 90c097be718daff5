"""A run whose judge is known to be wrong on a share of the rows, for the calibration's tests and
``bench/calibration.py``.

The construction, every part a seeded hash of the row's id and attempt (so workers, tests and the
scripted reviewer agree without sharing state):

* each answer is **right** with probability :data:`RIGHT` (what a person who knows the truth says);
* the judge's **score** is uniform in [0, 1);
* the judge **errs** (its verdict is the opposite of the truth) with probability
  ``2 · WRONG · (1 - score)``: :data:`WRONG` on average, often at low scores, never at 1 — so the
  agreement per score bucket is ``1 - 2 · WRONG · (1 - score)`` and a ``review_below_score`` can be
  read off it.

:func:`judge` is the ``callable`` judge (``airflow_batchinfer.dev.calibration:judge``); :func:`truth` is what
the reviewer answers; :func:`expected` computes the figures of a set of judged rows directly from
the construction, and :func:`theory` what the construction implies on average.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RIGHT = 0.7  # the share of answers a person approves
WRONG = 0.2  # the share of rows the judge gets wrong, on average
JUDGE = {"type": "callable", "target": "airflow_batchinfer.dev.calibration:judge"}


def _u(tag: str, rid: str, attempt: int) -> float:
    h = hashlib.sha256(f"{tag}:{rid}:{attempt}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def truth(rid: str, attempt: int) -> bool:
    """Whether the answer of attempt ``attempt`` of row ``rid`` is right (what a person says)."""
    return _u("truth", rid, attempt) < RIGHT


def score(rid: str, attempt: int) -> float:
    return round(_u("score", rid, attempt), 4)


def errs(rid: str, attempt: int) -> bool:
    """Whether the judge gets this row wrong."""
    return _u("err", rid, attempt) < 2 * WRONG * (1 - score(rid, attempt))


def verdict(rid: str, attempt: int) -> bool:
    return truth(rid, attempt) != errs(rid, attempt)


def judge(record: dict[str, Any], result: str) -> dict[str, Any]:
    """The callable judge: the construction's verdict and score for the row (its output unread)."""
    rid, attempt = str(record["id"]), int(record.get("attempts") or 1)
    ok = verdict(rid, attempt)
    return {"approved": ok, "reason": "looks right" if ok else "looks wrong", "score": score(rid, attempt)}


def write_input(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"c{i:05d}", "question": f"q {i}"}) + "\n" for i in range(n)))
    return path


@dataclass(frozen=True)
class Figures:
    """Agreement, Cohen's kappa, precision and recall of "approve" (the person as truth)."""

    agreement: float
    kappa: float
    precision: float
    recall: float
    rows: int

    def rounded(self, digits: int = 4) -> tuple[float, float, float, float]:
        return tuple(round(x, digits) for x in (self.agreement, self.kappa, self.precision, self.recall))  # type: ignore[return-value]


def _figures(tp: float, fp: float, fn: float, tn: float) -> Figures:
    n = tp + fp + fn + tn
    p_o = (tp + tn) / n
    judge_yes, person_yes = (tp + fp) / n, (tp + fn) / n
    p_e = judge_yes * person_yes + (1 - judge_yes) * (1 - person_yes)
    return Figures(p_o, (p_o - p_e) / (1 - p_e), tp / (tp + fp), tp / (tp + fn), int(n))


def expected(rows: Iterable[tuple[str, int]]) -> Figures:
    """The figures of the judged rows ``(id, attempt)``, counted directly from the construction."""
    tp = fp = fn = tn = 0
    for rid, attempt in rows:
        j, t = verdict(rid, attempt), truth(rid, attempt)
        tp, fp, fn, tn = tp + (j and t), fp + (j and not t), fn + (not j and t), tn + (not j and not t)
    return _figures(tp, fp, fn, tn)


def theory() -> Figures:
    """What the construction implies on average: agreement and recall ``1 - WRONG``, and so on."""
    tp, fn = RIGHT * (1 - WRONG), RIGHT * WRONG
    fp, tn = (1 - RIGHT) * WRONG, (1 - RIGHT) * (1 - WRONG)
    return _figures(tp, fp, fn, tn)


def bucket_agreement(bucket: str) -> float:
    """The agreement the construction implies in a score bucket (its middle's)."""
    middle = float(bucket) + 0.05
    return 1 - 2 * WRONG * (1 - middle)


def review_on_desk(
    desk: Any, run_id: str, *, user: str = "alice", rejected_share: float = 1.0
) -> dict[str, int]:
    """The scripted reviewer, on the desk's HTTP API (``desk``: a client with ``get``/``post`` as
    :class:`tests.unit.review.test_app.Desk`): reads every sample of the gate's round page by page
    and decides each one by its id as the truth says — accept a right answer, retry a wrong one —
    every spot check and a seeded ``rejected_share`` of the other samples. Returns how many of each
    it decided (``spot checks``: of them)."""
    url = f"/batchinfer/api/gates/desk/{run_id}"
    ids: dict[str, list[str]] = {"accept": [], "retry": []}
    spot = 0
    cursor = None
    while True:
        params: dict[str, Any] = {"size": 200, **({"cursor": cursor} if cursor else {})}
        answer = desk.get(user, url + "/page", params=params)
        assert answer.status_code == 200, answer.text
        page = answer.json()
        for s in page["samples"]:
            if s["status"] == "error":
                continue
            if not s["spot_check"] and _u("look", s["id"], s["attempts"]) >= rejected_share:
                continue  # not looked at this time
            spot += s["spot_check"]
            ids["accept" if truth(s["id"], s["attempts"]) else "retry"].append(s["id"])
        cursor = page["cursor"]
        if not cursor:
            break
    for action, chosen in ids.items():
        if chosen:
            r = desk.post(
                user, url + "/decisions", {"action": action, "ids": chosen, "note": "scripted reviewer"}
            )
            assert r.status_code == 201, r.text
    return {"accept": len(ids["accept"]), "retry": len(ids["retry"]), "spot checks": spot}
