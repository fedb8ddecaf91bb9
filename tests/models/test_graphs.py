"""``models/graphs.py``'s ``ForwardGraphs``: a forward through padded buckets is the eager forward."""

import torch

from eyas.models import kv_cache
from eyas.models.kernel_settings import KernelSettings
from eyas.models.native import NativeTarget, PoolPlan


def pool_and_runner(native, graphs: bool):
    return native.new_pool(PoolPlan(4, 300, 0), [1, 2, 4], [1, 4], graphs, capture_aux=True, kernels=KernelSettings())


def forward_both(target, pools, lengths, ids):
    """The same forward through each (cache, runner) of ``pools``, committed: the outputs, the new lengths."""
    t, outs = ids.shape[1], []
    pos = lengths[:, None] + torch.arange(t)
    for cache, run in pools:
        slots = cache.used
        mask = kv_cache.attention_mask(lengths, slots, torch.ones(3, t, t, dtype=torch.bool).tril(), target.dtype)
        cache.n = 3
        outs.append(run({"ids": ids, "pos": pos}, mask))
        after = cache.commit(lengths, slots + torch.arange(t).expand(3, t), torch.full((3,), t))
        cache.crop(int(after.max()))
    for a, b in zip(*outs):
        assert a.shape == b.shape and a.is_contiguous() and b.is_contiguous()
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    return after


def same_committed_slots(pools, used):
    (a, _), (b, _) = pools
    torch.testing.assert_close(a.buf[:, :, :3, :, :used], b.buf[:, :, :3, :, :used], rtol=1e-9, atol=1e-9)


@torch.inference_mode()
def test_padded_rows_tokens_and_windows_give_the_eager_forward(target):
    """Three rows of three tokens run in the (4 rows, 4 tokens) bucket, past the 256-slot window too: the
    logits, the aux states and every committed slot are those of the unpadded eager forward."""
    native = NativeTarget.from_target(target)
    pools = [pool_and_runner(native, graphs=False), pool_and_runner(native, graphs=True)]
    gen = torch.Generator().manual_seed(0)
    lengths = torch.zeros(3, dtype=torch.long)
    for step in range(130):  # 260 slots: the last steps attend the second window bucket
        t = 3 if step % 2 == 0 else 1
        lengths = forward_both(target, pools, lengths, torch.randint(0, target.info.vocab_size, (3, t), generator=gen))
    runner = pools[1][1]
    assert runner.eager_calls == 0 and pools[0][1].eager_calls == 130
    assert {(r, t, w) for r, t, w in runner.graphs} == {(4, 4, 256), (4, 1, 256), (4, 4, 300), (4, 1, 300)}
    same_committed_slots(pools, int(lengths.max()))


@torch.inference_mode()
def test_a_bucket_built_mid_sequence_writes_past_the_committed_slots(target):
    """253 committed slots, then three tokens padded to four: their window must hold all four (300, not 256),
    or building that bucket (its warm-up writes at the window's last slots) would overwrite slot 252."""
    native = NativeTarget.from_target(target)
    pools = [pool_and_runner(native, graphs=False), pool_and_runner(native, graphs=True)]
    gen = torch.Generator().manual_seed(1)
    lengths = torch.zeros(3, dtype=torch.long)
    for t in (253, 3):  # 253 tokens: past the last token bucket, eagerly
        lengths = forward_both(target, pools, lengths, torch.randint(0, target.info.vocab_size, (3, t), generator=gen))
    assert list(pools[1][1].graphs) == [(4, 4, 300)]
    same_committed_slots(pools, int(lengths.max()))
