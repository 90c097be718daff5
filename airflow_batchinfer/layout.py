"""The run directory layout (DESIGN §3), one place for every path a run reads or writes.

::

    <root>/input/                 sharded input            <root>/rejects/   malformed input lines
    <root>/round-00/pending/      this round's input       <root>/round-00/inferred/
    <root>/round-00/rejected/     judge's rejected rows    <root>/round-00/failed/
    <root>/round-00/jobs/         completion manifests     <root>/round-00/summary.json
    <root>/results/               approved rows (round00-part-NNNNN..., tail-part-NNNNN...)
    <root>/checkpoints/           in-place retry state     <root>/report/
    <root>/run.json               the run's settings       <root>/round-00/plan.json, <root>/tail/plan.json
    <root>/preflight/             the pre-flight sample and its projection
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_batchinfer.storage.location import join

SHARD_SUFFIX = ".jsonl.zst"


@dataclass(frozen=True)
class RunLayout:
    root: str

    def _p(self, *parts: str) -> str:
        return join(self.root, *parts)

    @property
    def run_config(self) -> str:
        return self._p("run.json")

    @property
    def preflight(self) -> str:
        return self._p("preflight")

    @property
    def input(self) -> str:
        return self._p("input")

    @property
    def rejects(self) -> str:
        return self._p("rejects")

    @property
    def results(self) -> str:
        return self._p("results")

    @property
    def report(self) -> str:
        return self._p("report")

    def round(self, r: int) -> str:
        return self._p(f"round-{r:02d}")

    def pending(self, r: int) -> str:
        return self.input if r == 0 else join(self.round(r), "pending")

    def inferred(self, r: int, shard_id: str) -> str:
        return join(self.round(r), "inferred", shard_id + SHARD_SUFFIX)

    def rejected_dir(self, r: int) -> str:
        return join(self.round(r), "rejected")

    def rejected(self, r: int, shard_id: str) -> str:
        return join(self.rejected_dir(r), shard_id + SHARD_SUFFIX)

    def failed(self, r: int) -> str:
        return join(self.round(r), "failed")

    def job_manifest(self, r: int, shard_id: str, kind: str) -> str:
        return join(self.round(r), "jobs", f"{shard_id}.{kind}.json")

    def summary(self, r: int) -> str:
        return join(self.round(r), "summary.json")

    def result(self, r: int, shard_id: str, *, tail: bool = False) -> str:
        prefix = "tail" if tail else f"round{r:02d}"
        return join(self.results, f"{prefix}-{shard_id}{SHARD_SUFFIX}")

    def checkpoints(self, r: int, shard_id: str) -> str:
        return join(self.root, "checkpoints", f"round-{r:02d}", shard_id)
