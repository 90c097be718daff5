"""Reference tables generated from the code, so the docs cannot drift from it.

Directives (in the MyST pages: a fenced block named after the directive), each building docutils
nodes directly (a table, or a literal block):

- ``batchinfer-params``: every run setting, as DAG param and ``batchinfer run`` flag
  (``settings.RUN_SETTINGS_SPEC``, which the params, their schemas and the flags are generated from);
- ``batchinfer-worker-settings``: every ``batchinfer worker serve`` flag with its environment variable
  and default (``worker.settings.WORKER_SETTINGS``, which the flags, a local pool's worker command
  line and a Kubernetes pool's container environment are generated from);
- ``batchinfer-connection``: the ``batchinfer_pool`` connection type (``get_provider_info``);
- ``batchinfer-cli``: ``batchinfer … --help`` of one command (the argument, e.g. ``pool up``);
- ``batchinfer-model``: the fields of a pydantic model (the argument: its dotted path);
- ``batchinfer-job-outputs``: the outputs each job kind requires (``rpc.models.REQUIRED_OUTPUTS``);
- ``batchinfer-limits``: what trigger params may choose (``spec.limit_settings.SETTINGS``), and where
  each is set;
- ``batchinfer-desk-settings``: how much the review desk returns at once (``desk_bounds.DESK_SETTINGS``);
- ``batchinfer-pool-network``: who may call a Kubernetes pool's workers
  (``spec.limit_settings.POOL_NETWORK_SETTINGS``);
- ``batchinfer-sampling``: every field of a request body and of the ``sampling`` param, and the
  engines that honour it (``engines.sampling.REQUEST_FIELDS``, which ``SamplingParams``, the engines'
  declarations, the param's schema and help are derived from);
- ``batchinfer-engine-metrics``: the engine's figures on a worker's ``/metrics``
  (``worker.metrics.ENGINE_METRICS``) and which engines report each (their ``stats()``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


def _inline(text: str) -> list[nodes.Node]:
    """Text with ``literal`` spans, as docutils nodes (no other markup)."""
    out: list[nodes.Node] = []
    for i, part in enumerate(re.split(r"``(.+?)``", str(text))):
        if part:
            out.append(nodes.literal(part, part) if i % 2 else nodes.Text(part))
    return out


def _table(header: list[str], rows: list[list[str]]) -> nodes.table:
    """A table whose cells are plain text with ``literal`` spans."""
    table = nodes.table(classes=["batchinfer-generated"])
    group = nodes.tgroup(cols=len(header))
    table += group
    group.extend(nodes.colspec(colwidth=1) for _ in header)

    def row(cells: list[str]) -> nodes.row:
        r = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += nodes.paragraph("", "", *_inline(cell))
            r += entry
        return r

    head = nodes.thead()
    head += row(header)
    body = nodes.tbody()
    body.extend(row(r) for r in rows)
    group += head
    group += body
    return table


def _code(value: Any) -> str:
    if hasattr(value, "model_dump"):  # a pydantic default such as Progress()
        value = value.model_dump()
    text = json.dumps(value, ensure_ascii=False, default=str)
    return f"``{text}``" if text else ""


class _Generated(SphinxDirective):
    def nodes(self) -> list[nodes.Node]:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        return self.nodes()


class Params(_Generated):
    def nodes(self) -> list[nodes.Node]:
        from airflow_batchinfer.spec.settings import reference_table

        header, rows = reference_table()
        return [_table(header, rows)]


class WorkerSettings(_Generated):
    def nodes(self) -> list[nodes.Node]:
        from airflow_batchinfer.worker.settings import reference_table

        header, rows = reference_table()
        return [_table(header, rows)]


class Connection(_Generated):
    def nodes(self) -> list[nodes.Node]:
        from airflow_batchinfer.get_provider_info import get_provider_info

        (conn,) = get_provider_info()["connection-types"]
        ui = conn["ui-field-behaviour"]
        hidden = ", ".join(f"``{f}``" for f in ui["hidden-fields"])
        lead = nodes.paragraph("", "", *_inline(
            f"Connection type ``{conn['connection-type']}`` (\"{conn['hook-name']}\"), hook "
            f"``{conn['hook-class-name']}``. Hidden standard fields: {hidden}."
        ))  # fmt: skip
        rows = [
            [f"``{field}``", "standard", label, ui["placeholders"].get(field, "")]
            for field, label in ui["relabeling"].items()
        ]
        for name, spec in conn["conn-fields"].items():
            schema = spec["schema"]
            kind = schema.get("type")
            kind = " | ".join(kind) if isinstance(kind, list) else kind
            extra = ""
            if "enum" in schema:
                extra = f"; one of {', '.join(schema['enum'])}; default ``{schema['default']}``"
            rows.append([f"``{name}``", f"extra ({kind})", spec["label"], spec["description"] + extra])
        return [lead, _table(["field", "where", "label in the UI", "meaning"], rows)]


def _subparser(parser: argparse.ArgumentParser, path: list[str]) -> argparse.ArgumentParser:
    for word in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser


class Cli(_Generated):
    required_arguments = 1
    final_argument_whitespace = True

    def nodes(self) -> list[nodes.Node]:
        from airflow_batchinfer.cli import build_parser

        saved = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = "100"
        try:
            text = _subparser(build_parser(), self.arguments[0].split()).format_help()
        finally:
            if saved is None:
                os.environ.pop("COLUMNS", None)
            else:
                os.environ["COLUMNS"] = saved
        text = text.rstrip()
        return [nodes.literal_block(text, text, language="text")]


class Model(_Generated):
    required_arguments = 1

    def nodes(self) -> list[nodes.Node]:
        module, _, name = self.arguments[0].rpartition(".")
        model = getattr(importlib.import_module(module), name)
        rows = []
        for field, info in model.model_fields.items():
            hint = info.annotation
            annotation = hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
            if info.is_required():
                default = "required"
            elif info.default_factory is not None:
                default = _code(info.default_factory())
            else:
                default = _code(info.default)
            pattern = next((m.pattern for m in info.metadata if hasattr(m, "pattern") and m.pattern), None)
            rows.append([f"``{field}``", f"``{annotation}``", default,
                         f"pattern ``{pattern}``" if pattern else ""])  # fmt: skip
        refused = " Unknown fields are refused." if model.model_config.get("extra") == "forbid" else ""
        lead = nodes.paragraph("", "", *_inline(f"Fields of ``{name}``.{refused}"))
        return [lead, _table(["field", "type", "default", "constraint"], rows)]


class JobOutputs(_Generated):
    def nodes(self) -> list[nodes.Node]:
        from airflow_batchinfer.rpc.models import REQUIRED_OUTPUTS

        rows = [[f"``{k}``", ", ".join(f"``{o}``" for o in outs)] for k, outs in REQUIRED_OUTPUTS.items()]
        return [_table(["kind", "required outputs (URIs)"], rows)]


class Limits(_Generated):
    def nodes(self) -> list[nodes.Node]:
        from airflow_batchinfer.spec.limit_settings import CONFIG_SECTION, SETTINGS

        kinds = {"prefixes": "storage prefixes", "names": "names", "count": "number (unset: no limit)",
                 "quantity": "Kubernetes quantity (unset: no limit)"}  # fmt: skip

        def kind(s: Any) -> str:  # a cap that holds unset says so
            of = s.unset_default_of
            if of is not None:
                return f"number (unset: the ``{of}`` setting's default)"
            return kinds[s.type] if s.default is None else f"number (unset: {s.default})"

        rows = [
            [f"``{s.name}``", kind(s), f"``AIRFLOW__{CONFIG_SECTION.upper()}__{s.name.upper()}``",
             re.sub(r"(?<!`)`([^`]+)`(?!`)", r"``\1``", s.help)]
            for s in SETTINGS
        ]  # fmt: skip
        return [_table(["limit (config key, connection extra, ``TriggerLimits`` field)", "kind",
                        "environment variable", "what it pins"], rows)]  # fmt: skip


class DeskSettings(_Generated):
    def nodes(self) -> list[nodes.Node]:
        from airflow_batchinfer.review.bounds import DESK_SETTINGS
        from airflow_batchinfer.spec.limit_settings import CONFIG_SECTION

        rows = [
            [f"``{s.name}``", f"``{s.default}`` (at least {s.minimum})",
             f"``AIRFLOW__{CONFIG_SECTION.upper()}__{s.name.upper()}``",
             re.sub(r"(?<!`)`([^`]+)`(?!`)", r"``\1``", s.help)]
            for s in DESK_SETTINGS
        ]  # fmt: skip
        header = [f"``[{CONFIG_SECTION}]`` key", "default (bytes)", "environment variable", "what it caps"]
        return [_table(header, rows)]


class PoolNetwork(_Generated):
    def nodes(self) -> list[nodes.Node]:
        from airflow_batchinfer.spec.limit_settings import CONFIG_SECTION, POOL_NETWORK_SETTINGS

        rows = [
            [f"``{s.name}``", f"``{s.example}``", f"``AIRFLOW__{CONFIG_SECTION.upper()}__{s.name.upper()}``",
             re.sub(r"(?<!`)`([^`]+)`(?!`)", r"``\1``", s.help)]
            for s in POOL_NETWORK_SETTINGS
        ]  # fmt: skip
        header = [f"``[{CONFIG_SECTION}]`` key and connection extra", "example", "environment variable",
                  "what it names"]  # fmt: skip
        return [_table(header, rows)]


class SamplingFields(_Generated):
    def nodes(self) -> list[nodes.Node]:
        from airflow_batchinfer.engines.sampling import reference_table

        header, rows = reference_table()
        return [_table(header, rows)]


class EngineMetrics(_Generated):
    def nodes(self) -> list[nodes.Node]:
        from airflow_batchinfer.worker.metrics import ENGINE_METRICS, engine_reporting

        reporting = engine_reporting()
        rows = [[f"``{m.name}``", m.kind, m.help, ", ".join(f"``{e}``" for e in reporting[m.name])]
                for m in ENGINE_METRICS]  # fmt: skip
        return [_table(["metric", "type", "meaning", "engines"], rows)]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("batchinfer-params", Params)
    app.add_directive("batchinfer-worker-settings", WorkerSettings)
    app.add_directive("batchinfer-connection", Connection)
    app.add_directive("batchinfer-cli", Cli)
    app.add_directive("batchinfer-model", Model)
    app.add_directive("batchinfer-job-outputs", JobOutputs)
    app.add_directive("batchinfer-limits", Limits)
    app.add_directive("batchinfer-desk-settings", DeskSettings)
    app.add_directive("batchinfer-pool-network", PoolNetwork)
    app.add_directive("batchinfer-engine-metrics", EngineMetrics)
    app.add_directive("batchinfer-sampling", SamplingFields)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
