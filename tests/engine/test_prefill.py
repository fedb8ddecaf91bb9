"""The native path's prefill from graphs (``engine/prefill.py``) against the eager prefill.

On the CPU its buckets run eagerly with the very padding the GPU replays (no capture), so these
check everything but the capture: the same first tokens, the same draft output for the first tree,
the same tokens after (HF greedy), and the eager fallbacks (long prompts, a fifth prompt, caches
still lent to a batch that has not joined)."""

import pytest
import torch
from helpers import reference_greedy

from eyas.config import SpecConfig
from eyas.engine import prefill as prefill_mod
from eyas.engine.engine import Engine
from eyas.models.native import NativeTarget
from eyas.sample.sampling import SamplingParams

PROMPTS = [[72, 101, 108, 108, 111], [7] * 23, [200, 13], list(range(30, 71))]
NEW = 24
GREEDY = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
CLOSE = dict(atol=1e-5, rtol=1e-4)  # float64 here; the kernels (EYAS_KERNELS=triton) compute in float32


@pytest.fixture(scope="module")
def references(target):
    return [reference_greedy(target.model, p, NEW) for p in PROMPTS]


def engines(target, draft, spec, **kw):
    """(graph-prefill engine, eager-prefill engine) on one native target."""
    native = NativeTarget.from_target(target)
    graphs = Engine(native, draft if spec.speculative else None, spec, max_batch=8, **kw)
    eager = Engine(native, draft if spec.speculative else None, spec, max_batch=8, **kw)
    eager.prefiller = None
    return graphs, eager


def built(engine) -> dict:
    p = engine.prefiller
    return {t: sorted(g.graphs) for t, g in p.targets.items() if g.graphs}


@pytest.mark.parametrize("spec", [SpecConfig("NONE"), SpecConfig("EAGLE3", 4, 3, 8)], ids=["plain", "tree"])
def test_prefill_from_graphs_matches_the_eager_prefill(target, draft, references, spec):
    """One prompt, then three ragged ones in one prefill (a 4-row bucket, one padded row): the first
    token, the draft's output that seeds the first tree, the keys in both caches, and every token after."""
    fast, slow = engines(target, draft, spec)
    for group in ([0], [0, 1, 2], [3]):
        prompts = [PROMPTS[i] for i in group]
        a = fast.prefill([fast.new_sequence(p, GREEDY) for p in prompts])
        b = slow.prefill([slow.new_sequence(p, GREEDY) for p in prompts])
        assert a.target_cache is fast.prefiller.target_cache and b.target_cache is not slow.target_pool
        assert torch.equal(a.root, b.root) and torch.equal(a.lengths, b.lengths)
        if spec.speculative:
            torch.testing.assert_close(a.draft_logits, b.draft_logits, **CLOSE)
            torch.testing.assert_close(a.draft_hidden, b.draft_hidden, **CLOSE)
        for x, y in zip((fast.prefiller.target_cache, fast.prefiller.draft_cache), (b.target_cache, b.draft_cache)):
            if x is None:
                continue
            for r, p in enumerate(prompts):  # row r's keys and values, every layer, its prompt's slots
                want = torch.stack([torch.stack([lay.keys[r, :, : len(p)], lay.values[r, :, : len(p)]])
                                    for lay in y.hf.layers])
                torch.testing.assert_close(x.buf[:, :, r, :, : len(p)], want, **CLOSE)
        while not all(s.finished for s in a.seqs):
            fast.step(a)
        assert [s.output_ids for s in a.seqs] == [references[i] for i in group]
    assert built(fast) == {32: [(1, 32), (4, 32)], 64: [(1, 64)]}


def test_prefill_falls_back_to_eager_where_no_bucket_fits(target, draft, monkeypatch):
    """Past the longest bucket, past the most rows, and while the caches are lent to a batch that has
    not joined the running one: eagerly, the same tokens."""
    spec = SpecConfig("EAGLE3", 5, 1, 6)
    fast, _ = engines(target, draft, spec)
    monkeypatch.setattr(prefill_mod, "PREFILL_TOKENS", 32)
    capped, _ = engines(target, draft, spec)
    assert capped.prefiller.tokens == [32]
    long = capped.generate([PROMPTS[3]], GREEDY)  # 41 tokens > 32
    assert [o.output_ids for o in long] == [o.output_ids for o in fast.generate([PROMPTS[3]], GREEDY)]
    assert not built(capped)
    five = fast.prefill([fast.new_sequence(p, GREEDY) for p in PROMPTS + [[5, 6]]])  # five rows > 4
    assert five.target_cache is not fast.prefiller.target_cache and five.draft_cache is not fast.prefiller.draft_cache
    fast.step(five)

    first = fast.prefill([fast.new_sequence(PROMPTS[0], GREEDY)])  # lent to `first` until it joins
    second = fast.prefill([fast.new_sequence(PROMPTS[2], GREEDY)])
    assert first.target_cache is fast.prefiller.target_cache and second.target_cache is not first.target_cache
    batch = fast.merge(fast.merge(None, first), second)
    assert fast.prefill([fast.new_sequence(PROMPTS[1], GREEDY)]).target_cache is fast.prefiller.target_cache
    while not all(s.finished for s in batch.seqs):
        fast.step(batch)
    solo = Engine(NativeTarget.from_target(target), draft, spec, max_batch=8)
    assert [s.output_ids for s in batch.seqs] == [o.output_ids for o in solo.generate([PROMPTS[0], PROMPTS[2]], GREEDY)]


def test_a_filtered_prefill_batch_keeps_its_caches(target, draft):
    """A row that ends with its first token is filtered out before the batch's first step: the kept
    rows still hold the prefill's caches, so the next prefill must not take them."""
    spec = SpecConfig("EAGLE3", 4, 3, 8)
    engine, _ = engines(target, draft, spec)
    params = [SamplingParams(max_new_tokens=1), GREEDY]
    batch = engine.prefill([engine.new_sequence(p, sp) for p, sp in zip(PROMPTS[:2], params)])
    kept = engine.filter(batch, [1])
    del batch
    other = engine.prefill([engine.new_sequence(PROMPTS[2], GREEDY)])
    assert kept.target_cache is engine.prefiller.target_cache and other.target_cache is not kept.target_cache
    while not kept.seqs[0].finished:
        engine.step(kept)
    solo = Engine(NativeTarget.from_target(target), draft, spec, max_batch=8, cuda_graphs=False)
    assert kept.seqs[0].output_ids == solo.generate([PROMPTS[1]], GREEDY)[0].output_ids


def test_sampled_first_tokens_follow_the_seed(target, draft):
    spec = SpecConfig("EAGLE3", 4, 3, 8)
    fast, slow = engines(target, draft, spec)
    params = [SamplingParams(max_new_tokens=12, temperature=0.8, seed=s) for s in (1, 2)] + [GREEDY]
    outs = [e.generate(PROMPTS[:3], params) for e in (fast, slow)]
    assert [o.output_ids for o in outs[0]] == [o.output_ids for o in outs[1]]
    assert built(fast)


def test_prompts_arriving_together_are_prefilled_in_graph_sized_groups(target, draft, references, monkeypatch):
    """By length, each group within its bucket's rows; prompts past the longest bucket in one eager
    prefill after them; past PREFILL_GROUPS groups, everything eagerly; eager prefills take prompts of like
    length, at most EAGER_CELLS padded tokens each."""
    spec = SpecConfig("EAGLE3", 4, 3, 8)
    engine, _ = engines(target, draft, spec)
    groups = engine.prefiller.groups
    assert groups([5, 23, 2, 41]) == [[2, 0, 1, 3]]
    assert groups([5, 23, 2, 41, 7, 600]) == [[2, 0, 4, 1], [3, 5]]  # 600 tokens: the 1024 bucket, 2 rows
    assert groups([5, 2000, 3]) == [[2, 0], [1]]  # 2000 tokens fit no bucket
    assert groups([10] * 17) == [list(range(17))]  # five groups of 4: one eager prefill
    assert groups([3000] * 3 + [10] * 40) == [list(range(3, 43)), [0, 1, 2]]  # not 43 rows of 3,000
    lengths = [(i * 397) % 2000 + 20 for i in range(64)]  # a burst of chat prompts
    cut = groups(lengths)
    assert sorted(i for g in cut for i in g) == list(range(64)) and len(cut) > 1
    assert all(len(g) * max(lengths[i] for i in g) <= prefill_mod.EAGER_CELLS for g in cut)
    assert [lengths[i] for g in cut for i in g] == sorted(lengths)
    assert groups([20000, 5]) == [[1], [0]]  # past the cells alone
    assert engine.prefill_groups([]) == [] and engine.generate([]) == []
    prompts = PROMPTS + [[9, 8, 7], [300 - i for i in range(60)]]  # six prompts: groups of 4 and 2
    refs = references + [reference_greedy(target.model, p, NEW) for p in prompts[4:]]
    outs = engine.generate(prompts, GREEDY)
    assert [o.output_ids for o in outs] == refs
    assert built(engine) == {32: [(4, 32)], 64: [(2, 64)]}
    eager = Engine(NativeTarget.from_target(target), draft, spec, max_batch=8, cuda_graphs=False)
    assert eager.prefill_groups([eager.new_sequence(p, GREEDY) for p in prompts]) == [list(range(6))]
