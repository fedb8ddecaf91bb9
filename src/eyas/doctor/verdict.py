"""Checks and verdicts as plain data, rendered as a table or as JSON; the exit code is derived here.

A ``Check`` is one line of the doctor's table: ``ok``, ``warning`` or ``problem``, what was found
and, unless it is ok, the fix. A ``Report`` is the list of checks plus, for a live server, the
measured figures and the one-line verdict. Exit status: 0 when no check is a problem, 1 otherwise,
so ``eyas doctor`` can gate a deployment in CI.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

OK, WARNING, PROBLEM = "ok", "warning", "problem"
MARK = {OK: "ok", WARNING: "WARN", PROBLEM: "PROBLEM"}


@dataclass
class Check:
    name: str
    status: str  # ok | warning | problem
    message: str
    fix: str = ""


@dataclass
class Report:
    subject: str  # what was examined: "draft X for target Y", "http://host:port (SGLang)"
    checks: list[Check] = field(default_factory=list)
    verdict: str = ""  # plain words, with the numbers
    figures: dict = field(default_factory=dict)  # tau, accept_rate, per-position, tokens/s, ...

    def add(self, name: str, status: str, message: str, fix: str = "") -> Check:
        c = Check(name, status, message, fix if status != OK else "")
        self.checks.append(c)
        return c

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.status == PROBLEM]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == WARNING]

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

    def as_dict(self) -> dict:
        return {"subject": self.subject, "ok": not self.problems, "exit_code": self.exit_code,
                "verdict": self.verdict, "figures": self.figures, "checks": [asdict(c) for c in self.checks]}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


def render(report: Report, width: int = 100) -> str:
    """The human table: one row per check, fixes indented under the rows that need them."""
    name_w = max([len(c.name) for c in report.checks] + [5])
    lines = [f"eyas doctor: {report.subject}", ""]
    lines.append(f"  {'check'.ljust(name_w)}  {'status'.ljust(7)}  finding")
    lines.append(f"  {'-' * name_w}  {'-' * 7}  {'-' * max(10, width - name_w - 13)}")
    for c in report.checks:
        lines.append(f"  {c.name.ljust(name_w)}  {MARK[c.status].ljust(7)}  {c.message}")
        if c.fix:
            lines.append(f"  {' ' * name_w}  {' ' * 7}  fix: {c.fix}")
    lines.append("")
    n_p, n_w = len(report.problems), len(report.warnings)
    summary = f"{n_p} problem{'s' if n_p != 1 else ''}, {n_w} warning{'s' if n_w != 1 else ''}"
    lines.append(f"verdict: {report.verdict}" if report.verdict else f"verdict: {'OK' if not n_p else 'NOT OK'}")
    lines.append(f"({summary}; exit status {report.exit_code})")
    return "\n".join(lines)
