"""Helpers for the server tests: a real server subprocess, an in-process one, a metrics scrape."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from helpers import InProcessServer, free_port  # noqa: F401 - shared with the doctor tests

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


class ServerProcess:
    def __init__(self, args: list[str], log_dir: Path, name: str = "server"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stdout_path, self.stderr_path = log_dir / f"{name}.out", log_dir / f"{name}.err"
        self._logs = [open(self.stdout_path, "w"), open(self.stderr_path, "w")]  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([PYTHON, "-m", "eyas.serve", *args, "--port", str(self.port)], cwd=ROOT,
                                     stdout=self._logs[0], stderr=self._logs[1])

    def wait_ready(self, timeout: float = 240) -> ServerProcess:
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.stderr()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(self.stderr())

    def stdout(self) -> str:
        return self.stdout_path.read_text()

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in self._logs:
            f.close()
        return self.proc.returncode


CONSTANT_LABELS = ("model_name", "engine")  # on every series; test_metrics.py checks them


def scrape(url: str) -> dict[str, float]:
    """``/metrics`` through prometheus_client's own parser: {'name{label="v",...}': value}, the labels every
    series carries (``CONSTANT_LABELS``) left out of the keys."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k not in CONSTANT_LABELS)
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def wait_idle(url: str, timeout: float = 60.0) -> dict:
    """``/health`` once nothing runs or waits (or the last answer, after ``timeout`` seconds)."""
    deadline = time.time() + timeout
    while True:
        health = httpx.get(url + "/health", timeout=10).json()
        if health["running"] == 0 and health["queued"] == 0 or time.time() > deadline:
            return health
        time.sleep(0.1)
