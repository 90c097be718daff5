"""What review gates and round tails idle, for ``batchinfer plan --review-delay``: per gate the
GPU-hours a run's pool idles while people take ``review_delay_s`` to answer, under ``gate_idle:
keep`` (the lease kept the whole wait) and ``release`` (kept ``gate_keep_warm_s``, then the pool
idles its own ``idle_ttl_s`` before it scales to zero, unless the answer comes first), beside the
planned rounds' tail idle (:mod:`~airflow_batchinfer.run.sizing`). A gate precedes each planned
round after the first. Release pays a re-warm after the wait instead (the pool's cold start, or a
wake from sleep): not counted here, measured in the run's report (``usage.rewarm_s``)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run.sizing_plan import SizingPlan, duration

# ReviewConfig's gate_keep_warm_s default (the run setting's): the lease a released gate keeps first.
DEFAULT_GATE_KEEP_WARM_S = 300.0
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_delay(text: str) -> float:
    """Seconds from ``3600``, ``45s``, ``30m``, ``12h`` or ``1.5d``."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text.lower())
    if m is None:
        raise ConfigError(f"--review-delay: {text!r} is not a duration (seconds, or e.g. 45s, 30m, 12h, 1d)")
    return float(m.group(1)) * _UNITS[m.group(2)]


@dataclass(frozen=True)
class GateIdle:
    """Per gate, the GPU-hours idle under ``keep`` and ``release``; for the run, ``gates`` of them
    and the planned rounds' tail idle; ``*_total_gpu_h``: gates and tails together."""

    review_delay_s: float
    gates: int
    gpus: int
    gate_keep_warm_s: float
    idle_ttl_s: float
    keep_gpu_h_per_gate: float
    release_gpu_h_per_gate: float
    tail_idle_gpu_h: float
    keep_total_gpu_h: float
    release_total_gpu_h: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The estimate as text, printed beside the plan's table."""
        held = self.gate_keep_warm_s + self.idle_ttl_s
        return [
            f"review gates: {self.gates}, each answered after {duration(self.review_delay_s)}; "
            f"idle GPU-hours per gate: keep {self.keep_gpu_h_per_gate:,.2f}, release "
            f"{self.release_gpu_h_per_gate:,.2f} (kept {duration(self.gate_keep_warm_s)}, then the "
            f"pool's idle_ttl {duration(self.idle_ttl_s)}: {duration(min(held, self.review_delay_s))} "
            "held; plus a re-warm after the answer)",
            f"idle GPU-hours, gates and tails ({self.tail_idle_gpu_h:,.2f} in tails): keep "
            f"{self.keep_total_gpu_h:,.2f}, release {self.release_total_gpu_h:,.2f}",
        ]


def gate_idle(
    plan: SizingPlan,
    review_delay_s: float,
    *,
    gate_keep_warm_s: float = DEFAULT_GATE_KEEP_WARM_S,
    idle_ttl_s: float,
) -> GateIdle:
    """The estimate for ``plan``'s rounds on its GPUs (see the module doc)."""
    if review_delay_s < 0 or gate_keep_warm_s < 0 or idle_ttl_s < 0:
        raise ConfigError("the review delay, gate_keep_warm_s and idle_ttl_s must be >= 0")
    gates = max(len(plan.rounds) - 1, 0)
    keep = plan.gpus * review_delay_s / 3600
    release = plan.gpus * min(review_delay_s, gate_keep_warm_s + idle_ttl_s) / 3600
    tails = plan.tail_idle_gpu_s / 3600
    return GateIdle(
        review_delay_s=review_delay_s,
        gates=gates,
        gpus=plan.gpus,
        gate_keep_warm_s=gate_keep_warm_s,
        idle_ttl_s=idle_ttl_s,
        keep_gpu_h_per_gate=round(keep, 4),
        release_gpu_h_per_gate=round(release, 4),
        tail_idle_gpu_h=round(tails, 4),
        keep_total_gpu_h=round(gates * keep + tails, 4),
        release_total_gpu_h=round(gates * release + tails, 4),
    )
