"""``batchinfer shard`` and ``batchinfer recompact``: a dataset's shards."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


def add_commands(sub: Any) -> None:
    """``shard`` and ``recompact``, with their common flags."""
    from airflow_batchinfer.spec.settings import setting
    from airflow_batchinfer.storage.jsonl_dir import DEFAULT_BYTES_PER_SHARD

    def common(p: argparse.ArgumentParser) -> None:
        rps = setting("records_per_shard")
        p.add_argument(
            "--records-per-shard",
            type=rps.flag_kwargs()["type"],
            default=rps.default,
            help=f"records per shard (default {rps.default:,}, as a run's records_per_shard)",
        )
        p.add_argument(
            "--max-bytes-per-shard",
            type=int,
            default=DEFAULT_BYTES_PER_SHARD,
            help="uncompressed bytes per shard (default 256 MiB)",
        )
        p.add_argument("--compression", choices=["zstd", "none"], default="zstd")
        p.add_argument(
            "--overwrite", action="store_true", help="replace shards in DST that another run wrote"
        )
        p.add_argument(
            "--storage-option",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="fsspec option, e.g. endpoint_url=http://127.0.0.1:8333 (repeatable); "
            "credentials default to the environment",
        )

    p = sub.add_parser("shard", help="split one JSONL(.zst) file into part-NNNNN.jsonl.zst shards")
    p.add_argument("src", help="input file: path or URI (.jsonl, .jsonl.zst)")
    p.add_argument("dst", help="output directory: path or URI")
    common(p)
    p.add_argument(
        "--id-field", default=None, help="unique id field (default: id, or custom_id for OpenAI batch files)"
    )
    p.add_argument("--assign-ids", action="store_true", help="give records without an id '<file>:<line>'")
    p.add_argument("--on-error", choices=["quarantine", "raise", "skip"], default="quarantine")
    p.add_argument("--rejects", default=None, help="where bad lines go (default: rejects/ beside DST)")
    for bound in (setting("max_line_bytes"), setting("max_id_bytes")):  # as a run's input bounds
        p.add_argument(str(bound.flag), **bound.flag_kwargs())
    p.set_defaults(func=_cmd_shard)

    p = sub.add_parser("recompact", help="rewrite a directory of small shards into full shards")
    p.add_argument("src", help="directory of shards: path or URI")
    p.add_argument("dst", help="output directory: path or URI")
    common(p)
    p.add_argument("--workers", type=int, default=4, help="parallel writers (default 4)")
    p.set_defaults(func=_cmd_recompact)


def _storage_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``--storage-option endpoint_url=http://127.0.0.1:8333`` → fsspec options (JSON values allowed)."""
    from airflow_batchinfer.worker.settings import parse_options

    return parse_options(list(pairs))


def _source_size(uri: str, options: dict[str, Any]) -> int | None:
    from airflow_batchinfer.storage import JsonlFile

    f = JsonlFile(uri, storage_options=options)
    return None if f.compressed else int(f.info().get("size") or 0) or None


def _cmd_shard(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_batchinfer.progress import ProgressBar
    from airflow_batchinfer.storage import shard_dataset

    options = _storage_options(args.storage_option)
    with ProgressBar("shard", _source_size(args.src, options)) as bar:
        result = shard_dataset(
            args.src,
            args.dst,
            records_per_shard=args.records_per_shard,
            max_bytes_per_shard=args.max_bytes_per_shard,
            id_field=args.id_field,
            assign_ids=args.assign_ids,
            on_error=args.on_error,
            max_line_bytes=args.max_line_bytes,
            max_id_bytes=args.max_id_bytes,
            rejects=args.rejects,
            compression=args.compression,
            storage_options=options,
            overwrite=args.overwrite,
            progress=bar,
        )
    return {
        "dst": args.dst,
        "shards": len(result.shards),
        "counts": result.counts,
        "id_field": result.id_field,
        "rejects": result.rejects_uri,
        "reused": result.reused,
        "seconds": round(result.seconds, 3),
    }


def _cmd_recompact(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_batchinfer.progress import ProgressBar
    from airflow_batchinfer.storage import recompact

    with ProgressBar("recompact") as bar:
        result = recompact(
            args.src,
            args.dst,
            records_per_shard=args.records_per_shard,
            max_bytes_per_shard=args.max_bytes_per_shard,
            workers=args.workers,
            compression=args.compression,
            storage_options=_storage_options(args.storage_option),
            overwrite=args.overwrite,
            progress=bar,
        )
    return {
        "dst": args.dst,
        "shards": len(result.shards),
        "records": result.records,
        "sources": result.sources,
        "reused": result.reused,
        "seconds": round(result.seconds, 3),
    }
