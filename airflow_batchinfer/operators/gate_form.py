"""A review gate's form and answer in Airflow: the fields a reviewer may change with the answer, the
link to the run's review desk, and what an answer payload says (the choice, who gave it, the changed
fields)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Context, Param

from airflow_batchinfer.compat import review_desk_unavailable
from airflow_batchinfer.run.gate.body import desk_url
from airflow_batchinfer.run.gate.changes import GATE_CHANGES, GATE_SCHEMAS

# The gate's form: what a reviewer may change for the next rounds with the answer ("Continue with
# changes", run.gate.changes.GATE_CHANGES), with the run settings' schemas (GATE_SCHEMAS there: a
# gate accepts what a trigger accepts); each shows the value the next round would run with.
GATE_PARAM = "next_{}"


def gate_params() -> dict[str, Param]:
    about = "the next rounds' {} (change it to retry with another)"
    return {
        GATE_PARAM.format(k): Param(None, description=about.format(k), **v) for k, v in GATE_SCHEMAS.items()
    }


def desk(context: Context) -> str | None:
    """This DAG run's review desk (the plugin's page in the Airflow UI); none on an Airflow older
    than the desk needs."""
    from airflow.configuration import conf

    ti = context.get("ti") if hasattr(context, "get") else None
    base = conf.get("api", "base_url", fallback=None)
    if ti is None or not base or review_desk_unavailable():
        return None
    return desk_url(base, ti.dag_id, ti.run_id)


def read_answer(payload: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """A gate's answer (the HITL payload): the option chosen, who chose it (``the timeout
    default`` when nobody did) and the form's change fields as answered (``None``: unchanged)."""
    user = payload.get("responded_by_user") or {}
    who = (user.get("name") or user.get("id")) if isinstance(user, dict) else user
    fields = payload.get("params_input") or {}
    answered = {name: fields.get(GATE_PARAM.format(name)) for name in GATE_CHANGES}
    return payload["chosen_options"][0], str(who or "the timeout default"), answered
