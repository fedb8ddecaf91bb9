"""ServeMetrics on its own: the window behind the gauges, per-position counts, histogram."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from eyas.serve.metrics import ServeMetrics


def samples(m: ServeMetrics) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            out[s.name + "".join(f"[{v}]" for _, v in sorted(s.labels.items()))] = s.value
    return out


def test_gauges_cover_the_last_window_steps_and_counters_everything():
    m = ServeMetrics(num_steps=3, num_draft_tokens=4, window=2)
    m.record_step([(1, 3, 3), (1, 3, 0)])  # step 1: two rows
    m.record_step([(1, 3, 1)])  # step 2
    m.record_step([(1, 3, 2), (0, 0, 0)])  # step 3 (second row finished: no draft)
    s = samples(m)
    assert s["eyas:spec_decode_num_drafts_total"] == 4
    assert s["eyas:spec_decode_num_accepted_tokens_total"] == 6
    assert s["eyas:spec_accept_length"] == 1 + (1 + 2) / 2  # steps 2 and 3 only
    assert s["eyas:spec_accept_rate"] == (1 + 2) / 6
    assert [s[f"eyas:spec_decode_num_accepted_tokens_per_pos_total[{i}]"] for i in range(3)] == [3, 2, 1]
    assert s["eyas:spec_accept_length_per_step_count"] == 4
    assert s["eyas:spec_accept_length_per_step_sum"] == 4 + 6
    assert s["eyas:spec_accept_length_per_step_bucket[1.0]"] == 1  # the row that accepted nothing


def test_time_per_output_token_needs_two_tokens():
    m = ServeMetrics(num_steps=1, num_draft_tokens=2)
    m.finished("length", ttft=0.5, e2e=1.5, completion_tokens=5)
    m.finished("stop", ttft=0.1, e2e=0.1, completion_tokens=1)
    m.finished("abort", ttft=None, e2e=2.0, completion_tokens=0)
    s = samples(m)
    assert s["eyas:time_per_output_token_seconds_count"] == 1
    assert s["eyas:time_per_output_token_seconds_sum"] == 0.25
    assert s["eyas:time_to_first_token_seconds_count"] == 2
    assert s["eyas:requests_total[abort]"] == 1 and s["eyas:requests_total[length]"] == 1
