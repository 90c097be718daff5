"""A pool whose workers already run somewhere: a list of URLs and the token they accept."""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_batchinfer.exceptions import ConfigError


@dataclass(frozen=True)
class StaticPool:
    urls: list[str] = field(default_factory=list)
    token: str | None = None

    def __post_init__(self) -> None:
        if not self.urls:
            raise ConfigError("a static pool needs at least one worker URL")
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"worker URL {url!r} must start with http:// or https://")
