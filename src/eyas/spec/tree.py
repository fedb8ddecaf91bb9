"""Token trees: the shape one target forward verifies.

Column 0 is the root (the last emitted token, not yet in the target's cache); every other column
is a draft token whose parent comes before it. ``mask[b, i, j]`` is true when node ``j`` is node
``i`` itself or one of its ancestors: the tree-attention mask over the verified block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models import consts
from .tree_ops import ancestors


@dataclass
class Tree:
    tokens: torch.Tensor  # [B, T] target token ids, column 0 = root
    parents: torch.Tensor  # [B, T] parent column, -1 for the root
    depth: torch.Tensor  # [B, T] 0 for the root
    mask: torch.Tensor  # [B, T, T] bool, ancestor-or-self

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    @classmethod
    def root_only(cls, root: torch.Tensor) -> Tree:  # root [B]
        b = root.shape[0]
        dev = root.device
        return cls(
            tokens=root[:, None],
            parents=consts.full((b, 1), -1, torch.long, dev),
            depth=consts.full((b, 1), 0, torch.long, dev),
            mask=consts.full((b, 1, 1), True, torch.bool, dev),
        )

    @classmethod
    def from_parents(cls, tokens: torch.Tensor, parents: torch.Tensor, max_depth: int | None = None) -> Tree:
        """Depth and ancestor mask from parent pointers (parents precede children): ``tree_ops.ancestors``."""
        depth, mask = ancestors(parents, max_depth)
        return cls(tokens=tokens, parents=parents, depth=depth, mask=mask)

    def children(self, row: int) -> list[list[int]]:
        """Children columns of each node of one row, in column order."""
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for j, p in enumerate(self.parents[row].tolist()):
            if p >= 0:
                kids[p].append(j)
        return kids
