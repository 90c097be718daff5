"""Which directories the transformers engine loads as embedding models, and how it pools and
normalizes them: as vLLM reads the same sentence-transformers files (no torch needed here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.engines.embedding_models import is_embedding_model, pooling_of
from airflow_batchinfer.exceptions import ConfigError

TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}


def model_dir(
    tmp_path: Path, modules: list[dict[str, Any]] | None, pooling: dict[str, Any] | None = None
) -> str:
    if modules is not None:
        (tmp_path / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return str(tmp_path)


@pytest.mark.parametrize(
    ("modules", "pooling", "expected"),
    [
        (None, None, ("mean", True)),  # no sentence-transformers files: vLLM's embed default
        ([TRANSFORMER, POOLING, NORMALIZE], {"pooling_mode_mean_tokens": True}, ("mean", True)),
        ([TRANSFORMER, POOLING], {"pooling_mode_mean_tokens": True}, ("mean", False)),  # no Normalize
        ([TRANSFORMER, POOLING, NORMALIZE], {"pooling_mode_cls_token": True}, ("cls", True)),
        ([TRANSFORMER, POOLING], {"pooling_mode": "lasttoken"}, ("last", False)),
    ],
)
def test_pooling_and_normalizing_as_vllm_reads_them(
    tmp_path: Path,
    modules: list[dict[str, Any]] | None,
    pooling: dict[str, Any] | None,
    expected: tuple[str, bool],
) -> None:
    assert pooling_of(model_dir(tmp_path, modules, pooling)) == expected


def test_a_pooling_it_does_not_do_is_refused_naming_it(tmp_path: Path) -> None:
    path = model_dir(tmp_path, [TRANSFORMER, POOLING], {"pooling_mode_max_tokens": True})
    with pytest.raises(ConfigError, match=r"pooling_mode_max_tokens.*it pools by mean, cls, last"):
        pooling_of(path)


def test_embedding_models_by_their_files_or_architectures(tmp_path: Path) -> None:
    assert is_embedding_model(
        model_dir(tmp_path, [TRANSFORMER]), ["LlamaForCausalLM"]
    )  # sentence-transformers
    other = tmp_path / "other"
    other.mkdir()
    assert is_embedding_model(str(other), ["BertModel"]) and is_embedding_model(str(other), ["LlamaModel"])
    assert not is_embedding_model(str(other), ["LlamaForCausalLM"])
    assert not is_embedding_model(str(other), ["BertForSequenceClassification"]) and not is_embedding_model(
        str(other), None
    )
