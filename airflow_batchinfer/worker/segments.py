"""The segment log of one shard job: resume inside a shard (``infer``, ``judge``, ``infer_judge``).

A job spec with ``outputs["segments"]`` (a directory) commits its output chunk by chunk, in the
chunks it reads its input in (the first :data:`~airflow_batchinfer.worker.jobs.chunks.FIRST_CHUNK`
records, then ``chunk_size`` each). A chunk's *segment* is, per output name of the kind, one file of
that chunk's rows, encoded like the final output (``.jsonl.zst``: one zstd frame), and last its
document (:class:`SegmentDoc`), the commit point::

    <segments>/chunk-000007.<attempt>.<output>.jsonl.zst    (none for an output without rows)
    <segments>/chunk-000007.<attempt>.json

The document holds the chunk's input record count and id digest, per output its rows, digest and
file, and the chunk's deltas of the job's tally, tokens and reason groups. Each attempt (a start of
the job, :attr:`JobContext.attempt`) writes only names with its own token, so two copies of one job
never write the same file, and a segment is usable only once its document exists.

A later attempt of the same job (same job id, fingerprint and ``chunk_size``) resumes after the
longest prefix of chunks 0..m-1 that each have a document (:meth:`SegmentLog.load`); reading its
input as usual it checks each such chunk's records and ids against the document, skips its
inference and judging, and folds the document's figures into the job's. The final outputs are the
byte concatenation of the chosen segments' files, so they hold exactly what the digests say, and the
completion manifest is what an undisturbed run writes (plus its tally's ``resume``: records and
segments).
Each attempt marks itself live (``attempt-<attempt>.live``) before it lists the directory and
unmarks itself when it ends. Once its manifest is written (``JobContext.cleanup``) an attempt deletes
the directory's documents, then its files, only while no other attempt is marked live
(:meth:`SegmentLog.clear`): a second copy of the job still running (an Airflow retry while the first
runs elsewhere) reads its own and the others' files until it assembles, and one starting meanwhile
finds either the documents with their files kept for it, or neither. A killed attempt's mark stays,
so the files then wait for the round's close, which deletes a shard's segments once it settles the
shard.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, TypeAdapter

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.judges.reasons import ReasonGroups
from airflow_batchinfer.state.docs.io import Digest, DocModel, read_model
from airflow_batchinfer.state.tally import Tally
from airflow_batchinfer.storage import confine, files
from airflow_batchinfer.storage.atomic import AtomicSink, is_temp_name
from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.storage.json_doc import write_bytes
from airflow_batchinfer.storage.jsonl_file import JsonlFile
from airflow_batchinfer.storage.lines import is_zstd
from airflow_batchinfer.storage.location import Location, StorageOptions, join, resolve
from airflow_batchinfer.storage.records import Record

log = logging.getLogger("airflow_batchinfer.worker")

SEGMENTS_VERSION = 2  # of the segment documents (2: counts a Tally)
COPY_BYTES = 1024 * 1024  # assembly copies segment files in blocks of this size
_DOC_NAME = re.compile(r"^chunk-(\d{6,})\.([A-Za-z0-9_-]+)\.json$")
_REMEDY = "delete the segments directory to recompute the shard"


def live_name(attempt: str) -> str:
    """The mark of an attempt that runs now (or was killed while it ran)."""
    return f"attempt-{attempt}.live"


def doc_name(chunk: int, attempt: str) -> str:
    return f"chunk-{chunk:06d}.{attempt}.json"


def file_name(chunk: int, attempt: str, output: str, final_uri: str) -> str:
    """A segment's file of ``output``: compressed like the final output it is assembled into."""
    suffix = ".jsonl.zst" if is_zstd(final_uri) else ".jsonl"
    return f"chunk-{chunk:06d}.{attempt}.{output}{suffix}"


# --------------------------------------------------------------------------------------- tallies
@dataclass
class ChunkFigures:
    """What one chunk of a job counted: its ``tally``, ``tokens``, the ``ids`` it read (``input``)
    and emitted per output, and the ``reason_groups`` of the rows it rejected. Kept per chunk because
    chunk k+1 is processed while chunk k is written: each chunk's own figures go into its segment
    document, and into the job's once the chunk is written (:meth:`JobContext.absorb`)."""

    tally: Tally = field(default_factory=Tally)
    tokens: Counter[str] = field(default_factory=Counter)
    ids: dict[str, IdDigest] = field(default_factory=dict)
    reason_groups: ReasonGroups = field(default_factory=ReasonGroups)

    def count_ids(self, name: str, ids: Iterable[Any]) -> None:
        digest = self.ids.get(name)
        if digest is None:
            digest = self.ids[name] = IdDigest()
        digest.add_many(ids)

    @classmethod
    def of(cls, doc: SegmentDoc) -> ChunkFigures:
        """A committed segment's figures, as its chunk counted them."""
        ids = {"input": doc.input.digest(), **{n: o.ids.digest() for n, o in doc.outputs.items()}}
        return cls(
            doc.counts.model_copy(deep=True), Counter(doc.tokens), ids, ReasonGroups(doc.reason_groups)
        )


# ------------------------------------------------------------------------------------- documents
class SegmentOutput(BaseModel):
    """One output's part of a segment: its rows, their id digest and the file holding them (none
    when the chunk gave that output no rows)."""

    model_config = ConfigDict(extra="forbid")
    rows: int
    ids: Digest
    file: str | None = None


class SegmentDoc(DocModel):
    """A committed segment (``chunk-NNNNNN.<attempt>.json``): written after its files, so a segment
    exists complete or not at all. ``job_id``, ``fingerprint`` and ``chunk_size`` name the job and
    its chunking: another job's segments (other settings, another input version) are never used."""

    VERSION: ClassVar[int] = SEGMENTS_VERSION

    job_id: str
    fingerprint: str
    attempt: str
    chunk: int
    chunk_size: int
    records: int  # input records in the chunk
    input: Digest  # the chunk's input ids
    outputs: dict[str, SegmentOutput]
    counts: Tally
    tokens: dict[str, int]
    reason_groups: dict[str, int]  # all of the chunk's groups (a chunk has few): the job caps them
    committed_at: float


_SEGMENT = TypeAdapter(SegmentDoc)


def read_segment(uri: str, so: StorageOptions | None = None) -> SegmentDoc | None:
    """The segment document at ``uri`` (``None``: there is none). Unreadable ones are errors."""
    return read_model(_SEGMENT, uri, "segment document", so, version=SEGMENTS_VERSION, remedy=_REMEDY)


@dataclass(frozen=True)
class JobKey:
    """What a segment must match to be used: the job and how it chunks its input."""

    job_id: str
    fingerprint: str
    chunk_size: int
    outputs: Mapping[str, str]  # output name -> the final URI its segments are assembled into
    what: str  # the job, for messages ("job J (shard S)")


class SegmentLog:
    """One job's segment directory ``uri``, for the attempt ``attempt`` (sync: call in a thread)."""

    def __init__(self, uri: str, key: JobKey, attempt: str, storage_options: StorageOptions | None) -> None:
        self.uri = uri
        self.key = key
        self.attempt = attempt
        self.so = storage_options
        self.committed = 0  # segments this attempt wrote

    # ------------------------------------------------------------------------------------ resume
    def load(self) -> list[SegmentDoc]:
        """The longest prefix of chunks 0..m-1 that each have a usable document (of any attempt;
        of several for one chunk, the smallest token's). A chunk without one ends the prefix; a
        file without its document is never looked at; another job's documents are left alone.
        First this attempt marks itself live: no other copy that finishes meanwhile deletes the
        files it is about to choose."""
        write_bytes(self._loc(live_name(self.attempt)), b"")
        names = set(self.names())
        by_chunk: dict[int, list[str]] = {}
        for name in names:
            m = _DOC_NAME.match(name)
            if m is not None:
                by_chunk.setdefault(int(m.group(1)), []).append(m.group(2))
        prefix: list[SegmentDoc] = []
        while (tokens := by_chunk.get(len(prefix))) is not None:
            doc = next((d for t in sorted(tokens) if (d := self._usable(len(prefix), t, names))), None)
            if doc is None:
                break
            prefix.append(doc)
        if prefix:
            log.info(
                "%s: resuming after %d committed segments (%d records)",
                self.key.what,
                len(prefix),
                sum(d.records for d in prefix),
            )
        return prefix

    def _usable(self, chunk: int, token: str, names: set[str]) -> SegmentDoc | None:
        uri = join(self.uri, doc_name(chunk, token))
        try:
            doc = read_segment(uri, self.so)
        except StorageError as exc:  # a newer release's or a damaged document: recompute that chunk
            log.warning("%s: segment %s not used: %s", self.key.what, uri, exc)
            return None
        if doc is None:  # removed since it was listed
            return None
        key = self.key
        if (doc.job_id, doc.fingerprint, doc.chunk_size) != (key.job_id, key.fingerprint, key.chunk_size):
            return None  # another job's (other settings or input version): not this one's to use
        expected = {n: file_name(chunk, token, n, u) for n, u in key.outputs.items()}
        problem = None
        if (doc.chunk, doc.attempt) != (chunk, token) or set(doc.outputs) != set(expected):
            problem = "its chunk, attempt or outputs are not those its name says"
        elif doc.records != doc.input.count or sum(o.rows for o in doc.outputs.values()) != doc.records:
            problem = f"its {doc.records} records do not add up to its input ids and rows"
        else:
            for n, out in doc.outputs.items():
                if out.file != (expected[n] if out.rows else None) or out.ids.count != out.rows:
                    problem = f"its {n} file {out.file!r} is not {expected[n]!r} with {out.rows} rows"
                elif out.file is not None and out.file not in names:
                    problem = f"its {n} file {out.file} is missing"
                if problem:
                    break
        if problem is not None:
            log.warning("%s: segment %s not used: %s", self.key.what, uri, problem)
            return None
        return doc

    def names(self) -> list[str]:
        """The directory's names as stored now: object stores' clients cache listings (s3fs), and a
        warm worker lists a job's directory again at each attempt, after other workers wrote there."""
        loc = resolve(self.uri, self.so)
        loc.fs.invalidate_cache(loc.path)
        return files.names(self.uri, self.so)

    def discard(self, docs: Sequence[SegmentDoc]) -> None:
        """Delete the documents of segments that turned out not to match the input read now: no
        later attempt chooses them again (their files go with the directory)."""
        for doc in docs:
            files.remove(self._loc(doc_name(doc.chunk, doc.attempt)).uri, self.so)

    # ------------------------------------------------------------------------------------ commit
    def commit(
        self,
        chunk: int,
        records: int,
        rows: list[Record],
        split: Callable[[list[Record]], dict[str, list[Record]]],
        figures: ChunkFigures,
    ) -> SegmentDoc:
        """Write chunk ``chunk``'s segment: each output's rows (``split`` of ``rows``), then its
        document. Encoding and compression happen here, in the caller's thread."""
        parts = split(rows)
        outputs: dict[str, SegmentOutput] = {}
        for name, final in self.key.outputs.items():
            part = parts.get(name, [])
            fname = file_name(chunk, self.attempt, name, final) if part else None
            if fname is not None:
                with JsonlFile(join(self.uri, fname), storage_options=self.so).writer_sync() as w:
                    w.write_many(part)
            ids = Digest.of(figures.ids.get(name, IdDigest()))
            outputs[name] = SegmentOutput(rows=len(part), ids=ids, file=fname)
        doc = SegmentDoc(
            job_id=self.key.job_id,
            fingerprint=self.key.fingerprint,
            attempt=self.attempt,
            chunk=chunk,
            chunk_size=self.key.chunk_size,
            records=records,
            input=Digest.of(figures.ids.get("input", IdDigest())),
            outputs=outputs,
            counts=figures.tally,
            tokens=dict(figures.tokens),
            reason_groups=figures.reason_groups.as_dict(limit=max(len(figures.reason_groups), 1)),
            committed_at=time.time(),
        )
        write_bytes(resolve(join(self.uri, doc_name(chunk, self.attempt)), self.so), doc.encode())
        self.committed += 1
        return doc

    # ---------------------------------------------------------------------------------- assembly
    def assemble(self, docs: Sequence[SegmentDoc], name: str, target: str) -> None:
        """Write output ``name`` at ``target`` (atomically): the bytes of the chosen segments' files
        for it, in chunk order (concatenated zstd frames are one valid stream; every reader reads
        them all). A file gone since (removed by the round's close, or by this attempt's own
        :meth:`clear`) fails the job with the reason."""
        parts = [(d, d.outputs[name].file) for d in docs if d.outputs[name].file]
        if not parts:  # no rows: the empty file an undisturbed job writes
            JsonlFile(target, storage_options=self.so).writer_sync().commit()
            return
        sink = AtomicSink(resolve(target, self.so))
        try:
            for doc, fname in parts:
                assert fname is not None
                loc = resolve(join(self.uri, fname), self.so)
                try:
                    with loc.fs.open(loc.path, "rb") as src:
                        confine.check_file(src, loc)
                        while block := src.read(COPY_BYTES):
                            sink.write(block)
                except FileNotFoundError as exc:
                    raise StorageError(
                        f"{self.key.what}: segment file {loc.uri} (chunk {doc.chunk}, attempt "
                        f"{doc.attempt}) vanished before this attempt assembled its output: the round's "
                        "close settled the shard meanwhile, or the segments directory was deleted. Nothing "
                        "to do if the job's completion manifest exists; otherwise resubmit the job (it "
                        "recomputes the shard)"
                    ) from exc
        except BaseException:
            sink.abort()
            raise
        sink.commit()

    def _loc(self, name: str = "") -> Location:
        """The directory (or its file ``name``), checked against the job's prefixes where local."""
        loc = resolve(join(self.uri, name) if name else self.uri, self.so)
        if loc.is_local:  # a job's write or delete must not follow a swapped link out of its prefixes
            confine.check_path(loc.path, loc.uri)
        return loc

    def leave(self) -> None:
        """Unmark this attempt (it ended without completing the job): its segments stay for the next."""
        loc = self._loc(live_name(self.attempt))
        files.remove(loc.uri, self.so)

    def clear(self) -> None:
        """The job's manifest is written: unmark this attempt and delete what the directory held,
        unless another attempt is marked live (it may still read files here; the last to finish
        deletes them, or the round's close does). Documents go first, then, unless an attempt marked
        itself live meanwhile, the files: an attempt that lists after the documents are gone chooses
        none of them, and one that listed before is marked by the second look, so the files it chose
        stay. Only what the first listing held is deleted (never a temporary file, such as another
        attempt's mark being written): the directory is never removed whole while a copy that
        starts now may be writing in it. Locally an empty directory stays for the round's close."""
        self.leave()
        held = [n for n in self.names() if not is_temp_name(n)]
        if self._others_live(held):
            return
        docs = [n for n in held if _DOC_NAME.match(n)]
        self._remove(docs)
        if not self._others_live(self.names()):
            self._remove(sorted(set(held) - set(docs)))

    def _remove(self, names: list[str]) -> None:
        for name in names:
            self._loc(name)  # local: each path still inside the job's prefixes
        files.remove_all(self.uri, names, self.so)

    def _others_live(self, names: Iterable[str]) -> bool:
        others = [n for n in names if n.startswith("attempt-") and n.endswith(".live")]
        if others:
            log.info("%s: segments kept for %d other live attempts: %s", self.key.what, len(others), self.uri)
        return bool(others)
