"""--speculative-batch-schedule auto: the chooser maximises expected tokens per second per batch bucket, follows
the live acceptance, and the engine stays lossless while the setting changes between steps."""

import logging
import random

import pytest
from helpers import reference_greedy

from eyas.config import AUTO_CANDIDATES, Algorithm, SpecConfig, format_schedule, parse_schedule
from eyas.engine.adaptive import GREEDY, SAMPLED, Chooser, kind_of, measure_step_costs, prior_reach
from eyas.engine.engine import Engine
from eyas.errors import EyasError
from eyas.models.native import NativeTarget
from eyas.sample.sampling import SamplingParams

AUTO = SpecConfig.auto("EAGLE3")
NONE, CHAIN3, CHAIN5, TREE16, TREE32 = AUTO.options
HOT = kind_of(SamplingParams(temperature=0.7))  # the band of sampled rows at T 0.7


def costs(table: dict[int, tuple[float, ...]]) -> dict:
    """{rows bucket: seconds of (NONE, 3,1,4, 5,1,6, 4,4,16, 6,8,32)} -> the chooser's cost table."""
    return {s: {b: row[i] for b, row in table.items()} for i, s in enumerate(AUTO.options)}


def test_auto_spec_holds_the_candidates_and_no_speculation():
    assert [(s.num_steps, s.eagle_topk, s.num_draft_tokens) for s in AUTO.options[1:]] == list(AUTO_CANDIDATES)
    assert not NONE.speculative and AUTO.adaptive and AUTO.num_draft_tokens == max(c[2] for c in AUTO_CANDIDATES)
    assert AUTO.verify_sizes == [1, 4, 6, 16, 32] and AUTO.for_batch(64) is AUTO
    assert format_schedule(AUTO) == "auto"
    assert format_schedule(SpecConfig("EAGLE3", schedule=parse_schedule("1:0;2:3,1,4"))) == "1:0;2:3,1,4"
    with pytest.raises(EyasError, match="(?s)auto needs speculation.*NONE.*fix"):
        SpecConfig("NONE", adaptive=True)
    with pytest.raises(EyasError, match="no hand-written schedule"):
        SpecConfig("EAGLE3", schedule=parse_schedule("1:3,1,4"), adaptive=True)


def test_the_choice_maximises_expected_tokens_per_second_in_each_bucket():
    chooser = Chooser(AUTO.options, costs({1: (1.0, 1.1, 1.2, 1.5, 1.7), 8: (2.0, 2.4, 2.8, 5.0, 9.0),
                                           64: (4.0, 12.0, 14.0, 20.0, 40.0)}))
    for s, reach in zip(AUTO.options[1:], ([0.7, 0.5, 0.3], [0.7, 0.5, 0.3, 0.2, 0.1], [0.9, 0.7, 0.5, 0.3],
                                           [0.95, 0.8, 0.6, 0.45, 0.3, 0.2])):
        chooser.reach[GREEDY][s] = list(reach)
    for rows in (1, 2, 5, 8, 9, 64, 100):
        best = max(AUTO.options, key=lambda s: chooser.tau(s) / chooser.cost(s, rows))
        assert chooser.choose(rows) == best, rows
    # by hand: tau 1, 2.5, 2.8, 3.4, 4.3
    assert chooser.choose(1) == TREE32  # 4.3 / 1.7 beats 2.8 / 1.2, 3.4 / 1.5 and 2.5 / 1.1
    assert chooser.choose(8) == CHAIN3  # 2.5 / 2.4 beats 1 / 2.0 and 2.8 / 2.8
    assert chooser.choose(64) == NONE  # 1 / 4 beats 2.5 / 12 and 2.8 / 14
    assert chooser.cost(NONE, 128) == 8.0  # past the largest bucket: scaled by the rows
    rate, best = chooser.rates(8)[0]
    assert best == CHAIN3 and rate == pytest.approx(8 * 2.5 / 2.4)


def test_live_acceptance_moves_the_choice_and_the_log_says_why(caplog):
    chooser = Chooser(AUTO.options, costs({1: (1.0, 1.1, 1.2, 1.5, 2.0)}))
    assert chooser.tau(TREE32) == pytest.approx(1 + sum(prior_reach(TREE32)))  # the prior before data
    with caplog.at_level(logging.INFO, logger="eyas.engine"):
        first = chooser.choose(1)
        assert first == TREE32  # the optimistic prior: the big tree gets tried
        for _ in range(200):  # its rows accept nothing: tau falls to 1 and it loses to no speculation
            chooser.observe(chooser.choose(1), [0])
        assert chooser.choice == NONE and chooser.tau(TREE32) < 2.0 < 1 + sum(prior_reach(TREE32))
        assert chooser.steps[TREE32] > 0 and chooser.steps[NONE] > 0
        learnt = len(caplog.records)
        for _ in range(100):  # settled: probes draft now and then, but the choice (and the log) stays
            chooser.observe(chooser.choose(1), [0])
        assert chooser.choice == NONE and len(caplog.records) == learnt
    changes = [r.getMessage() for r in caplog.records]
    assert changes[0].startswith("adaptive speculation: 1 rows (0 sampled) -> setting 6,8,32 (expected")
    assert changes[-1].startswith("adaptive speculation: 1 rows (0 sampled) -> setting 0 (expected 1 tok/s, "
                                  "tau 1.00 greedy; ")
    assert all(" tok/s" in m and "; " in m and " at " in m for m in changes)  # the top two's figures
    assert len(changes) < 200 / 3  # one line per change, not per step

    # acceptance comes back: NONE runs teach nothing, so a probe drafts every probe_gap quiet steps
    probes = 0
    for _ in range(2 * chooser.max_probe_every):
        s = chooser.choose(1)
        probes += s.speculative
        chooser.observe(s, [s.path_width - 1] * 4)  # every row accepts the whole path (NONE: ignored)
        if chooser.choice.speculative:
            break
    assert chooser.choice.speculative and probes >= 1
    assert chooser.probe_gap == chooser.probe_every  # a probe that paid: the next comes soon again


@pytest.mark.parametrize("measured", [False, True], ids=["model-costs", "measured-costs"])
def test_probes_that_find_nothing_come_ever_more_rarely(measured):
    """A draft that never pays (sampled at temperature 1, say): each probe costs a speculative step, so the gap
    between them doubles up to max_probe_every; with the gap kept at probe_every it would be 63 probes. Measured
    costs add no refresh while no speculation is the choice."""
    table = costs({1: (1.0, 1.2, 1.8, 2.5, 3.0)})  # 3,1,4 at 83% of the plain step's rate: close, but not run
    chooser = Chooser(AUTO.options, table)
    chooser.set_costs(table, measured=measured)
    for s in chooser.reach[GREEDY]:
        chooser.reach[GREEDY][s] = [0.0] * len(chooser.reach[GREEDY][s])
    probes = []
    for step in range(4096):
        s = chooser.choose(1)
        if s.speculative:
            probes.append(step)
        chooser.observe(s, [0])
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert len(probes) <= 8 and gaps == sorted(gaps) and max(gaps) == chooser.max_probe_every + 1
    assert chooser.probe_gap == chooser.max_probe_every and chooser.choice == NONE


def test_a_refresh_re_measures_the_settings_close_to_the_choice_in_turn():
    """Measured costs: after every ``probe_every`` steps of a speculative choice, four steps of another setting
    run (the middle two are timed steady), taking turns among the settings expected at 70% of the choice's rate or
    more; one far behind never runs. The choice stays. Relative costs (the CPU) follow nothing: no refresh."""
    table = costs({1: (1.0, 1.0, 1.0, 1.0, 1.0)})
    chooser = Chooser(AUTO.options, table, probe_every=8)
    chooser.set_costs(table, measured=True)
    for s, reach in zip(AUTO.options[1:], ([0.0] * 3, [0.9, 0.8, 0.7, 0.6, 0.5], [0.9, 0.6, 0.3, 0.1],
                                           [0.9, 0.8, 0.7, 0.6, 0.5, 0.5])):
        chooser.reach[GREEDY][s] = list(reach)
    # tau: NONE 1, 3,1,4 1 (no better, ranked after NONE), 5,1,6 4.5, 4,4,16 2.9 (64% of 6,8,32), 6,8,32 5
    picks = [chooser.choose(1) for _ in range(39)]
    refreshes = [(i, s) for i, s in enumerate(picks) if s != TREE32]
    assert refreshes == [(i, CHAIN5) for i in (*range(8, 12), *range(20, 24), *range(32, 36))]
    assert chooser.choice == TREE32
    chooser.reach[GREEDY][TREE16] = [0.9, 0.8, 0.7, 0.6]  # 4,4,16 now close too (tau 4): they take turns
    picks = [chooser.choose(1) for _ in range(39)]
    assert [s for s in picks if s != TREE32] == [TREE16] * 4 + [CHAIN5] * 4 + [TREE16] * 4
    chooser.observe(CHAIN5, [4], seconds=1.6, rows=1)  # a refresh's step moves its setting's cost by 0.3
    assert chooser.cost(CHAIN5, 1) == pytest.approx(1.0 + 0.3 * 0.6)
    chooser.observe(TREE32, [5], seconds=1.6, rows=1)  # the choice's own steps by 0.05
    assert chooser.cost(TREE32, 1) == pytest.approx(1.0 + 0.05 * 0.6)
    relative = Chooser(AUTO.options, table, probe_every=8)
    relative.reach = chooser.reach
    assert {relative.choose(1) for _ in range(39)} == {TREE32}


def test_refreshes_correct_a_warm_up_cost_that_came_out_high():
    """A served 16-row batch at T 0.7 (H100, SmolLM2): warm-up timed 3,1,4 at 2.27 ms where its steps take about
    1.55, so 4,4,16 looked best and 3,1,4 never ran. Refreshes of the settings close to the choice re-measure it
    and the choice moves to it; with none (a floor no setting reaches) the wrong choice stays."""
    true = {NONE: 1.2, CHAIN3: 1.55, CHAIN5: 1.9, TREE16: 2.4, TREE32: 3.6}  # ms a step, 16 sampled rows
    warm = {**true, CHAIN3: 2.27, TREE16: 2.2}
    reach = {CHAIN3: [0.45, 0.12, 0.04], CHAIN5: [0.45, 0.13, 0.05, 0.03, 0.02], TREE16: [0.75, 0.38, 0.15, 0.08],
             TREE32: [0.78, 0.4, 0.16, 0.07, 0.03, 0.02]}  # tau 1.61, 1.68, 2.36, 2.46: served figures

    def served(floor: float) -> Chooser:
        table = {s: {16: warm[s]} for s in AUTO.options}
        chooser = Chooser(AUTO.options, table, refresh_floor=floor)
        chooser.set_costs(table, measured=True, sampled=table)
        previous = None
        for _ in range(12000):
            s = chooser.choose(16, {HOT: 16})
            # the tree's acceptance holds its value: each row accepts the expected count, in the reach's shape
            accepted = [0] * 16 if not s.speculative else [
                sum(1 for p in reach[s] if (i + 0.5) / 16 < p) for i in range(16)]
            chooser.observe(s, accepted, true[s] if s == previous else None, 16, [HOT] * 16)
            previous = s
        return chooser

    assert served(floor=0.7).choice == CHAIN3
    assert served(floor=1.01).choice == TREE16


def test_live_step_times_correct_a_warm_up_cost_that_was_too_low():
    """Warm-up said the tree costs what a plain step does; served steps take three times as long, so the
    chooser moves to no speculation once its estimate follows them. Model costs (no units) are not followed."""
    table = costs({1: (1.0, 1.0, 1.0, 1.0, 1.0), 32: (1.0, 5.0, 5.0, 5.0, 1.0)})
    for measured in (False, True):
        chooser = Chooser(AUTO.options, table)
        chooser.set_costs(table, measured=measured)
        chooser.reach[GREEDY][TREE32] = [0.5, 0.2, 0.1, 0.05, 0.0, 0.0]  # tau 1.85
        assert chooser.choose(32) == TREE32
        for _ in range(200):
            s = chooser.choose(32)
            chooser.observe(s, [1] * 32, seconds=3.0 if s == TREE32 else 1.0, rows=32)
        assert chooser.choice == (NONE if measured else TREE32)
        if measured:  # followed until the tree lost (tau 1.85 for 1.85x the cost), then kept: it stopped running
            assert 1.85 < chooser.cost(TREE32, 32) <= 3.0
        else:
            assert chooser.cost(TREE32, 32) == 1.0
        assert chooser.cost(TREE32, 1) == 1.0  # another bucket: untouched
    chooser.observe(NONE, [], seconds=100.0, rows=32)  # one stalled step moves it at most 2x times the decay
    assert chooser.cost(NONE, 32) <= 1.0 + chooser.cost_decay * 1.0 + 1e-9
    n, seconds = chooser.observed[GREEDY][(NONE, 32)]  # what the steps measured, before the clip: the tally
    assert seconds == pytest.approx(1.0 * (n - 1) + 100.0)
    assert (TREE32, 1) not in chooser.observed[GREEDY] and chooser.observed[SAMPLED] == {}


def test_one_row_at_a_time_does_not_talk_the_chooser_out_of_a_tree_that_pays():
    """Batch 1, sampled: the tree accepts 1.43 tokens a step on average (tau 2.43) for 2.04x a plain step's cost,
    but a step accepts 0 to 6. Weighed per step, a run of bad luck would leave the estimate low just when the tree
    stops running, and probes one step at a time (ever rarer while they find it losing) would take thousands of
    steps to undo it. Weighed per row, the estimate stays near the truth and the tree keeps running."""
    rng = random.Random(0)
    chooser = Chooser(AUTO.options, costs({1: (0.76, 9.0, 9.0, 9.0, 1.55)}))  # the H100's batch-1 T 0.7 costs

    def accepted() -> int:  # each depth reached with probability 0.6: E = 0.6 + ... + 0.6^6 = 1.43
        n = 0
        while n < 6 and rng.random() < 0.6:
            n += 1
        return n

    for _ in range(20000):
        s = chooser.choose(1, {HOT: 1})
        chooser.observe(s, [accepted()] if s.speculative else [], kinds=[HOT] if s.speculative else None)
    assert chooser.steps[TREE32] > 0.9 * 20000, chooser.steps
    assert chooser.tau(TREE32, HOT) == pytest.approx(2.43, abs=0.25)



def test_each_band_of_temperature_has_its_own_acceptance():
    """Clients at T 0.7, for whom the tree pays, give way to clients at T 1.0, for whom it does not (an H100's
    one-client figures: tau 2.3 and 1.6 for 1.3x and 1.24 ms a step against 0.65 ms plain). Lumped as one kind of
    sampled row, the estimate left from T 0.7 kept the tree running for some 1,700 steps at T 1.0; each band starts
    from its own figures, so the T 1.0 rows settle on plain steps within a few dozen, and rows back at T 0.7 get
    the tree at once."""
    assert [kind_of(SamplingParams(temperature=t)) for t in (0, 0.3, 0.7, 0.8, 1.0, 1.3)] == [
        GREEDY, "t<=0.4", "t<=0.8", "t<=0.8", "t<=1", "t>1"]
    rng = random.Random(0)
    chooser = Chooser(AUTO.options, costs({1: (0.65, 9.0, 9.0, 1.24, 9.0)}))

    def accepted(level: float) -> int:  # each depth reached with probability ``level``
        n = 0
        while n < 4 and rng.random() < level:
            n += 1
        return n

    def serve(kind: str, level: float, steps: int) -> int:
        """Speculative steps of ``steps``, one row of ``kind`` accepting at ``level`` per depth."""
        spec = 0
        for _ in range(steps):
            s = chooser.choose(1, {kind: 1})
            spec += s.speculative
            chooser.observe(s, [accepted(level)] if s.speculative else [], kinds=[kind])
        return spec

    warm = kind_of(SamplingParams(temperature=0.7))
    assert serve(warm, 0.6, 3000) > 2700 and chooser.choice == TREE16  # tau 2.3: the tree pays
    hot = kind_of(SamplingParams(temperature=1.0))
    assert serve(hot, 0.4, 3000) < 150 and chooser.choice == NONE  # tau 1.6: plain steps, after a few tries
    assert chooser.choose(1, {warm: 1}) == TREE16  # T 0.7 again: its own estimate, the tree at once
    rate = dict((s, r) for r, s in chooser.rates(2, {warm: 1, hot: 1}))[TREE16]  # one row of each: its own tau
    assert rate == pytest.approx((chooser.tau(TREE16, warm) + chooser.tau(TREE16, hot)) / chooser.cost(TREE16, 2, 2))

def test_sampled_rows_are_weighed_by_what_sampled_rows_accepted():
    """Greedy rows accept the whole tree, sampled rows nothing: a greedy batch keeps the tree, a sampled one
    runs no speculation (no greedy-era estimate to unlearn), a mixed batch weighs each kind by its rows; each
    kind's step costs follow steps of batches of that kind only."""
    chooser = Chooser(AUTO.options, costs({4: (1.0, 1.3, 1.4, 1.6, 1.8)}))
    chooser.set_costs(costs({4: (1.0, 1.3, 1.4, 1.6, 1.8)}), measured=True)
    for _ in range(100):
        chooser.observe(TREE32, [5] * 4, seconds=1.8, rows=4)  # greedy rows: the whole path
        for s in AUTO.options[1:]:  # sampled rows: nothing, whatever the shape
            chooser.observe(s, [0] * 4, seconds=2.7 if s == TREE32 else None, rows=4, kinds=[HOT] * 4)
    assert chooser.tau(TREE32, GREEDY) > 5.5 and chooser.tau(TREE32, HOT) < 1.05
    assert chooser.cost(TREE32, 4) == pytest.approx(1.8) and chooser.cost(TREE32, 4, sampled=4) > 2.6
    assert chooser.choose(4) == TREE32
    chooser.choice = None
    assert chooser.choose(4, {HOT: 4}) == NONE
    rate = dict((s, r) for r, s in chooser.rates(4, {HOT: 1}))[TREE32]
    want = (3 * chooser.tau(TREE32, GREEDY) + chooser.tau(TREE32, HOT)) / chooser.cost(TREE32, 4, sampled=1)
    assert rate == pytest.approx(want)
    # a batch of both kinds: each row teaches its own kind; the cost goes to the sampled table
    greedy_cost, seen = chooser.cost(CHAIN5, 4), {k: chooser.seen[k][CHAIN5] for k in (GREEDY, HOT)}
    chooser.observe(CHAIN5, [4, 4, 0, 0], seconds=5.0, rows=4, kinds=[GREEDY, GREEDY, HOT, HOT])
    assert [chooser.seen[k][CHAIN5] for k in (GREEDY, HOT)] == [seen[GREEDY] + 2, seen[HOT] + 2]  # rows
    assert chooser.cost(CHAIN5, 4) == greedy_cost < chooser.cost(CHAIN5, 4, sampled=2)
    chooser.observe(NONE, [], seconds=2.0, rows=4, sampled=1)  # a plain step of a mixed batch: its cost alone
    assert chooser.cost(NONE, 4) == 1.0 < chooser.cost(NONE, 4, sampled=1)


def test_sampled_batches_start_from_their_own_measured_costs():
    """Warm-up times sampled steps too: a sampled batch is ranked on those from its first step, so where the
    sampling kernels make drafting lose, it runs no speculation while a greedy batch drafts."""
    chooser = Chooser(AUTO.options, costs({1: (1.0, 1.1, 1.2, 1.5, 1.7)}))
    chooser.set_costs(costs({1: (1.0, 1.1, 1.2, 1.5, 1.7)}), measured=True,
                      sampled=costs({1: (1.1, 3.0, 3.3, 4.0, 5.0)}))
    for s in AUTO.options[1:]:  # sampled rows accept half as deep at each depth: tau < 2
        chooser.reach[HOT][s] = [0.5 ** (i + 1) for i in range(len(chooser.reach[HOT][s]))]
    assert chooser.cost(TREE32, 1) == 1.7 and chooser.cost(TREE32, 1, sampled=1) == 5.0
    assert chooser.choose(1) == TREE32  # the greedy prior
    chooser.choice = None
    assert chooser.choose(1, {HOT: 1}) == NONE  # 1 / 1.1 beats 1.875 / 3.0 (3,1,4) and the rest
    chooser.set_costs(costs({1: (1.0, 1.1, 1.2, 1.5, 1.7)}), measured=True)  # no sampled table: the greedy copy
    chooser.choice = None
    assert chooser.choose(1, {HOT: 1}) != NONE  # 1.875 / 1.1 would draft


def test_the_engine_tells_the_chooser_which_rows_draw(target, draft, references):
    """A batch of greedy and sampled rows: the chooser learns each kind's acceptance from its own rows, and
    the greedy rows still get the target's own greedy tokens."""
    engine = Engine(NativeTarget.from_target(target), draft, AUTO, max_batch=4)
    engine.chooser.set_costs(costs({4: (1.0, 1.1, 1.2, 1.3, 1.4)}))  # drafting always pays: trees run
    params = [SamplingParams(max_new_tokens=16, ignore_eos=True, temperature=t, seed=i)
              for i, t in enumerate((0.0, 1.0, 0.0, 1.0))]
    outs = engine.generate(PROMPTS, params)
    assert [outs[i].output_ids for i in (0, 2)] == [references[i][:16] for i in (0, 2)]
    assert any(engine.chooser.seen[GREEDY].values()) and any(engine.chooser.seen[kind_of(params[1])].values())


def test_no_cost_for_a_setting_is_refused():
    with pytest.raises(ValueError, match="no step cost"):
        Chooser(AUTO.options, {NONE: {1: 1.0}})


NEW = 40
PROMPTS = [[72, 101, 108, 108, 111], [7] * 23, [200, 13], list(range(30, 71))]


@pytest.fixture(scope="module")
def references(target):
    return [reference_greedy(target.model, p, NEW) for p in PROMPTS]


@pytest.mark.parametrize("path", ["generic", "native"])
def test_greedy_output_equals_plain_decoding_while_the_setting_changes(target, draft, references, path):
    """Costs that make no speculation best at 3+ rows and a tree best at 1: the setting changes as rows
    finish, and with the acceptance the rows produce; every token equals the target's own greedy one."""
    t = target if path == "generic" else NativeTarget.from_target(target)
    engine = Engine(t, draft, AUTO, max_batch=4)
    engine.chooser.set_costs(costs({1: (1.0, 1.2, 1.3, 1.6, 2.2), 2: (1.0, 1.8, 2.0, 2.4, 3.0),
                                    4: (1.0, 4.0, 5.0, 8.0, 12.0)}))
    lengths = [NEW, 12, 25, 6]
    outs = engine.generate(PROMPTS, [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lengths])
    assert [o.output_ids for o in outs] == [r[:n] for r, n in zip(references, lengths)]
    ran = {s for s, n in engine.chooser.steps.items() if n}
    assert NONE in ran and len(ran) >= 2, engine.chooser.steps
    assert outs[0].stats.drafts > 0  # the fed draft drafted once the batch shrank


def test_step_costs_are_measured_for_every_setting_and_bucket(target, draft):
    engine = Engine(NativeTarget.from_target(target), draft, AUTO, max_batch=2, cuda_graphs=False)
    assert engine.launches_ahead  # so the steps are timed launched ahead, as the overlap schedule runs them
    measured = measure_step_costs(engine, [1, 2], repeats=1)
    assert set(measured) == set(AUTO.options)
    assert all(set(t) == {1, 2} and all(v > 0 for v in t.values()) for t in measured.values())
    assert engine.chooser.steps == dict.fromkeys(AUTO.options, 0)  # measuring is not serving
    assert engine.chooser.tau(TREE32) == pytest.approx(1 + sum(prior_reach(TREE32)))  # nor learning
    sampled = measure_step_costs(engine, [1], repeats=1, params=SamplingParams(temperature=0.7, top_p=0.95))
    assert set(sampled) == set(AUTO.options) and all(t[1] > 0 for t in sampled.values())
    out = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=8, ignore_eos=True))[0]
    assert out.output_ids == reference_greedy(target.model, PROMPTS[0], 8)  # the caches were emptied after


def test_without_graphs_auto_still_times_its_settings_at_warm_up(target, draft):
    """``--disable-cuda-graph`` with ``auto``: nothing to capture, but the chooser still gets measured costs
    (with only its model's, live steps never corrected them)."""
    engine = Engine(NativeTarget.from_target(target), draft, AUTO, max_batch=2, cuda_graphs=False)
    assert not engine.chooser.measured
    assert engine.warm_up(on_cpu=True) == "CUDA graphs: none to capture (disabled)"
    assert engine.chooser.measured


def test_the_engine_teaches_the_chooser_each_steps_cost(target, draft, references):
    """Measured costs (seconds) move with the steps the engine runs; the plain steps between drafting ones leave
    no draft logits, and the next drafting step computes them: outputs stay the target's greedy ones."""
    engine = Engine(NativeTarget.from_target(target), draft, AUTO, max_batch=2)
    table = costs({1: (1.0, 1.2, 1.3, 1.6, 2.2), 2: (1.0, 4.0, 5.0, 8.0, 12.0)})
    engine.chooser.set_costs(table, measured=True)
    lengths = [NEW, 12]
    outs = engine.generate(PROMPTS[:2], [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lengths])
    assert [o.output_ids for o in outs] == [r[:n] for r, n in zip(references, lengths)]
    assert outs[0].stats.drafts > 0  # drafted after plain steps, from logits computed anew
    moved = [(s, b) for s in AUTO.options for b in (1, 2) if engine.chooser.costs[GREEDY][s][b] != table[s][b]]
    assert (NONE, 2) in moved and all(engine.chooser.steps[s] for s, _ in moved), moved
    assert engine.chooser.cost(NONE, 2) < 1.0  # a CPU step of this tiny model takes milliseconds, not a second


def test_algorithm_is_kept_for_the_candidates():
    assert all(s.algorithm is Algorithm.EAGLE for s in SpecConfig.auto("EAGLE").options[1:])


def test_only_steady_steps_teach_the_chooser_their_time(target, draft):
    """Steps launched ahead overlap: the time between two read-backs holds the host's work on the step before and
    its launch of the next. A step's seconds reach the chooser only where the step collected before it and the
    one launched after it ran its own setting; the acceptance of every step does."""
    engine = Engine(NativeTarget.from_target(target), draft, AUTO, max_batch=1)
    seen = []
    observe = engine.chooser.observe
    engine.chooser.observe = lambda spec, accepted, seconds=None, *a, **k: (
        seen.append((spec, seconds is not None)), observe(spec, accepted, seconds, *a, **k))
    batch = engine.prefill_all([engine.new_sequence(PROMPTS[0], SamplingParams(max_new_tokens=64, ignore_eos=True))])
    for s in (NONE, TREE32, TREE32, NONE, NONE):  # one at a time: each read back before the next launches
        engine.step(batch, s)
    step = engine.launch(batch, NONE)  # NONE after NONE, but TREE32 launched ahead of its read-back
    ahead = engine.launch(batch, TREE32, ahead=True)
    engine.collect(step)
    engine.collect(ahead)
    assert seen == [(NONE, False), (TREE32, False), (TREE32, True), (NONE, False), (NONE, True), (NONE, False),
                    (TREE32, False)]
