"""What a shard job has while it runs (:class:`JobContext`): its spec and params, the worker's
runtime (storage, engine, batcher), its progress, and what it counts, digests and writes."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_batchinfer.engines.base import GenerationRequest, GenerationResult
from airflow_batchinfer.engines.scoring import ScoreRequest, ScoreResult
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.base import Scorer
from airflow_batchinfer.judges.reasons import ReasonGroups, row_reason
from airflow_batchinfer.rpc.models import JobSpec, Progress
from airflow_batchinfer.state.docs import ID_OUTPUTS, Digest
from airflow_batchinfer.state.layout import fenced_outputs, staged_output
from airflow_batchinfer.state.params import JobSetup
from airflow_batchinfer.state.tally import Read, Tally
from airflow_batchinfer.storage import JsonlFile
from airflow_batchinfer.storage.digest import IdDigest, record_ids
from airflow_batchinfer.storage.id_hash_files import HashWriter, hashes_beside
from airflow_batchinfer.storage.ranges import InputRange, RangeRecordReader
from airflow_batchinfer.storage.reader import RecordReader
from airflow_batchinfer.worker.runtime import Runtime
from airflow_batchinfer.worker.segments import ChunkFigures


@dataclass
class JobContext:
    spec: JobSpec
    params: JobSetup
    runtime: Runtime
    progress: Progress = field(default_factory=Progress)
    tally: Tally = field(default_factory=Tally)  # what it counted (:meth:`counts`)
    # A range job's read of its range: set by the reader's thread when it ends (apart from ``tally``,
    # which the loop replaces as it adds each chunk's).
    read: Read | None = None
    tokens: Counter[str] = field(default_factory=Counter)
    # Run after the completion manifest is written (e.g. deleting checkpoints that served).
    cleanup: list[Callable[[], None]] = field(default_factory=list)
    # This attempt's token: a fresh one each time the worker starts the job, so two copies of one job
    # (an Airflow retry while the first still runs elsewhere) never write the same staged files.
    attempt: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Fenced outputs as written by this attempt: name -> staged URI (recorded in the manifest).
    committed: dict[str, str] = field(default_factory=dict)
    # "input" and each output name -> the count and digest of its ids (the manifest's ``ids``).
    ids: dict[str, IdDigest] = field(default_factory=dict)
    # The reason groups of the rows this job rejected (the manifest's ``reason_groups``).
    reason_groups: ReasonGroups = field(default_factory=ReasonGroups)

    def counts(self) -> Tally:
        """What the job counted so far: its status's and its manifest's ``counts``."""
        return self.tally if self.read is None else self.tally.model_copy(update={"read": self.read})

    def count_rejected(self, row: Mapping[str, Any]) -> None:
        """Count a rejected (or, in place, exhausted) row's reason group."""
        self.reason_groups.add(row_reason(row))

    def count_ids(self, name: str, records: Iterable[Mapping[str, Any]]) -> None:
        """Add the ids of ``records`` (read, or emitted into output ``name``) to that digest."""
        digest = self.ids.get(name)
        if digest is None:
            digest = self.ids[name] = IdDigest()
        digest.add_many(record_ids(records, self.params.id_field))

    def absorb(self, chunk: ChunkFigures) -> None:
        """Add one chunk's figures (counted while it was processed, or read from its segment) to the job's."""
        self.tally += chunk.tally
        self.tokens.update(chunk.tokens)
        self.reason_groups.merge(chunk.reason_groups)
        for name, digest in chunk.ids.items():
            self.ids[name] = self.ids.get(name, IdDigest()) + digest

    def ids_doc(self) -> dict[str, Digest]:
        """The manifest's ``ids``: ``input`` and every output of the kind, empty ones included."""
        names = ("input", *ID_OUTPUTS.get(self.spec.kind, ()))
        return {n: Digest.of(self.ids.get(n, IdDigest())) for n in dict.fromkeys([*names, *self.ids])}

    def file(self, uri: str) -> JsonlFile:
        return JsonlFile(uri, storage_options=self.runtime.storage_options)

    def read_input(self) -> RecordReader:
        """The job's input records, for every job kind. A round-0 range shard (``params.input_range``:
        a byte range of the input file, nothing copied) is validated line by line exactly as sharding
        validates (:class:`~airflow_batchinfer.storage.ranges.RangeRecordReader`): bad lines go to
        ``outputs["input_rejects"]`` with their line in the range and byte offset, and the read's
        line counts are the job's ``read`` (:meth:`counts`) (round 0's close turns them into the run's
        ``rejects/`` with absolute line numbers). Once the range is read to its end, its id hash
        file (:class:`~airflow_batchinfer.storage.id_hash_files.HashWriter`: each kept id's hash and
        line in the range) is written beside the manifest, before it."""
        raw = self.params.raw.get("input_range")
        if raw is None:
            return self.file(self.spec.input).iter_records()
        rng = InputRange.from_params(raw, root=self.spec.input)
        rejects_uri = self.spec.outputs.get("input_rejects")
        if rejects_uri is None:
            raise ConfigError(
                f"shard {rng.shard_id}: a range job needs outputs['input_rejects'] (where its bad lines go)"
            )
        rejects = self.file(rejects_uri).writer_sync()
        # Beside the manifest, written before it: round 0's close finds ids two ranges hold from these.
        hashes = HashWriter(
            hashes_beside(self.spec.outputs["manifest"], rng.shard_id), self.runtime.storage_options
        )
        reader: RangeRecordReader

        def finish(ok: bool) -> None:
            if not ok:
                rejects.abort()
                hashes.abort()
                return
            rejects.commit()
            hashes.commit(reader.stats.lines)
            self.read = Read.of(reader.policy.stats)

        reader = RangeRecordReader(
            self.file(self.spec.input), rng, rejects=rejects, finish=finish, keep=hashes.add
        )
        return reader

    def output(self, name: str) -> str:
        """Where this attempt writes output ``name``. With ``outputs["staging"]`` the fenced outputs
        (approved, rejected; an infer job's inferred) go to ``<staging>/<job>/<attempt>/<name>.jsonl.zst``,
        and the round's close moves one attempt's files to their final URIs (``outputs[name]``);
        without it, straight there."""
        outputs = self.spec.outputs
        staging = outputs.get("staging")
        if not staging or name not in fenced_outputs(self.spec.kind):
            return outputs[name]
        uri = staged_output(staging, outputs["manifest"], self.attempt, name)
        self.committed[name] = uri
        return uri

    async def generate(
        self,
        requests: list[GenerationRequest],
        costs: list[float] | None = None,
        *,
        chunk: ChunkFigures | None = None,
    ) -> list[GenerationResult]:
        """The worker's shared batcher, with this job's token usage counted (``costs``: the
        requests' :meth:`Runtime.estimate`, if known), into ``chunk``'s when given."""
        results = await self.runtime.generate(requests, costs)
        tokens = self.tokens if chunk is None else chunk.tokens
        for r in results:
            tokens["prompt"] += r.prompt_tokens
            tokens["completion"] += r.completion_tokens
        return results

    async def score(
        self, requests: list[ScoreRequest], *, chunk: ChunkFigures | None = None
    ) -> list[ScoreResult]:
        """The worker's shared batcher for a scoring model, this job's tokens counted as in
        :meth:`generate` (a scored text's are all prompt tokens)."""
        results = await self.runtime.score(requests)
        tokens = self.tokens if chunk is None else chunk.tokens
        tokens["prompt"] += sum(r.prompt_tokens for r in results)
        return results

    def scorer(self, chunk: ChunkFigures | None = None) -> Scorer | None:
        """The worker's scoring model for this job's judge (``None``: the worker generates)."""
        model = self.runtime.engine.scoring
        if model is None:
            return None

        async def score(requests: list[ScoreRequest]) -> list[ScoreResult]:
            return await self.score(requests, chunk=chunk)

        return Scorer(model, score, self.params.conversation)

    def record_id(self, record: Mapping[str, Any]) -> str:
        rid = record.get(self.params.id_field, record.get("custom_id"))
        return str(rid)
