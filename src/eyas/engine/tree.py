"""Token trees: the shape one target forward verifies.

Column 0 is the root (the last emitted token, not yet in the target's cache); every other column
is a draft token whose parent comes before it. ``mask[b, i, j]`` is true when node ``j`` is node
``i`` itself or one of its ancestors: the tree-attention mask over the verified block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
    def root_only(cls, root: torch.Tensor) -> "Tree":  # root [B]
        b = root.shape[0]
        dev = root.device
        return cls(
            tokens=root[:, None],
            parents=torch.full((b, 1), -1, dtype=torch.long, device=dev),
            depth=torch.zeros((b, 1), dtype=torch.long, device=dev),
            mask=torch.ones((b, 1, 1), dtype=torch.bool, device=dev),
        )

    @classmethod
    def from_parents(cls, tokens: torch.Tensor, parents: torch.Tensor, max_depth: int | None = None) -> "Tree":
        """Build depth and ancestor mask from parent pointers (parents precede children).

        With ``max_depth`` known (the drafter's step count) the walk runs that many rounds and never
        asks the device whether it is done, which would stall a GPU pipeline once per round."""
        b, t = tokens.shape
        dev = tokens.device
        mask = torch.eye(t, dtype=torch.bool, device=dev).expand(b, t, t).clone()
        depth = torch.zeros((b, t), dtype=torch.long, device=dev)
        cur = parents.clone()
        rows = torch.arange(b, device=dev)[:, None].expand(b, t)
        cols = torch.arange(t, device=dev)[None, :].expand(b, t)
        for _ in range(t if max_depth is None else max_depth):
            live = cur >= 0
            if max_depth is None and not bool(live.any()):
                break
            mask[rows, cols, cur.clamp(min=0)] |= live
            depth += live.long()
            cur = torch.where(live, parents.gather(1, cur.clamp(min=0)), cur)
        return cls(tokens=tokens, parents=parents, depth=depth, mask=mask)

    def children(self, row: int) -> list[list[int]]:
        """Children columns of each node of one row, in column order."""
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for j, p in enumerate(self.parents[row].tolist()):
            if p >= 0:
                kids[p].append(j)
        return kids
