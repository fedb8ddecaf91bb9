"""How an engine runs, as one frozen object: sizes, graphs and the routes a step takes.

``Engine(target, draft, spec, config=EngineConfig(...))`` reads nothing else; ``eyas serve``'s flags
(``pipeline.EngineArgs``) build it. Keyword arguments to ``Engine`` are this object's fields
(``Engine(target, max_batch=4)``), folded into it. The speculative settings are ``config.SpecConfig``.

``max_batch``, ``cuda_graphs``, ``graph_max_batch`` and ``mem_fraction_static`` matter on the native path
only (a ``NativeTarget``): they size the preallocated KV caches, say whether forwards replay CUDA graphs,
cap the batch sizes that have graphs (larger batches run eagerly), and bound the caches' memory
(``models.native.kv_budget``). ``whole_step_graphs`` and ``prefill_graphs`` pick a route, for
benchmarks that compare them side by side: False runs the step by parts (``engine/decode.py`` not
used) or the prompts' prefill eagerly (``engine/prefill.py`` not used). ``draft_feed_interval``: where a
schedule or ``auto`` runs plain steps with a draft, how many of them the draft is fed at once
(``engine/feed.py``). ``kernels`` says which kernels the native path's forwards run
(``models.kernel_settings``); left out, ``EYAS_KERNELS`` picks their mode, read here, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from .errors import EyasError
from .models.kernel_settings import KernelSettings


@dataclass(frozen=True)
class EngineConfig:
    max_batch: int = 64  # rows the native path's preallocated KV cache holds
    cuda_graphs: bool = True
    graph_max_batch: int | None = None  # largest batch with CUDA graphs (None: max_batch)
    mem_fraction_static: float | None = None  # weights + KV pools within this share of the GPU's memory
    whole_step_graphs: bool = True  # a step as one graph (engine/decode.py); False: by parts
    prefill_graphs: bool = True  # short prompts prefilled from graphs (engine/prefill.py); False: eagerly
    draft_feed_interval: int = 8  # plain whole steps whose feed the draft takes at once (engine/feed.py); 1: each
    kernels: KernelSettings = field(default_factory=KernelSettings.from_env)  # the Triton kernels' settings

    def __post_init__(self):
        if self.max_batch < 1:
            raise EyasError(f"the engine's max batch must be at least 1, got {self.max_batch}",
                            "pass --max-running-requests 1 or more")
        if self.draft_feed_interval < 1:
            raise EyasError(f"the draft feed interval must be at least 1, got {self.draft_feed_interval}",
                            "pass 1 to feed the draft on every plain step, or more to feed it less often")
        if self.graph_max_batch is not None and self.graph_max_batch < 1:
            raise EyasError(f"--cuda-graph-max-bs must be at least 1, got {self.graph_max_batch}",
                            "pass a batch size, or leave it out to capture up to the max batch")

    @property
    def graph_rows(self) -> int:
        """The largest batch that replays graphs."""
        return min(self.graph_max_batch or self.max_batch, self.max_batch)

    def with_(self, **changes) -> EngineConfig:
        """This config with ``changes`` (field names), refused with the list of fields when one is unknown."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise TypeError(f"unknown engine setting(s) {', '.join(unknown)}; "
                            f"EngineConfig has {', '.join(sorted(names))}")
        return replace(self, **changes) if changes else self
