"""A tiny random vision-language model (LLaVA-style) for tests and benchmarks, built offline.

A ``LlavaForConditionalGeneration``: a 2-layer CLIP vision tower on 56x56 images (14-pixel patches:
16 image tokens), a projector, and the tiny Llama's text model and tokenizer
(:mod:`~airflow_batchinfer.dev.tiny_llama`) with an ``<image>`` token added. Its processor (a CLIP
image processor and a chat template that writes ``<image>`` for each image part) is saved with it,
so ``AutoProcessor`` and vLLM load it as they load a real LLaVA. Random weights: its answers mean
nothing, but they depend on the image. It needs the ``transformers`` extra (torch, transformers,
Pillow).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from airflow_batchinfer.dev import tiny_llama

IMAGE_TOKEN = "<image>"
IMAGE_SIZE = 56
PATCH_SIZE = 14
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # the CLS token is dropped ("default" strategy)
# ChatML as the tiny Llama's, with an image part written as the image token
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}" + IMAGE_TOKEN + "{% elif "
    "part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def cache_key() -> str:
    """What the model is built from (this builder's and the tiny Llama's source): a cached copy
    under another key is from other code."""
    digest = hashlib.sha256()
    for module in (tiny_llama, __import__(__name__, fromlist=["_"])):
        digest.update(Path(str(module.__file__)).read_bytes())
    return digest.hexdigest()[:12]


def build_tiny_vlm(dst: str | Path, *, seed: int = 0) -> Path:
    """The tiny LLaVA at ``dst`` (built unless there); deterministic for a seed, a few seconds."""
    import torch
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    dst = Path(dst)
    if (dst / "config.json").exists() and (dst / "processor_config.json").exists():
        return dst
    tmp = dst.with_name(dst.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    llama = tiny_llama.build_tiny_llama(tmp / "llama", seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(str(llama), local_files_only=True)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = CHAT_TEMPLATE
    text = LlamaConfig.from_pretrained(str(llama), local_files_only=True)
    text.vocab_size = len(tokenizer)
    vision = CLIPVisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=1,  # head_dim 64
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=64,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=IMAGE_TOKENS,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
    )
    config.architectures = ["LlavaForConditionalGeneration"]
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    for p in model.parameters():  # a larger spread than the default init: answers depend on the input
        torch.nn.init.normal_(p, std=0.2)
    model.save_pretrained(tmp, safe_serialization=True)
    size = {"shortest_edge": IMAGE_SIZE}
    crop = {"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    images = CLIPImageProcessor(size=size, crop_size=crop)
    processor = LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's CLS token
        chat_template=CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
    )
    processor.save_pretrained(tmp)
    shutil.rmtree(tmp / "llama")
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(tmp, dst)
    return dst


def cached_tiny_vlm(cache: str | Path) -> Path:
    """The tiny LLaVA under ``cache``/models, keyed by :func:`cache_key` (built once per key)."""
    return build_tiny_vlm(Path(cache) / "models" / f"tiny-llava-{cache_key()}")
