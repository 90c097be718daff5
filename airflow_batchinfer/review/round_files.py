"""What :class:`~airflow_batchinfer.review.browse.RoundView` reads a round's rejected rows from:
the round's rejected shards and their row counts, taken from what the round's close accepted
(``jobs/<shard>.<kind>.accepted.json``: the count of the rejected file's id digest) in O(shards) and
without reading a row; their reason groups (the manifests' ``reason_groups``); their lines, block by
block; and the run's settings a row is shown with (its id field, the round's prompts).

Every file is read through the package's storage layer, so local paths and ``s3://`` work alike.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Generator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, cast

from airflow_batchinfer.exceptions import BatchInferError, ReviewError
from airflow_batchinfer.judges.reasons import OTHER, ReasonGroups, row_reason
from airflow_batchinfer.prompts.retries import RetrySettings
from airflow_batchinfer.review.prompt_text import Prompts, render
from airflow_batchinfer.review.samples import Sample, sample_of
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    AcceptedJob,
    Plan,
    read_accepted,
    read_plan,
    read_run_config,
    read_summary,
    slots,
)
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, files
from airflow_batchinfer.storage.location import StorageOptions, join
from airflow_batchinfer.storage.record_file import record_file
from airflow_batchinfer.storage.records import parse_record

__all__ = ["RoundFiles", "RoundShard", "ShardRows"]

DOC_THREADS = 16  # documents read at once (one per shard: object stores answer in parallel)


class ShardRows(NamedTuple):
    """One rejected shard of the round: its id, its file's URI and its row count."""

    shard_id: str
    uri: str
    rows: int


@dataclass
class RoundShard:
    """One rejected shard of the round as :class:`RoundFiles` learns it."""

    index: int
    shard_id: str
    uri: str
    rows: int
    accepted: AcceptedJob | None = None  # the accepted doc close wrote (None: none readable)
    groups: dict[str, int] | None = None  # its rejected rows' reason groups (None: not known yet)
    groups_known: bool = False  # groups looked up in the manifest (maybe still None: read the rows)


class RoundFiles:
    """Round ``round``'s rejected files: which, how many rows each, their reason groups and their
    lines (:class:`~airflow_batchinfer.review.browse.RoundView` reads pages, samples and ids from
    them).

    Constructing it reads nothing; the first call lists the round's rejected shards and reads what
    close accepted for each (one small document per shard, in parallel). Safe to share between
    threads; :meth:`refresh` forgets what it learnt (after a re-run close)."""

    def __init__(self, run_root: str, round: int, so: StorageOptions | None = None) -> None:
        if isinstance(round, bool) or not isinstance(round, int) or round < 0:
            raise ReviewError(f"round must be an integer >= 0, got {round!r}")
        self.run_root = run_root
        self.round = round
        self.so = so
        self.layout = RunLayout(run_root)
        self._lock = threading.Lock()
        self._shards: list[RoundShard] | None = None
        self._starts: list[int] = []  # each shard's first row's position in the round
        self._settings: tuple[str, Prompts | None] | None = None
        self._spot: int | None = None

    # ----------------------------------------------------------------------------- what it holds
    def refresh(self) -> None:
        with self._lock:
            self._shards, self._settings, self._spot = None, None, None

    def shards(self) -> list[ShardRows]:
        """The round's rejected shards in order, with their row counts (O(shards), no row read)."""
        return [ShardRows(s.shard_id, s.uri, s.rows) for s in self._load()]

    def total(self) -> int:
        """The round's rejected rows."""
        return sum(s.rows for s in self._load())

    def groups(self) -> dict[str, int]:
        """The round's rejected rows per reason group (most common first, at most
        :data:`~airflow_batchinfer.judges.reasons.MAX_GROUPS` and ``(other)``): the jobs' manifests'
        ``reason_groups`` (copied into the accepted docs) added up; a shard with no accepted doc is read."""
        total = ReasonGroups()
        for shard in self._with_groups(scan=True):
            total.merge(shard.groups or {})
        return total.as_dict()

    def spot_checks(self) -> int:
        """The round's spot checks (approved rows held back for people), from its summary."""
        if self._spot is None:
            summary = read_summary(self.layout, self.round, self.so)
            self._spot = (summary.spot_checks or 0) if summary is not None else 0
        return self._spot

    @property
    def id_field(self) -> str:
        return self._run_settings()[0]

    def exact_groups(self) -> dict[str, int] | None:
        """The round's rows per reason group, uncapped, when every shard's manifest counts its groups
        exactly (no ``(other)``, adding up to its rows); else ``None``. Reads no row."""
        total: dict[str, int] = {}
        for shard in self._with_groups(scan=False):
            groups = shard.groups
            if groups is None or OTHER in groups or sum(groups.values()) != shard.rows:
                return None
            for g, n in groups.items():
                total[g] = total.get(g, 0) + n
        return total

    def scan(self, *, prompts: bool = True) -> Iterator[tuple[Sample, dict[str, Any]]]:
        """Every rejected row of the round in order, as ``(sample, row)`` (streaming: one shard's
        block at a time). ``prompts=False`` leaves ``sample.prompt`` ``None`` (no rendering)."""
        for shard in self._load():
            for pos, line in self._lines(shard):
                row = parse_record(line)
                yield self.to_sample(row, shard.shard_id, pos, prompt=prompts), row

    def to_sample(
        self, row: Mapping[str, Any], shard_id: str = "", position: int = 0, *, prompt: bool = True
    ) -> Sample:
        """A row of this run (any round's rejected or pending row) as a :class:`Sample`."""
        id_field, prompts = self._run_settings()
        return sample_of(
            row, shard_id, position, round=self.round, id_field=id_field, prompts=prompts if prompt else None
        )

    # --------------------------------------------------------------------------------- internals
    def _with_prompt(self, sample: Sample) -> Sample:
        prompts = self._run_settings()[1]
        prompt = render(prompts, sample.record, sample.id, sample.attempts, sample.previous)
        return replace(sample, prompt=prompt)

    def _blocks(self, shard: RoundShard) -> Generator[tuple[int, list[bytes]], None, None]:
        """A shard's non-blank lines in blocks, each with its first line's position."""
        pos = 0
        file = record_file(shard.uri, storage_options=self.so)  # rejected/: JSONL or Parquet
        blocks = cast(Generator[list[bytes], None, None], file.iter_line_blocks())
        with contextlib.closing(blocks):
            for block in blocks:
                lines = [line for line in block if line.strip()]
                if lines:
                    yield pos, lines
                    pos += len(lines)

    def _lines(
        self, shard: RoundShard, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """A shard's lines ``[start, stop)`` with their positions; lines before ``start`` are
        decompressed but not parsed."""
        if stop is not None and stop <= start:
            return
        blocks = self._blocks(shard)
        with contextlib.closing(blocks):
            for first, lines in blocks:
                end = first + len(lines)
                if end <= start:
                    continue
                for k in range(max(start - first, 0), len(lines)):
                    if stop is not None and first + k >= stop:
                        return
                    yield first + k, lines[k]
                if stop is not None and end >= stop:
                    return

    def _run_settings(self) -> tuple[str, Prompts | None]:
        """The run's id field and the round's prompts: ``run.json`` with what a review changed for the
        round (the plan that ran it); without ``run.json``: ``id``, no prompts."""
        if self._settings is None:
            try:
                cfg = read_run_config(self.run_root, self.so)
            except BatchInferError:
                self._settings = ("id", None)
            else:
                with contextlib.suppress(BatchInferError):  # a plan that cannot be read: run.json's
                    cfg = plan.effective_config(cfg) if (plan := self._plan(cfg)) else cfg
                prompts: Prompts | None
                try:
                    # no prompt shows sampling
                    retry = RetrySettings(cfg.retries.retry_template, cfg.retries.retry_system)
                    prompts = Prompts(cfg.prompt.prompt_template, cfg.prompt.system, retry)
                except BatchInferError:
                    prompts = None
                self._settings = (cfg.data.id_field or "id", prompts)
        return self._settings

    def _plan(self, cfg: RunConfig) -> Plan | None:
        """The plan of the slot that ran this round."""
        for slot in slots(cfg.retries.max_rounds):
            plan = read_plan(self.layout, slot, self.so)
            if plan is not None and plan.round == self.round and plan.mode != "skip":
                return plan
        return None

    def _load(self) -> list[RoundShard]:
        with self._lock:
            if self._shards is None:
                self._shards = self._list()
                starts, n = [], 0
                for s in self._shards:
                    starts.append(n)
                    n += s.rows
                self._starts = starts
            return self._shards

    def _list(self) -> list[RoundShard]:
        """The rejected shards and their counts from the accepted docs (a file without one is counted
        by reading it)."""
        r = self.round
        listed = JsonlDir(self.layout.rejected_dir(r), storage_options=self.so).shards()
        kinds: dict[str, list[str]] = {}
        for base in files.names(join(self.layout.round(r), "jobs"), self.so):
            if base.endswith(".accepted.json"):
                sid, _, kind = base[: -len(".accepted.json")].rpartition(".")
                kinds.setdefault(sid, []).append(kind)

        def one(item: tuple[int, Any]) -> RoundShard:
            i, listed_shard = item
            sid = listed_shard.shard_id
            doc = None
            for kind in sorted(kinds.get(sid, [])):
                found = read_accepted(self.layout.accepted(r, sid, kind), self.so)
                if isinstance(found, AcceptedJob):
                    doc = found
                    break
            shard = RoundShard(i, sid, listed_shard.uri, 0, accepted=doc)
            rows = _rejected_rows(doc)
            if rows is None:
                rows = sum(len(lines) for _, lines in self._blocks(shard))
            shard.rows = rows
            return shard

        if not listed:
            return []
        with ThreadPoolExecutor(min(DOC_THREADS, len(listed))) as ex:
            return list(ex.map(one, enumerate(listed)))

    def _with_groups(self, *, scan: bool) -> list[RoundShard]:
        """The shards with their reason groups, their accepted docs'; with ``scan``, a shard with
        none is read."""
        shards = self._load()
        with self._lock:
            for s in shards:
                if not s.groups_known:
                    groups = None if s.accepted is None else s.accepted.reason_groups
                    s.groups, s.groups_known = (None if groups is None else dict(groups)), True
        if scan:
            for s in shards:
                if s.groups is None:
                    counted = ReasonGroups()
                    for _, line in self._lines(s):
                        counted.add(row_reason(parse_record(line)))
                    with self._lock:
                        s.groups = counted.as_dict()
        return shards


def lacks(shard: RoundShard, group: str) -> bool:
    """Whether a shard's job counted no row of ``group`` (exactly: its groups were not capped)."""
    return shard.groups is not None and OTHER not in shard.groups and not shard.groups.get(group)


def _rejected_rows(doc: AcceptedJob | None) -> int | None:
    """The rows of the accepted attempt's rejected file: its id digest's count, else its counts."""
    if doc is None:
        return None
    digest = doc.digest("rejected")
    if digest is not None:
        return digest.count
    outcomes = doc.counts.outcomes
    return outcomes.max_attempts + outcomes.error if doc.kind == "in_place" else outcomes.rejected
