"""Process groups from ``torchrun``'s environment; no cluster code of our own.

``torchrun --nproc-per-node N -m eyas train ...`` sets RANK / WORLD_SIZE / LOCAL_RANK; without
them everything runs as one process. The backend is NCCL on CUDA and gloo on the CPU (what the CI
test uses).
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..models.loading import resolve_device


@dataclass
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def gather_objects(self, obj) -> list:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def mean(self, values: list[float]) -> list[float]:
        """Element-wise mean over ranks of a list of floats."""
        if not self.active or not values:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.comm_device)
        dist.all_reduce(t)
        return (t / self.world).tolist()

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (on ``comm_device``) summed over ranks in place, without waiting on the host."""
        if self.active:
            dist.all_reduce(t)
        return t

    def sum(self, values: list[float]) -> list[float]:
        if not self.active or not values:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.comm_device)
        dist.all_reduce(t)
        return t.tolist()

    @property
    def comm_device(self) -> str:
        return self.device if dist.is_initialized() and dist.get_backend() == "nccl" else "cpu"

    def close(self) -> None:
        """Leave the group together: a rank that tears gloo down while another is still in a
        collective can abort (``terminate called without an active exception``, seen in CI). The
        objects of a finished run (sharded modules, their collectives' work) are collected first:
        left to the interpreter's finalization, a gloo work that still holds tensors aborts the
        process after everything was saved."""
        if self.active and dist.is_initialized():
            gc.collect()
            dist.barrier()
            dist.destroy_process_group()


def init(device: str = "auto", backend: str | None = None) -> DistContext:
    """Join torchrun's group if its variables are set; pick this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device)
    if device.startswith("cuda"):
        if world > 1 or device == "cuda":
            device = f"cuda:{local}"
        torch.cuda.set_device(torch.device(device))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend or ("nccl" if device.startswith("cuda") else "gloo"))
    return DistContext(rank, world, local, device)
