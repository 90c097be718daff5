"""The judge checked against people: the reviewers' verdicts on a round's rows beside the judge's.

One pure function, :func:`calibrate`, turns ``(judge verdict, person verdict, score)`` pairs
(:class:`Pair`) into a round's figures (:class:`~airflow_batchinfer.state.docs.calibration.Calibration`):
agreement, Cohen's κ, precision and recall of "approve" with the person taken as truth, the raw
confusion counts, and per score bucket the judge's and the people's approval and their agreement.
Which decisions count (:func:`pair_of`): a decision that names the row's id is a person's verdict on
it (accept: approve; retry or drop: not); a decision by filter (*apply to all matching*) is a rule
over a group, not a look at each row, and is left out (counted as ``bulk``); a row the judge never
judged (an inference error, a truncated answer, a human judge's) is left out too (``unjudged``).

The rows on the desk are not a uniform sample of what the judge saw: every rejected row is there,
but only a sample of the approved ones (spot checks), and reviewers decide some of each. So each
reviewed row is weighed by the judged rows of its **stratum** it stands for (post-stratification):
the judge's verdict as it reached people (``approved``, spot checks included; ``held`` for review by
its score; ``rejected``) and its score bucket, whose counts the judge jobs kept (the round summary's
``verdicts``). A bucket of a verdict with no reviewed row lends its rows to that verdict's reviewed
buckets (collapsed strata); a verdict none of whose rows was reviewed makes the figures that need it
undefined, with a note. Without the counts the rows count as they are (``weighted: false``).

:func:`measured` computes the same from a round's rows as its decisions stand (the desk, live);
:func:`pooled` and :func:`calibration_chart` are the report's.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.charts import Series, bar_chart, line_chart, side_by_side
from airflow_batchinfer.judges import RAW_SCORES
from airflow_batchinfer.judges.reasons import INFERENCE_ERROR, TRUNCATED, TRUNCATED_IN_THINKING
from airflow_batchinfer.judges.spot_check import BUCKETS, STRATA, Stratum, score_bucket
from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.decisions import Decision, Resolver
from airflow_batchinfer.review.samples import Sample
from airflow_batchinfer.state.docs import read_summary
from airflow_batchinfer.state.docs.calibration import Bucket, Calibration, Confusion

__all__ = [
    "DecidedRows",
    "Judged",
    "Pair",
    "calibrate",
    "calibration_chart",
    "judge_checked",
    "judge_verdict",
    "kappa",
    "measured",
    "pair_of",
    "pooled",
    "scored_in_tenths",
]

DIGITS = 4  # figures as the document keeps them
MAX_DECIDED_ROWS = 100_000  # the ids a round's DecidedRows keeps (a few hundred bytes each)
Population = Mapping[str, Mapping[str, int]]  # stratum -> bucket -> judged rows (Summary.verdicts)


@dataclass(frozen=True)
class Pair:
    """One reviewed row: the judge's verdict, the person's, the judge's score and the stratum the
    row was drawn from (:mod:`~airflow_batchinfer.judges.spot_check`)."""

    judge: bool
    person: bool
    score: float | None = None
    stratum: Stratum | None = None  # None: the judge's verdict's own (approved or rejected)
    spot_check: bool = False

    @property
    def key(self) -> tuple[str, str]:
        stratum = self.stratum or ("approved" if self.judge else "rejected")
        return stratum, score_bucket(self.score)


UNJUDGED = (TRUNCATED, TRUNCATED_IN_THINKING)  # reason groups of rows rejected before the judge


def judge_verdict(sample: Sample) -> tuple[bool, Stratum] | None:
    """The judge's own verdict on a rejected row and its stratum, or ``None`` when the judge gave
    none (an inference error, a truncated answer rejected unjudged, one cut while thinking, a human
    judge's row)."""
    if sample.status == "error" or sample.group in UNJUDGED or sample.reason.startswith(INFERENCE_ERROR):
        return None
    if sample.spot_check:
        return True, "approved"
    if sample.judge_approved is not None:  # held for review by its score
        return sample.judge_approved, "held" if sample.judge_approved else "rejected"
    if sample.for_review:  # a person is the judge
        return None
    return sample.approved, "approved" if sample.approved else "rejected"


@dataclass(frozen=True)
class Judged:
    """What a rejected row lends the pair a decision on it makes: the judge's verdict and stratum
    (:func:`judge_verdict`; ``None``: never judged), its score and whether it is a spot check."""

    verdict: tuple[bool, Stratum] | None
    score: float | None
    spot_check: bool

    @classmethod
    def of(cls, sample: Sample) -> Judged:
        return cls(judge_verdict(sample), sample.score, sample.spot_check)

    def pair(self, decision: Decision | None, *, tenths: bool = True) -> Pair | None:
        """:func:`pair_of` the row this was read from."""
        if decision is None or decision.bulk or self.verdict is None:
            return None
        judge, stratum = self.verdict
        score = self.score if tenths else None
        return Pair(judge, decision.action == "accept", score, stratum, self.spot_check)


def pair_of(sample: Sample, decision: Decision | None, *, tenths: bool = True) -> Pair | None:
    """The pair a person's decision on ``sample`` makes, or ``None`` (no decision, one by filter, or
    a row the judge never judged). ``tenths``: the judge's scores are in [0, 1] and bucketed by their
    tenth, as its judge jobs counted them (:func:`scored_in_tenths`); else every pair is unscored."""
    return Judged.of(sample).pair(decision, tenths=tenths)


class DecidedRows:
    """A round's decided rows as calibration reads them (:class:`Judged`, or ``None``: no such row),
    kept between requests for one :class:`RoundView` (a closed round's rows do not change): each
    request reads only the rows of ids no earlier one looked for, and stops where the last turns
    up. At most ``limit`` ids are kept (past it, the index starts over)."""

    def __init__(self, limit: int = MAX_DECIDED_ROWS) -> None:
        self.limit = limit
        self._rows: dict[str, Judged | None] = {}
        self._lock = threading.Lock()

    def of(self, view: RoundView, ids: set[str]) -> dict[str, Judged | None]:
        with self._lock:  # one reader at a time: a second request finds what the first read
            missing = [sid for sid in ids if sid not in self._rows]
            if missing:
                found = {s.id: Judged.of(s) for s in view.with_ids(missing, until_found=True)}
                if len(self._rows) + len(missing) > self.limit:
                    self._rows.clear()
                self._rows.update({sid: found.get(sid) for sid in missing})
            return {sid: self._rows.get(sid) for sid in ids}


def judge_checked(judge: Mapping[str, Any]) -> bool:
    """Whether a run's judge (its spec) gives verdicts people can be checked against: every judge
    but people themselves (``human``), whose rows have no judge's verdict to calibrate."""
    return judge.get("type") != "human"


def scored_in_tenths(judge: Mapping[str, Any]) -> bool:
    """Whether the judge spec's verdicts are bucketed by their score's tenth, as its judge jobs count
    them: a ``reward`` judge's raw scores are not (its strata are its verdicts alone)."""
    return judge.get("type") not in RAW_SCORES


def kappa(tp: float, fp: float, fn: float, tn: float) -> float | None:
    """Cohen's κ of a 2×2 table (judge × person): ``(p_o - p_e) / (1 - p_e)``; ``None`` when
    undefined: no rows, or both gave one and the same verdict to every row (``p_e`` = 1)."""
    n = tp + fp + fn + tn
    if n <= 0:
        return None
    p_o = (tp + tn) / n
    judge_yes, person_yes = (tp + fp) / n, (tp + fn) / n
    p_e = judge_yes * person_yes + (1 - judge_yes) * (1 - person_yes)
    if p_e >= 1 - 1e-12:
        return None
    return (p_o - p_e) / (1 - p_e)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, DIGITS)


def _share(part: float, whole: float) -> float | None:
    return None if whole <= 0 else _rounded(part / whole)


def calibrate(pairs: Iterable[Pair], population: Population | None = None, *, round: int = 0) -> Calibration:
    """The figures of ``pairs`` (reviewed rows), each weighed by its stratum's judged rows in
    ``population`` (``{stratum: {bucket: rows}}``; ``None``: unweighted). No I/O."""
    pairs = list(pairs)
    reviewed: dict[tuple[str, str], int] = defaultdict(int)
    for p in pairs:
        reviewed[p.key] += 1
    notes: list[str] = []
    weights, coverage = _weights(reviewed, population, notes)
    confusion = Confusion()
    cells: dict[tuple[bool, bool], float] = defaultdict(float)
    for p in pairs:
        cells[p.judge, p.person] += weights.get(p.key, 0.0)
        field = {
            (True, True): "both_approve",
            (True, False): "judge_approves_person_rejects",
            (False, True): "judge_rejects_person_approves",
            (False, False): "both_reject",
        }[p.judge, p.person]
        setattr(confusion, field, getattr(confusion, field) + 1)
    tp, fp, fn, tn = cells[True, True], cells[True, False], cells[False, True], cells[False, False]
    n = tp + fp + fn + tn
    missing = _missing_verdicts(reviewed, population)
    doc = Calibration(
        round=round,
        reviewed=len(pairs),
        spot_checks=sum(1 for p in pairs if p.spot_check),
        weighted=population is not None,
        coverage=coverage,
        confusion=confusion,
        agreement=_share(tp + tn, n),
        precision=None if "approved" in missing else _share(tp, tp + fp),
        recall=None if missing else _share(tp, tp + fn),
        buckets=_buckets(pairs, population),
    )
    k = None if missing else kappa(tp, fp, fn, tn)
    doc.kappa = _rounded(k)
    if not pairs:
        notes.append("no reviewed row: decide samples one by one (a decision by filter is not counted)")
    elif "approved" in missing:
        notes.append(
            "no row the judge approved was reviewed: precision, recall and kappa need spot checks of its "
            "approvals (spot_check_approved)"
        )
    elif "rejected" in missing:
        notes.append("no row the judge rejected was reviewed: recall and kappa need some of them decided")
    elif k is None:
        notes.append("kappa is undefined: the judge and the people gave every reviewed row the same verdict")
    if tp + fp <= 0 and "approved" not in missing and pairs:
        notes.append("precision is undefined: the judge approved no reviewed row")
    if tp + fn <= 0 and not missing and pairs:
        notes.append("recall is undefined: the people approved no reviewed row")
    doc.notes = notes
    return doc


def _weights(
    reviewed: Mapping[tuple[str, str], int], population: Population | None, notes: list[str]
) -> tuple[dict[tuple[str, str], float], float | None]:
    """Each reviewed stratum's weight per row, and the share of the judged rows the reviewed strata
    cover; a verdict's unreviewed buckets lend their rows to its reviewed ones."""
    if population is None:
        return {key: 1.0 for key in reviewed}, None
    rows = {(s, b): int(n) for s, by in population.items() for b, n in by.items() if n > 0}
    # a reviewed stratum the counts lack (a hand-made doc): as reviewed
    for key, n in reviewed.items():
        if rows.get(key, 0) < n:
            rows[key] = n
    weights: dict[tuple[str, str], float] = {}
    total = sum(rows.values())
    covered = 0
    for verdict in ("approve", "reject"):
        strata = [s for s in STRATA if (s == "rejected") == (verdict == "reject")]
        mine = {k: n for k, n in rows.items() if k[0] in strata}
        seen = {k: n for k, n in mine.items() if reviewed.get(k)}
        if not seen:
            continue
        covered += sum(seen.values())
        lend = sum(mine.values()) / sum(seen.values())  # the unreviewed buckets' rows, spread
        for key, n in seen.items():
            weights[key] = n * lend / reviewed[key]
    if total and covered < total:
        notes.append(f"{total - covered} of {total} judged rows are in buckets no reviewed row came from")
    return weights, _share(covered, total)


def _verdict(stratum: str) -> str:
    return "rejected" if stratum == "rejected" else "approved"


def _missing_verdicts(reviewed: Mapping[tuple[str, str], int], population: Population | None) -> set[str]:
    """The judge's verdicts (``approved``, ``rejected``) that judged rows had but no reviewed row."""
    had = {_verdict(s) for s, by in (population or {}).items() if any(n > 0 for n in by.values())}
    had |= {_verdict(s) for s, _ in reviewed}
    return had - {_verdict(s) for s, _ in reviewed}


def _buckets(pairs: list[Pair], population: Population | None) -> list[Bucket]:
    """Per score bucket that has judged or reviewed rows: rows, the judge's approval, the reviewed
    rows, the people's approval and the agreement (weighted within the bucket, per stratum)."""
    out = []
    for bucket in BUCKETS:
        mine = [p for p in pairs if p.key[1] == bucket]
        counted: dict[str, int] = {s: (population or {}).get(s, {}).get(bucket, 0) for s in STRATA}
        if mine or sum(counted.values()):
            out.append(_bucket(bucket, mine, counted if population is not None else None))
    return out


def _bucket(bucket: str, mine: list[Pair], counted: dict[str, int] | None) -> Bucket:
    """One bucket's figures; within it each stratum counts for its own rows (``counted``; ``None``:
    unweighted), with no lending across buckets."""
    reviewed = Counter(p.key[0] for p in mine)
    own = {s: counted[s] / n for s, n in reviewed.items() if counted and counted.get(s)}
    weights = [own.get(p.key[0], 1.0) for p in mine]
    total = sum(weights)

    def share(test: Callable[[Pair], bool]) -> float | None:
        return _share(sum(w for p, w in zip(mine, weights, strict=True) if test(p)), total)

    rows = None if counted is None else sum(counted.values())
    judged = (
        share(lambda p: p.judge)
        if counted is None
        else _share(counted["approved"] + counted["held"], rows or 0)
    )
    return Bucket(
        bucket=bucket,
        rows=rows,
        judge_approval=judged,
        reviewed=len(mine),
        person_approval=share(lambda p: p.person),
        agreement=share(lambda p: p.person == p.judge),
    )


def pooled(docs: Iterable[Calibration]) -> list[Bucket]:
    """The buckets of several rounds' calibrations as one (the run's): each round's shares weighed
    by its bucket's judged rows (weighted docs; else by its reviewed rows)."""
    sums: dict[str, dict[str, float]] = {}
    for doc in docs:
        for b in doc.buckets:
            into = sums.setdefault(b.bucket, defaultdict(float))
            size = float(b.rows if b.rows is not None else b.reviewed)
            into["rows"] += b.rows or 0
            into["reviewed"] += b.reviewed
            for name in ("judge_approval", "person_approval", "agreement"):
                value = getattr(b, name)
                if value is not None and size:
                    into[name] += value * size
                    into[name + "_of"] += size
    out = []
    for bucket in BUCKETS:
        if bucket not in sums:
            continue
        s = sums[bucket]
        shares = {n: _share(s[n], s[n + "_of"]) for n in ("judge_approval", "person_approval", "agreement")}
        out.append(Bucket(bucket=bucket, rows=int(s["rows"]), reviewed=int(s["reviewed"]), **shares))
    return out


def calibration_chart(docs: list[Calibration], *, width: int = 420, height: int = 300) -> str:
    """The calibration plot: agreement, Cohen's kappa, precision and recall per reviewed round; and
    per score bucket (the rounds pooled) the judge's approval, the people's and their agreement: where
    the judge's verdicts stop agreeing with people is where ``review_below_score`` goes."""
    rounds = [d.round for d in docs]
    per_round = line_chart(
        rounds,
        [
            Series("agreement", [d.agreement for d in docs], color="#2a7"),
            Series("kappa", [d.kappa for d in docs], color="#1f77b4"),
            Series("precision", [d.precision for d in docs], color="#ff7f0e"),
            Series("recall", [d.recall for d in docs], color="#9467bd"),
        ],
        title="judge vs reviewers, per round",
        x_label="round reviewed",
        y_range=(min([0.0, *(d.kappa for d in docs if d.kappa is not None)]), 1),
        width=width,
        height=height,
    )
    buckets = pooled(docs)
    per_bucket = bar_chart(
        [b.bucket for b in buckets],
        [
            Series("judge approval", [b.judge_approval for b in buckets], color="#bbb"),
            Series("people's approval", [b.person_approval for b in buckets], color="#1f77b4"),
            Series("agreement", [b.agreement for b in buckets], color="#2a7"),
        ],
        title="per judge score bucket",
        x_label="score from",
        y_range=(0, 1),
        width=width,
        height=height,
    )
    return side_by_side(per_round, per_bucket)


def measured(
    view: RoundView, decisions: Sequence[Decision], *, tenths: bool = True, index: DecidedRows | None = None
) -> Calibration:
    """Round ``view.round``'s calibration as its decisions stand (the desk's live figures, the same
    :func:`calibrate` the gate's answer stores): only the rows decisions name by id are read, until
    the last of them turns up, and the round's summary gives the strata (``tenths``: as
    :func:`pair_of`). ``index``: the round's rows read by earlier requests (:class:`DecidedRows`),
    so only newly named ids are looked for (unless a decision is by filter, which needs the rows
    whole). ``bulk`` is not counted here (it needs every row)."""
    resolver = Resolver(decisions)
    named = {i for d in decisions if not d.bulk for i in d.ids}
    found: list[tuple[Judged, Decision | None]]
    if index is not None and not resolver.by_filter:
        found = [(row, resolver.named(sid)) for sid, row in index.of(view, named).items() if row is not None]
    else:
        samples = view.with_ids(named, prompt=resolver.needs_prompts, until_found=True)
        found = [(Judged.of(s), resolver.decision(s)) for s in samples]
    pairs: list[Pair] = []
    unjudged = 0
    for row, decision in found:
        pair = row.pair(decision, tenths=tenths)
        if pair is not None:
            pairs.append(pair)
        elif decision is not None and not decision.bulk:
            unjudged += 1
    summary = read_summary(view.layout, view.round, view.so)
    doc = calibrate(pairs, summary.verdicts if summary is not None else None, round=view.round)
    return doc.model_copy(update={"decisions": len(decisions), "unjudged": unjudged})
