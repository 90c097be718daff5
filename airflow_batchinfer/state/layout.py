"""The run directory layout, one place for every path a run reads or writes (docs/architecture.md).

::

    <root>/input/                 sharded input            <root>/rejects/   malformed input lines
    <root>/round-00/pending/      this round's input       <root>/round-00/inferred/
    <root>/round-00/rejected/     judge's rejected rows    <root>/round-00/failed/
    <root>/round-00/jobs/         completion manifests, <shard>.<kind>.accepted.json (what close accepted)
    <root>/round-00/staged/       fenced job outputs: <shard>.<kind>/<attempt token>/<name>.jsonl.zst,
                                  moved into results/, rejected/ and inferred/ by close (one attempt,
                                  once); a quarantined shard's attempts no current manifest names
                                  are swept by close
    <root>/round-00/summary.json
    <root>/results/               approved rows (round00-part-NNNNN..., tail-part-NNNNN...)
    <root>/checkpoints/           in-place retry state     <root>/report/
    <root>/checkpoints/round-00/segments/<shard>.<kind>/
                                  an infer, judge or infer_judge job's committed chunks (resume inside
                                  a shard; deleted once its manifest is written, or by close)
    <root>/run.json               the run's settings       <root>/round-00/plan.json, <root>/tail/plan.json
    <root>/output_columns.json    output_format parquet: the input's columns in the output, pinned at planning
    <root>/preflight/             the pre-flight sample and its projection
    <root>/round-00/review/decisions.jsonl
                                  reviewers' decisions on the round's rejected rows (accept, retry, drop)
    <root>/round-01/reviewed/     round 1's pending set once those decisions took effect
    <root>/dropped/               rows a review dropped out of the run (reviewed-r00-part-NNNNN..., each
                                  with the decision and its note); accepted ones: results/reviewed-r00-...
    <root>/pending/               output_format parquet: the rows the run left pending, as Parquet
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from airflow_batchinfer.storage.location import join
from airflow_batchinfer.storage.record_file import JSONL_SUFFIX, PARQUET_SUFFIX, output_suffix

SHARD_SUFFIX = JSONL_SUFFIX  # the run's own files (input, pending, staged, inferred): JSONL always
# what results/, rejected/ and dropped/ files end in: their run's output_format (RunLayout.suffix)
OUTPUT_SUFFIXES = (SHARD_SUFFIX, PARQUET_SUFFIX)
# Outputs a job with ``outputs["staging"]`` writes per attempt, for the round's close to accept once.
FENCED_OUTPUTS = ("approved", "rejected")
INFERRED = "inferred"  # an infer job's one output: fenced too (the judge reads the attempt it names)


def fenced_outputs(kind: str) -> tuple[str, ...]:
    """The outputs a job of ``kind`` writes per attempt when its spec has ``outputs["staging"]``."""
    return (INFERRED,) if kind == "infer" else FENCED_OUTPUTS


def output_stem(name: str) -> str | None:
    """``name`` less its output file ending (``part-00003.parquet`` → ``part-00003``); ``None`` when
    it has neither ending."""
    for suffix in OUTPUT_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


def staged_name(manifest_uri: str) -> str:
    """The staging folder of one job, from its manifest's name (``part-00003.judge.json`` →
    ``part-00003.judge``); reduced to safe characters, so it always stays inside the staging URI."""
    base = posixpath.basename(manifest_uri.rstrip("/"))
    base = base[: -len(".json")] if base.endswith(".json") else base
    name = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".")
    return name or "job"


def staged_output(staging: str, manifest_uri: str, token: str, name: str) -> str:
    """Where the attempt ``token`` of a job writes its fenced output ``name``."""
    return join(staging, staged_name(manifest_uri), token, name + SHARD_SUFFIX)


def staged_attempt(job_dir: str, uri: str, name: str) -> str | None:
    """The attempt token when ``uri`` is output ``name`` of one attempt under ``job_dir`` (a
    :meth:`RunLayout.staged_job`), else ``None``: a job's recorded input is trusted only there."""
    prefix, suffix = job_dir.rstrip("/") + "/", "/" + name + SHARD_SUFFIX
    if not (uri.startswith(prefix) and uri.endswith(suffix)):
        return None
    token = uri[len(prefix) : -len(suffix)]
    return token if token and "/" not in token and token not in (".", "..") else None


@dataclass(frozen=True)
class RunLayout:
    """Every path of the run at ``root``. ``suffix``: the ending of its output files (``results/``,
    ``rejected/``, ``dropped/``), :data:`SHARD_SUFFIX` or ``.parquet`` as its ``output_format`` says
    (:meth:`of`); only what names those files needs it, reading lists them whatever they end in."""

    root: str
    suffix: str = SHARD_SUFFIX

    @classmethod
    def of(cls, root: str, output_format: str) -> RunLayout:
        return cls(root, output_suffix(output_format))

    def _p(self, *parts: str) -> str:
        return join(self.root, *parts)

    @property
    def name(self) -> str:
        """The run's name: the last part of its root (``<output_root>/<run_name>``), what headings
        and gate subjects show instead of a storage path."""
        return self.root.rstrip("/").rsplit("/", 1)[-1] or self.root

    @property
    def run_config(self) -> str:
        return self._p("run.json")

    @property
    def output_columns(self) -> str:
        """The input columns of a Parquet run's output files (``storage.parquet_columns``)."""
        return self._p("output_columns.json")

    @property
    def preflight(self) -> str:
        return self._p("preflight")

    @property
    def input(self) -> str:
        return self._p("input")

    @property
    def usage(self) -> str:
        """The run's pool-usage events (``state.docs.usage``): leases, gates, pool starts."""
        return self._p("usage")

    @property
    def rejects(self) -> str:
        return self._p("rejects")

    @property
    def results(self) -> str:
        return self._p("results")

    @property
    def report(self) -> str:
        return self._p("report")

    @property
    def final_pending(self) -> str:
        """A Parquet run's final pending rows, as Parquet (``run.report.final_pending``)."""
        return self._p("pending")

    @property
    def dropped(self) -> str:
        """Rows a review dropped out of the run, each with the reviewer's note."""
        return self._p("dropped")

    def round(self, r: int) -> str:
        return self._p(f"round-{r:02d}")

    def pending(self, r: int) -> str:
        return self.input if r == 0 else join(self.round(r), "pending")

    def inferred(self, r: int, shard_id: str) -> str:
        return join(self.round(r), "inferred", shard_id + SHARD_SUFFIX)

    def rejected_dir(self, r: int) -> str:
        return join(self.round(r), "rejected")

    def rejected(self, r: int, shard_id: str) -> str:
        return join(self.rejected_dir(r), shard_id + self.suffix)

    def range_rejects(self, r: int, shard_id: str) -> str:
        """Bad lines a round-0 range job found in its range (line in range, byte offset); round 0's
        close rewrites them into ``rejects/`` with absolute line numbers."""
        return join(self.round(r), "input-rejects", shard_id + SHARD_SUFFIX)

    def failed(self, r: int) -> str:
        return join(self.round(r), "failed")

    def job_manifest(self, r: int, shard_id: str, kind: str) -> str:
        return join(self.round(r), "jobs", f"{shard_id}.{kind}.json")

    def job_error(self, r: int, shard_id: str, kind: str) -> str:
        """The last error of a shard's job (the round's close quotes it when it quarantines)."""
        return join(self.round(r), "jobs", f"{shard_id}.{kind}.error.json")

    def accepted(self, r: int, shard_id: str, kind: str) -> str:
        """What close accepted for a shard's job (the attempt and its counts), or its quarantine."""
        return join(self.round(r), "jobs", f"{shard_id}.{kind}.accepted.json")

    def staging(self, r: int) -> str:
        return join(self.round(r), "staged")

    def spill(self, r: int) -> str:
        """Round ``r``'s close's spilled sorts (round 0's repeated ids), removed as it finishes."""
        return join(self.round(r), "spill")

    def staged_job(self, r: int, shard_id: str, kind: str) -> str:
        """Every attempt's staged outputs of one job (see :func:`staged_output`)."""
        return join(self.staging(r), staged_name(self.job_manifest(r, shard_id, kind)))

    def summary(self, r: int) -> str:
        return join(self.round(r), "summary.json")

    def claims(self, r: int, *, judge: bool = False) -> str:
        """Round ``r``'s shard claims: one document per shard a lane took (see ``run/lanes.py``); a
        judge pool's lanes claim the shards they judge in ``judge-claims/`` (``run/judge_lanes.py``)."""
        return join(self.round(r), "judge-claims" if judge else "claims")

    def claim(self, r: int, shard_id: str, *, judge: bool = False) -> str:
        return join(self.claims(r, judge=judge), f"{shard_id}.json")

    def lanes(self, r: int, *, judge: bool = False) -> str:
        """Round ``r``'s lane status documents: which shards each lane took, and how each ended (a
        judge pool's lanes: ``judge-lanes/``)."""
        return join(self.round(r), "judge-lanes" if judge else "lanes")

    def lane(self, r: int, lane: int, *, judge: bool = False) -> str:
        return join(self.lanes(r, judge=judge), f"lane-{lane:04d}.json")

    def handoffs(self, r: int) -> str:
        """Round ``r``'s shards whose inference ended, for a judge pool's lanes: one empty object
        per shard, named ``<shard>.done`` or ``<shard>.failed`` (one listing tells them all)."""
        return join(self.round(r), "inferred-shards")

    def handoff(self, r: int, shard_id: str, state: str) -> str:
        return join(self.handoffs(r), f"{shard_id}.{state}")

    def result(self, r: int, shard_id: str, *, tail: bool = False) -> str:
        prefix = "tail" if tail else f"round{r:02d}"
        return join(self.results, f"{prefix}-{shard_id}{self.suffix}")

    def checkpoints(self, r: int, shard_id: str) -> str:
        return join(self.root, "checkpoints", f"round-{r:02d}", shard_id)

    def segments(self, r: int, shard_id: str, kind: str) -> str:
        """The committed chunks of a shard's infer, judge or infer_judge job
        (:mod:`~airflow_batchinfer.worker.segments`): a later attempt resumes after them."""
        return join(self.root, "checkpoints", f"round-{r:02d}", "segments", f"{shard_id}.{kind}")

    def review(self, r: int) -> str:
        """Round ``r``'s review of its rejected rows (:mod:`airflow_batchinfer.review`)."""
        return join(self.round(r), "review")

    def reviewed(self, r: int) -> str:
        """Round ``r``'s pending set after a review's decisions took effect (what it runs then)."""
        return join(self.round(r), "reviewed")

    def decisions(self, r: int) -> str:
        """The reviewers' decisions on round ``r``'s rejected rows, one JSON line each."""
        return join(self.review(r), "decisions.jsonl")

    def review_accepted(self, reviewed: int, shard_id: str) -> str:
        """Where a pending shard's rows that the review of round ``reviewed`` accepted go."""
        return join(self.results, f"reviewed-r{reviewed:02d}-{shard_id}{self.suffix}")

    def review_dropped(self, reviewed: int, shard_id: str) -> str:
        """Where a pending shard's rows that the review of round ``reviewed`` dropped go."""
        return join(self.dropped, f"reviewed-r{reviewed:02d}-{shard_id}{self.suffix}")
