"""airflow-batchinfer: LLM batch inference at 100M-sample scale on Apache Airflow.

The public API is what this module exports (``__all__``): the DAG factory and its results asset, a
run's settings, the operators the factory builds a DAG from, the deployment's trigger limits and the
errors. Each is imported on first use, so ``import airflow_batchinfer`` loads nothing else (no
Airflow). Every other module is internal: documented, but free to change between releases.

The worker side (``storage``, ``batching``, ``engines``, ``worker``, ``rpc``) imports without Airflow;
the Airflow side (``hooks``, ``triggers``, ``assets``, ``operators``, ``dag_factory``) needs the
``airflow`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_batchinfer.lazy import exports

if TYPE_CHECKING:
    from airflow_batchinfer.assets import results_asset
    from airflow_batchinfer.dag_factory import build_batch_inference_dag
    from airflow_batchinfer.exceptions import (
        AuthenticationError,
        BadJobError,
        BatcherError,
        BatchInferError,
        ConfigError,
        CorruptFileError,
        EngineAsleep,
        ForbiddenError,
        JobConflict,
        JobFailed,
        JobNotFound,
        JobTimeout,
        MalformedRecordError,
        OutputExistsError,
        OverQuickBudget,
        ParamsRefused,
        PromptError,
        ReviewClosedError,
        ReviewError,
        RpcError,
        SleepRefused,
        StorageError,
        WorkerBusy,
        WorkerUnavailable,
    )
    from airflow_batchinfer.operators.lanes import JudgeLanesOperator, ShardLaneOperator
    from airflow_batchinfer.operators.pool import PoolSetupOperator, PoolTeardownOperator
    from airflow_batchinfer.operators.report import PreflightOperator, RunReportOperator
    from airflow_batchinfer.operators.rounds import CloseRoundOperator, RoundControllerOperator
    from airflow_batchinfer.operators.shard import ShardDatasetOperator
    from airflow_batchinfer.spec.limits import TriggerLimits
    from airflow_batchinfer.state.config import RunConfig

__version__ = "0.1.0"

_EXCEPTIONS = (
    "AuthenticationError",
    "BadJobError",
    "BatchInferError",
    "BatcherError",
    "ConfigError",
    "CorruptFileError",
    "EngineAsleep",
    "ForbiddenError",
    "JobConflict",
    "JobFailed",
    "JobNotFound",
    "JobTimeout",
    "MalformedRecordError",
    "OutputExistsError",
    "OverQuickBudget",
    "ParamsRefused",
    "PromptError",
    "ReviewClosedError",
    "ReviewError",
    "RpcError",
    "SleepRefused",
    "StorageError",
    "WorkerBusy",
    "WorkerUnavailable",
)
__all__ = [
    "AuthenticationError",
    "BadJobError",
    "BatchInferError",
    "BatcherError",
    "CloseRoundOperator",
    "ConfigError",
    "CorruptFileError",
    "EngineAsleep",
    "ForbiddenError",
    "JobConflict",
    "JobFailed",
    "JobNotFound",
    "JobTimeout",
    "JudgeLanesOperator",
    "MalformedRecordError",
    "OutputExistsError",
    "OverQuickBudget",
    "ParamsRefused",
    "PoolSetupOperator",
    "PoolTeardownOperator",
    "PreflightOperator",
    "PromptError",
    "ReviewClosedError",
    "ReviewError",
    "RoundControllerOperator",
    "RpcError",
    "RunConfig",
    "RunReportOperator",
    "ShardDatasetOperator",
    "ShardLaneOperator",
    "SleepRefused",
    "StorageError",
    "TriggerLimits",
    "WorkerBusy",
    "WorkerUnavailable",
    "build_batch_inference_dag",
    "results_asset",
]
# Imported on first use: the operators and the factory need Airflow, the rest does not.
__getattr__, __dir__ = exports(
    __name__,
    __all__,
    {
        "dag_factory": ("build_batch_inference_dag",),
        "assets": ("results_asset",),
        "state.config": ("RunConfig",),
        "spec.limits": ("TriggerLimits",),
        "operators.shard": ("ShardDatasetOperator",),
        "operators.pool": ("PoolSetupOperator", "PoolTeardownOperator"),
        "operators.lanes": ("ShardLaneOperator", "JudgeLanesOperator"),
        "operators.rounds": ("RoundControllerOperator", "CloseRoundOperator"),
        "operators.report": ("PreflightOperator", "RunReportOperator"),
        "exceptions": _EXCEPTIONS,
    },
)
