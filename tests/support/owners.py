"""A run root's ``owner.json`` written as it is, for tests that start from a given owner (the
package only ever writes one through :func:`~airflow_batchinfer.state.owner.claim`)."""

from __future__ import annotations

from typing import Any

from airflow_batchinfer.state.owner import OWNER_VERSION, RunIdentity, owner_record, owner_uri
from airflow_batchinfer.storage.json_doc import write_json
from airflow_batchinfer.storage.location import StorageOptions, resolve


def write_owner(
    run_root: str, me: RunIdentity, so: StorageOptions | None = None, *, creator: str | None = None,
    previous: RunIdentity | None = None, extra: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Record ``me`` as ``run_root``'s owner, unconditionally; the record, as read back."""
    record = owner_record(me, creator=creator, previous=previous, extra=extra)
    write_json(resolve(owner_uri(run_root), so), record, schema_version=OWNER_VERSION)
    return {"schema_version": OWNER_VERSION, **record}
