"""--speculative-batch-schedule auto served: eyas serve's default with a draft, the choice in /metrics (through
prometheus_client's parser), and greedy answers equal to plain decoding while the setting changes."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
from serve_helpers import InProcessServer, scrape

from eyas.cli import build_parser
from eyas.config import AUTO, setting_name
from eyas.pipeline import EngineArgs, build_engine
from eyas.serve.cli import pasted_flags, served_choice


def served(*argv: str, target: str = "m") -> EngineArgs:
    args = build_parser().parse_args(["serve", "--model-path", target, *argv])
    pasted_flags(args)
    return served_choice(args)[0]


def test_auto_is_the_default_unless_a_tree_or_a_schedule_is_named():
    no_flags = served("--device", "cuda", target="smollm2-135m-instruct")  # the device's default (test_defaults.py)
    assert no_flags.speculative_batch_schedule == AUTO
    assert served("--device", "cuda").speculative_algorithm == "NONE"  # no draft ships for "m": plain decoding
    assert served("--speculative-draft-model-path", "d").speculative_batch_schedule == AUTO
    assert served("--speculative-num-steps", "3").speculative_batch_schedule is None
    assert served("--speculative-config", '{"method": "eagle3", "model": "d", "num_speculative_tokens": 3}'
                  ).speculative_batch_schedule is None
    assert served("--speculative-batch-schedule", "1:3,1,4;8:0").speculative_batch_schedule == "1:3,1,4;8:0"


def test_auto_without_speculation_is_plain_decoding(models):
    tiny, _ = models
    engine = build_engine(EngineArgs(model_path=str(tiny), speculative_algorithm="NONE", dtype="float64",
                                     speculative_batch_schedule=AUTO))
    assert not engine.spec.speculative and engine.chooser is None


@pytest.fixture(scope="module")
def auto_engine(models):
    tiny, draft = models
    engine = build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(draft), dtype="float64",
                                     speculative_batch_schedule="Auto", max_batch=8))
    assert engine.spec.adaptive and engine.chooser is not None
    from eyas.serve.banner import banner_lines, info_labels

    labels = info_labels(engine)  # no one tree is the server's: the tree labels are empty (not 3,1,4, the first)
    assert labels["batch_schedule"] == "auto" and labels["num_steps"] == labels["num_draft_tokens"] == ""
    assert any(line.startswith("tree per step: auto, the setting with the most expected tok/s for the batch among "
                               "0 3,1,4 5,1,6 4,4,16 6,8,32") for line in banner_lines(engine, 8, 8))
    # no speculation pays from 3 rows up, a chain at 2, the big tree at 1 (the step costs a GPU would measure)
    table = {1: (1.0, 1.2, 1.3, 1.6, 2.2), 2: (1.0, 1.8, 2.0, 2.4, 3.0), 4: (1.0, 4.0, 5.0, 8.0, 12.0),
             8: (1.0, 8.0, 10.0, 16.0, 24.0)}
    engine.chooser.set_costs({s: {b: row[i] for b, row in table.items()} for i, s in enumerate(engine.spec.options)})
    return engine


def test_greedy_answers_equal_plain_decoding_and_metrics_show_the_choice(auto_engine, reference):
    from eyas.serve.app import ServeOptions, create_app

    prompts = [[5 + i, 17, 42 + 3 * i] for i in range(6)]
    lengths = [40, 8, 16, 24, 12, 32]
    with InProcessServer(create_app(auto_engine, ServeOptions(served_model_name="tiny", log_interval=0))) as srv:
        def ask(i: int) -> list[int]:
            r = httpx.post(srv.url + "/generate", timeout=120, json={
                "input_ids": prompts[i], "sampling_params": {"max_new_tokens": lengths[i], "temperature": 0,
                                                             "ignore_eos": True}})
            assert r.status_code == 200, r.text
            return r.json()["output_ids"]

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            got = list(pool.map(ask, range(6)))
        m = scrape(srv.url)
    assert got == reference(prompts, lengths, ignore_eos=True)
    names = [setting_name(s) for s in auto_engine.spec.options]
    assert names == ["0", "3,1,4", "5,1,6", "4,4,16", "6,8,32"]
    active = {n: m[f'eyas:spec_active_setting{{setting="{n}"}}'] for n in names}
    assert sorted(active.values()) == [0, 0, 0, 0, 1]
    steps = {n: m[f'eyas:spec_setting_steps_total{{setting="{n}"}}'] for n in names}
    assert sum(steps.values()) == m["eyas:engine_steps_total"]  # every step ran exactly one setting
    assert steps["0"] > 0 and sum(v for n, v in steps.items() if n != "0") > 0, steps  # it switched
    for kind in ("greedy", "t<=0.4", "t<=0.8", "t<=1", "t>1"):  # greedy rows, sampled ones per band of temperature
        assert m[f'eyas:spec_expected_accept_length{{rows="{kind}",setting="0"}}'] == 1.0
        assert all(1 <= m[f'eyas:spec_expected_accept_length{{rows="{kind}",setting="{n}"}}'] for n in names)
    assert m["eyas:spec_decode_num_drafts_total"] > 0  # the speculative steps recorded their acceptance



def test_a_seeded_requests_choices_are_its_n_1_texts_whatever_tree_each_step_took(auto_engine):
    """Choice i of n is the text the same request gives with n 1 and seed + i: alone, at batch 1, ``auto`` runs
    the big tree; beside its other choices (and other clients) the batch runs a chain or no speculation."""
    from eyas.serve.app import ServeOptions, create_app

    with InProcessServer(create_app(auto_engine, ServeOptions(served_model_name="tiny", log_interval=0))) as srv:
        def ask(n: int, seed: int) -> list[list[int]]:
            r = httpx.post(srv.url + "/generate", timeout=120, json={
                "input_ids": [9, 31, 4], "sampling_params": {"max_new_tokens": 24, "temperature": 1.0, "top_p": 0.9,
                                                            "seed": seed, "n": n, "ignore_eos": True}})
            assert r.status_code == 200, r.text
            body = r.json()
            return [c["output_ids"] for c in (body if isinstance(body, list) else [body])]

        before = dict(auto_engine.chooser.steps)
        alone = [ask(1, 500 + i)[0] for i in range(3)]
        together = ask(3, 500)
        ran = {setting_name(s) for s, n in auto_engine.chooser.steps.items() if n > before.get(s, 0)}
    assert together == alone
    assert len(set(map(tuple, alone))) == 3  # the seeds decide
    assert "0" in ran and len(ran) >= 2, ran  # the trees differed between the two ways of asking


def test_an_auto_server_lists_every_setting_it_may_run(auto_engine):
    """/server_info names the smallest tree (num_draft_tokens) and every setting, so that ``eyas doctor --url``
    bounds tau by the largest tree, not the first."""
    from eyas.common.server_metrics import EYAS
    from eyas.doctor.server_config import num_draft_tokens
    from eyas.serve.banner import describe

    info = describe(auto_engine)
    assert info["num_draft_tokens"] == 4 and info["settings"] == ["0", "3,1,4", "5,1,6", "4,4,16", "6,8,32"]
    assert num_draft_tokens(EYAS, info) == 32

def test_the_step_costs_the_chooser_weighs_are_exported_where_timed():
    """``eyas:spec_step_cost_seconds`` per setting, kind of batch and rows bucket, through the Prometheus text
    format and its parser; absent where the costs are the CPU's relative units."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from eyas.config import SpecConfig, setting_name
    from eyas.engine.adaptive import Chooser, model_costs
    from eyas.serve.metrics import ChooserCollector

    options = SpecConfig.auto("EAGLE3").options
    chooser = Chooser(options, model_costs(options, [1, 8]))

    def samples():
        registry = CollectorRegistry()
        registry.register(ChooserCollector(chooser))
        text = generate_latest(registry).decode()
        return {(s.labels["setting"], s.labels["rows"], s.labels["bucket"]): s.value
                for f in text_string_to_metric_families(text) if f.name == "eyas:spec_step_cost_seconds"
                for s in f.samples}

    assert samples() == {}
    greedy = {s: {1: 0.001 * (i + 1), 8: 0.002 * (i + 1)} for i, s in enumerate(options)}
    sampled = {s: {1: 0.003 * (i + 1), 8: 0.004 * (i + 1)} for i, s in enumerate(options)}
    chooser.set_costs(greedy, measured=True, sampled=sampled)
    got = samples()
    assert len(got) == len(options) * 2 * 2
    assert got[("6,8,32", "greedy", "8")] == pytest.approx(0.010) and got[("0", "sampled", "1")] == pytest.approx(0.003)
    tree = next(s for s in options if s.speculative)
    for seconds in (0.02, 0.04):  # live steps of 8 rows, some sampled: the raw tally beside the estimate
        chooser.observe(tree, [1] * 8, seconds=seconds, rows=8, kinds=["t<=1"] * 8)
    registry = CollectorRegistry()
    registry.register(ChooserCollector(chooser))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    name = setting_name(tree)
    [count] = [s.value for s in families["eyas:spec_step_observations"].samples if s.name.endswith("_total")]
    [total] = [s.value for s in families["eyas:spec_step_observed_seconds"].samples if s.name.endswith("_total")]
    [labels] = [s.labels for s in families["eyas:spec_step_observations"].samples if s.name.endswith("_total")]
    assert (count, total) == (2.0, pytest.approx(0.06))
    assert labels == {"setting": name, "rows": "sampled", "bucket": "8"}
