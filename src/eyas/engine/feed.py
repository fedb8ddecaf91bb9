"""The draft's deferred feed: plain steps keep what the draft must see, and the draft takes it in one extend.

A step that does not speculate (no speculation in ``auto``'s choice or in a schedule's entry) still has to
feed the draft, so that it can draft again when the batch shrinks. Fed one token a step, the draft costs a
layer's forward over the batch on every plain step. Instead each plain whole step (``decode.step_static``)
writes each row's emitted token and the target's aux states at the position before it into a ``Feed``, and
the engine feeds the draft all of them in one extend (``feed_draft``: a ``StaticExtender`` of the feed's
width, one graph replay) before the next step that drafts, before a step by parts, and when the feed
is full: one extend every ``EngineConfig.draft_feed_interval`` plain steps instead of one a step.

A row's buffered tokens sit at positions ``lengths - n .. lengths - 1`` (a plain step adds one a row), so the
extend takes ``base = lengths - n``; a row that joined since (merged, fed by its prefill) has ``n`` 0 and keeps
its draft state. Columns past ``n`` hold stale but finite values that the extend drops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Feed:
    tokens: torch.Tensor  # [B, G] emitted tokens, columns 0..n-1 in order
    aux: torch.Tensor  # [B, G, A] the target's aux states at the position before each
    n: torch.Tensor  # [B] buffered tokens a row

    @staticmethod
    def empty(rows: int, width: int, aux_width: int, dtype: torch.dtype, device) -> Feed:
        return Feed(torch.zeros((rows, width), dtype=torch.long, device=device),
                    torch.zeros((rows, width, aux_width), dtype=dtype, device=device),
                    torch.zeros(rows, dtype=torch.long, device=device))

    def select(self, rows: torch.Tensor) -> Feed:
        return Feed(self.tokens[rows], self.aux[rows], self.n[rows])

    def emptied(self) -> Feed:
        """The same buffers with nothing in them (after the draft took them)."""
        return Feed(self.tokens, self.aux, torch.zeros_like(self.n))

    @staticmethod
    def concat(a: Feed | None, rows_a: int, b: Feed | None, rows_b: int) -> Feed | None:
        """The feeds of two batches joined (a side without one: empty rows)."""
        if a is None and b is None:
            return None
        like = a or b
        make = lambda rows: Feed.empty(rows, like.tokens.shape[1], like.aux.shape[2], like.aux.dtype,  # noqa: E731
                                       like.aux.device)
        a, b = a or make(rows_a), b or make(rows_b)
        return Feed(torch.cat([a.tokens, b.tokens]), torch.cat([a.aux, b.aux]), torch.cat([a.n, b.n]))


def append(tokens: torch.Tensor, aux: torch.Tensor, n: torch.Tensor, token: torch.Tensor, token_aux: torch.Tensor,
           take: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A feed's tensors with row b's ``token`` [B] and ``token_aux`` [B, A] written at column ``n[b]`` and
    ``n`` raised where ``take`` [B] (bool) holds: inside a plain step's graph, so no shape depends on ``n``.
    The engine feeds the draft before a row's feed is full; the column is clamped all the same."""
    col = n.clamp(max=tokens.shape[1] - 1)[:, None]
    tokens = tokens.scatter(1, col, token[:, None])
    aux = aux.scatter(1, col[:, :, None].expand(-1, 1, aux.shape[2]), token_aux[:, None].to(aux.dtype))
    return tokens, aux, n + take.long()


def feed_draft(batch, extenders: dict, extend, in_flight: int = 0, ahead: bool = False) -> bool:
    """Feed the draft what ``batch``'s plain steps deferred, in one extend: ``extend(cache, base, tokens, aux,
    counts)`` (``StepByParts.draft_extend``: a graph, else eagerly). ``ahead``: a step is in flight, its rows
    up to ``in_flight`` slots past the caches' count on the host: the block's slots come from the device, by
    the feed's width's extender (``extenders``), and False where it has no graph (nothing done). Rows with
    nothing kept keep their draft state; the next step that drafts computes the draft's logits."""
    feed = batch.feed
    base = batch.lengths - feed.n
    if ahead:
        out = extenders[feed.tokens.shape[1]](base, feed.tokens, feed.aux, feed.n, batch.lengths.max(), in_flight)
        if out is None:
            return False
    else:
        out = extend(batch.draft_cache, base, feed.tokens, feed.aux, feed.n)
    batch.draft_hidden = torch.where((feed.n > 0)[:, None], out[1], batch.draft_hidden)
    batch.draft_logits = None
    batch.feed, batch.deferred, batch.feeds = feed.emptied(), 0, batch.feeds + 1
    return True
