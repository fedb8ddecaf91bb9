"""/metrics parses with prometheus_client's parser, names are documented, derivations are exact, every
series carries model_name and engine, and the KV usage gauge follows the running requests."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import scrape

NAMES = [
    "eyas:spec_decode_num_drafts_total", "eyas:spec_decode_num_draft_tokens_total",
    "eyas:spec_decode_num_accepted_tokens_total", 'eyas:spec_decode_num_accepted_tokens_per_pos_total{position="0"}',
    "eyas:spec_accept_length", "eyas:spec_accept_rate", "eyas:spec_accept_length_per_step_count",
    "eyas:prompt_tokens_total", "eyas:generation_tokens_total", 'eyas:requests_total{outcome="stop"}',
    'eyas:requests_total{outcome="rejected"}', "eyas:time_to_first_token_seconds_count",
    "eyas:time_per_output_token_seconds_count", "eyas:e2e_request_latency_seconds_count",
    "eyas:num_requests_running", "eyas:num_requests_waiting", "eyas:kv_cache_usage_perc",
]


@pytest.fixture(scope="module")
def metrics(server):
    for i in range(3):  # some traffic, so the derivations have something to derive from
        r = httpx.post(server.url + "/v1/completions", timeout=60,
                       json={"prompt": f"metrics {i}", "max_tokens": 20, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200
    return scrape(server.url)


def test_documented_names_are_exposed(metrics):
    missing = [n for n in NAMES if n not in metrics]
    assert not missing


def test_derivations_are_exact(metrics):
    drafts = metrics["eyas:spec_decode_num_drafts_total"]
    proposed = metrics["eyas:spec_decode_num_draft_tokens_total"]
    accepted = metrics["eyas:spec_decode_num_accepted_tokens_total"]
    assert drafts > 0 and proposed == 5 * drafts
    # the server runs with --metrics-window larger than the whole test session
    assert metrics["eyas:spec_accept_length"] == 1 + accepted / drafts
    assert metrics["eyas:spec_accept_rate"] == accepted / proposed
    assert metrics["eyas:spec_accept_length_per_step_count"] == drafts
    assert metrics["eyas:spec_accept_length_per_step_sum"] == drafts + accepted
    per_pos = [metrics[f'eyas:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}'] for i in range(3)]
    assert sum(per_pos) == accepted
    assert per_pos == sorted(per_pos, reverse=True)  # reaching depth 2 implies reaching depth 1


def test_info_metric_carries_the_configuration(metrics):
    info = [k for k in metrics if k.startswith("eyas:spec_info")]
    assert len(info) == 1
    for part in ('algorithm="EAGLE3"', 'aux_layer_ids="2,4,5"', 'num_steps="3"', 'eagle_topk="2"',
                 'num_draft_tokens="6"', 'draft_vocab_size="320"', 'context_length="1024"'):
        assert part in info[0]


def test_grep_accept_finds_the_acceptance_lines(server):
    text = httpx.get(server.url + "/metrics").text
    lines = [ln for ln in text.splitlines() if "accept" in ln and not ln.startswith("#")]
    assert any(ln.startswith('eyas:spec_accept_length{engine="0",model_name="tiny"} ') for ln in lines)
    assert any(ln.startswith('eyas:spec_accept_rate{engine="0",model_name="tiny"} ') for ln in lines)


def test_every_series_carries_the_served_model_name_and_engine(metrics, server):
    families = list(text_string_to_metric_families(httpx.get(server.url + "/metrics").text))
    samples = [s for f in families for s in f.samples]
    assert len(samples) > 50 and all(s.name.startswith("eyas:") for s in samples)
    unlabelled = [s for s in samples if s.labels.get("model_name") != "tiny" or s.labels.get("engine") != "0"]
    assert not unlabelled  # the server runs with --served-model-name tiny


def test_kv_usage_counts_the_running_rows_and_falls_to_zero(inprocess, engine):
    capacity = engine.config.max_batch * engine.max_context
    with inprocess(step_delay=0.05) as srv:
        body = {"prompt": "kv usage " * 4, "max_tokens": 60, "temperature": 0, "ignore_eos": True}
        answer = {}
        request = threading.Thread(target=lambda: answer.update(
            httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()))
        request.start()
        held = []  # tokens in the cache, as the gauge says, while the request runs
        while request.is_alive() and len(held) < 3:
            m = scrape(srv.url)
            if m["eyas:num_requests_running"] == 1 and m["eyas:kv_cache_usage_perc"] > 0:
                held.append(m["eyas:kv_cache_usage_perc"] * capacity)
            time.sleep(0.1)
        request.join()
        prompt = answer["usage"]["prompt_tokens"]
        assert held, "never saw the request running"
        # the prompt and the output so far, less the root not yet in the cache: whole tokens, growing
        assert all(prompt <= h <= prompt + 60 and abs(h - round(h)) < 1e-6 for h in held), (prompt, held)
        assert held == sorted(held)
        end = time.time() + 10
        while scrape(srv.url)["eyas:kv_cache_usage_perc"] != 0 and time.time() < end:
            time.sleep(0.05)  # the engine's turn after the last step retires the row
        assert scrape(srv.url)["eyas:kv_cache_usage_perc"] == 0


ACTIVITIES = ("idle", "prefill", "step", "host")


def test_the_engine_thread_accounts_for_its_time(server):
    """``engine_thread_seconds_total``: a quiet second shows as idle by the next scrape (a wait under way counts),
    a request's prompt as prefill and its steps as step; together never more than the wall time."""
    def thread():
        m = scrape(server.url)
        return {a: m[f'eyas:engine_thread_seconds_total{{activity="{a}"}}'] for a in ACTIVITIES}

    httpx.post(server.url + "/v1/completions", json={"prompt": "warm", "max_tokens": 2}, timeout=60)
    start, before = time.perf_counter(), thread()
    time.sleep(1.0)
    quiet, wall = thread(), time.perf_counter() - start
    assert 0.9 <= quiet["idle"] - before["idle"] <= wall
    r = httpx.post(server.url + "/v1/completions", timeout=60,
                   json={"prompt": "time", "max_tokens": 12, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200
    after, wall = thread(), time.perf_counter() - start
    delta = {a: after[a] - before[a] for a in after}
    assert delta["prefill"] > 0 and delta["step"] > 0 and delta["host"] >= 0
    assert all(after[a] >= quiet[a] for a in after) and sum(delta.values()) <= wall
