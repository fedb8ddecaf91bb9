"""The engine's ops: the transformer block's and the token tree's on one object, chosen per forward.

``models`` holds the block's ops (``models.torch_ops.TorchOps``, ``models.kernels.triton_ops.TritonOps``)
and picks one for a model's forward (``models.ops.ops_for``); ``spec`` holds the tree's
(``tree_ops.TreeOps``, ``tree_kernels.TritonTreeOps``). The engine uses both through one ``ops`` (the
verify's ``ops.tree_mask`` on the target's choice of kernels, ``ops.top_children`` on the draft's), so
they are composed here, above both: ``spec`` imports ``models``, never the other way. ``ops_for`` makes
``models.ops.ops_for``'s choice and returns the composed counterpart: ``TORCH`` (``SpecTorchOps``) or
``kernel_ops(settings)`` (a ``tree_kernels.SpecTritonOps``, composed next to the tree's kernels: it needs Triton).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from ..models import ops as block_ops
from ..models.kernel_settings import KernelSettings
from ..models.torch_ops import TorchOps
from .tree_ops import TreeOps

if TYPE_CHECKING:
    from .tree_kernels import SpecTritonOps


class SpecTorchOps(TreeOps, TorchOps):
    """The engine's ops in plain PyTorch: the block's reference and the tree's."""


TORCH = SpecTorchOps()


def ops_for(cache, x: torch.Tensor, rope) -> SpecTorchOps | SpecTritonOps:
    """``models.ops.ops_for(cache, x, rope)``'s choice with the tree's ops added: ``TORCH`` where it
    takes the torch ops, the kernels under the cache's settings where it takes those."""
    settings = block_ops.kernels_for(cache, x, rope)
    return TORCH if settings is None else kernel_ops(settings)


@functools.cache
def kernel_ops(settings: KernelSettings) -> SpecTritonOps:
    """The engine's kernels under ``settings``: one ``SpecTritonOps`` each, kept for the process."""
    from .tree_kernels import SpecTritonOps

    return SpecTritonOps(settings)
