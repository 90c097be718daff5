"""Every setting of a run, described once.

:data:`RUN_SETTINGS_SPEC` is the one description: each :class:`Setting` has its default, its JSON
schema (type, null, enum, bounds), its help and where it appears. A run setting's comes from its
field in a ``RunConfig`` section (:mod:`~airflow_batchinfer.state.config_sections`: the default and
its description, in the field's metadata), so each default is declared once; the pool's and the run
root's are here. Generated from it:

- the DAG params of :func:`~airflow_batchinfer.dag_factory.build_batch_inference_dag` (their
  defaults, schemas, descriptions and trigger-form sections: :func:`param_defaults`,
  :func:`param_schemas`, :func:`dag_params`), so the trigger form asks for every one;
- the ``batchinfer run`` flags, their defaults and help (:func:`add_run_arguments`,
  :func:`run_settings_from_args`);
- the params table of the docs (:func:`reference_table`).

A setting whose empty value means "the default" or "none" (``run_name``, ``model``,
``prompt_template``, ``system``, ``id_field``, ``budget_gpu_hours``) is *nullable*: its schema
accepts ``null``, its default is ``None`` where it has none, and Airflow's trigger form (which
treats an empty field of a type without ``null`` as missing, and disables Trigger) submits it empty
as ``null``.

This module imports no Airflow (:func:`dag_params` imports ``Param`` when called) and nothing heavy.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from airflow_batchinfer.engines import ENGINES
from airflow_batchinfer.fields import Described
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.config_sections import SETTING
from airflow_batchinfer.worker.settings import POOL_IDLE_TTL_S, worker_default, worker_setting

# limits.SAFE_NAME, and not "." or "..": one folder name (limits.refusals checks it again at run time)
RUN_NAME_PATTERN = r"^(?!\.+$)[A-Za-z0-9._-]{1,200}$"

JsonType = Literal["string", "integer", "number", "boolean", "object"]
GoesTo = Literal["run", "run root", "pool"]
# The trigger form's sections, in its order (Airflow's ``Param(section=...)``). Airflow 3.3's form
# shows each as an accordion item, collapsed as the form opens (it opens only its unnamed default
# section, which these params leave empty). Advanced holds the operational knobs, so that the
# others hold only what a person triggering a run chooses.
Section = Literal[
    "Data", "Model & pool", "Prompt & sampling", "Judge", "Retries", "Review", "Budget & failure", "Advanced"
]
SECTIONS: tuple[Section, ...] = get_args(Section)
ADVANCED: Section = "Advanced"

_SAME: Any = object()  # Setting.param_default: the same as Setting.default


@dataclass(frozen=True, kw_only=True)
class Setting(Described):
    """One setting of a run (:class:`~airflow_batchinfer.fields.Described`; ``name`` is the DAG
    param, the flat name of a run setting (its field in a ``RunConfig`` section) and the flag's
    ``dest``; ``default`` the DAG param's (unless ``param_default``), the flag's and ``RunConfig``'s;
    ``help`` the param's description, the flag's help and the docs' text; ``choices`` its schema's
    enum; ``flag`` the ``batchinfer run`` flag, or a positional's name, ``input``).

    :ivar type: its JSON-schema type.
    :ivar goes_to: ``run`` (a ``RunConfig`` section's field, stored in ``run.json``), ``run root`` (names the
        run's folder) or ``pool`` (configures the worker pool, ``pool_setup``).
    :ivar section: the param's section of the trigger form (:data:`SECTIONS`); by default Advanced.
    :ivar nullable: ``None`` is a value (an empty field in the trigger form): "the default" or "none".
    :ivar min_length: the shortest string allowed (an empty string is refused: use ``None``).
    :ivar pattern: a regular expression the string matches.
    :ivar schema_extra: more JSON schema (e.g. an object's ``required`` keys).
    :ivar param: a DAG param.
    :ivar judge_pool_param: a param only of DAGs built with ``judge_airflow_pool``.
    :ivar param_default: the param's default where it must differ from ``default`` (``judge_pool``:
        a DAG built with a judge pool always judges there; a run without one, nowhere).
    :ivar flag_help: what the command line adds to ``help``.
    """

    type: JsonType
    goes_to: GoesTo
    section: Section = ADVANCED
    nullable: bool = False
    min_length: int | None = None
    pattern: str | None = None
    schema_extra: Mapping[str, Any] = field(default_factory=dict)
    param: bool = True
    judge_pool_param: bool = False
    param_default: Any = _SAME
    flag_help: str = ""

    def __post_init__(self) -> None:
        if self.section not in SECTIONS:  # a run setting's: its section field's metadata
            raise ValueError(f"{self.name}: section {self.section!r} is not one of {SECTIONS}")
        if self.type == "boolean" and self.flag and self.default is not False:
            raise ValueError(f"{self.name}: a boolean flag is store_true, so its default must be False")
        if self.type == "string" and not self.nullable and not (self.choices or self.min_length):
            # Airflow's trigger form treats an empty required string as missing (Trigger disabled)
            raise ValueError(f"{self.name}: a string that is not nullable needs an enum or a min_length")

    @property
    def is_run_setting(self) -> bool:
        """A ``RunConfig`` section's field (stored in ``run.json``)."""
        return self.goes_to == "run"

    @property
    def dag_default(self) -> Any:
        """The DAG param's default (a copy)."""
        return copy.deepcopy(self.default if self.param_default is _SAME else self.param_default)

    def schema(self) -> dict[str, Any]:
        """The param's JSON schema, with its description."""
        out: dict[str, Any] = {"type": [self.type, "null"] if self.nullable else self.type}
        if self.choices:
            out["enum"] = [*self.choices, *([None] if self.nullable else [])]
        for key, value in (
            ("minimum", self.minimum),
            ("maximum", self.maximum),
            ("minLength", self.min_length),
            ("pattern", self.pattern),
        ):
            if value is not None:
                out[key] = value
        out.update(copy.deepcopy(dict(self.schema_extra)))
        out["description"] = self.help
        return out

    def limits_text(self) -> str:
        """The schema's constraints in words (for the docs)."""
        out = [self.bounds_text()] if self.bounds_text() else []
        if self.min_length is not None:
            out.append(f"length ≥ {self.min_length}")
        if self.pattern is not None:
            out.append("one folder name: letters, digits, ``.`` ``_`` ``-``")
        if "required" in self.schema_extra:
            out.append("needs " + ", ".join(f"``{k}``" for k in self.schema_extra["required"]))
        return "; ".join(out)

    # -------------------------------------------------------------------------- the command line
    def parse(self, text: str) -> Any:
        """A command-line value as this setting's type, checked against its schema's bounds
        (``argparse.ArgumentTypeError`` otherwise); an empty nullable value is ``None``."""
        if self.nullable and text == "":
            return None
        value: Any
        try:
            if self.type == "object":
                value = json.loads(text)
                if not isinstance(value, dict):
                    raise ValueError("not a JSON object")
            elif self.type == "integer":
                value = int(text)
            elif self.type == "number":
                value = float(text)
            else:
                value = text
        except ValueError as exc:
            want = {"object": "a JSON object", "integer": "a whole number", "number": "a number"}
            raise argparse.ArgumentTypeError(f"{text!r} is not {want.get(self.type, self.type)}") from exc
        if self.minimum is not None and value < self.minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {_num(self.minimum)}")
        if self.maximum is not None and value > self.maximum:
            raise argparse.ArgumentTypeError(f"{value} is more than {_num(self.maximum)}")
        if self.min_length is not None and isinstance(value, str) and len(value) < self.min_length:
            raise argparse.ArgumentTypeError("may not be empty")
        return value

    def flag_kwargs(self) -> dict[str, Any]:
        """``add_argument`` keyword arguments for :attr:`flag`."""
        help_ = " ".join(x for x in (self.help, self.flag_help) if x)
        if self.flag is not None and not self.flag.startswith("-"):  # a positional: required
            return {"help": help_.replace("%", "%%"), "metavar": self.metavar}
        if self.type == "boolean":
            return {"action": "store_true", "help": help_.replace("%", "%%")}
        shown = self.default if self.type != "object" else json.dumps(self.default)
        if self.default is not None:
            help_ += f" (default {shown})"
        out: dict[str, Any] = {
            "default": copy.deepcopy(self.default),
            "help": help_.replace("%", "%%"),
            "dest": self.name,
        }
        if self.choices:
            out["choices"] = list(self.choices)
        else:
            out["type"] = _Parser(self)
        if self.metavar:
            out["metavar"] = self.metavar
        return out


class _Parser:
    """``type=`` of a flag: :meth:`Setting.parse`, named for argparse's messages."""

    def __init__(self, setting: Setting) -> None:
        self.setting = setting
        self.__name__ = setting.type

    def __call__(self, text: str) -> Any:
        return self.setting.parse(text)

    def __repr__(self) -> str:
        return self.setting.type


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _pool(name: str, type_: JsonType, default: Any, help_: str, **kw: Any) -> Setting:
    return Setting(name=name, type=type_, default=default, help=help_, goes_to="pool", **kw)


def _root(name: str, default: Any, help_: str, **kw: Any) -> Setting:
    return Setting(name=name, type="string", default=default, help=help_, goes_to="run root", **kw)


_RUN_FIELDS = RunConfig.setting_fields()


def _run(name: str) -> Setting:
    """The run setting ``name``, from its field in a ``RunConfig`` section: the field's default (or,
    for a field that has none, the one its description gives the param and the flag) and its
    description."""
    f = _RUN_FIELDS[name]
    about = dict(f.metadata[SETTING])
    factory = f.default_factory
    about.setdefault("default", factory() if callable(factory) else f.default)
    return Setting(name=name, goes_to="run", **about)


def _judge_pool(setting: Setting, help_: str, section: Section = ADVANCED) -> Setting:
    return dataclasses.replace(
        setting, name=f"judge_{setting.name}", help=help_, judge_pool_param=True, section=section
    )


# fmt: off
# The settings, one a row; first the pool's that a judge pool repeats (_judge_pool, below).
# The pool settings' defaults are the workers' (worker.settings), but the engine's and the model's:
# the trigger form runs a real small model as it opens (builtin:smollm2, which the transformers
# engine runs), where a worker or `pool up` alone defaults to the simulated engine (no model needed).
_ENGINE = _pool("engine", "string", "transformers", "the engine the workers run", choices=ENGINES,
                section="Model & pool")
_MODEL = _pool(
    "model", "string", "builtin:smollm2",
    "the model: a directory on the workers (vllm, transformers), a model name (openai), or "
    "builtin:smollm2 (SmolLM2-135M-Instruct, local pools); empty: none (the simulated engine needs none)",
    nullable=True, section="Model & pool",
)
_ENGINE_OPTIONS = _pool("engine_options", "object", {}, 'engine arguments, e.g. {"max_model_len": 4096}')
_REPLICAS = _pool("replicas", "integer", 1, "workers this run needs", minimum=1)
_CONCURRENCY = _pool("concurrency", "integer", worker_default("concurrency"), "shard jobs per worker",
                     minimum=worker_setting("concurrency").minimum)
_KUBERNETES = _pool(
    "kubernetes", "object", {},
    "Kubernetes pools only: image, gpus, cpu, memory, node_selector, tolerations, interruptible, "
    "model_pvc, storage_secret, engine_secret (the Secret of api_key…), scaledown_ttl_s…, e.g. "
    '{"image": "reg/worker:0.1.0", "gpus": 1}',
)

#: Every setting of a run, by concern; the trigger form shows them by section, in this order within one.
RUN_SETTINGS_SPEC: tuple[Setting, ...] = (
    # where the data comes from and where the run goes
    _run("input"),
    _root("output_root", "/tmp/batchinfer/runs", "runs are written under this root", min_length=1,
          section="Data"),
    _root("run_name", None, "the run's folder under output_root; empty: the DAG run id. The same name "
          "resumes that run", nullable=True, pattern=RUN_NAME_PATTERN, section="Data"),
    # the model
    _ENGINE,
    _MODEL,
    _ENGINE_OPTIONS,
    # prompts, sampling, judge
    _run("task"),
    _run("prompt_template"),
    _run("system"),
    _run("sampling"),
    _run("judge"),
    _run("adapters"),
    _run("fan_out"),
    _run("select"),
    # rounds
    _run("strategy"),
    _run("max_rounds"),
    _run("max_attempts"),
    _run("truncated"),
    _run("truncated_max_tokens_factor"),
    _run("max_tokens_cap"),
    # retries that use feedback (retries.py): what a sample's second and later attempts are sent with
    _run("retry_template"),
    _run("retry_system"),
    _run("retry_sampling"),
    _run("hybrid_min_shrink"),
    _run("review"),
    _run("review_min_approval"),
    _run("review_below_score"),
    _run("spot_check_approved"),
    _run("gate_idle"),
    _run("gate_keep_warm_s"),
    # shards
    _run("records_per_shard"),
    _run("lanes"),
    _run("chunk_size"),
    _run("id_field"),
    _run("assign_ids"),
    _run("max_line_bytes"),
    _run("max_id_bytes"),
    _run("output_format"),
    # the pool
    _pool("worker_pool", "string", "local://batchinfer", "the backend switch: local://NAME, "
          "kubernetes://NAMESPACE/NAME or a batchinfer_pool connection id", min_length=1,
          section="Model & pool"),
    _REPLICAS,
    _CONCURRENCY,
    _pool("idle_ttl_s", "number", POOL_IDLE_TTL_S, "the pool stops after this idle time, in seconds",
          minimum=0),
    _pool("target_batch_tokens", "integer", worker_default("target_batch_tokens"),
          worker_setting("target_batch_tokens").help, minimum=worker_setting("target_batch_tokens").minimum),
    _KUBERNETES,
    # checks and budgets
    _run("preflight_records"),
    _run("budget_gpu_hours"),
    _run("max_failed_shards"),
    _run("job_retries"),
    _run("unreachable_grace_s"),
    # the judge's own pool (DAGs built with judge_airflow_pool; batchinfer run --judge-pool)
    _run("judge_pool"),
    _judge_pool(_ENGINE, "the judge pool's engine"),
    _judge_pool(_MODEL, "the judge's model, on the judge's pool (as model)", section="Judge"),
    _judge_pool(_ENGINE_OPTIONS, "the judge pool's engine arguments"),
    _judge_pool(_REPLICAS, "judge workers this run needs"),
    _judge_pool(_CONCURRENCY, "judge jobs per judge worker"),
    _judge_pool(_KUBERNETES, "the judge pool's Kubernetes settings (as kubernetes)"),
)
# fmt: on

BY_NAME: dict[str, Setting] = {s.name: s for s in RUN_SETTINGS_SPEC}


def setting(name: str) -> Setting:
    """The setting called ``name``."""
    return BY_NAME[name]


def _params(judge_pool: bool | None) -> Iterable[Setting]:
    """The DAG params: ``judge_pool`` None: all; True: only the judge pool's; False: the others."""
    return (
        s for s in RUN_SETTINGS_SPEC if s.param and (judge_pool is None or s.judge_pool_param == judge_pool)
    )


def param_defaults(*, judge_pool: bool | None = False) -> dict[str, Any]:
    """The params' defaults (copies): of every DAG (``judge_pool=False``), only of DAGs built with a
    judge pool (``True``), or both (``None``)."""
    return {s.name: s.dag_default for s in _params(judge_pool)}


def param_schemas(*, judge_pool: bool | None = None) -> dict[str, dict[str, Any]]:
    """The params' JSON schemas, with descriptions (``judge_pool`` as in :func:`param_defaults`)."""
    return {s.name: s.schema() for s in _params(judge_pool)}


def run_setting_params() -> tuple[str, ...]:
    """The params of every DAG that become the run's settings (``run.json``); the rest configure the
    pool or name the run's folder (``judge_pool``, a run setting too, exists only with a judge pool)."""
    return tuple(s.name for s in _params(False) if s.is_run_setting)


def param_values(
    defaults: Mapping[str, Any] | None, *, judge_pool: bool, max_rounds: int | None = None
) -> dict[str, Any]:
    """A DAG's param defaults: :func:`param_defaults` updated with the DAG author's ``defaults``, and
    ``max_rounds`` capped by the DAG's round slots. Unknown names are refused (a typo would
    otherwise be ignored)."""
    values = {**param_defaults(judge_pool=False), **(param_defaults(judge_pool=True) if judge_pool else {})}
    unknown = sorted(set(defaults or {}) - set(values))
    if unknown:
        judge_only = [n for n in unknown if n in BY_NAME and BY_NAME[n].judge_pool_param]
        hint = ""
        if judge_only:
            hint = f"; {', '.join(judge_only)}: params of DAGs built with judge_airflow_pool="
        raise ValueError(f"defaults: unknown params {unknown}{hint} (the params: {', '.join(values)})")
    values.update(copy.deepcopy(dict(defaults or {})))
    if max_rounds is not None:
        values["max_rounds"] = min(int(values["max_rounds"]), max_rounds)
    return values


def dag_params(values: Mapping[str, Any], *, max_rounds: int | None = None) -> dict[str, Any]:
    """``airflow.sdk.Param`` objects for ``values`` (from :func:`param_values`): each setting's schema,
    description and section, in the sections' order (the trigger form lists its sections in the
    order their first params come); ``max_rounds`` also bounded by the DAG's round slots."""
    from airflow.sdk import Param

    out = {}
    for name in sorted(values, key=lambda n: SECTIONS.index(BY_NAME[n].section)):
        schema = BY_NAME[name].schema()
        if name == "max_rounds" and max_rounds is not None:
            schema["maximum"] = max_rounds
        out[name] = Param(values[name], section=BY_NAME[name].section, **schema)
    return out


# ------------------------------------------------------------------------------ the command line
def cli_settings() -> tuple[Setting, ...]:
    """The settings ``batchinfer run`` takes (flags and the ``input`` positional)."""
    return tuple(s for s in RUN_SETTINGS_SPEC if s.flag)


def add_run_arguments(parser: argparse.ArgumentParser, *, positionals: bool = True) -> None:
    """Add the run settings' flags (and positionals, e.g. ``input``) to ``parser``."""
    for s in cli_settings():
        assert s.flag is not None
        if positionals or s.flag.startswith("-"):
            parser.add_argument(s.flag, **s.flag_kwargs())


def run_settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The flat run settings (``RunConfig.of``) the parsed flags give (every setting of
    :func:`cli_settings`)."""
    return {s.name: getattr(args, s.name) for s in cli_settings() if s.is_run_setting}


# --------------------------------------------------------------------------------------- the docs
def reference_table() -> tuple[list[str], list[list[str]]]:
    """The header and rows of the settings table in the docs (cells: text with ````literal```` spans)."""
    header = ["setting", "section", "type", "default", "DAG param / ``batchinfer run``", "goes to", "meaning"]
    rows = []
    for s in RUN_SETTINGS_SPEC:
        kind = f"{s.type} | null" if s.nullable else s.type
        default = _code(s.dag_default)
        if s.param_default is not _SAME:
            default = f"{default} (a DAG with a judge pool); {_code(s.default)} (``batchinfer run``)"
        where = []
        if s.param:
            where.append("param" + (" (with a judge pool)" if s.judge_pool_param else ""))
        if s.flag:
            where.append(f"``{s.flag}``" if s.flag.startswith("-") else f"``{s.flag.upper()}`` (positional)")
        goes = {"run": "run setting", "run root": "run root", "pool": "pool"}[s.goes_to]
        if s.judge_pool_param and s.goes_to == "pool":
            goes = "judge pool"
        meaning = "; ".join(x for x in (_literal_braces(s.help), s.limits_text()) if x)
        section = s.section if s.param else ""
        rows.append([f"``{s.name}``", section, kind, default, ", ".join(where), goes, meaning])
    return header, rows


def _code(value: Any) -> str:
    return f"``{json.dumps(value, ensure_ascii=False)}``"


def _literal_braces(text: str) -> str:
    """JSON examples in help text as literals."""
    return re.sub(r"(\{[^{}]*\}|'[^']*\{\{[^']*\}\}[^']*')", r"``\1``", text)
