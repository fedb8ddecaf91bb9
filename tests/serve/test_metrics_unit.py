"""ServeMetrics on its own: the window behind the gauges, per-position counts, histogram, labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from eyas.serve.metrics import ServeMetrics


def samples(m: ServeMetrics) -> dict[str, float]:
    """{name[label value]...: value}, without the labels every series carries (checked below)."""
    out = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            out[s.name + "".join(f"[{v}]" for k, v in sorted(s.labels.items()) if k not in m.labels)] = s.value
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


def test_every_sample_carries_model_name_and_engine():
    m = ServeMetrics(num_steps=2, num_draft_tokens=3, model_name="org/model-7b")
    m.set_info({"algorithm": "EAGLE3"})
    m.record_step([(1, 2, 1)])
    m.finished("stop", ttft=0.1, e2e=0.5, completion_tokens=3)
    m.kv_usage.set(0.25)
    families = list(text_string_to_metric_families(m.exposition().decode()))
    assert {"counter", "gauge", "histogram"} <= {f.type for f in families}
    for fam in families:
        for s in fam.samples:
            assert s.labels["model_name"] == "org/model-7b" and s.labels["engine"] == "0", s
    s = {x.name: x for f in families for x in f.samples}
    assert s["eyas:spec_info"].labels["algorithm"] == "EAGLE3"  # the info's own labels stay
    assert s["eyas:kv_cache_usage_perc"].value == 0.25
    buckets = [x for f in families for x in f.samples if x.name == "eyas:time_to_first_token_seconds_bucket"]
    assert buckets and all("le" in b.labels for b in buckets)  # a histogram's le survives beside them


def test_a_second_server_in_the_same_process_has_its_own_labels():
    a, b = ServeMetrics(1, 2, model_name="a"), ServeMetrics(1, 2, model_name="b", speculative=False)
    a.generation_tokens.inc(5)

    def generated(m):
        fams = text_string_to_metric_families(m.exposition().decode())
        return [(s.labels, s.value) for f in fams for s in f.samples if s.name == "eyas:generation_tokens_total"]

    assert generated(a) == [({"model_name": "a", "engine": "0"}, 5.0)]
    assert generated(b) == [({"model_name": "b", "engine": "0"}, 0.0)]
    assert b"spec_accept_length" not in b.exposition()  # NONE: no acceptance series, labelled or not


def test_what_was_built_after_warm_up_is_exported_by_kind(monkeypatch):
    """``eyas:engine_first_use_total`` / ``_seconds_total`` read the process's first-use watch when scraped."""
    from eyas.models.first_use import FirstUse
    from eyas.serve import metrics

    watch = FirstUse()
    monkeypatch.setattr(metrics, "FIRST_USE", watch)
    m = ServeMetrics(num_steps=3, num_draft_tokens=4)
    s = samples(m)
    assert s["eyas:engine_first_use_total[kernel]"] == 0 and s["eyas:engine_first_use_seconds_total[graph]"] == 0
    watch.armed = True
    watch.record("kernel", "_distribution_kernel", 1.5)
    watch.record("kernel", "_walk_kernel", 0.5)
    s = samples(m)
    assert s["eyas:engine_first_use_total[kernel]"] == 2 and s["eyas:engine_first_use_seconds_total[kernel]"] == 2.0
    assert s["eyas:engine_first_use_total[graph]"] == 0


def test_the_accept_length_histogram_reads_as_prometheus_clients_own():
    """The per-step histogram kept as counts per accepted value exposes, through the text format and its parser,
    exactly what ``prometheus_client.Histogram`` with the same buckets would, past the top bucket too; and the
    per-position counters count the rows that reached each depth."""
    import random

    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    rng = random.Random(0)
    m = ServeMetrics(num_steps=6, num_draft_tokens=4)
    registry = CollectorRegistry()
    reference = Histogram("eyas:spec_accept_length_per_step", "x", buckets=[1.0, 2.0, 3.0, 4.0], registry=registry)
    reached = [0] * 6
    for _ in range(50):
        rows = [(rng.choice([0, 1]), 3, rng.randint(0, 6)) for _ in range(rng.randint(1, 9))]
        m.record_step(rows)
        for drafts, _, accepted in rows:
            if drafts:
                reference.observe(1 + accepted)
                for i in range(accepted):
                    reached[i] += 1
    ours = {k: v for k, v in samples(m).items() if k.startswith("eyas:spec_accept_length_per_step")}
    theirs = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            if not s.name.endswith("_created"):
                theirs[s.name + "".join(f"[{v}]" for v in s.labels.values())] = s.value
    assert ours == theirs and ours["eyas:spec_accept_length_per_step_bucket[+Inf]"] > ours[
        "eyas:spec_accept_length_per_step_bucket[4.0]"]  # some steps accepted more than the top bucket holds
    assert [samples(m)[f"eyas:spec_decode_num_accepted_tokens_per_pos_total[{i}]"] for i in range(6)] == reached
