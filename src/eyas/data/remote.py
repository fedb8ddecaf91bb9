"""Answers written by a server: ``eyas prepare --regenerate-url URL``.

Any OpenAI-compatible server that serves the target (SGLang, vLLM, ``eyas serve``) answers the
prompts through ``/v1/chat/completions``, ``concurrency`` requests in flight, after ``served.check``
has made sure it serves the target the data is for. The server renders each chat with the target's
template; the training rows are then rendered and tokenized here with the same template, exactly as
in-process answers are.

Resume: every answer is appended to ``answers.jsonl`` in the output folder (and flushed) as it
arrives, keyed by a hash of the request that asked for it (messages, sampling settings, the per-prompt
seed, template options; not the model's name). A rerun reads the file first and asks only for what it
does not hold, so an interrupted run loses at most the requests in flight and no prompt is answered
twice. A changed setting makes new keys: the old answers stay in the file, unused.

Retries: a connection error, a timeout, HTTP 408, 429 or 5xx is retried with exponential backoff and
jitter (or after the server's ``Retry-After``) until the server answers or ``retry_for`` seconds
have passed since that request first failed, so a server restarting mid-run only pauses the run.
HTTP 401/403/404 stop the run (every request would fail); any other 4xx (a prompt too long for
the server's context, say) drops that prompt, counted and named in the log.

Seeds: each prompt is sent ``seed`` = a hash of ``--seed`` and the prompt, so a sampled answer does
not depend on the order or concurrency of requests. Greedy answers (``--temperature 0``) equal the
in-process ones where the server's greedy decoding is deterministic (``tests/data/test_remote.py``).
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from tqdm.auto import tqdm

from ..common.server_metrics import server_root
from ..errors import EyasError
from .chat import prompt_messages
from .regenerate import RegenConfig, RegenStats, with_system
from .served import check, request_body

ANSWERS = "answers.jsonl"
BACKOFF_FIRST, BACKOFF_MAX = 0.25, 8.0  # seconds: the first retry's wait, doubling up to this
FATAL = (401, 403, 404)  # the same for every request: stop at once
RETRIED = (408, 429)  # and every 5xx


@dataclass
class RemoteConfig:
    url: str
    concurrency: int = 32
    request_timeout: float = 600.0  # seconds one request may take
    retry_for: float = 600.0  # seconds one request keeps retrying a failing server
    api_key: str | None = None
    served_model_name: str | None = None  # None: the server's model whose name matches --model-path

    def __post_init__(self):
        self.url = server_root(self.url)  # an OpenAI base URL (.../v1) as users paste it
        if self.concurrency < 1:
            raise EyasError(f"--concurrency must be at least 1, got {self.concurrency}", "e.g. --concurrency 32")
        if not self.request_timeout > 0:
            raise EyasError(f"--request-timeout must be positive, got {self.request_timeout}",
                            "e.g. --request-timeout 600")
        if not self.retry_for >= 0:
            raise EyasError(f"--retry-for must be 0 or more seconds, got {self.retry_for}", "e.g. --retry-for 600")

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def prompt_seed(seed: int, messages: list[dict]) -> int:
    """The seed one prompt is sampled with: a function of ``--seed`` and the prompt alone."""
    text = json.dumps([seed, messages], ensure_ascii=False, sort_keys=True)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") >> 1


def answer_key(body: dict) -> str:
    """The request's identity in ``answers.jsonl``: everything but the model's name."""
    text = json.dumps({k: v for k, v in body.items() if k != "model"}, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def retry_after(response: httpx.Response) -> float | None:
    """Seconds the server asks to wait (``Retry-After`` in seconds or as an HTTP date), else None."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class Refused(Exception):
    """The server refused one prompt for good (a 4xx other than 401/403/404/408/429)."""


class RemoteRegenerator:
    """``regenerate(records)`` as ``regenerate.regenerate`` does it, through the server at ``remote.url``."""

    def __init__(self, target, cfg: RegenConfig, remote: RemoteConfig, out, model_path: str, log=print,
                 progress: bool = True):
        self.target, self.cfg, self.remote, self.log, self.progress = target, cfg, remote, log, progress
        timeout = min(60.0, remote.request_timeout)
        with httpx.Client(base_url=remote.url, headers=remote.headers(), timeout=timeout) as c:
            self.served = check(c, remote.url, target, cfg, model_path, remote.served_model_name)
        log(f"{remote.url} serves {self.served.model!r}: checked {', '.join(self.served.checked)}")
        for note in self.served.notes:
            log(f"note: {note}")
        self.path = Path(out) / ANSWERS
        self.answers: dict[str, dict] = self._read()
        self.reused = self.refused = 0

    @property
    def meta(self) -> dict:
        return {**self.served.as_dict(), "answers_file": ANSWERS, "concurrency": self.remote.concurrency,
                "reused_answers": self.reused, "refused_prompts": self.refused}

    def _read(self) -> dict[str, dict]:
        answers: dict[str, dict] = {}
        if not self.path.is_file():
            return answers
        bad = 0
        with self.path.open() as f:
            for line in f:
                try:
                    entry = json.loads(line)
                    answers[entry["key"]] = entry
                except (ValueError, KeyError, TypeError):
                    bad += 1  # a line cut by an interruption: that prompt is asked again
        self.log(f"{self.path}: {len(answers)} answers from earlier runs"
                 + (f", {bad} unreadable lines" if bad else ""))
        return answers

    def regenerate(self, records: list[dict]) -> tuple[list[dict], RegenStats]:
        asks = []
        for r in records:
            msgs = with_system(prompt_messages(r["messages"]), self.cfg.system_prompt)
            body = request_body(self.served.model, msgs, self.cfg, self.cfg.max_new_tokens,
                                prompt_seed(self.cfg.seed, msgs))
            asks.append((answer_key(body), msgs, body))
        todo = list({k: b for k, _, b in asks if k not in self.answers}.items())
        reused = len({k for k, _, _ in asks} & self.answers.keys())
        self.reused += reused
        if reused:
            self.log(f"{reused} prompts answered in an earlier run are taken from {self.path}; {len(todo)} to ask")
        t0 = time.perf_counter()
        fresh = asyncio.run(self._ask_all(todo)) if todo else {}
        stats = RegenStats(len(fresh), sum(e.get("completion_tokens") or 0 for e in fresh.values()),
                           sum(e.get("finish_reason") == "length" for e in fresh.values()), time.perf_counter() - t0)
        out = []
        for (key, msgs, _), r in zip(asks, records):
            entry = self.answers.get(key)
            text = (entry or {}).get("answer", "").strip()
            if text:
                out.append({**r, "messages": msgs + [{"role": "assistant", "content": text}], "regenerated": True,
                            "truncated": entry.get("finish_reason") == "length"})
        return out, stats

    async def _ask_all(self, todo: list[tuple[str, dict]]) -> dict[str, dict]:
        n = min(self.remote.concurrency, len(todo))
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        timeout = httpx.Timeout(self.remote.request_timeout, connect=min(10.0, self.remote.request_timeout))
        bar = tqdm(total=len(todo), desc=f"regenerate via {self.remote.url}", unit="prompt", disable=not self.progress)
        items, fresh, tokens = iter(todo), {}, [0]
        t0 = time.perf_counter()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file() and self.path.stat().st_size:
            with self.path.open("rb") as f:
                f.seek(-1, 2)
                broken = f.read(1) != b"\n"  # an interrupted write: start on a line of our own
        else:
            broken = False
        async with httpx.AsyncClient(base_url=self.remote.url, headers=self.remote.headers(), timeout=timeout,
                                     limits=limits) as client:
            with self.path.open("a") as f:
                if broken:
                    f.write("\n")

                async def worker():
                    for key, body in items:
                        try:
                            entry = await self._ask(client, key, body)
                        except Refused as e:
                            self.refused += 1
                            if self.refused <= 5:
                                self.log(f"refused by the server, dropped: {e}")
                            bar.update(1)
                            continue
                        f.write(json.dumps(entry, ensure_ascii=False) + "\n")
                        f.flush()
                        self.answers[key] = fresh[key] = entry
                        tokens[0] += entry.get("completion_tokens") or 0
                        rate = tokens[0] / max(time.perf_counter() - t0, 1e-9)
                        bar.set_postfix_str(f"{rate:.0f} tok/s", refresh=False)
                        bar.update(1)

                tasks = [asyncio.create_task(worker()) for _ in range(n)]
                try:
                    await asyncio.gather(*tasks)
                finally:
                    for t in tasks:
                        t.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    bar.close()
        return fresh

    async def _ask(self, client: httpx.AsyncClient, key: str, body: dict) -> dict:
        """One answer, retried while the server fails; ``Refused`` when it refuses this prompt for good."""
        give_up, attempt = None, 0
        while True:
            wait = None
            try:
                r = await client.post("/v1/chat/completions", json=body)
            except httpx.TransportError as e:  # refused connections, resets, timeouts, cut responses
                why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            else:
                if r.status_code == 200:
                    return self._entry(key, r)
                why = f"HTTP {r.status_code}: {r.text[:200]}"
                if r.status_code in FATAL:
                    raise EyasError(f"{self.remote.url} answered {why}", self._resume_fix(
                        "check --api-key and --served-model-name"))
                if r.status_code not in RETRIED and r.status_code < 500:
                    raise Refused(why)
                wait = retry_after(r)
            now = time.monotonic()
            give_up = give_up or now + self.remote.retry_for
            if now >= give_up:
                raise EyasError(f"{self.remote.url} failed one request for {self.remote.retry_for:.0f} s "
                                f"(--retry-for), last: {why}",
                                self._resume_fix("bring the server back (or raise --retry-for)"))
            if wait is None:
                step = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** attempt)
                wait = step / 2 + random.uniform(0, step / 2)
            attempt += 1
            await asyncio.sleep(min(wait, give_up - now))

    def _entry(self, key: str, r: httpx.Response) -> dict:
        try:
            data = r.json()
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise Refused(f"HTTP 200 without a chat completion: {r.text[:200]}") from None
        usage = data.get("usage") or {}
        return {"key": key, "answer": text, "finish_reason": choice.get("finish_reason"),
                "completion_tokens": usage.get("completion_tokens"), "prompt_tokens": usage.get("prompt_tokens")}

    def _resume_fix(self, first: str) -> str:
        return (f"{first}, then rerun the same command: the {len(self.answers)} answers saved in {self.path} "
                "are kept and only the rest are asked")
