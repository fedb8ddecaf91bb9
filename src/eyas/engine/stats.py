"""Acceptance statistics: plain data that the log line, Prometheus and JSON exporters read.

    drafts          verify steps (target forwards that checked a draft)
    draft_tokens    draft tokens proposed (num_draft_tokens - 1 per verify step)
    accepted        draft tokens accepted
    accepted_per_position[i]  steps whose accepted path reached depth i + 1

    acceptance length tau = 1 + accepted / drafts     (tokens emitted per target forward)
    acceptance rate       = accepted / draft_tokens
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, proposed: int, accepted: int) -> None:
        """One verify step that proposed ``proposed`` tokens and accepted a path of ``accepted``."""
        self.drafts += 1
        self.draft_tokens += proposed
        self.accepted += accepted
        if len(self.accepted_per_position) < accepted:
            self.accepted_per_position.extend([0] * (accepted - len(self.accepted_per_position)))
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    def add(self, other: SpecStats) -> SpecStats:
        self.drafts += other.drafts
        self.draft_tokens += other.draft_tokens
        self.accepted += other.accepted
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        a = self.accepted_per_position + [0] * (n - len(self.accepted_per_position))
        b = other.accepted_per_position + [0] * (n - len(other.accepted_per_position))
        self.accepted_per_position = [x + y for x, y in zip(a, b)]
        return self

    @property
    def accept_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0

    @property
    def accept_rate(self) -> float:
        return self.accepted / self.draft_tokens if self.draft_tokens else 0.0

    def as_dict(self) -> dict:
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted,
            "accepted_per_position": list(self.accepted_per_position),
            "accept_length": round(self.accept_length, 4),
            "accept_rate": round(self.accept_rate, 4),
        }
