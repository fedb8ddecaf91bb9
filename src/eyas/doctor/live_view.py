"""What ``eyas doctor --url`` is asked (``LiveOptions``) and what it saw (``ServerView``, ``ProbeResult``).

``live`` fills them in and ``judge`` reads them; they sit below both so neither imports the other's module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from ..common import server_metrics


@dataclass
class ProbeResult:
    requests: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    timeouts: int = 0  # requests that got no answer within --timeout (part of errors)
    per_request_tau: list[float] = field(default_factory=list)  # where responses carry spec_accept_length

    @property
    def tokens_per_s(self) -> float | None:
        return self.completion_tokens / self.seconds if self.seconds > 0 and self.completion_tokens else None


@dataclass
class ServerView:
    url: str
    kind: str = server_metrics.UNKNOWN
    model: str | None = None
    owned_by: str | None = None
    models_status: int | None = None  # GET /v1/models's status
    models_error: str | None = None  # a 200 that is no model list, in words (what was received)
    metrics_status: int | None = None
    metrics_error: str | None = None  # /metrics timed out, failed or answered text that is not Prometheus
    error: str | None = None
    timed_out: bool = False


@dataclass
class LiveOptions:
    probes: int = 5
    no_probe: bool = False
    max_tokens: int = 64
    expect_tau: float | None = None
    tau_tolerance: float = 0.1  # relative
    baseline_url: str | None = None
    baseline_tps: float | None = None
    model: str | None = None
    timeout: float = 300.0
    api_key: str | None = None  # sent as "Authorization: Bearer KEY" (eyas/SGLang/vLLM --api-key)

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        return httpx.Client(timeout=self.timeout, headers=headers)
