"""A tiny random Llama for tests and benchmarks, built offline in well under a second.

Nothing is downloaded: a BPE tokenizer trained on a built-in corpus, random weights, a ChatML chat
template. It needs the ``transformers`` extra (torch, tokenizers, transformers).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Hermes' format (vLLM's ``hermes`` tool parser): the tools in the system turn, each call between
# <tool_call> and </tool_call> tokens
TOOL_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>"
    "<|im_end|>\n{% endif %}" + CHAT_TEMPLATE
)
TOOL_TOKENS = ("<tool_call>", "</tool_call>")
THINK_TOKENS = ("<think>", "</think>")


def _thinking(template: str) -> str:
    """``template`` as DeepSeek-R1's and Qwen3's: the answer's turn opens the reasoning, or
    (``enable_thinking`` false) holds an empty one."""
    return template.replace(
        "<|im_start|>assistant\n{% endif %}",
        "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
        "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}",
    )


THINKING_TEMPLATE = _thinking(CHAT_TEMPLATE)
_CORPUS = (
    "the quick brown fox jumps over the lazy dog. what is two plus two? the answer is four. "
    "please answer the question briefly. approved rejected yes no because the reason is clear. "
    "0 1 2 3 4 5 6 7 8 9 10 11 12 + - * = ? ! , . : ; ( ) { } [ ] \" ' "
    "one two three four five six seven eight nine ten hundred thousand number sum result "
    "user assistant system you are a helpful model judge review score json true false "
)


def build_tiny_llama(dst: str | Path, *, seed: int = 0, vocab_size: int = 384) -> Path:
    """A random 2-layer Llama (``head_dim`` 64, so vLLM accepts it) with a trained BPE tokenizer
    and a ChatML chat template. Deterministic for a seed; builds in well under a second."""
    return _build(Path(dst), seed, vocab_size, CHAT_TEMPLATE)


def build_tiny_thinker(dst: str | Path, *, seed: int = 0, vocab_size: int = 384) -> Path:
    """:func:`build_tiny_llama` as a reasoning model: ``<think>`` and ``</think>`` are tokens of its
    vocabulary (added, not special: decoded into the text, as DeepSeek-R1's and Qwen3's are), and its
    chat template opens the reasoning in the answer's turn, or an empty one when rendered with
    ``enable_thinking`` false (Qwen3's)."""
    return _build(Path(dst), seed, vocab_size, THINKING_TEMPLATE, added=THINK_TOKENS)


def build_tiny_tool_llama(
    dst: str | Path, *, seed: int = 0, vocab_size: int = 384, thinking: bool = False
) -> Path:
    """:func:`build_tiny_llama` with Hermes' tool-call tokens (special, one id each) and a chat
    template that renders ``tools``; ``thinking``: a reasoning model too, as :func:`build_tiny_thinker`
    (its calls come in the answer after the reasoning)."""
    if thinking:
        template = _thinking(TOOL_CHAT_TEMPLATE)
        return _build(Path(dst), seed, vocab_size, template, added=THINK_TOKENS, specials=TOOL_TOKENS)
    return _build(Path(dst), seed, vocab_size, TOOL_CHAT_TEMPLATE, specials=TOOL_TOKENS)


def _build(
    dst: Path,
    seed: int,
    vocab_size: int,
    template: str,
    *,
    added: tuple[str, ...] = (),
    specials: tuple[str, ...] = (),
) -> Path:
    """The tiny Llama with ``template`` as its chat template, ``specials`` as more special tokens
    and ``added`` as added (not special) tokens."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (dst / "config.json").exists() and (dst / "tokenizer.json").exists():
        return dst
    tmp = _staging(dst)
    tmp.mkdir(parents=True)
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>", *specials]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
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
    fast.add_tokens(list(added))
    fast.chat_template = template
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


def build_tiny_classifier(model: str | Path, dst: str | Path, *, seed: int = 2) -> Path:
    """A random sequence classifier made from the tiny Llama at ``model``: its tokenizer and chat
    template, its config with a two-label head (``rejected``, ``approved``), random weights for a
    seed (``LlamaForSequenceClassification``: the transformers engine and vLLM load it as a scoring
    model). Its scores mean nothing, but they are the model's: tests compare them with the model run
    directly."""
    from transformers import AutoConfig, LlamaForSequenceClassification

    dst = Path(dst)
    if (dst / "config.json").exists():
        return dst
    tmp = _staging(dst)
    config = AutoConfig.from_pretrained(str(model), local_files_only=True)
    config.num_labels = 2
    config.id2label = {0: "rejected", 1: "approved"}
    config.label2id = {"rejected": 0, "approved": 1}
    _save_random(LlamaForSequenceClassification, config, seed, model, tmp)
    os.replace(tmp, dst)
    return dst


def build_tiny_embedder(model: str | Path, dst: str | Path, *, seed: int = 3) -> Path:
    """A random embedding model made from the tiny Llama at ``model``: its tokenizer, a bare
    ``LlamaModel`` (no head) with random weights for a seed, and a sentence-transformers pooling
    config (mean over the tokens, then normalized), which vLLM's pooling runner and the transformers
    engine both read: they embed a text the same way."""
    import json

    from transformers import AutoConfig, LlamaModel

    dst = Path(dst)
    if (dst / "modules.json").exists():
        return dst
    tmp = _staging(dst)
    config = AutoConfig.from_pretrained(str(model), local_files_only=True)
    _save_random(LlamaModel, config, seed, model, tmp)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (tmp / "modules.json").write_text(json.dumps(modules))
    (tmp / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": config.hidden_size, "pooling_mode_mean_tokens": True}
    (tmp / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (tmp / "2_Normalize").mkdir()
    os.replace(tmp, dst)
    return dst


def _staging(dst: Path) -> Path:
    """An empty place beside ``dst`` to build it in, then move it to ``dst`` whole (a builder
    interrupted, or running in another process, leaves no half-built model at ``dst``)."""
    tmp = dst.with_name(dst.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def _save_random(cls: Any, config: Any, seed: int, model: str | Path, tmp: Path) -> None:
    """A ``cls`` of ``config`` with random weights for ``seed``, and the tokenizer of ``model``, saved
    at ``tmp``."""
    import torch
    from transformers import AutoTokenizer

    config.architectures = [cls.__name__]
    torch.manual_seed(seed)
    cls(config).save_pretrained(tmp, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(model), local_files_only=True).save_pretrained(tmp)


def build_tiny_lora(model: str | Path, dst: str | Path, *, seed: int = 1, rank: int = 8) -> Path:
    """A LoRA adapter for the tiny Llama at ``model`` (peft's directory: ``adapter_config.json`` and
    ``adapter_model.safetensors``) on every attention and MLP projection, with random A and B (peft's
    default starts B at zero, a no-op) and a large scale, so it changes what the model answers."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    dst = Path(dst)
    if (dst / "adapter_config.json").exists():
        return dst
    torch.manual_seed(seed)
    base = LlamaForCausalLM.from_pretrained(str(model), local_files_only=True)
    config = LoraConfig(
        r=rank,
        lora_alpha=4 * rank,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        init_lora_weights=False,
        lora_dropout=0.0,
    )
    tmp = _staging(dst)
    get_peft_model(base, config).save_pretrained(str(tmp))
    os.replace(tmp, dst)
    return dst
