"""A run's first step: its settings checked, its input sharded (round 0's pending set), a Parquet
run's output columns pinned and ``run.json`` stored; :func:`run_key`, the part of every job id that
names the run."""

from __future__ import annotations

import hashlib
from typing import Any

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_run_config
from airflow_batchinfer.state.layout import RunLayout, output_stem
from airflow_batchinfer.storage import files, shard_dataset
from airflow_batchinfer.storage.input_parts import InputParts
from airflow_batchinfer.storage.jsonl_dir import DEFAULT_BYTES_PER_SHARD
from airflow_batchinfer.storage.location import StorageOptions, join, resolve
from airflow_batchinfer.storage.parquet_columns import decide, read_columns, write_columns
from airflow_batchinfer.storage.range_plan import shard_ranges
from airflow_batchinfer.storage.record_file import is_parquet
from airflow_batchinfer.storage.shard_ref import RangeRef, ShardRef
from airflow_batchinfer.storage.sharding import ShardingResult


def run_key(run_root: str) -> str:
    """Part of every job id: warm workers shared by several runs never confuse their jobs."""
    return hashlib.sha256(resolve(run_root).uri.encode()).hexdigest()[:10]


def prepare_run(
    cfg: RunConfig, so: StorageOptions | None = None, *, lanes: int = 0, listed: InputParts | None = None
) -> ShardingResult:
    """A run's first step: validate the settings, shard the input (reused when identical; the last
    ranges tapered for round 0's ``lanes``, 0: none) and store ``run.json``, its ``id_field`` the
    one sharding found (``result.id_field``: a caller going on with ``cfg`` sets it too). ``listed``:
    the input as the caller listed it (the shard task's owner check), planned without listing it again."""
    cfg.validate()
    layout = RunLayout.of(cfg.run_root, cfg.data.output_format)
    check_output_format(layout, cfg.data.output_format, so)
    result = shard_input(cfg, layout, so, lanes, listed)
    pin_output_columns(layout, result.shards, so)  # before run.json: its absence marks a new run
    write_run_config(cfg.replace(id_field=result.id_field), so)
    return result


def check_output_format(layout: RunLayout, output_format: str, so: StorageOptions | None) -> None:
    """Refuse to go on with a run whose outputs are in another format than ``output_format``: its
    jobs would all run again, and their files would double the rows of the ones already there."""
    for folder in (layout.results, layout.dropped, layout.rejected_dir(0)):
        other = sorted(n for n in files.names(folder, so) if output_stem(n) and not n.endswith(layout.suffix))
        if other:
            raise ConfigError(
                f"{join(folder, other[0])}: this run's outputs are not {output_format}; a run keeps the "
                "output_format it started with: set it back, or start a new run (another run_name)"
            )


def pin_output_columns(
    layout: RunLayout, shards: list[ShardRef | RangeRef], so: StorageOptions | None
) -> None:
    """Decide a new Parquet run's input columns from its first shard's first file and pin them
    (:mod:`~airflow_batchinfer.storage.parquet_columns`): every output file of every round then has
    that schema. Pinned ones are kept (a resumed run); a run with ``run.json`` but none was planned
    before columns were pinned, and keeps the fixed schema its files already have."""
    if not is_parquet(layout.suffix) or not shards or read_columns(layout.output_columns, so) is not None:
        return
    if files.exists(layout.run_config, so):
        return
    first = shards[0]
    pieces = first.pieces if isinstance(first, RangeRef) else None
    write_columns(layout.output_columns, decide(pieces[0].uri if pieces else first.uri, so), so)


def shard_input(
    cfg: RunConfig,
    layout: RunLayout,
    so: StorageOptions | None,
    lanes: int = 0,
    listed: InputParts | None = None,
) -> ShardingResult:
    """Round 0's shards: byte ranges of the input (plain JSONL, multi-frame zstd: nothing copied,
    see :mod:`~airflow_batchinfer.storage.range_plan`; the last ones tapered for ``lanes`` lanes), or,
    for input that cannot be split (one zstd frame), shards copied from it as before. With
    ``fan_out`` either holds every record once per arm (:mod:`~airflow_batchinfer.storage.fan_out`):
    the ranges when read, the copy as written."""
    how: dict[str, Any] = {
        "records_per_shard": cfg.sharding.records_per_shard,
        "id_field": cfg.data.id_field,
        "assign_ids": cfg.data.assign_ids,
        "rejects": layout.rejects,
        "storage_options": so,
        "max_line_bytes": cfg.data.max_line_bytes,
        "max_id_bytes": cfg.data.max_id_bytes,
        "fan_out": cfg.prompt.fan_out_arms(),
    }
    planned = shard_ranges(
        cfg.data.input,
        layout.input,
        max_bytes_per_shard=DEFAULT_BYTES_PER_SHARD,
        lanes=lanes,
        listed=listed,
        **how,
    )
    if planned is None:  # copied as shards, read the same way
        return shard_dataset(cfg.data.input, layout.input, **how)
    shards, manifest, reused = planned
    return ShardingResult(
        shards=[*shards],
        counts=manifest.counts or {},
        id_field=manifest.id_field or cfg.data.id_field or "id",
        rejects_uri=manifest.rejects_uri or "",
        reused=reused,
    )
