"""The native Llama-family path: same logits as HF, same tokens as HF greedy, eager and graph paths.

On the CPU the graph path runs its padded buffers and shape buckets eagerly (no capture), so these
tests check everything the GPU replays except the capture itself.
"""

import pytest
import torch
from helpers import reference_greedy, tiny_target
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from eyas.config import SpecConfig, parse_schedule
from eyas.engine.batch import in_place
from eyas.engine.engine import Engine
from eyas.errors import EyasError
from eyas.models import kv_cache
from eyas.models.llama import NativeLlama, native_support
from eyas.models.native import NativeTarget, choose, plan_pool
from eyas.models.static_cache import StaticKV
from eyas.models.target import Target
from eyas.sample.sampling import SamplingParams

SHAPE = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "llama3-rope": (LlamaConfig, LlamaForCausalLM, {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "qwen2-bias": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3-qk-norm": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 16}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
}
PROMPTS = [[72, 101, 108, 108, 111], [7] * 23, [200, 13], list(range(30, 71)), [1]]
NEW = 40


def family_model(name: str) -> torch.nn.Module:
    config_cls, model_cls, extra = FAMILIES[name]
    torch.manual_seed(0)
    cfg = config_cls(**SHAPE, **extra)
    cfg._attn_implementation = "sdpa"
    model = model_cls(cfg).to(torch.float64).eval()
    for p in model.parameters():  # make biases and norms matter
        p.data.add_(torch.randn_like(p) * 0.02)
    return model


@pytest.mark.parametrize("name", FAMILIES)
def test_native_forward_matches_hugging_face(name):
    model = family_model(name)
    ids = torch.tensor([[5, 9, 33, 7, 250, 1, 2], [8, 8, 8, 100, 0, 0, 0]])
    lengths = torch.tensor([7, 4])
    with torch.no_grad():
        hf = model(input_ids=ids, attention_mask=(torch.arange(7)[None] < lengths[:, None]).long(),
                   output_hidden_states=True)
        target = NativeTarget(model, aux_layer_ids=[1, 2, 3])
        visible = torch.arange(7)[None, :, None] >= torch.arange(7)[None, None, :]
        visible = visible & (torch.arange(7)[None, None, :] < lengths[:, None, None])
        mask = kv_cache.attention_mask(torch.zeros(2, dtype=torch.long), 0, visible, torch.float64)
        logits, aux = target.forward(ids, torch.arange(7).expand(2, 7), mask, kv_cache.new_cache())
    for row, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(logits[row, :n], hf.logits[row, :n])
        want = torch.cat([hf.hidden_states[i][row, :n] for i in (1, 2, 3)], dim=-1)
        torch.testing.assert_close(aux[row, :n], want)


@pytest.mark.parametrize("name", ["qwen3-qk-norm", "qwen2-bias"])
@pytest.mark.parametrize("graphs", [False, True])
def test_other_families_decode_like_hugging_face(name, graphs):
    model = family_model(name)
    refs = [reference_greedy(model, p, 24) for p in PROMPTS[:3]]
    engine = Engine(NativeTarget(model), None, SpecConfig("NONE"), max_batch=4, cuda_graphs=graphs)
    outs = engine.generate(PROMPTS[:3], SamplingParams(max_new_tokens=24, ignore_eos=True))
    assert [o.output_ids for o in outs] == refs


def test_a_plain_greedy_step_replays_whole_and_decodes_like_hugging_face(monkeypatch):
    """Without a draft, a greedy step is one graph (``engine/decode.py``, the tree of the root alone): ragged
    rows, rows that finish early, windows that grow past a bucket; the same tokens as HF and as the step by parts.
    A sampled row in the batch rides in the same replay (the graph's sampled variant)."""
    model = family_model("qwen2-bias")
    prompts = [PROMPTS[0], PROMPTS[1] * 12, PROMPTS[2]]  # the second crosses the 256-slot window
    refs = [reference_greedy(model, p, 40) for p in prompts]
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (40, 40, 12)]
    engine = Engine(NativeTarget(model), None, SpecConfig("NONE"), max_batch=4, cuda_graphs=True)
    outs = engine.generate(prompts, params, overlap=False)  # steps one at a time: counted exactly below
    assert [o.output_ids for o in outs] == [refs[0], refs[1], refs[2][:12]]
    whole = engine.whole_steps[engine.spec]
    assert whole.steps == 39  # every step after prefill's token, the batch filtered as rows finish
    # a step leaves the next one's inputs in the graph's buffers: only the steps after prefill, a filter, or a
    # window bucket change copy them (the second row's window moves from the 256-slot bucket to the next)
    assert 30 <= whole.graph.carried < 39
    parts = Engine(NativeTarget(model), None, SpecConfig("NONE"), max_batch=4, cuda_graphs=True,
                   whole_step_graphs=False)
    assert not parts.whole_steps
    assert [o.output_ids for o in parts.generate(prompts, params)] == [o.output_ids for o in outs]
    mixed = [params[0], SamplingParams(max_new_tokens=8, temperature=0.7, seed=1), params[2]]
    before = whole.steps
    outs = engine.generate(prompts, mixed, overlap=False)
    assert outs[0].output_ids == refs[0] and whole.steps - before == 39  # the sampled row on the graph too
    ahead = engine.generate(prompts, params)  # launched ahead: the same tokens, one more step per row that ends
    assert [o.output_ids for o in ahead] == [refs[0], refs[1], refs[2][:12]]
    assert whole.graphs["sampled"].graphs and len(outs[1].output_ids) == 8


@pytest.fixture(scope="module")
def references(target):
    return [reference_greedy(target.model, p, NEW) for p in PROMPTS]


SPECS = {"none": SpecConfig("NONE"), "chain-5": SpecConfig("EAGLE3", 5, 1, 6),
         "tree-4x3-8": SpecConfig("EAGLE3", 4, 3, 8), "tree-3x4-16": SpecConfig("EAGLE3", 3, 4, 16)}


@pytest.mark.parametrize("path", ["eager", "graph-buffers", "graph-buffers-by-parts"])
@pytest.mark.parametrize("name", SPECS)
def test_native_engine_is_lossless(target, draft, references, name, path, monkeypatch):
    """Eagerly, through the graph path's buckets with the whole greedy step as one (here emulated)
    replay, and through the same buckets step by parts (drafter, target and draft extend replayed
    one after the other, acceptance and commit between them, as batches with a sampled row run)."""
    spec, graphs = SPECS[name], path != "eager"
    native = NativeTarget.from_target(target)
    engine = Engine(native, draft if spec.speculative else None, spec, max_batch=8, cuda_graphs=graphs,
                    whole_step_graphs=path != "graph-buffers-by-parts")
    assert engine.static and "static KV cache 8 x" in engine.layout
    outs = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW, ignore_eos=True))
    assert [o.output_ids for o in outs] == references
    if path == "graph-buffers":  # the steps after the first took their inputs from the last step's carry
        whole = engine.whole_steps[spec]
        assert whole.graph.carried > 0
    if spec.speculative:
        accepted = sum(o.stats.accepted for o in outs)
        assert 0 < accepted < sum(o.stats.draft_tokens for o in outs)
    runner = engine.target_runner
    whole = engine.whole_steps.get(spec)
    if path == "graph-buffers":  # every step one replay: the per-forward runners never used
        assert whole.steps > 0
        assert runner.eager_calls == 0 and not runner.graphs
        if spec.speculative:
            assert not engine.drafters[spec].graph.graphs and not engine.extenders[spec.path_width].graph.graphs
    elif path == "graph-buffers-by-parts":  # a tree drafted by one replay, the target's forward by another
        assert whole is None and runner.graphs and runner.eager_calls == 0
        if spec.speculative:
            assert engine.drafters[spec].graph.graphs and engine.extenders[spec.path_width].graph.graphs
    else:
        assert runner.eager_calls > 0 and not runner.graphs and (whole is None or whole.steps == 0)


@pytest.mark.parametrize("spec", [SpecConfig("EAGLE3", 4, 3, 8),
                                  SpecConfig("EAGLE3", schedule=parse_schedule("1:4,4,12;2:3,1,4;4:0"))],
                         ids=["tree", "schedule"])
def test_warm_up_builds_every_bucket_and_changes_no_output(target, draft, references, spec, capsys):
    """What startup capture runs on the GPU, run eagerly: every bucket built, the caches emptied
    again, then the same tokens and acceptance as an engine that built its buckets lazily."""
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    lazy = Engine(NativeTarget.from_target(target), draft, spec, max_batch=8,
                  graph_max_batch=4).generate(PROMPTS, params)
    engine = Engine(NativeTarget.from_target(target), draft, spec, max_batch=8, graph_max_batch=4)
    assert "n/a on the CPU" in engine.warm_up()  # a CPU server skips it
    summary = engine.warm_up(on_cpu=True)
    runners = engine.graph_runners()
    planned = sum(len(r.plan()) for r in runners)
    assert summary.startswith(f"graph buckets: {planned} warmed up eagerly")
    assert all(set(r.graphs) == set(r.plan()) for r in runners)
    assert all(r.rows == [1, 2, 4] for r in runners if not r.name.startswith("prefill"))
    assert {r.name for r in runners if r.name.startswith("prefill")} >= {"prefill 32", "prefill draft 32"}
    assert "warming up graph buckets: " in capsys.readouterr().err
    assert (engine.target_pool.n, engine.target_pool.used, engine.draft_steps.pool.used) == (0, 0, 0)
    outs = engine.generate(PROMPTS, params)
    assert [o.output_ids for o in outs] == references == [o.output_ids for o in lazy]
    assert [o.stats.as_dict() for o in outs] == [o.stats.as_dict() for o in lazy]
    assert sum(len(r.graphs) for r in runners) == planned  # nothing left to build on first use


def test_cuda_graph_max_bs_caps_every_runner_the_prefills_too(target, draft):
    """``--cuda-graph-max-bs 2``: no graph of more rows, the prefill's included (they went up to 4 rows)."""
    engine = Engine(NativeTarget.from_target(target), draft, SpecConfig("EAGLE3", 3, 1, 4), max_batch=8,
                    graph_max_batch=2)
    runners = engine.graph_runners()
    assert any(r.name.startswith("prefill") for r in runners)
    assert max(max(r.rows) for r in runners) == 2


def test_warm_up_says_why_it_captures_nothing(target):
    assert "generic path" in Engine(target).warm_up()
    assert "disabled" in Engine(NativeTarget.from_target(target), cuda_graphs=False, max_batch=2).warm_up()
    with pytest.raises(EyasError, match="--cuda-graph-max-bs must be at least 1"):
        Engine(NativeTarget.from_target(target), max_batch=2, graph_max_batch=0)


def test_engines_sharing_one_native_target_keep_their_own_caches(target, draft, references):
    """A bench runs a speculative and a baseline engine on one loaded target, interleaved."""
    native = NativeTarget.from_target(target)
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    spec = Engine(native, draft, SpecConfig("EAGLE3", 4, 2, 6), max_batch=4)
    base = Engine(native, None, SpecConfig("NONE"), max_batch=4)
    a, b = spec.prefill([spec.new_sequence(PROMPTS[0], params)]), base.prefill([base.new_sequence(PROMPTS[1], params)])
    while not (a.seqs[0].finished and b.seqs[0].finished):
        for engine, batch in ((spec, a), (base, b)):
            if not batch.seqs[0].finished:
                engine.step(batch)
    assert [a.seqs[0].output_ids, b.seqs[0].output_ids] == references[:2]


def test_native_and_generic_paths_accept_the_same_tokens(target, draft):
    spec = SpecConfig("EAGLE3", 4, 3, 8)
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    generic = Engine(target, draft, spec).generate(PROMPTS, params)
    native = Engine(NativeTarget.from_target(target), draft, spec, max_batch=8).generate(PROMPTS, params)
    assert [o.stats.accepted_per_position for o in native] == [o.stats.accepted_per_position for o in generic]


def test_long_context_crosses_window_buckets(target, draft):
    """A prompt past the first attention window (256 slots) moves to the next bucket, still lossless."""
    prompt = [(i * 7) % 250 + 3 for i in range(250)]
    ref = reference_greedy(target.model, prompt, 24)
    engine = Engine(NativeTarget.from_target(target), draft, SpecConfig("EAGLE3", 5, 1, 6), max_batch=2)
    out = engine.generate([prompt], SamplingParams(max_new_tokens=24, ignore_eos=True))[0]
    assert out.output_ids == ref
    assert {key[1] for key in engine.whole_steps[engine.spec].graph.graphs} == {256, 1024}


def test_static_cache_operations_match_the_dynamic_cache():
    torch.manual_seed(1)
    dyn = kv_cache.new_cache()
    static = StaticKV(2, 4, 2, 32, 8, torch.float64, "cpu")
    for layer in range(2):
        k, v = torch.randn(3, 2, 10, 8, dtype=torch.float64), torch.randn(3, 2, 10, 8, dtype=torch.float64)
        dyn.update(k, v, layer)
    static.adopt(dyn)
    assert (static.n, static.used) == (3, 10)
    for layer in range(2):  # append 4 slots, as a verify step does
        k, v = torch.randn(3, 2, 4, 8, dtype=torch.float64), torch.randn(3, 2, 4, 8, dtype=torch.float64)
        dyn.update(k, v, layer)
        static.begin(4) if layer == 0 else None
        static.update(k, v, layer)
    static.advance(4)
    lengths = torch.tensor([10, 7, 9])
    src = torch.tensor([[10, 12, 13], [11, 0, 0], [13, 10, 0]])
    counts = torch.tensor([3, 1, 2])
    new = dyn.commit(lengths, src, counts)
    assert torch.equal(static.commit(lengths, src, counts), new)
    rows = [2, 0]
    dyn.select_rows(rows, 13)
    static.select_rows(rows, 13)
    for layer, dl in enumerate(dyn.hf.layers):
        for b, n in enumerate(new[torch.tensor(rows)].tolist()):
            assert torch.equal(static.buf[layer, 0, b, :, :n], dl.keys[b, :, :n])
            assert torch.equal(static.buf[layer, 1, b, :, :n], dl.values[b, :, :n])


@pytest.mark.parametrize("keep", [[0, 1, 3, 4, 5], [1, 2, 3, 4, 5], [0, 2, 5], [5], [0, 1, 2, 3, 4, 5]])
def test_a_batch_that_loses_rows_moves_the_fewest(keep):
    """``in_place`` keeps every row below the kept count where it is and moves the rest into the places left;
    ``select_rows`` copies those alone, and each kept row's slots end up where the new order says."""
    static = StaticKV(1, 6, 1, 8, 2, torch.float32, "cpu")
    static.buf[:, :, :6] = torch.arange(6, dtype=torch.float32).view(1, 1, 6, 1, 1, 1) + 1
    static.n = 6
    order = in_place(keep)
    assert sorted(order) == keep and all(order[r] == r for r in keep if r < len(keep))
    static.select_rows(order, 8)
    assert static.n == len(keep) and [int(static.buf[0, 0, i, 0, 0, 0]) - 1 for i in range(len(keep))] == order


def test_static_cache_refuses_what_it_cannot_hold():
    static = StaticKV(1, 2, 1, 16, 4, torch.float32, "cpu")
    dyn = kv_cache.new_cache()
    dyn.update(torch.zeros(3, 1, 5, 4), torch.zeros(3, 1, 5, 4), 0)
    with pytest.raises(EyasError, match="(?s)sized for 2.*--max-running-requests"):
        static.adopt(dyn)
    static.hold(0, 14)
    with pytest.raises(EyasError, match="(?s)16 positions.*--context-length"):
        static.begin(4)


def test_pool_plan_fits_the_budget():
    assert plan_pool(4, 1000, 10, 100, 10**9).slots == 1010
    capped = plan_pool(4, 100000, 10, 1000, 4 * 1000 * 5000)
    assert capped.slots == 5000 and capped.bytes <= 4 * 1000 * 5000


def test_engine_caps_context_to_the_pool(target, monkeypatch):
    per_slot = NativeTarget.from_target(target).bytes_per_slot()
    monkeypatch.setattr("eyas.engine.pools.kv_budget", lambda device, fraction=None: 2 * 300 * per_slot)
    engine = Engine(NativeTarget.from_target(target), None, SpecConfig("NONE"), max_batch=2)
    assert engine.max_context == 298 and "context 298" in engine.layout
    assert engine.target.info.max_context > 298  # the pool set the limit, not the model: the error says which
    with pytest.raises(EyasError, match="the KV cache holds 298 a row for 2 rows.*at most") as err:
        engine.new_sequence([5] * 299, SamplingParams())
    assert "--max-running-requests" in err.value.fix and "--mem-fraction-static" in err.value.fix


@pytest.mark.parametrize("native,tree", [(True, (4, 3, 8)), (True, (5, 1, 6)), (False, (4, 3, 8)),
                                         (True, "1:3,1,4;2:0"), (True, "1:5,1,6;2:0")])
def test_a_row_generates_up_to_the_last_slot_of_the_context(target, draft, monkeypatch, native, tree):
    """A row ends at the context, prompt and output together, whatever tree the steps verify: the KV pool has
    room past the context for the last step's tree (a row that stopped a tree short of it lost the last
    tokens of a request that fit, and a prompt a tree short of it was refused). With a schedule's plain steps
    the draft's feed is deferred, and the step by parts that drafts again when the batch shrinks to one row
    writes the feed's block and its own path past the context (the pool once lacked the block's room: an error
    for the whole batch)."""
    model = target.info.max_context
    per_slot = NativeTarget.from_target(target).bytes_per_slot()
    monkeypatch.setattr("eyas.engine.pools.kv_budget", lambda device, fraction=None: 3 * 300 * per_slot)
    spec = SpecConfig("EAGLE3", 3, 1, 4, schedule=parse_schedule(tree)) if isinstance(tree, str) else \
        SpecConfig("EAGLE3", *tree)
    engine = Engine(NativeTarget.from_target(target), draft, spec, max_batch=3) if native else Engine(target, draft,
                                                                                                       spec)
    context = engine.max_context
    assert context < model if native else context == model  # the pool's slots less its slack (tree and bonus)
    prompt = [(i * 7) % 250 + 3 for i in range(context - 11)]
    out = engine.generate([prompt, prompt[:-3], prompt[:-6]], SamplingParams(max_new_tokens=10**6, ignore_eos=True))
    assert [len(o.output_ids) for o in out] == [11, 14, 17] and {o.finish_reason for o in out} == {"length"}
    assert out[0].output_ids == reference_greedy(target.model, prompt, 11)
    with pytest.raises(EyasError, match=f"the prompt has {context} tokens"):
        engine.new_sequence([5] * context, SamplingParams())
    engine.new_sequence([5] * (context - 1), SamplingParams())  # room for one token


def test_an_engine_dropped_leaves_nothing_on_its_target(target, draft):
    """Engines built one after another on one target (regeneration's splits, a bench's settings): a dropped
    engine's KV pool and graphs are freed. (Its runner, keyed by the pool on the target, kept them alive:
    on the GPU a second engine was sized from what the first left free, a few dozen tokens a row.)"""
    import gc
    import weakref

    native = NativeTarget.from_target(target)
    engine = Engine(native, draft, SpecConfig("EAGLE3", 4, 2, 6), max_batch=2)
    engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=4))
    pool, runner = weakref.ref(engine.target_pool), weakref.ref(engine.target_runner)
    del engine
    gc.collect()
    assert pool() is None and runner() is None and not native.runners
    again = Engine(native, None, SpecConfig("NONE"), max_batch=2)
    assert again.generate([PROMPTS[0]], SamplingParams(max_new_tokens=4))[0].output_ids


def test_native_support_names_what_it_cannot_run():
    assert native_support(family_model("llama")) is None
    gelu = LlamaForCausalLM(LlamaConfig(**SHAPE, hidden_act="gelu"))
    assert "gelu" in native_support(gelu)
    windowed = MistralForCausalLM(MistralConfig(**{**SHAPE, "max_position_embeddings": 4096}, sliding_window=128))
    assert "sliding-window" in native_support(windowed)
    dynamic = LlamaForCausalLM(LlamaConfig(**SHAPE, rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                                       "rope_theta": 10000.0}))
    assert "dynamic" in native_support(dynamic)
    with pytest.raises(ValueError, match="no native path"):
        NativeLlama(gelu)


def test_choose_is_automatic_and_says_why():
    target = tiny_target()
    same, why = choose(target, "auto")
    assert same is target and "CUDA" in why  # on the CPU auto keeps the generic path
    native, why = choose(target, "native")
    assert isinstance(native, NativeTarget) and why is None
    gelu = Target(LlamaForCausalLM(LlamaConfig(**SHAPE, hidden_act="gelu")))
    with pytest.raises(EyasError, match="(?s)gelu.*--engine auto"):
        choose(gelu, "native")
    assert "gelu" in choose(gelu, "auto")[1]
    assert choose(target, "generic") == (target, "--engine generic")


def test_build_engine_takes_the_native_path_when_asked(tmp_path):
    from helpers import save_tiny_model

    from eyas.pipeline import EngineArgs, build_engine
    from eyas.serve.banner import banner_lines

    save_tiny_model(tmp_path / "t")
    args = EngineArgs(model_path=str(tmp_path / "t"), speculative_algorithm="NONE", engine="native", max_batch=3)
    engine = build_engine(args)
    assert engine.static and engine.target_pool.capacity_rows == 3
    assert any(line.startswith("engine: native Llama forward, static KV cache 3 x")
               for line in banner_lines(engine, 3, 8))
    generic = build_engine(EngineArgs(model_path=str(tmp_path / "t"), speculative_algorithm="NONE", engine="generic"))
    assert not generic.static and "--engine generic" in generic.layout


@pytest.mark.parametrize("name", ["chain-5", "tree-4x3-8"])
def test_graph_paths_draft_what_the_eager_path_drafts(target, draft, name, monkeypatch):
    """The whole-function graphs (the whole greedy step; tree drafting and draft extend by parts)
    propose the same tokens as the eager reference: the acceptance of every sequence is the same,
    step for step, not only the output."""
    spec = SPECS[name]
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    runs = {}
    for graphs, whole in ((False, True), (True, True), (True, False)):
        engine = Engine(NativeTarget.from_target(target), draft, spec, max_batch=8, cuda_graphs=graphs,
                        whole_step_graphs=whole)
        runs[graphs, whole] = [o.stats.as_dict() for o in engine.generate(PROMPTS, params)]
        if graphs:
            parts = [engine.drafters[spec], *engine.extenders.values()]
            assert all(len(e.graph.graphs) > 0 for e in parts) != whole
    assert runs[True, True] == runs[False, True] == runs[True, False]


@pytest.mark.parametrize("name", ["none", "tree-4x3-8"])
def test_what_a_step_graph_carries_is_what_the_host_would_have_copied(target, draft, name):
    """A whole-step graph leaves the next step's inputs in its buffers (``BatchGraph``'s carry): after every
    step whose graph holds the batch's state, those buffers equal the batch's tensors and the caches' slot
    counts the host keeps, and the padding rows are zeros. Rows finish at different steps (filters)."""
    spec = SPECS[name]
    engine = Engine(NativeTarget.from_target(target), draft if spec.speculative else None, spec, max_batch=8,
                    cuda_graphs=True)
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (20, 7, 14)]
    batch = engine.prefill_all([engine.new_sequence(p, q) for p, q in zip(PROMPTS[:3], params)])
    runner = engine.whole_steps[spec]
    checked = 0
    while True:
        alive = [i for i, s in enumerate(batch.seqs) if not s.finished]
        if not alive:
            break
        if len(alive) < len(batch):
            batch = engine.filter(batch, alive)
        engine.step(batch)
        held = [g for g in runner.graph.graphs.values() if g.holds == batch.state()[0]]
        assert len(held) <= 1
        for g in held:
            b, inputs = len(batch), g.inputs
            assert inputs["lengths"][:b].tolist() == batch.lengths.tolist()
            assert inputs["root"][:b].tolist() == batch.root.tolist()
            assert not inputs["lengths"][b:].any() and not inputs["root"][b:].any()
            if spec.speculative:
                assert int(inputs["tprefix"]) == engine.target_pool.used == int(inputs["dprefix"])
                assert engine.draft_steps.pool.used == engine.target_pool.used
                torch.testing.assert_close(inputs["hidden0"][:b], batch.draft_hidden, rtol=0, atol=0)
                torch.testing.assert_close(inputs["logits0"][:b], batch.draft_logits, rtol=0, atol=0)
            else:
                assert int(inputs["tprefix"]) == engine.target_pool.used and "dprefix" not in inputs
            checked += 1
    assert checked >= 10


def test_fused_draft_forward_matches_the_drafts_own(target):
    """The engine drafts with ``NativeEagle3`` (fused weights, folded GQA): same numbers as the
    draft's own modules, with a cache and a ragged mask, and the draft still trains afterwards."""
    from eyas.models.draft import Eagle3Draft
    from eyas.models.llama import NativeEagle3

    torch.manual_seed(1)
    draft = Eagle3Draft.for_target(target, draft_vocab_size=120)
    for p in draft.parameters():
        p.data.add_(torch.randn_like(p) * 0.05)
    ids = torch.tensor([[5, 9, 33, 7], [8, 100, 0, 0]])
    aux = torch.randn(2, 4, draft.fc.in_features, dtype=torch.float64)
    lengths = torch.tensor([4, 2])
    visible = (torch.arange(4)[None, :, None] >= torch.arange(4)[None, None, :]) & \
        (torch.arange(4)[None, None, :] < lengths[:, None, None])
    mask = kv_cache.attention_mask(torch.zeros(2, dtype=torch.long), 0, visible, torch.float64)
    pos = torch.arange(4).expand(2, 4)
    with torch.no_grad():
        want_h = draft.backbone(draft.embed(ids), draft.project(aux), pos, kv_cache.new_cache(), mask)
        want = draft.logits(want_h)
        net = NativeEagle3(draft)
        got_h = net.backbone(net.embed(ids), net.project(aux), pos, kv_cache.new_cache(), mask)
        got = net.logits(got_h)
    for row, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(got_h[row, :n], want_h[row, :n])
        torch.testing.assert_close(got[row, :n], want[row, :n])
    assert net.d2t is draft.d2t and net.draft_vocab_size == 120
    q = draft.midlayer.self_attn.q_proj.weight
    assert q.requires_grad and q.data_ptr() == net.qkv.data_ptr()  # a view: training updates what serving reads
