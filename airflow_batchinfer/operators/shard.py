"""``ShardDatasetOperator``: the run's first task. Validates the run settings, shards the input
(CPU; reused when an identical sharding exists), stores ``run.json`` and returns shard descriptors
(references and counts, never records)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowFailException

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.hooks.aws import storage_options_from_aws_conn
from airflow_batchinfer.layout import RunLayout
from airflow_batchinfer.rounds import prepare_run
from airflow_batchinfer.run_config import RunConfig
from airflow_batchinfer.storage import ShardDescriptor


def max_map_length() -> int:
    from airflow.configuration import conf

    return conf.getint("core", "max_map_length", fallback=1024)


class ShardDatasetOperator(BaseOperator):
    """:param config: the run settings (:class:`RunConfig` fields; templated, so DAG params fit).
    :param aws_conn_id: AWS connection for ``s3://`` input and run roots.
    :param max_map_length: refuse more shards than this (default: the deployment's
        ``[core] max_map_length``, since a round maps one task per shard)."""

    template_fields = ("config", "aws_conn_id")
    ui_color = "#fdf5e6"

    def __init__(
        self,
        *,
        config: dict[str, Any],
        aws_conn_id: str | None = None,
        max_map_length: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config = config
        self.aws_conn_id = aws_conn_id
        self.max_map_length = max_map_length

    def execute(self, context: Context) -> list[ShardDescriptor]:
        so = storage_options_from_aws_conn(self.aws_conn_id)
        try:
            cfg = RunConfig.from_dict(dict(self.config))
            self.log.info("sharding %s into %s (%d records per shard)", cfg.input,
                          RunLayout(cfg.run_root).input, cfg.records_per_shard)  # fmt: skip
            result = prepare_run(cfg, so, max_shards=self.max_map_length or max_map_length())
        except ConfigError as exc:
            raise AirflowFailException(f"bad run settings: {exc}") from exc
        self.log.info("%s%d shards, counts %s; quarantined lines in %s",
                      "reused: " if result.reused else "", len(result.shards), result.counts,
                      result.rejects_uri)  # fmt: skip
        return list(result.shards)
