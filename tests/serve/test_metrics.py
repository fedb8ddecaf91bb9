"""/metrics parses with prometheus_client's parser, names are documented, derivations are exact."""

from __future__ import annotations

import httpx
import pytest
from serve_helpers import scrape

NAMES = [
    "eyas:spec_decode_num_drafts_total", "eyas:spec_decode_num_draft_tokens_total",
    "eyas:spec_decode_num_accepted_tokens_total", 'eyas:spec_decode_num_accepted_tokens_per_pos_total{position="0"}',
    "eyas:spec_accept_length", "eyas:spec_accept_rate", "eyas:spec_accept_length_per_step_count",
    "eyas:prompt_tokens_total", "eyas:generation_tokens_total", 'eyas:requests_total{outcome="stop"}',
    'eyas:requests_total{outcome="rejected"}', "eyas:time_to_first_token_seconds_count",
    "eyas:time_per_output_token_seconds_count", "eyas:e2e_request_latency_seconds_count",
    "eyas:num_requests_running", "eyas:num_requests_waiting",
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
    assert any(ln.startswith("eyas:spec_accept_length ") for ln in lines)
    assert any(ln.startswith("eyas:spec_accept_rate ") for ln in lines)
