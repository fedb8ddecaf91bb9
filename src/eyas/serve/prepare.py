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

Every exception raised while a request is parsed and checked becomes a 400 with the error's text,
never a 500: what reaches this stage is the client's input, and the server has run nothing yet.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..sample.grammar import GrammarError, grammars_for
from .api_errors import ApiError, bad_request
from .inputs import Job
from .sampling_defaults import OPENAI, SamplingDefaults

log = logging.getLogger("eyas.serve")
WORKERS = 2  # preparing threads: a slow body holds one; the GIL is shared, so more buys little


@dataclass
class Prepared:
    req: object  # the validated request model
    job: Job
    prompt_text: str | None = None  # the first prompt's text, for the request log (--log-requests only)


class Preparer:
    def __init__(self, engine, served_names: list[str], max_prompt_tokens: int | None, log_requests: bool,
                 sampling: SamplingDefaults = OPENAI):
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

    def _claim(self) -> None:
        """Each worker thread takes its own tokenizer copy when it starts."""
        self._local.tokenizer = self._spare.pop()

    @property
    def tokenizer(self):
        """The calling worker's tokenizer copy (``tokenizers`` holds every worker's)."""
        return self._local.tokenizer

    async def __call__(self, build, raw: bytes):
        """``build(preparer, raw)`` (a ``Prepared`` for the generating routes) on the worker thread; any failure
        there is a 400."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, build, self, raw)
        except ApiError:
            raise
        except Exception as e:  # the catch-all: a request that cannot be read is the client's 4xx
            log.warning("request refused: reading it raised %s: %s", type(e).__name__, e, exc_info=True)
            text = str(e) if len(str(e)) <= 200 else str(e)[:197] + "..."
            raise bad_request(f"the request could not be read: {type(e).__name__}: {text}",
                              code="invalid_request") from None

    def prepared(self, req, job: Job) -> Prepared:
        if job.params.grammar is not None:  # compiled now (kept in an LRU), so a bad schema is this request's 400
            try:
                self.grammars.compile(job.params.grammar)
            except GrammarError as e:
                raise bad_request(f"{e.problem}; {e.fix}", param=e.param, code="invalid_value") from None
        text = self.tokenizer.decode(job.prompts[0]) if self.log_requests else None
        return Prepared(req, job, text)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def prompt_char_bound(tokenizer, max_tokens: int) -> int | None:
    """Characters that ``max_tokens`` tokens can cover at most; None when the vocabulary is unknown."""
    try:
        longest = max(map(len, tokenizer.get_vocab()), default=0)
    except Exception:  # noqa: BLE001 - a tokenizer without a readable vocabulary: no early bound
        return None
    return max_tokens * longest if longest else None
