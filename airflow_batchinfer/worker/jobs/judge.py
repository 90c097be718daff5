"""The ``judge`` job (and the judging of ``infer_judge``): each answer of a row (its candidates)
judged, a jury's votes and the candidates' selection counted, a row people check held back for
them (``review_below_score``, spot checks), and the judged rows counted: by outcome, per adapter,
per stratum (:class:`~airflow_batchinfer.state.tally.Tally`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from airflow_batchinfer.engines import reasoning
from airflow_batchinfer.engines.adapters import counted
from airflow_batchinfer.engines.base import GenerationRequest, GenerationResult
from airflow_batchinfer.engines.pooling import POOLING_TASKS
from airflow_batchinfer.engines.tools import calls_of
from airflow_batchinfer.judges import RAW_SCORES, JudgeItem, Verdict, candidates, jury, spot_check
from airflow_batchinfer.judges.human import HumanJudge
from airflow_batchinfer.judges.truncation import LENGTH, TRUNCATED_IN_THINKING, row_decision
from airflow_batchinfer.state.tally import Tally
from airflow_batchinfer.storage.digest import record_ids
from airflow_batchinfer.storage.fan_out import ADAPTER_FIELD
from airflow_batchinfer.storage.records import Record
from airflow_batchinfer.worker.jobs.chunks import run_chunks
from airflow_batchinfer.worker.jobs.context import JobContext
from airflow_batchinfer.worker.segments import ChunkFigures

# A candidate's own of what the truncation decision reads (the rest is its row's).
CUT_FIELDS = ("finish_reason", TRUNCATED_IN_THINKING)
# What infer_judge generates a chunk's rows with before they are judged (:class:`~.infer.Inference`).
Infer = Callable[[list[Record], ChunkFigures], Awaitable[list[Record]]]


def answers(row: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """What the judge judges of ``row``: the candidates its generation wrote (``n`` > 1), else its
    one ``result``."""
    return candidates.of(row) or [row]


def to_judge(ctx: JobContext, row: Record) -> list[tuple[Any, JudgeItem | Verdict]]:
    """Each answer of ``row`` (a candidate, or the row itself) and what the judge step makes of it
    before any judge: the item to judge, or its rejection. An errored inference is one rejection; a
    truncated answer is rejected unless ``truncated: judge``
    (:mod:`~airflow_batchinfer.judges.truncation`)."""
    # an embed or score row has no text answer (result null) but is no error (engines.pooling)
    unanswered = row.get("result") is None and row.get("task") not in POOLING_TASKS
    if row.get("status") == "error" or unanswered:
        return [(row, Verdict(False, f"inference_error: {row.get('error')}"))]
    out: list[tuple[Any, JudgeItem | Verdict]] = []
    attempt = int(row.get("attempts") or 1)
    for c, candidate in enumerate(answers(row)):
        probe = row if candidate is row else {**row, **{k: candidate.get(k) for k in CUT_FIELDS}}
        truncation = row_decision(probe, ctx.params.truncation)
        if truncation.reject:  # half an answer: not worth the judge's tokens
            out.append((candidate, Verdict(False, truncation.reason or "truncated")))
        else:
            answer = "" if candidate.get("result") is None else str(candidate["result"])
            calls = calls_of(candidate.get("tool_calls"))
            item = JudgeItem(row, answer, ctx.record_id(row), attempt, c, calls)
            out.append((candidate, item))
    return out


async def judge_rows(
    ctx: JobContext, rows: list[Record], chunk: ChunkFigures | None = None
) -> list[tuple[Record, Verdict]]:
    """Verdicts for inferred rows; an errored inference is a rejection without asking the judge, and
    so is a truncated one unless ``truncated: judge`` (:mod:`~airflow_batchinfer.judges.truncation`).
    A row with candidates has each judged and comes back as the run's ``select`` chose
    (:func:`_selected`), its verdict the chosen candidate's, the candidates (and a jury's votes)
    counted. A judge's tokens and those counts go to ``chunk``'s figures when given, else to the
    job's."""
    p = ctx.params
    assert p.judge is not None
    verdicts: list[list[Verdict | None]] = []
    items, positions = [], []
    for i, row in enumerate(rows):
        mine: list[Verdict | None] = []
        for c, (_, todo) in enumerate(to_judge(ctx, row)):
            if isinstance(todo, Verdict):
                mine.append(todo)
                continue
            mine.append(None)
            items.append(todo)
            positions.append((i, c))
        verdicts.append(mine)
    if items:

        async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
            return await ctx.generate(requests, chunk=chunk)

        judged = await p.judge.judge(items, generate, ctx.scorer(chunk))
        for (i, c), verdict in zip(positions, judged, strict=True):
            verdicts[i][c] = verdict
    out = []
    tally = ctx.tally if chunk is None else chunk.tally
    people = isinstance(p.judge, HumanJudge)  # every verdict awaits a person: no candidate is approved yet
    for row, found in zip(rows, verdicts, strict=True):
        vs = [v if v is not None else Verdict(False, "invalid_judgment") for v in found]
        if len(vs) < 2:
            out.append((_without_carried(row), vs[0]))
            tally.jury.count(vs[0])
            continue
        cut = [c.get("finish_reason") == LENGTH for c in answers(row)]
        selection = candidates.select(vs, p.select, review_below=p.review_below, truncated=cut)
        if not people:
            tally.candidates.count(len(vs), selection)
        tally.jury.count(vs[selection.chosen])  # the answer the row keeps
        out.append((_selected(row, vs, selection, p.select), vs[selection.chosen]))
    return out


def _without_carried(row: Record) -> Record:
    """``row`` without the jury verdicts its inference carried (its judgment's ``members`` hold them)."""
    if jury.CARRIED not in row:
        return row
    return {k: v for k, v in row.items() if k != jury.CARRIED}


def _selected(row: Record, verdicts: list[Verdict], selection: candidates.Selection, how: str) -> Record:
    """``row`` as ``selection`` chose: the chosen candidate's ``result``, ``finish_reason`` (and
    ``logprobs``, its reasoning), its index as ``candidate``; ``candidates``, each with its
    ``judgment``: the kept ones when approved with ``select: all``, none when approved otherwise, all
    when rejected."""
    judged = [
        {**{k: x for k, x in c.items() if k != jury.CARRIED}, "judgment": v.as_dict()}
        for c, v in zip(answers(row), verdicts, strict=True)
    ]
    chosen = judged[selection.chosen]
    out = {**_without_carried(row), "result": chosen["result"], "finish_reason": chosen.get("finish_reason")}
    out["candidate"] = selection.chosen
    if "logprobs" in chosen:
        out["logprobs"] = chosen["logprobs"]
    # the chosen one's reasoning and calls, not the first candidate's (the row's until now)
    for name in (*reasoning.ROW_FIELDS, "tool_calls"):
        out.pop(name, None)
        if name in chosen:
            out[name] = chosen[name]
    if not selection.ok:
        out["candidates"] = judged
    elif how == "all":
        out["candidates"] = [judged[i] for i in selection.kept]
    else:
        del out["candidates"]
    return out


def _for_review(ctx: JobContext, verdict: Verdict) -> bool:
    """Whether people judge this sample: a human judge's, or a verdict scored below the run's
    ``review_below_score`` (or not scored at all: the judge's answer could not be read)."""
    if isinstance(ctx.params.judge, HumanJudge):
        return True
    below = ctx.params.review_below
    return below is not None and (verdict.score is None or verdict.score < below)


def count_adapter(
    tally: Tally, row: Mapping[str, Any], status: str, judgment: Mapping[str, Any] | None = None
) -> None:
    """A judged row's count under the LoRA adapter that answered it (the round's approval per
    adapter): a spot check (``judgment``'s) apart, neither approved nor rejected. A row without an
    answer (an inference error, a record naming no adapter of the run: its name is the record's, not
    the run's) is the round's inference errors."""
    name = counted(row.get(ADAPTER_FIELD))
    if name is not None and row.get("status") != "error":
        tally.count_adapter(name, status, judgment is not None and spot_check.is_spot_check(judgment))


async def _judged(ctx: JobContext, rows: list[Record], figures: ChunkFigures) -> list[Record]:
    """``rows`` with their verdicts: ``status`` approved or rejected, ``judgment`` (counted into
    ``figures``, and their ids digested per output). An approved row the round's spot check picks
    (:mod:`~airflow_batchinfer.judges.spot_check`) is held back for people as a low-scored one is; a
    judge people check counts its judged rows per stratum (the calibration's weights)."""
    judged = []
    tally, outcomes = figures.tally, figures.tally.outcomes
    p = ctx.params
    checked = not isinstance(p.judge, HumanJudge) and (p.spot_check is not None or p.review_below is not None)
    tenths = p.judge is not None and p.judge.kind not in RAW_SCORES  # a reward's raw score has none
    for row, verdict in await judge_rows(ctx, rows, figures):
        judgment = verdict.as_dict()
        cut = row_decision(row, p.truncation)
        if cut.truncated:  # judged or not: the round counts its truncated rows
            tally.truncated += 1
            tally.truncated_in_thinking += cut.in_thinking
        stratum: spot_check.Stratum = "approved" if verdict.approved else "rejected"
        if row.get("status") == "error":
            outcomes.inference_errors += 1
        elif cut.reject:
            pass  # half an answer is retried, not put before people
        elif _for_review(ctx, verdict):  # a person decides: held back from results, on the review page
            if not isinstance(p.judge, HumanJudge):
                judgment.update(
                    approved=False, judge_approved=verdict.approved, reason=f"for review: {verdict.reason}"
                )
            judgment["for_review"] = True
            outcomes.for_review += 1
            stratum = "held" if verdict.approved else "rejected"
        elif verdict.approved and p.spot_check is not None and p.spot_check.holds(ctx.record_id(row)):
            judgment.update(
                approved=False,
                judge_approved=True,
                reason=spot_check.spot_check_reason(verdict.reason),
                for_review=True,
                spot_check=True,
            )
            outcomes.for_review += 1
            outcomes.spot_checks += 1
        if checked and row.get("status") != "error" and not cut.reject:
            tally.count_stratum(stratum, verdict.score if tenths else None)
        status = "approved" if judgment["approved"] else "rejected"
        if status == "approved":
            outcomes.approved += 1
        else:
            outcomes.rejected += 1
            figures.reason_groups.add(judgment["reason"])
        count_adapter(tally, row, status, judgment)
        judged.append({**row, "status": status, "judgment": judgment})
    for name in ("approved", "rejected"):
        figures.count_ids(name, record_ids((r for r in judged if r["status"] == name), ctx.params.id_field))
    return judged


async def judge_job(ctx: JobContext, infer: Infer | None) -> Tally:
    """Judge every row of the input into approved and rejected; with ``infer``, generate the rows
    first (the fused job: the shard is read once, and nothing is written in between)."""
    ctx.progress.total = ctx.params.input_records

    async def process(chunk: list[Record], figures: ChunkFigures) -> list[Record]:
        return await _judged(ctx, await infer(chunk, figures) if infer is not None else chunk, figures)

    def split(rows: list[Record]) -> dict[str, list[Record]]:
        return {name: [r for r in rows if r["status"] == name] for name in ("approved", "rejected")}

    await run_chunks(ctx, process, split)
    return ctx.counts()


async def run_judge(ctx: JobContext) -> Tally:
    return await judge_job(ctx, None)
