"""Request bodies become jobs off the event loop, and whatever goes wrong there is the client's 4xx.

Decoding a few megabytes of JSON, rendering the chat template and tokenizing are CPU work; on the
event loop they stall every other request and every running stream (a 3.9 MB chat body held
``/health`` for 11 s). ``Preparer`` runs that work on worker threads of its own, each with its own
tokenizer copy (Hugging Face fast tokenizers are not safe to share between threads; the engine
thread decodes with a copy of its own too). The tokenizer releases the GIL while it encodes, so the
event loop and the engine thread keep running meanwhile. There are ``WORKERS`` of them, so one
request whose body takes seconds to read (a few MB of messages to validate and render) does not hold
every other request's preparation behind it.

A prompt that cannot fit is refused by its length in characters before it is tokenized: no token
covers more characters than the longest entry of the vocabulary, so a text longer than
``most prompt tokens x longest token`` is too long whatever it holds. (A tokenizer whose normalizer
deletes characters could in theory fit more; a prompt padded that far is refused all the same.)

A grammar (structured output, tools) is compiled on threads of its own (``GRAMMAR_WORKERS``), never on a
preparing one: a compile cannot be interrupted, and a crafted regex takes xgrammar tens of seconds, so on
the shared workers two such requests held every other request's tokenizing behind them. The request waits
for its compile until its ``--request-timeout`` (408, counted from when it was read) or until its client
leaves; a compile not yet started is then dropped, one running finishes alone into the LRU. The compiled
grammar travels with the job to the engine (``Job.compiled``), which never compiles on the event loop.

Every exception raised while a request is parsed and checked becomes a 400 with the error's text,
never a 500: what reaches this stage is the client's input, and the server has run nothing yet.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..sample.grammar import GrammarError, grammars_for
from .api_errors import ApiError, bad_request
from .inputs import Job
from .limits import Limits, timed_out
from .sampling_defaults import OPENAI, SamplingDefaults

log = logging.getLogger("eyas.serve")
WORKERS = 2  # preparing threads: a slow body holds one; the GIL is shared, so more buys little
GRAMMAR_WORKERS = 2  # compiling threads (xgrammar releases the GIL): a slow grammar holds one, no other request


@dataclass
class Prepared:
    req: object  # the validated request model
    job: Job
    prompt_text: str | None = None  # the first prompt's text, for the request log (--log-requests only)


class Preparer:
    def __init__(self, engine, served_names: list[str], max_prompt_tokens: int | None, log_requests: bool,
                 sampling: SamplingDefaults = OPENAI, limits: Limits | None = None):
        tok = engine.target.tokenizer
        try:  # one copy per worker, made here (copying one while another thread uses it is not safe either)
            self.tokenizers = [copy.deepcopy(tok) for _ in range(WORKERS)]
        except Exception:  # noqa: BLE001 - an uncopyable tokenizer: one worker, its only other user
            self.tokenizers = [tok]
        self._spare = list(self.tokenizers)
        self._local = threading.local()
        self.served_names = served_names
        self.max_context = engine.max_context  # the model's context length (/tokenize's max_model_len)
        self.max_tokens = max_prompt_tokens or engine.max_context
        self.max_chars = prompt_char_bound(tok, self.max_tokens)
        self.log_requests = log_requests
        self.sampling = sampling  # what an OpenAI request's left-out sampling fields take (sampling_defaults.py)
        self.grammars = grammars_for(engine.target)  # structured output: compiled here, off the event loop (locked)
        self._pool = ThreadPoolExecutor(max_workers=len(self.tokenizers), thread_name_prefix="eyas-prepare",
                                        initializer=self._claim)
        self._compiles = ThreadPoolExecutor(max_workers=GRAMMAR_WORKERS, thread_name_prefix="eyas-grammar")
        self.limits = limits or Limits()

    def _claim(self) -> None:
        """Each worker thread takes its own tokenizer copy when it starts."""
        self._local.tokenizer = self._spare.pop()

    @property
    def tokenizer(self):
        """The calling worker's tokenizer copy (``tokenizers`` holds every worker's)."""
        return self._local.tokenizer

    async def __call__(self, build, raw: bytes, receive=None):
        """``build(preparer, raw)`` (a ``Prepared`` for the generating routes) on the worker thread, then its
        grammar compiled (``receive``: the ASGI channel, watched for the client leaving meanwhile); any failure
        there is a 400."""
        try:
            out = await asyncio.get_running_loop().run_in_executor(self._pool, build, self, raw)
        except ApiError:
            raise
        except Exception as e:  # the catch-all: a request that cannot be read is the client's 4xx
            log.warning("request refused: reading it raised %s: %s", type(e).__name__, e, exc_info=True)
            text = str(e) if len(str(e)) <= 200 else str(e)[:197] + "..."
            raise bad_request(f"the request could not be read: {type(e).__name__}: {text}",
                              code="invalid_request") from None
        if isinstance(out, Prepared) and out.job.params.grammar is not None:
            out.job.compiled = await self._compile(out.job, receive)
        return out

    async def _compile(self, job: Job, receive):
        """The job's grammar from a compiling thread (a bad one: this request's 400), waited for until the
        request's deadline (408) or until its client leaves (499)."""
        compiling = asyncio.get_running_loop().run_in_executor(self._compiles, self.grammars.compile,
                                                               job.params.grammar)
        gone = asyncio.ensure_future(_client_left(receive)) if receive is not None else None
        timeout = self.limits.request_timeout
        left = max(0.0, job.arrived + timeout - time.monotonic()) if timeout else None
        try:
            done, _ = await asyncio.wait([compiling, *([gone] if gone else [])], timeout=left,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if gone is not None:
                gone.cancel()
        if compiling not in done:  # not started: never runs; running: finishes alone, into the LRU
            compiling.cancel()
            if gone is not None and gone in done:
                raise ApiError(499, "the client closed the connection while its grammar compiled",
                               code="client_closed")
            raise timed_out(self.limits)
        try:
            return compiling.result()
        except GrammarError as e:
            raise bad_request(f"{e.problem}; {e.fix}", param=e.param, code="invalid_value") from None

    def prepared(self, req, job: Job) -> Prepared:
        text = self.tokenizer.decode(job.prompts[0]) if self.log_requests else None
        return Prepared(req, job, text)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._compiles.shutdown(wait=False, cancel_futures=True)


async def _client_left(receive) -> None:
    """Returns once ``receive`` (the ASGI channel, its body already read) says the client disconnected."""
    while (await receive()).get("type") != "http.disconnect":
        pass


def prompt_char_bound(tokenizer, max_tokens: int) -> int | None:
    """Characters that ``max_tokens`` tokens can cover at most; None when the vocabulary is unknown."""
    try:
        longest = max(map(len, tokenizer.get_vocab()), default=0)
    except Exception:  # noqa: BLE001 - a tokenizer without a readable vocabulary: no early bound
        return None
    return max_tokens * longest if longest else None
