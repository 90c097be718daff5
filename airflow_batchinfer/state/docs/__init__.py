"""A run's documents in storage, one typed model each, read and written here: ``run.json`` (the run's
settings) and the generic versioned JSON docs (:mod:`.io`), each round slot's ``plan.json``
(:mod:`.plan`), each round's ``summary.json`` and ``failed/`` quarantine records (:mod:`.summary`),
the jobs' completion manifests, close's accepted docs and the jobs' last errors (:mod:`.jobs`), the
pending set as reviewers left it (:mod:`.reviewed`), the lanes' documents and claims (:mod:`.lanes`),
the judge's calibration (:mod:`.calibration`), the pre-flight's summary (:mod:`.preflight`) and the
run report (:mod:`.report`). The writer, every reader and the tests' fakes go through the same
models; unknown fields or versions are refused (no reader for an earlier version: 0.1.0's
pre-releases wrote version 1, which a new ``run_name`` leaves behind).

The review package reads these (and nothing else of the run package but its layout and settings),
and the worker writes its manifests through here, so this package imports nothing of
:mod:`airflow_batchinfer.run` but :mod:`~airflow_batchinfer.state.layout` and
:mod:`~airflow_batchinfer.state.config`: not the orchestration's settings, limits or gates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_batchinfer.lazy import exports

if TYPE_CHECKING:
    from airflow_batchinfer.state.docs.io import (
        DOC_VERSION,
        Digest,
        read_doc,
        read_run_config,
        write_doc,
        write_run_config,
    )
    from airflow_batchinfer.state.docs.jobs import (
        ACCEPTED_VERSION,
        ID_OUTPUTS,
        MANIFEST_VERSION,
        SWEEPING,
        SWEPT,
        AcceptedDoc,
        AcceptedJob,
        BatcherDelta,
        EngineTelemetry,
        GaugeSpan,
        JobError,
        JobFigures,
        JobManifest,
        QuarantinedJob,
        RepeatsLeftOut,
        Timings,
        parse_accepted,
        read_accepted,
        read_job_error,
        read_job_manifest,
        write_accepted,
        write_job_error,
        write_job_manifest,
    )
    from airflow_batchinfer.state.docs.plan import TAIL, Mode, Plan, read_plan, rounds_ran, slots, write_plan
    from airflow_batchinfer.state.docs.reviewed import review_applied, review_split
    from airflow_batchinfer.state.docs.summary import (
        AdapterApproval,
        Candidates,
        FailedShard,
        Invariant,
        Jury,
        JuryMember,
        RepeatedIds,
        Summary,
        UnreadablePart,
        WorkerTotals,
        read_failed,
        read_summary,
        write_failed,
        write_summary,
    )

__all__ = [
    "ACCEPTED_VERSION",
    "DOC_VERSION",
    "ID_OUTPUTS",
    "MANIFEST_VERSION",
    "SWEEPING",
    "SWEPT",
    "TAIL",
    "AcceptedDoc",
    "AcceptedJob",
    "AdapterApproval",
    "BatcherDelta",
    "Candidates",
    "Digest",
    "EngineTelemetry",
    "FailedShard",
    "GaugeSpan",
    "Invariant",
    "JobError",
    "JobFigures",
    "JobManifest",
    "Jury",
    "JuryMember",
    "Mode",
    "Plan",
    "QuarantinedJob",
    "RepeatedIds",
    "RepeatsLeftOut",
    "Summary",
    "Timings",
    "UnreadablePart",
    "WorkerTotals",
    "parse_accepted",
    "read_accepted",
    "read_doc",
    "read_failed",
    "read_job_error",
    "read_job_manifest",
    "read_plan",
    "read_run_config",
    "read_summary",
    "review_applied",
    "review_split",
    "rounds_ran",
    "slots",
    "write_accepted",
    "write_doc",
    "write_failed",
    "write_job_error",
    "write_job_manifest",
    "write_plan",
    "write_run_config",
    "write_summary",
]
# Imported on first use: importing one module of the package loads no other.
__getattr__, __dir__ = exports(
    __name__,
    __all__,
    {
        "io": ("DOC_VERSION", "Digest", "read_doc", "read_run_config", "write_doc", "write_run_config"),
        "jobs": (
            "ACCEPTED_VERSION",
            "ID_OUTPUTS",
            "MANIFEST_VERSION",
            "SWEEPING",
            "SWEPT",
            "AcceptedDoc",
            "AcceptedJob",
            "BatcherDelta",
            "EngineTelemetry",
            "GaugeSpan",
            "JobError",
            "JobFigures",
            "JobManifest",
            "QuarantinedJob",
            "RepeatsLeftOut",
            "Timings",
            "parse_accepted",
            "read_accepted",
            "read_job_error",
            "read_job_manifest",
            "write_accepted",
            "write_job_error",
            "write_job_manifest",
        ),
        "plan": ("TAIL", "Mode", "Plan", "read_plan", "rounds_ran", "slots", "write_plan"),
        "reviewed": ("review_applied", "review_split"),
        "summary": (
            "AdapterApproval",
            "Candidates",
            "FailedShard",
            "Invariant",
            "Jury",
            "JuryMember",
            "RepeatedIds",
            "Summary",
            "UnreadablePart",
            "WorkerTotals",
            "read_failed",
            "read_summary",
            "write_failed",
            "write_summary",
        ),
    },
)
