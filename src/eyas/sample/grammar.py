"""Structured output: grammars compiled with xgrammar, and the token masks they put on the target's logits.

A request may constrain its output to a grammar (``SamplingParams.grammar``, a ``GrammarSpec``):
any JSON object (``response_format: {"type": "json_object"}``), a JSON schema (``json_schema``, and
the tool calls of ``tool_choice: "required"`` or a named function), a regular expression or an EBNF
grammar (``/generate``'s ``sampling_params.regex`` / ``ebnf``). xgrammar (what vLLM and SGLang use)
compiles it against the target's tokenizer: ``Grammars`` holds the tokenizer's compiled info (once
per target) and the compiled grammars (a small LRU by spec). The server compiles on its preparing
thread, never on the event loop; a spec xgrammar refuses is a ``GrammarError`` (a 400 there) and
touches no other request.

Each constrained sequence carries a ``RowGrammar``: xgrammar's ``GrammarMatcher`` at the sequence's
output so far. A step of a batch that holds one takes the engine's by-parts path (no whole-step
graph: the mask is made on the host), and ``constrain`` puts the mask on the target's logits over
the verified tree before acceptance:

- the tree is read back to the host (one sync), and for each constrained row the matcher walks it
  (``GrammarMatcher.traverse_draft_tree``: accept a node's token, fill the bitmask of the token after
  it, roll back), so every node's logits, the bonus position's included, are masked with exactly the
  grammar state of the prefix that node ends; a node whose token the grammar refuses is never
  accepted (its masked probability is 0), so the positions under it are left unmasked;
- a disallowed token's logit becomes -inf; greedy takes the argmax of what is left, sampling draws
  from the masked distribution (``sampling.distribution`` never keeps a -inf token).

So the output is exactly what plain decoding (NONE) gives under the same grammar: token for token
greedily, and in distribution when sampled. Rows without a grammar in the same batch are untouched.
The draft's own candidates are not masked: a refused draft token only costs acceptance.
``advance`` moves the matcher along each emitted token; the row ends ("stop") once the grammar has
accepted a stop token (it is complete).
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch

from ..errors import EyasError

KINDS = ("json_object", "json_schema", "regex", "ebnf")
CACHE_SIZE = 64  # compiled grammars kept per target (least recently used dropped first)


def xgr():
    """The xgrammar module, or an error that names the package (it comes with ``eyas[serve]``)."""
    try:
        import xgrammar
    except ImportError:
        raise EyasError("structured output (response_format, tools, json_schema, regex) needs the xgrammar package, "
                        "which is not installed", "pip install 'eyas[serve]' (or pip install xgrammar)") from None
    return xgrammar


def token_bytes(tokenizer) -> list[bytes]:
    """Each token's own bytes (xgrammar's decoded vocabulary: a byte-level or byte-fallback token holding part of
    a character has that part); [] without xgrammar or for a tokenizer it cannot read."""
    try:
        return [bytes(b) for b in xgr().TokenizerInfo.from_huggingface(tokenizer).decoded_vocab]
    except Exception:  # noqa: BLE001 - no xgrammar (EyasError), or a tokenizer it cannot read
        return []


class GrammarError(EyasError):
    """A grammar xgrammar cannot compile; ``param`` names the request field it came from."""

    def __init__(self, problem: str, fix: str | None = None, param: str = "response_format"):
        super().__init__(problem, fix)
        self.param = param


@dataclass(frozen=True)
class GrammarSpec:
    """What a request constrains its output to: ``kind`` (one of ``KINDS``) and ``source`` (the schema as
    JSON in the request's key order, which the output follows; the regex or the EBNF text; empty for
    json_object); ``param`` names the request field, for errors."""

    kind: str
    source: str = ""
    param: str = "response_format"

    @classmethod
    def json_schema(cls, schema, param: str = "response_format") -> GrammarSpec:
        return cls("json_schema", json.dumps(schema, ensure_ascii=False), param)


class Grammars:
    """A target's grammar compiler: its tokenizer's info (built on first use) and an LRU of compiled
    grammars. Thread-safe; compiling runs wherever ``compile`` is called (the server: its preparing
    thread)."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int], cache_size: int = CACHE_SIZE):
        self._tokenizer, self.vocab_size, self._stops = tokenizer, vocab_size, list(stop_token_ids)
        self._compiler = None
        self._cache: OrderedDict[tuple, object] = OrderedDict()
        self._size = cache_size
        self._lock = threading.Lock()

    def _get_compiler(self):
        xg = xgr()
        with self._lock:
            if self._compiler is None:
                info = xg.TokenizerInfo.from_huggingface(self._tokenizer, vocab_size=self.vocab_size,
                                                          stop_token_ids=self._stops)
                self._compiler = xg.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._compiler

    def compile(self, spec: GrammarSpec):
        """xgrammar's ``CompiledGrammar`` for ``spec``; ``GrammarError`` when it cannot be compiled."""
        key = (spec.kind, spec.source)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        compiled = self._compile(spec)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, spec: GrammarSpec):
        compiler = self._get_compiler()
        try:
            if spec.kind == "json_object":
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if spec.kind == "json_schema":
                return compiler.compile_json_schema(spec.source, any_whitespace=False)
            if spec.kind == "regex":
                return compiler.compile_regex(spec.source)
            if spec.kind == "ebnf":
                return compiler.compile_grammar(spec.source)
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError with the reason
            reason = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", " ".join(str(e).split()))  # xgrammar's C++ source line
            reason = reason if len(reason) <= 300 else reason[:297] + "..."
            raise GrammarError(f"{spec.param}: the {spec.kind.replace('_', ' ')} cannot be compiled into a grammar: "
                               f"{reason}", f"send a valid {spec.kind.replace('_', ' ')} (xgrammar's supported "
                               "subset: see docs/serve.md, Structured output)", spec.param) from None
        raise GrammarError(f"{spec.param}: unknown grammar kind {spec.kind!r}", f"use one of {', '.join(KINDS)}",
                           spec.param)


_per_target: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_per_target_lock = threading.Lock()


def grammars_for(target) -> Grammars:
    """The one ``Grammars`` of ``target`` (a ``Target`` or ``NativeTarget``: its tokenizer, vocabulary
    and stop tokens), made on first use."""
    with _per_target_lock:
        g = _per_target.get(target)
        if g is None:
            g = Grammars(target.tokenizer, target.info.vocab_size, sorted(target.eos_token_ids))
            _per_target[target] = g
        return g


class RowGrammar:
    """One sequence's grammar state: xgrammar's matcher over the output so far."""

    def __init__(self, compiled, vocab_size: int):
        self.matcher = xgr().GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.words = xgr().get_bitmask_shape(1, vocab_size)[1]  # int32 words per bitmask

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()

    def advance(self, token: int) -> bool:
        """Move past an emitted token; False when the grammar refuses it (a fault: it was masked out)."""
        return self.matcher.accept_token(token)

    def tree_mask(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """[T, words] int32 bitmask on the host: row i the tokens allowed after node i of a tree (column
        0 the root, the last emitted token, which the matcher has already accepted). Rows of nodes the
        grammar refuses, and of everything under them, allow every token (they are never accepted)."""
        t = len(tokens)
        first_child, next_sibling, last = [-1] * t, [-1] * t, [-1] * t
        for j in range(1, t):
            p = parents[j]
            if first_child[p] < 0:
                first_child[p] = j
            else:
                next_sibling[last[p]] = j
            last[p] = j
        bitmask = torch.full((t, self.words), -1, dtype=torch.int32)
        if t == 1:
            self.matcher.fill_next_token_bitmask(bitmask, 0)
        else:
            self.matcher.traverse_draft_tree(torch.tensor(first_child), torch.tensor(next_sibling),
                                             torch.tensor(tokens), bitmask)
        refused = (bitmask == 0).all(dim=1)  # a refused node (or one past the grammar's end): never accepted
        bitmask[refused] = -1
        return bitmask


def constrained(seqs) -> bool:
    """Some live row of the batch carries a grammar (its step then runs by parts)."""
    return any(s.grammar is not None and not s.finished for s in seqs)


def constrain(seqs, tokens: torch.Tensor, parents: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``logits`` [B, T, V] over the trees ``tokens``/``parents`` [B, T] with every constrained row's
    disallowed tokens at -inf (a copy; the other rows as they were). One host sync to read the trees."""
    rows = [i for i, s in enumerate(seqs) if s.grammar is not None and not s.finished]
    if not rows:
        return logits
    b, t, v = logits.shape
    index = torch.tensor(rows, device=tokens.device)
    host_tokens, host_parents = tokens[index].tolist(), parents[index].tolist()
    words = seqs[rows[0]].grammar.words
    bitmask = torch.full((b, t, words), -1, dtype=torch.int32)
    for r, toks, pars in zip(rows, host_tokens, host_parents):
        bitmask[r] = seqs[r].grammar.tree_mask(toks, pars)
    out = logits.clone()
    flat = out.view(b * t, v)
    backend = "torch_native" if flat.dtype == torch.float64 else "auto"  # xgrammar's kernels: float32/16 only
    xgr().apply_token_bitmask_inplace(flat, bitmask.view(b * t, words).to(flat.device), vocab_size=v, backend=backend)
    return out
