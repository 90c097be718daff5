"""A pool whose workers already run somewhere: a list of URLs and the token they accept.

Nothing here starts or stops them, so leases are no-ops: whoever runs the workers keeps them up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.rpc.locate import Workers
from airflow_batchinfer.state.docs.usage import WorkerStart


@dataclass(frozen=True)
class StaticPool:
    urls: list[str] = field(default_factory=list)
    rpc_token: str | None = None
    name: str = "static"

    backend = "static"

    def __post_init__(self) -> None:
        if not self.urls:
            raise ConfigError(f"pool {self.name!r}: a static pool needs at least one worker URL")
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"worker URL {url!r} must start with http:// or https://")

    def __str__(self) -> str:
        return self.name

    def token(self) -> str | None:
        return self.rpc_token

    def endpoints(self, lease_id: str | None = None) -> list[str]:
        return list(self.urls)

    def workers(self, lease_id: str | None = None) -> Workers:
        return Workers.of(self.urls)  # fixed: no worker is ever unlisted

    def acquire(self, lease_id: str, replicas: int, *, ttl_s: float = 0.0) -> int:
        return len(self.urls)

    def keep(self, lease_id: str, *, ttl_s: float = 0.0) -> str | None:
        return None

    def want(self, lease_id: str, replicas: int | None = None) -> int:
        return len(self.urls)  # not ours to scale

    def release(self, lease_id: str, *, stop: bool = False) -> int:
        return len(self.urls)  # not ours to stop

    def problems(self) -> list[str]:
        return []

    def starts(self, since: float) -> list[WorkerStart]:
        return []  # it starts no worker
