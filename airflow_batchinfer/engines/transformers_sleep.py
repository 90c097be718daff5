"""Sleep for the ``transformers`` engine on a CUDA GPU (``Engine.sleep``).

Level 1 moves the model to CPU memory and gives the GPU's cached blocks back to the driver; a wake
moves it back (a host-to-device copy, no file read). Level 2 drops the model; a wake loads it again
from its directory, as at start. On a CPU there is no device memory to free: refused.
"""

from __future__ import annotations

import gc

from airflow_batchinfer.engines.base import level_refusal


def sleep_refusal(device: str, level: int) -> str | None:
    """Why a transformers engine on ``device`` cannot sleep at ``level`` (``None``: it can)."""
    if (why := level_refusal("transformers", level)) is not None:
        return why
    if not device.startswith("cuda"):
        return (
            f"the transformers engine runs on {device}: sleep frees a CUDA GPU's memory, and a CPU has "
            "none to give back: use gate_idle keep or release"
        )
    return None


def free_device() -> None:
    """Give the memory of tensors no longer referenced back to the driver (torch keeps it cached)."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()
