"""The ``transformers`` engine: a local model directory, batched ``generate`` in a thread.

Prompts are left-padded so a batch decodes like its members would alone; chat messages go through
the tokenizer's chat template. A sampling ``seed`` seeds each batch (one group of requests with the
same sampling settings), so the same batch samples the same way; unlike vLLM it does not seed each
request on its own. The engine is total: a prompt that does not fit the context, a chat
template error or a generate failure on one element becomes that element's error result (a failing
batch is retried element by element to find the culprit).

``n`` candidates are ``n`` rows of the batch per request (sampled: ``SamplingParams`` refuses
``n`` > 1 at temperature 0); ``logprobs`` are the model's own scores (``output_logits``, before any
processor: vLLM's raw log probabilities), with the ``top_logprobs`` likeliest alternatives.

A request's LoRA adapter is loaded through ``peft`` the first time (``load_adapter``), and each
group of a batch runs with its adapter set (or the adapters off, for the base model).

Structured outputs (``structured_outputs``, ``response_format`` other than ``text``) are refused per
request, naming the engines that honour them: xgrammar's ``generate()`` integration would bring
packages (triton, apache-tvm-ffi) the main environment does not pin.

A reasoning model's output is split into reasoning and answer by the engine option
``reasoning_parser`` (one of vLLM's delimiter parsers by name: ``deepseek_r1``, ``seed_oss``; its
delimiters must be tokens of the model), on the generated tokens; stop strings cut the answer.
``reasoning_effort`` and ``chat_template_kwargs`` reach the chat template as on vLLM's server;
``thinking_token_budget`` forces the end delimiter after that many thinking tokens, as vLLM does
(:class:`~airflow_batchinfer.engines.reasoning.ThinkingBudget`; it needs ``reasoning_parser``).

A model whose architecture is a ``*ForSequenceClassification`` (a classifier, or a reward model with
one output) is loaded as a scoring model (:mod:`~airflow_batchinfer.engines.scoring`): it scores
batches of texts (right-padded; chat messages through the chat template, the answer's turn last)
and generates nothing.

A vision-language model (a config with a ``vision_config``: LLaVA, Qwen2-VL, ...) is loaded with its
processor (``AutoProcessor``, ``AutoModelForImageTextToText``): a request with images
(:mod:`~airflow_batchinfer.engines.images`) is rendered by the processor's chat template and encoded
with its images, alone in its batch. A text-only model refuses a request with images, saying so.

On a CUDA device it sleeps (:mod:`~airflow_batchinfer.engines.transformers_sleep`): level 1 moves
the model to CPU memory, level 2 drops it and a wake loads it again; on a CPU it refuses to.

An embedding model (a sentence-transformers directory, or a bare
``*Model`` architecture: :mod:`~airflow_batchinfer.engines.embedding_models`) is loaded with
``AutoModel`` and embeds instead, pooled and normalized as its config says (as vLLM reads it).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import threading
from collections.abc import Sequence
from typing import Any

from airflow_batchinfer.engines import transformers_sleep
from airflow_batchinfer.engines.adapters import Adapter
from airflow_batchinfer.engines.base import (
    Choice,
    Engine,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    TokenLogprob,
)
from airflow_batchinfer.engines.embedding_models import embed_batch, is_embedding_model, pooling_of
from airflow_batchinfer.engines.images import LoadedImage, refused_images, template_messages
from airflow_batchinfer.engines.messages import chat_messages
from airflow_batchinfer.engines.pooling import (
    EmbeddingModel,
    EmbedRequest,
    EmbedResult,
    dimensions_refusal,
    is_matryoshka,
)
from airflow_batchinfer.engines.reasoning import (
    Delimiters,
    Split,
    ThinkingBudget,
    delimiter_parser,
    prompt_refusal,
    template_kwargs,
)
from airflow_batchinfer.engines.scoring import (
    ScoreRequest,
    ScoreResult,
    ScoringModel,
    is_scoring_architecture,
    labels_of,
)
from airflow_batchinfer.engines.stats import TALLIED, EngineStats, StatsTally
from airflow_batchinfer.exceptions import ConfigError, EngineAsleep

PEFT_LEAST = (0, 20)  # what transformers' adapter methods ask for


class TransformersEngine(Engine):
    """:param model: local model directory (``config.json``, weights, tokenizer).
    :param dtype: ``float32`` (default on CPU), ``bfloat16`` or ``float16``.
    :param device: ``cpu`` or ``cuda[:N]``.
    :param threads: torch intra-op threads (``OMP_NUM_THREADS`` by default).
    :param reasoning_parser: splits each output into reasoning and answer (:data:`~airflow_batchinfer.
        engines.reasoning.DELIMITER_PARSERS`; unset: the output is the answer)."""

    name = "transformers"
    stats_fields = TALLIED
    loads_adapters = True  # with peft

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        threads: int | None = None,
        reasoning_parser: str | None = None,
    ) -> None:
        self.model_path = model
        self.reasoning_parser = reasoning_parser
        self.delimiters = None if reasoning_parser is None else delimiter_parser(reasoning_parser)
        self._think_ids: tuple[int, int] | None = None  # the delimiters' token ids, once loaded
        self.dtype = dtype
        self.device = device
        self.threads = threads
        self._lock = threading.Lock()  # one generate at a time on the model
        self.tokenizer: Any = None
        self.processor: Any = None  # a vision-language model's (None: the model takes no images)
        self.model: Any = None
        self.max_len = 0
        self.tally = StatsTally()  # tokens generated, batches and requests generating now
        self._adapters: dict[str, str] = {}  # adapter directory -> its name in the model (loaded)
        self._adapter_ids = 0
        self._pooling = ("mean", True)  # an embedding model's mode and normalizing (embedding_models)
        self.sleeping: int | None = None  # the level it sleeps at (None: awake; transformers_sleep)

    async def start(self) -> None:
        await asyncio.to_thread(self._load)

    def _load(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import (
            AutoConfig,
            AutoModel,
            AutoModelForCausalLM,
            AutoModelForSequenceClassification,
            AutoTokenizer,
        )

        if self.threads:
            torch.set_num_threads(self.threads)
        config = AutoConfig.from_pretrained(self.model_path, local_files_only=True)
        scores = is_scoring_architecture(getattr(config, "architectures", None))
        embeds = not scores and is_embedding_model(self.model_path, getattr(config, "architectures", None))
        scores = scores or embeds  # both read whole texts: right padding
        auto: Any = (
            AutoModel if embeds else AutoModelForSequenceClassification if scores else AutoModelForCausalLM
        )
        if getattr(config, "vision_config", None) is not None and not scores:
            from transformers import AutoModelForImageTextToText, AutoProcessor

            self.processor = AutoProcessor.from_pretrained(self.model_path, local_files_only=True)
            self.processor.tokenizer.padding_side = "left"
            auto = AutoModelForImageTextToText
        tok = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        # generation: left padding, so a batch decodes like its members alone; scoring reads each
        # text's last token (right padding keeps the positions every text has alone)
        tok.padding_side = "right" if scores else "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        model = auto.from_pretrained(self.model_path, local_files_only=True, dtype=getattr(torch, self.dtype))
        if embeds:
            self._pooling = pooling_of(self.model_path)
            size, matryoshka = int(model.config.hidden_size), is_matryoshka(model.config)
            self.embedding = EmbeddingModel(os.path.realpath(self.model_path), size, matryoshka)
        elif scores:
            if model.config.pad_token_id is None:  # it finds each text's last token by the padding
                model.config.pad_token_id = tok.pad_token_id
            labels, multi = labels_of(model.config)
            self.scoring = ScoringModel(os.path.realpath(self.model_path), labels, multi)
        self.model = model.to(self.device).eval()
        self.tokenizer = tok
        if self.delimiters is not None:
            assert self.reasoning_parser is not None
            self._think_ids = self.delimiters.token_ids(tok.get_vocab(), self.reasoning_parser)
        text_config = getattr(model.config, "text_config", None) or model.config
        self.max_len = int(getattr(text_config, "max_position_embeddings", 0) or tok.model_max_length)

    def sleep_refusal(self, level: int) -> str | None:
        return transformers_sleep.sleep_refusal(self.device, level)

    async def sleep(self, level: int) -> None:
        """Level 1: the model to CPU memory; 2: dropped
        (:mod:`~airflow_batchinfer.engines.transformers_sleep`)."""
        if (why := self.sleep_refusal(level)) is not None:
            raise ConfigError(why)
        await asyncio.to_thread(self._sleep, level)

    def _sleep(self, level: int) -> None:
        with self._lock:
            self.model = self.model.to("cpu") if level == 1 else None
            self.sleeping = level
            transformers_sleep.free_device()

    async def wake(self) -> None:
        await asyncio.to_thread(self._wake)

    def _wake(self) -> None:
        with self._lock:
            if self.sleeping == 1:
                self.model = self.model.to(self.device)
            elif self.sleeping == 2:
                self._adapters = {}  # they were loaded into the model dropped
                self._load()
            self.sleeping = None

    def _awake(self) -> None:
        if self.sleeping is not None:
            raise EngineAsleep(f"the transformers engine got a batch while asleep (level {self.sleeping})")

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self._awake()
        return await asyncio.to_thread(self._generate, requests)

    def _render(self, request: GenerationRequest) -> tuple[str, bool]:
        """The prompt text, and whether the tokenizer should add special tokens itself."""
        s = request.sampling
        if request.prompt is not None:
            return request.prompt, True
        kwargs = template_kwargs(s.reasoning_effort, s.chat_template_kwargs)
        if request.images:  # the processor's template writes the model's image placeholders
            messages = template_messages(request.messages or ())
            text = self.processor.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **kwargs
            )
            return str(text), False
        text = self.tokenizer.apply_chat_template(
            chat_messages(request.messages, self.tokenizer),
            add_generation_prompt=True,
            tokenize=False,
            **kwargs,
        )
        return str(text), False

    def _generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        if self.scoring is not None or self.embedding is not None:
            name = os.path.basename(self.model_path)
            kind = "a scoring" if self.scoring is not None else "an embedding"
            why = f"transformers: {name} is {kind} model: it generates nothing"
            return [GenerationResult.failed(why) for _ in requests]
        results: list[GenerationResult | None] = [None] * len(requests)
        # a request with images is a group of its own (its key: its id)
        groups: dict[tuple[SamplingParams, bool, Adapter | None, str | None], list[tuple[int, str]]] = {}
        for i, request in enumerate(requests):
            refused = self.sampling_refusal(request.sampling)  # e.g. OpenAI's additive penalties
            s = request.sampling
            if refused is None and request.images and self.processor is None:
                refused = refused_images(self.name, f"{os.path.basename(self.model_path)} takes no images")
            if refused is None and request.prompt is not None:
                refused = prompt_refusal(s.reasoning_effort, s.chat_template_kwargs, "transformers")
            if refused is None and s.thinking_token_budget is not None and self._think_ids is None:
                refused = (
                    "thinking_token_budget needs a reasoning parser: give the pool the engine option "
                    "reasoning_parser (deepseek_r1, seed_oss), or remove thinking_token_budget"
                )
            if refused is not None:
                results[i] = GenerationResult.failed(f"transformers: {refused}")
                continue
            try:
                text, specials = self._render(request)
            except Exception as exc:
                results[i] = GenerationResult.failed(f"chat template: {type(exc).__name__}: {exc}")
                continue
            n = len(self.tokenizer(text, add_special_tokens=specials)["input_ids"])
            if n + request.sampling.max_tokens > self.max_len:
                results[i] = GenerationResult.failed(
                    f"prompt has {n} tokens; with max_tokens {request.sampling.max_tokens} it exceeds the "
                    f"model's context of {self.max_len}: shorten the prompt or lower max_tokens"
                )
                continue
            alone = request.request_id if request.images else None
            groups.setdefault((request.sampling, specials, request.adapter, alone), []).append((i, text))
        with self._lock, self.tally.batch(sum(map(len, groups.values()))):
            for (sampling, specials, adapter, alone), members in groups.items():
                try:
                    self._use(adapter)
                except Exception as exc:  # a directory peft cannot load: those requests' error
                    assert adapter is not None
                    reason = f"adapter {adapter.name} ({adapter.path}): {type(exc).__name__}: {exc}"
                    for i, _ in members:
                        results[i] = GenerationResult.failed(f"transformers: {reason}")
                    continue
                texts = [t for _, t in members]
                if alone is None:
                    outs = self._run_isolating(texts, sampling, specials)
                else:
                    outs = self._run_isolating(texts, sampling, specials, requests[members[0][0]].images)
                for (i, _), out in zip(members, outs, strict=True):
                    results[i] = out
                self.tally.count(outs)
        return [r if r is not None else GenerationResult.failed("not generated") for r in results]

    def _use(self, adapter: Adapter | None) -> None:
        """Answer with ``adapter`` (loaded through peft the first time) or, ``None``, the base model.
        A load that fails halfway (peft adds the layers before it reads the weights) is undone, so
        the base model and the other adapters answer as before."""
        if adapter is None:
            if getattr(self.model, "_hf_peft_config_loaded", False):
                self.model.disable_adapters()
            return
        name = self._adapters.get(adapter.path)
        if name is None:
            self._adapter_ids += 1
            name = f"adapter_{self._adapter_ids}"  # peft's names: module attributes
            try:
                self.model.load_adapter(adapter.path, adapter_name=name)
            except Exception:
                if name in (getattr(self.model, "peft_config", None) or {}):
                    self.model.delete_adapter(name)
                raise
            self._adapters[adapter.path] = name
        self.model.set_adapter(name)
        self.model.enable_adapters()

    def adapter_refusal(self) -> str | None:
        try:
            version = importlib.metadata.version("peft")
        except importlib.metadata.PackageNotFoundError:
            version = None
        if version is not None and tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) >= PEFT_LEAST:
            return None
        return (
            f"the transformers engine loads LoRA adapters with peft {'.'.join(map(str, PEFT_LEAST))} or "
            f"later, and this worker has {'peft ' + version if version else 'none'}: install it (the "
            "transformers extra)"
        )

    def _run_isolating(
        self, texts: list[str], sampling: SamplingParams, specials: bool, images: Sequence[LoadedImage] = ()
    ) -> list[GenerationResult]:
        try:
            return self._run(texts, sampling, specials, images)
        except Exception as exc:
            if len(texts) == 1:
                return [GenerationResult.failed(f"generate: {type(exc).__name__}: {exc}")]
            # find the element that fails; the others still get their outputs
            return [r for t in texts for r in self._run_isolating([t], sampling, specials)]

    def _run(
        self, texts: list[str], sampling: SamplingParams, specials: bool, images: Sequence[LoadedImage] = ()
    ) -> list[GenerationResult]:
        """One result per text: its ``n`` candidates are ``n`` rows of the batch. ``images``: those
        of the one text, encoded with it by the processor."""
        import torch

        tok, n = self.tokenizer, sampling.n
        rows = [t for t in texts for _ in range(n)]
        if images:
            pictures = [image.pil() for image in images] * n
            enc = self.processor(text=rows, images=pictures, return_tensors="pt", padding=True)
            enc = enc.to(self.device)
        else:
            enc = tok(rows, return_tensors="pt", padding=True, add_special_tokens=specials).to(self.device)
        kwargs = self._generate_args(sampling)
        if sampling.thinking_token_budget is not None and self._think_ids is not None:
            from transformers import LogitsProcessorList

            budget = ThinkingBudget(sampling.thinking_token_budget, *self._think_ids)
            kwargs["logits_processor"] = LogitsProcessorList([budget])
        if sampling.logprobs:  # the model's own scores, before any processor (as vLLM's raw logprobs)
            kwargs.update(output_logits=True, return_dict_in_generate=True)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        with torch.inference_mode():
            out = self.model.generate(**enc, **kwargs)
        sequences = out.sequences if sampling.logprobs else out
        prompt_len = enc["input_ids"].shape[1]
        eos_ids = set(kwargs["eos_token_id"])
        choices = []
        for b, row in enumerate(sequences[:, prompt_len:]):
            ids = row.tolist()
            cut = next((k for k, t in enumerate(ids) if t in eos_ids), None)
            finish = "stop" if cut is not None else "length"
            ids = ids[:cut] if cut is not None else [t for t in ids if t != tok.pad_token_id]
            split = self._split(ids)
            text = split.answer
            whole = len(text)
            for stop in sampling.stop:
                if stop in text:
                    text, finish = text[: text.index(stop)], "stop"
            logprobs = (
                self._logprobs(out.logits, b, ids, sampling.top_logprobs) if sampling.logprobs else None
            )
            if logprobs is not None and len(text) < whole and split.reasoning is None:
                logprobs = _within(logprobs, len(text))  # a stop string cut the text: its tokens
            choices.append(
                Choice(text, finish, len(ids), logprobs, split.reasoning, split.reasoning_tokens, split.ended)
            )
        masks = enc["attention_mask"]
        return [
            GenerationResult.of(choices[i * n : (i + 1) * n], int(masks[i * n].sum()))
            for i in range(len(texts))
        ]

    def _split(self, ids: list[int]) -> Split:
        """The generated ``ids`` decoded, split on the reasoning parser's delimiters (none: all answer)."""
        decode = self.tokenizer.decode
        if self._think_ids is None:
            return Split(decode(ids, skip_special_tokens=True))
        thought, answer, ended = Delimiters.split_ids(ids, *self._think_ids)
        return Split(
            decode(answer, skip_special_tokens=True),
            decode(thought, skip_special_tokens=True),
            len(thought),
            ended,
        )

    def _logprobs(self, logits: Any, row: int, ids: list[int], top: int) -> tuple[TokenLogprob, ...]:
        """Row ``row``'s tokens ``ids`` with their log probabilities under the model (``logits``: one
        ``[rows, vocabulary]`` tensor per generated position) and the ``top`` likeliest alternatives."""
        import torch

        tokens = []
        for k, token_id in enumerate(ids):
            scores = torch.log_softmax(logits[k][row].float(), dim=-1)
            best = torch.topk(scores, top) if top else None
            alternatives = (
                tuple((self.tokenizer.decode([int(t)]), float(v)) for v, t in zip(*best, strict=True))
                if best is not None
                else ()
            )
            tokens.append(
                TokenLogprob(self.tokenizer.decode([token_id]), float(scores[token_id]), alternatives)
            )
        return tuple(tokens)

    def _generate_args(self, sampling: SamplingParams) -> dict[str, Any]:
        """``generate()``'s arguments for ``sampling``: each field it honours (``Engine.honours``)."""
        eos = self.model.generation_config.eos_token_id
        eos = eos if eos is not None else self.tokenizer.eos_token_id
        model_eos = list(eos) if isinstance(eos, list | tuple) else [eos]
        # ignore_eos: the end of sequence can never be chosen (a stop token id still ends the answer)
        suppressed = [t for t in model_eos if t not in sampling.stop_token_ids] if sampling.ignore_eos else []
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "min_new_tokens": sampling.min_tokens or None,
            "pad_token_id": self.tokenizer.pad_token_id,
            # an answer ends at the model's end of sequence or at a stop token id, whichever comes first
            "eos_token_id": [*model_eos, *(t for t in sampling.stop_token_ids if t not in model_eos)],
            "do_sample": sampling.temperature > 0,
            "repetition_penalty": sampling.repetition_penalty,
            "sequence_bias": [[[token], bias] for token, bias in sampling.logit_bias] or None,
            "suppress_tokens": suppressed or None,
        }
        if sampling.temperature > 0:
            kwargs.update(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,  # 0: every token (not generate()'s default of 50)
                min_p=sampling.min_p or None,
            )
        else:  # greedy: the likeliest token, which top_p, top_k and min_p all keep
            kwargs.update(temperature=None, top_p=None, top_k=None, min_p=None)
        return kwargs

    async def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        if self.scoring is None:
            return await super().score(requests)
        self._awake()
        return await asyncio.to_thread(self._score, requests)

    def _score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        """Each request's raw outputs; a text that cannot be rendered or does not fit the context is
        its own error, and a failing batch is scored text by text to find the culprit."""
        results: list[ScoreResult | None] = [None] * len(requests)
        groups: dict[bool, list[tuple[int, str]]] = {}
        for i, request in enumerate(requests):
            try:
                if request.prompt is not None:
                    text, specials = request.prompt, True
                else:
                    turns = chat_messages(request.messages, self.tokenizer)
                    text, specials = str(self.tokenizer.apply_chat_template(turns, tokenize=False)), False
            except Exception as exc:
                results[i] = ScoreResult.failed(f"chat template: {type(exc).__name__}: {exc}")
                continue
            n = len(self.tokenizer(text, add_special_tokens=specials)["input_ids"])
            if n > self.max_len:
                results[i] = ScoreResult.failed(
                    f"the text to score has {n} tokens, more than the model's context of {self.max_len}: "
                    "shorten it (a judge template that scores less of the record)"
                )
                continue
            groups.setdefault(specials, []).append((i, text))
        with self._lock, self.tally.batch(sum(map(len, groups.values()))):
            for specials, members in groups.items():
                outs = self._score_isolating([t for _, t in members], specials)
                for (i, _), out in zip(members, outs, strict=True):
                    results[i] = out
                self.tally.count(outs)
        return [r if r is not None else ScoreResult.failed("not scored") for r in results]

    def _score_isolating(self, texts: list[str], specials: bool) -> list[ScoreResult]:
        try:
            return self._score_batch(texts, specials)
        except Exception as exc:
            if len(texts) == 1:
                return [ScoreResult.failed(f"score: {type(exc).__name__}: {exc}")]
            return [r for t in texts for r in self._score_isolating([t], specials)]

    def _score_batch(self, texts: list[str], specials: bool) -> list[ScoreResult]:
        import torch

        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=specials)
        with torch.inference_mode():
            logits = self.model(**enc.to(self.device)).logits.float().cpu()
        lengths = enc["attention_mask"].sum(dim=1).tolist()
        return [
            ScoreResult(tuple(float(v) for v in row), prompt_tokens=int(n))
            for row, n in zip(logits.tolist(), lengths, strict=True)
        ]

    async def embed(self, requests: list[EmbedRequest]) -> list[EmbedResult]:
        if self.embedding is None:
            return await super().embed(requests)
        self._awake()
        return await asyncio.to_thread(self._embed, requests)

    def _embed(self, requests: list[EmbedRequest]) -> list[EmbedResult]:
        """Each request's vector; a text that cannot be rendered, does not fit the context or asks for
        more dimensions than the model's is its own error, and a failing batch is embedded text by text."""
        assert self.embedding is not None
        results: list[EmbedResult | None] = [None] * len(requests)
        todo: list[tuple[int, str]] = []
        for i, r in enumerate(requests):
            why = dimensions_refusal(r, self.embedding)
            try:
                text = (
                    r.prompt
                    if r.prompt is not None
                    else str(
                        self.tokenizer.apply_chat_template(
                            chat_messages(r.messages, self.tokenizer), tokenize=False
                        )
                    )
                )
            except Exception as exc:
                why = f"chat template: {type(exc).__name__}: {exc}"
            if why is None and (n := len(self.tokenizer(text)["input_ids"])) > self.max_len:
                why = f"the text to embed has {n} tokens, more than the model's context of {self.max_len}"
            if why is not None:
                results[i] = EmbedResult.failed(why)
            else:
                todo.append((i, text))
        with self._lock, self.tally.batch(len(todo)):
            outs = self._embed_isolating([t for _, t in todo], [requests[i].dimensions for i, _ in todo])
        for (i, _), out in zip(todo, outs, strict=True):
            results[i] = out
        return [r if r is not None else EmbedResult.failed("not embedded") for r in results]

    def _embed_isolating(self, texts: list[str], dims: list[int | None]) -> list[EmbedResult]:
        if not texts:
            return []
        try:
            return embed_batch(self.model, self.tokenizer, texts, self._pooling, dims, self.device)
        except Exception as exc:
            if len(texts) == 1:
                return [EmbedResult.failed(f"embed: {type(exc).__name__}: {exc}")]
            return [r for t, d in zip(texts, dims, strict=True) for r in self._embed_isolating([t], [d])]

    def stats(self) -> EngineStats:
        return self.tally.stats()

    async def close(self) -> None:
        self.model = None
        self.tokenizer = None
        self.processor = None

    def describe(self) -> dict[str, Any]:
        described = {
            "engine": self.name,
            "model": os.path.basename(os.path.normpath(self.model_path)),
            "dtype": self.dtype,
        }
        if self.reasoning_parser is not None:  # it changes what a row's result is
            described["reasoning_parser"] = self.reasoning_parser
        # a scoring or embedding model says so (a generating one is described as it always was)
        for served in (self.scoring, self.embedding):
            if served is not None:
                described.update(served.describe())
        return described


def _within(tokens: tuple[TokenLogprob, ...], chars: int) -> tuple[TokenLogprob, ...]:
    """The first of ``tokens`` whose text fits in ``chars`` characters (a text cut at a stop string)."""
    kept, length = [], 0
    for t in tokens:
        length += len(t.token)
        if length > chars:
            break
        kept.append(t)
    return tuple(kept)
