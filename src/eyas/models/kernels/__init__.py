"""Triton kernels for the static-cache path: the transformer block's ops in fewer launches.

With the torch ops a Llama-3.1-8B-shaped decode step at batch 1 ran 20 kernels a layer, of which
only four are GEMMs; the rest (RMSNorm, rotary as five elementwise kernels, two ``index_copy`` into
the cache, cuDNN's attention plus two copies of the cache window, silu and the product) and the gaps
between them cost a large share of a token. These kernels replace them (what each change measured:
docs/log/engine.md; what the engine measures now: docs/engine.md, "What it measures now"):

- ``norm``: RMSNorm, and ``silu(gate) * up``;
- ``attention``: rotary with the cache write, and attention over the cache window (flash-decoding);
- ``linear``: projections of one row and of a few rows with the norm, activation, bias and residual
  inside, and their block shapes;
- ``triton_ops``: ``TritonOps``, which launches them (``_launch``) in place of ``models.torch_ops.TorchOps``
  and falls back to it where a kernel cannot run; ``pdl``: what every kernel shares.

The token tree's kernels are ``eyas.spec.tree_kernels`` (drafting) and ``eyas.spec.verify_kernels``
(acceptance, masks, draws).

The arithmetic is float32 with one rounding to the model's dtype at the end, where the torch ops
round after each op; the two agree to that rounding (``tests/models/test_kernels.py``). Without a
GPU, the same kernels run in Triton's interpreter, which is how the CPU tests check them.
"""
