"""SIMULATED engine, for benchmarks and orchestration tests only: no model runs.

Batch latency is ``a + b·tokens``; outputs are deterministic. As a judge (``metadata.role ==
"judge"``) it answers a JSON verdict approving a record with probability ``approval_rate``, decided
by a hash of (record id, attempt), with a ``score`` in [0, 1) hashed the same way, so rounds and
retries are reproducible. ``fail_marker`` makes any
request whose prompt contains it fail alone (to show a bad element fails only its record). A prompt
containing ``simulate_tokens=N`` asks for an answer of ``N`` tokens (else ``completion_tokens``):
with ``max_tokens`` below ``N`` it is cut there, ``finish_reason`` ``"length"`` (to show truncation
and its retries). With ``n`` > 1 each candidate's answer differs (hashed with its index), and a
judge's verdict on candidate ``c`` (``metadata.candidate``) is hashed with it; an adapter's answers
(``GenerationRequest.adapter``) are hashed with its name. ``echo_prompt`` answers with the prompt
itself (a chat request's messages' contents, one a line): what a request was sent with, for tests of
prompts (a retry's ``previous``, say). A request with images (loaded and checked by the worker as for
any engine) is answered as its text alone would be, each answer starting with
``[simulated: N image(s) ignored]`` (:data:`IGNORED_IMAGES`): no model sees them. With
``embedding_dimensions`` it is an embedding model instead,
whose vectors are hashed from the text (:func:`~airflow_batchinfer.engines.pooling.simulated_vector`),
and with ``labels`` a scoring model whose raw outputs (one per label) are hashed the same way. It honours no
structured output and no logprobs (its answers are not model text a constraint could
hold): a request asking for one is that request's error, as on any engine that does not honour a field.

It sleeps (:meth:`~airflow_batchinfer.engines.base.Engine.sleep`) at level 1 or 2 unless started
with ``enable_sleep_mode`` false (then it refuses, as vllm does). ``load_s`` simulates loading the
model at start; a wake takes ``wake_s`` from level 1 and ``load_s + wake_s`` from level 2 (the
weights read again), so benchmarks compare them. A batch given to it asleep raises
:class:`~airflow_batchinfer.exceptions.EngineAsleep`.

A batch ends at its due time as a device's would: the event loop is woken then (:func:`until`), not
at its own timer's next millisecond, 0-1 ms late per batch (~1 s of each GPU's 3,500 batches at 1M
records in ``bench/scale.py``, whose Ray Data actors sleep as precisely).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_batchinfer.engines.base import Choice, Engine, GenerationRequest, GenerationResult, level_refusal
from airflow_batchinfer.engines.messages import flat_text
from airflow_batchinfer.engines.pooling import (
    EmbeddingModel,
    EmbedRequest,
    EmbedResult,
    dimensions_refusal,
    shaped,
    simulated_vector,
)
from airflow_batchinfer.engines.scoring import ScoreRequest, ScoreResult, ScoringModel
from airflow_batchinfer.engines.stats import TALLIED, EngineStats, StatsTally
from airflow_batchinfer.exceptions import ConfigError, EngineAsleep

# the answer's length a prompt asks for (a record field rendered into it): see the module's text
WANTS_TOKENS = re.compile(r"\bsimulate_tokens=(\d{1,9})\b")


# The last stretch of a wait that a thread sleeps (precise to microseconds) beside the loop's timer.
PRECISE_S = 0.002


async def until(due: float, clock: ThreadPoolExecutor) -> None:
    """Return at ``due`` (``loop.time()``). The loop's timer rounds its wait up to the next
    millisecond (epoll's resolution); a device's end wakes the loop when it happens. So the loop's
    timer waits until :data:`PRECISE_S` before ``due``, then a thread of ``clock`` sleeps exactly to
    ``due`` and wakes the loop beside a timer at ``due``: whichever comes first ends the wait (a busy
    clock or loop costs no more than the timer alone)."""
    loop = asyncio.get_running_loop()
    if due - loop.time() > PRECISE_S:
        await asyncio.sleep(due - loop.time() - PRECISE_S)
    left = due - loop.time()
    if left <= 0:
        return
    done = loop.create_future()

    def end() -> None:
        if not done.done():
            done.set_result(None)

    def woken(_: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(end)

    deadline = time.monotonic() + left  # absolute: a sleep queued behind another still ends on time
    timer = loop.call_at(due, end)
    clock.submit(lambda: time.sleep(max(0.0, deadline - time.monotonic()))).add_done_callback(woken)
    try:
        await done
    finally:
        timer.cancel()


def stable_fraction(*parts: Any) -> float:
    """A deterministic number in [0, 1) from ``parts``."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


#: The start of each answer to a request with images (the simulated engine sees none of them).
IGNORED_IMAGES = "[simulated: {} image(s) ignored]"


class SimulatedEngine(Engine):
    """SIMULATED: latency ``latency_base_s + latency_per_token_s · tokens`` per batch, no model."""

    name = "simulated"
    stats_fields = TALLIED
    loads_adapters = True  # any adapter: its name changes the answers

    def __init__(
        self,
        *,
        latency_base_s: float = 0.005,
        latency_per_token_s: float = 2e-6,
        approval_rate: float = 0.7,
        completion_tokens: int = 16,
        fail_marker: str | None = None,
        echo_prompt: bool = False,
        model: str = "simulated",
        embedding_dimensions: int | None = None,
        labels: list[str] | None = None,
        load_s: float = 0.0,
        wake_s: float = 0.02,
        enable_sleep_mode: bool = True,
    ) -> None:
        self.latency_base_s = latency_base_s
        self.latency_per_token_s = latency_per_token_s
        self.approval_rate = approval_rate
        self.completion_tokens = completion_tokens
        self.fail_marker = fail_marker
        self.echo_prompt = echo_prompt
        self.model = model
        if embedding_dimensions is not None:
            self.embedding = EmbeddingModel("simulated", int(embedding_dimensions), matryoshka=True)
        self.scoring = ScoringModel("simulated", tuple(labels)) if labels else None
        # a simulated device's times (benches compare them): loading the model, and a level-1 wake;
        # a level-2 wake reads the weights again, taking both
        self.load_s, self.wake_s = float(load_s), float(wake_s)
        self.enable_sleep_mode = enable_sleep_mode  # false: it refuses to sleep, as vllm then does
        self.sleeping: int | None = None  # the level it sleeps at (None: awake)
        self.tally = StatsTally()  # its batches, simulated tokens and requests in flight
        # ends batches on time (see :func:`until`): up to 4 in flight at once, more on the loop's timer
        self.clock = ThreadPoolExecutor(max_workers=4, thread_name_prefix="simulated-device")

    async def start(self) -> None:
        await asyncio.sleep(self.load_s)

    def sleep_refusal(self, level: int) -> str | None:
        if not self.enable_sleep_mode:
            return (
                "the simulated engine was started without enable_sleep_mode: give the pool the engine "
                "option enable_sleep_mode true, or use gate_idle keep or release"
            )
        return level_refusal(self.name, level)

    async def sleep(self, level: int) -> None:
        """Asleep at ``level`` (a simulated device frees nothing, and takes no time to)."""
        if (why := self.sleep_refusal(level)) is not None:
            raise ConfigError(why)
        self.sleeping = level

    async def wake(self) -> None:
        """Awake after ``wake_s`` (level 1), or ``load_s + wake_s`` (level 2: a reload)."""
        if self.sleeping is None:
            return
        await asyncio.sleep(self.wake_s + (self.load_s if self.sleeping == 2 else 0.0))
        self.sleeping = None

    def _awake(self) -> None:
        if self.sleeping is not None:
            raise EngineAsleep(f"the simulated engine got a batch while asleep (level {self.sleeping})")

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """The batch's results after ``a + b·tokens`` seconds, counted from the call: building the
        results (hashing, on the event loop) is part of that time, not added to it."""
        self._awake()
        loop = asyncio.get_running_loop()
        due = loop.time()
        tokens = sum(
            r.prompt_chars() // 4 + 1 + min(self.completion_tokens, r.sampling.max_tokens) for r in requests
        )
        due += self.latency_base_s + self.latency_per_token_s * tokens
        with self.tally.batch(len(requests)):
            results = [self._one(r) for r in requests]
            await until(due, self.clock)
        self.tally.count(results)
        return results

    async def embed(self, requests: list[EmbedRequest]) -> list[EmbedResult]:
        """Each text's simulated vector, after ``a + b·tokens`` seconds as :meth:`generate`."""
        if self.embedding is None:
            return await super().embed(requests)
        self._awake()
        model = self.embedding
        due = asyncio.get_running_loop().time()
        due += self.latency_base_s + self.latency_per_token_s * sum(r.estimate_tokens() for r in requests)
        results = []
        for r in requests:
            text = r.text()
            why = dimensions_refusal(r, model)
            if why is None and self.fail_marker and self.fail_marker in text:
                why = f"simulated failure: text contains {self.fail_marker!r}"
            vector = shaped(simulated_vector(text, model.dimensions), r.dimensions)
            results.append(EmbedResult.failed(why) if why else EmbedResult(vector, None, r.estimate_tokens()))
        with self.tally.batch(len(requests)):
            await until(due, self.clock)
        return results

    async def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        """With ``labels``: each text's raw outputs, hashed from it (one per label)."""
        if self.scoring is None:
            return await super().score(requests)
        self._awake()
        labels = self.scoring.labels
        out = []
        for r in requests:
            text = r.prompt if r.prompt is not None else json.dumps(list(r.messages or ()))
            if self.fail_marker and self.fail_marker in text:
                out.append(ScoreResult.failed(f"simulated failure: text contains {self.fail_marker!r}"))
                continue
            logits = tuple(round(4 * stable_fraction("logit", text, label) - 2, 6) for label in labels)
            out.append(ScoreResult(logits, prompt_tokens=r.estimate_tokens()))
        return out

    def stats(self) -> EngineStats:
        return self.tally.stats()

    async def close(self) -> None:
        self.clock.shutdown(wait=False)  # its sleeps end within milliseconds

    def _one(self, request: GenerationRequest) -> GenerationResult:
        prompt = request.prompt if request.prompt is not None else json.dumps(list(request.messages or ()))
        if self.fail_marker and self.fail_marker in prompt:
            return GenerationResult.failed(f"simulated failure: prompt contains {self.fail_marker!r}")
        if request.sampling.structured_outputs is not None or request.sampling.logprobs:  # not honoured
            return GenerationResult.failed(f"simulated: {self.sampling_refusal(request.sampling)}")
        meta = request.metadata
        wants = WANTS_TOKENS.search(prompt) if meta.get("role") != "judge" else None
        needed = int(wants.group(1)) if wants else self.completion_tokens
        budget = request.sampling.max_tokens
        finish = "length" if wants and needed > budget else "stop"
        if request.adapter is not None:  # another model's answers
            prompt = f"{request.adapter.name}\x1e{prompt}"
        said = self._said(request) if self.echo_prompt and meta.get("role") != "judge" else None
        # no model sees the images the worker loaded and checked: every answer says so
        unseen = f"{IGNORED_IMAGES.format(len(request.images))} " if request.images else ""
        choices = [
            Choice(
                unseen + (said if said is not None else self._text(prompt, meta, i)),
                finish,
                min(needed, budget),
            )
            for i in range(request.sampling.n)
        ]
        return GenerationResult.of(choices, request.prompt_chars() // 4 + 1)

    @staticmethod
    def _said(request: GenerationRequest) -> str:
        """What ``echo_prompt`` answers: the prompt, or the chat messages' contents, one a line."""
        if request.prompt is not None:
            return request.prompt
        return "\n".join(flat_text(m.get("content")) for m in request.messages or ())

    def _text(self, prompt: str, meta: Mapping[str, Any], index: int) -> str:
        """Candidate ``index``'s answer (a judge's verdict: of the candidate ``meta`` names)."""
        # the first candidate's hash is the same as before candidates existed: runs reproduce
        extra = () if index == 0 else (index,)
        if meta.get("role") == "judge":
            of = (
                meta.get("record_id"),
                meta.get("attempt", 1),
                *((c,) if (c := meta.get("candidate")) else ()),
            )
            approved = stable_fraction(*of) < self.approval_rate
            # a confidence, also deterministic (review_below_score sends the low ones to people)
            score = round(stable_fraction("score", *of), 3)
            return json.dumps({"approved": approved, "reason": "simulated verdict", "score": score})
        digest = hashlib.sha256("\x1f".join(map(str, (prompt, meta.get("attempt", 1), *extra))).encode())
        return f"simulated answer {digest.hexdigest()[:16]}"

    def describe(self) -> dict[str, Any]:
        described = {"engine": self.name, "model": self.model, "approval_rate": self.approval_rate}
        # a scoring or embedding model says so (as it always was otherwise: its runs' job ids stay)
        for served in (self.scoring, self.embedding):
            if served is not None:
                described.update(served.describe())
        return described
