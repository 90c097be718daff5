"""``PinRunOperator``: the run's first task. It renders, once, the DAG run's params and its run root
and returns them (XCom); every later task's templates (the run settings, the pools' names and sizes,
the run root) read that, not the params again.

Why: a task renders its templates from the DAG file its worker parses when the task starts, so the
defaults of a DAG file redeployed mid-run (a new ``output_root``, pool or replicas) would reach the
run's later tasks, which would look for the run in another root. A live run keeps what it started
with; a new run (or a cleared ``pin`` task) takes the DAG file as it is then.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator, Context

PIN = "pin"  # the task id the factory gives it; later tasks pull its XCom by this id


def _pin() -> str:
    return f"ti.xcom_pull(task_ids='{PIN}')"


def pinned_root() -> str:
    """A template of the run root as the run's first task rendered it."""
    return f"{{{{ {_pin()}['run_root'] }}}}"


def pinned_param(name: str) -> str:
    """A template of the param ``name`` as the run's first task rendered it."""
    return f"{{{{ {_pin()}['params']['{name}'] }}}}"


def pinned_expr(expression: str) -> str:
    """A template of ``expression`` over the pinned params ``p`` and run root ``run_root``, with one
    read of the pin's XCom: ``pinned_expr("p['replicas'] * p['concurrency']")``."""
    return (
        f"{{% set pin = {_pin()} %}}{{% set p, run_root = pin['params'], pin['run_root'] %}}"
        f"{{{{ {expression} }}}}"
    )


class PinRunOperator(BaseOperator):
    """Returns ``{"params": the DAG run's params, "run_root": run_root}`` (its XCom).

    :param run_root: the run's root (templated: rendered from the params, here only)."""

    template_fields = ("run_root",)
    ui_color = "#fdf5e6"

    def __init__(self, *, run_root: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_root = run_root

    def execute(self, context: Context) -> dict[str, Any]:
        self.log.info(
            "run root %s: the run keeps it and its params, whatever the DAG file says later", self.run_root
        )
        return {"params": dict(context["params"]), "run_root": self.run_root}
