"""What a job's outputs depend on: shared by the worker (which writes it into the completion
manifest) and the client (which reuses a finished job only when its fingerprint still matches)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.storage.jsonl_file import JsonlFile
from airflow_batchinfer.storage.location import StorageOptions

# The version of what job ids and fingerprints hash. Bump it to change every job's id and fingerprint
# on purpose (a new serialisation of params: state.params.JobParams.wire); version 1 adds nothing to
# the hash, so the jobs of runs from before it keep their ids and fingerprints. A new param needs no
# bump: at its default it is left out of the wire (JobParams).
FINGERPRINT_VERSION = 1

# Parameters that change how a job runs but not what it produces (left out of fingerprints).
NON_SEMANTIC = ("chunk_size", "input_records", "checkpoint_every", "checkpoint_interval_s", "fingerprint")
# Outputs that hold a job's progress, not its results (left out of job ids: a job id and its
# finished manifest stay what they were before the output existed).
NON_SEMANTIC_OUTPUTS = ("segments",)


def fingerprint(spec: JobSpec, engine: Mapping[str, Any], input_info: Mapping[str, Any]) -> str:
    """Engine and model, kind, templates, judge, sampling, and the input file's identity."""
    params = {k: v for k, v in spec.params.items() if k not in NON_SEMANTIC}
    payload = {
        "kind": spec.kind,
        "engine": dict(engine),
        "params": params,
        "input": {
            "uri": spec.input,
            "size": input_info.get("size"),
            "version": str(input_info.get("ETag") or input_info.get("mtime") or ""),
        },
    }
    from airflow_batchinfer.judges.llm import VERDICT_SCHEMA, schema_verdicts

    if schema_verdicts(spec.params.get("judge"), engine.get("engine")):
        payload["verdict_schema"] = VERDICT_SCHEMA  # only then: other jobs keep the fingerprints they had
    return _digest(payload)


def spec_input_info(spec: JobSpec, storage_options: StorageOptions | None) -> dict[str, Any]:
    """What ``spec``'s job id and fingerprint pin its input to (:func:`pin_input`, :func:`fingerprint`):
    the stored file's size and version, or for a part input's range shard (``params.input_range``
    with pieces) a hash of its pieces (the parts' URIs, spans and the versions planning pinned; the
    job refuses a part that changed since). Its input is then the parts' root directory, whose stat
    changes with any file added beside them: it pins nothing the job reads. Raises
    :class:`FileNotFoundError` for a file that is not there."""
    rng = spec.params.get("input_range")
    pieces = rng.get("pieces") if isinstance(rng, Mapping) else None
    if isinstance(pieces, list) and pieces:
        digest = hashlib.sha256(json.dumps(pieces, sort_keys=True, default=str).encode()).hexdigest()
        return {"size": len(pieces), "ETag": f"pieces:{digest[:32]}"}  # size: the piece count
    return JsonlFile(spec.input, storage_options=storage_options).info()


def input_version(input_info: Mapping[str, Any]) -> str:
    return f"{input_info.get('size')}:{input_info.get('ETag') or input_info.get('mtime') or ''}"


def pin_input(spec: JobSpec, input_info: Mapping[str, Any]) -> JobSpec:
    """``spec`` for this version of its input: ``params.input_version`` set and the job id's last part
    (its :func:`spec_key`) recomputed. A warm worker remembers finished jobs by id; without this, a
    rewritten input (a re-run upstream round) would be answered with the old job's result."""
    pinned = spec.model_copy(update={"params": {**spec.params, "input_version": input_version(input_info)}})
    pinned.job_id = f"{spec.job_id.rsplit('-', 1)[0]}-{spec_key(pinned)}"
    return pinned


def spec_key(spec: JobSpec) -> str:
    """A short hash of what the client asks for (kind, input, outputs, semantic params): part of job
    ids, so a changed request is a new job rather than a 409 from a worker that remembers the old."""
    params = {k: v for k, v in spec.params.items() if k not in NON_SEMANTIC}
    outputs = {k: v for k, v in spec.outputs.items() if k not in NON_SEMANTIC_OUTPUTS}
    payload = {"kind": spec.kind, "input": spec.input, "outputs": outputs, "params": params}
    return _digest(payload)[:10]


def _digest(payload: dict[str, Any]) -> str:
    """The hash of ``payload`` at :data:`FINGERPRINT_VERSION` (from 2 on, the version is hashed too)."""
    if FINGERPRINT_VERSION > 1:
        payload = {**payload, "fingerprint_version": FINGERPRINT_VERSION}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
