"""SIGTERM: stop accepting, let in-flight requests finish within --shutdown-timeout, cancel the rest."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
from serve_helpers import ServerProcess


def test_sigterm_finishes_or_cancels_in_flight_requests_and_exits_zero(models, tmp_path):
    tiny, _ = models
    s = ServerProcess(["--model-path", str(tiny), "--dtype", "float64",  # a local target, no draft: NONE
                       "--shutdown-timeout", "2", "--no-warmup", "--log-interval", "0"], tmp_path, "plain").wait_ready()
    try:
        assert "speculative algorithm: NONE" in s.stdout()
        metrics = httpx.get(s.url + "/metrics").text
        assert 'algorithm="NONE"' in metrics and "spec_accept" not in metrics  # no 1.00 where nothing drafts
        results: dict[str, object] = {}

        def stream(name: str, max_tokens: int) -> None:
            chunks = []
            try:
                with httpx.stream("POST", s.url + "/v1/completions", timeout=60, json={
                        "prompt": name, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                        "stream": True}) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            chunks.append(line[6:])
                            results[name + "_started"] = True
            except httpx.HTTPError as e:  # the cancelled stream may be cut mid-body
                results[name + "_error"] = type(e).__name__
            results[name] = chunks

        short = threading.Thread(target=stream, args=("short", 12))
        long = threading.Thread(target=stream, args=("long", 1000))
        long.start()
        short.start()
        end = time.time() + 60
        while not (results.get("short_started") and results.get("long_started")) and time.time() < end:
            time.sleep(0.02)
        s.proc.send_signal(signal.SIGTERM)
        short.join(60)
        long.join(60)
        assert s.proc.wait(60) == 0
        finished = [json.loads(c)["choices"][0]["finish_reason"] for c in results["short"][:-1]]
        assert finished[-1] == "length" and results["short"][-1] == "[DONE]"  # finished
        long_reasons = [json.loads(c)["choices"][0]["finish_reason"] for c in results["long"][:-1]]
        assert long_reasons[-1] == "abort" and results["long"][-1] == "[DONE]"  # 1000 tokens > 2 s: cancelled
        err = s.stderr()
        assert "Traceback" not in err, err[-3000:]
    finally:
        s.stop()
