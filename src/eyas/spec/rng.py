"""Counter-based random numbers in torch ops: a uniform draw is a pure function of (seed, position, lane).

There is no generator state: a sampled row's draws depend on its own seed and on the positions its
tokens decide, never on what else is in the batch, how the batch was scheduled, or which device and
path (generic, native eager, native graph replay) ran the step. The ops are integer element-wise
ones, so a CUDA graph captures them and replays fresh draws as its inputs change, and the CPU and
the GPU give the same bits.

The hash is Chris Wellons' ``lowbias32`` (xor-shift-multiply, a bijection on 32 bits), chained over
the key's 32-bit words: the seed's low and high halves, the position, the lane. Every value is kept
in [0, 2^32) in int64 (so right shifts are logical ones), and the 32-bit products are taken in two
16-bit halves: no intermediate reaches 2^63 and nothing relies on signed overflow. The top 23 bits
of the result, plus half a step, make a float32 in (0, 1) exactly.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_M16 = 0xFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2^32`` for ``x`` in [0, 2^32): partial products stay below 2^48."""
    lo = x * (c & _M16)
    hi = ((x * (c >> 16)) & _M16) << 16
    return (lo + hi) & _M32


def _mix(x: torch.Tensor) -> torch.Tensor:
    """``lowbias32``: x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform(seed: torch.Tensor, position: torch.Tensor, lane: torch.Tensor) -> torch.Tensor:
    """float32 in (0, 1) of the broadcast shape of the three int64 tensors (any int64 seed, including
    negative ones; positions and lanes below 2^32): the top 23 bits of the last mix, plus half a step, over 2^23
    (exact in float32; never 0 nor 1)."""
    h = _mix((seed & _M32) ^ 0x9E3779B9)
    h = _mix(h ^ ((seed >> 32) & _M32))
    h = _mix(h ^ (position & _M32))
    h = _mix(h ^ (lane & _M32))
    return ((h >> 9).float() + 0.5) * (1.0 / (1 << 23))
