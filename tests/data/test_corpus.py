"""A prompt corpus as a source (a folder of gzipped {"prompt", "source", "category"} JSONL, one file
per source, as ../shared/data/chat-prompts): exclusion, deduplication, the chat holdout, the mix
and the per-source summary, each deterministic."""

import gzip
import json
from collections import Counter

import pytest
from helpers import save_tiny_model

from eyas.cli import main
from eyas.data import mix
from eyas.data.exclude import bench_sets
from eyas.data.files import read_inputs
from eyas.data.holdout import stratum
from eyas.data.ledger import Ledger
from eyas.data.prepare import PrepareConfig, select
from eyas.data.split import fold

BENCH_PROMPT = bench_sets()["chat"][0]


def _gz(path, rows):
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "chat-prompts"
    d.mkdir()
    chat = [{"prompt": f"Tell me about topic {i}.", "category": "chat"} for i in range(40)]
    chat[5]["prompt"] = "  " + BENCH_PROMPT.upper() + " "  # a benchmark prompt, other case and spacing
    chat[6]["prompt"] = "Please keep this one out."  # named by the user's --exclude file
    _gz(d / "chat.jsonl.gz", chat)
    _gz(d / "roleplay.jsonl.gz", [{"prompt": f"Act as character {i}.", "category": f"roleplay/{'ab'[i % 2]}"}
                                  for i in range(20)])
    math = [{"prompt": f"Compute {i} + {i}.", "category": "math/gsm8k"} for i in range(60)]
    math[0]["prompt"] = "tell me   ABOUT topic 7."  # a repeat of a chat prompt: the chat file keeps it
    _gz(d / "math.jsonl.gz", math)
    (d / "SOURCES.md").write_text("not data")
    (d / "stats.json").write_text('{"chat": {"kept": 40}}')
    (tmp_path / "mine.jsonl").write_text(json.dumps({"prompt": "please keep THIS one out."}) + "\n")
    return d


def _select(corpus, **kw):
    cfg = PrepareConfig(inputs=[str(corpus)], exclude=["bench", str(corpus.parent / "mine.jsonl")], held_out=0.1, **kw)
    ledger = Ledger()
    train, held, chat_eval = select(list(read_inputs(cfg.inputs)), cfg, ledger, log=lambda *a: None)
    return train, held, chat_eval, ledger.as_dict()


def _prompts(records):
    return [r["messages"][0]["content"] for r in records]


def test_corpus_mix_holdout_and_summary(corpus):
    train, held, chat_eval, counts = _select(corpus, holdout_prompts=8, holdout_sources=["chat", "roleplay"],
                                             source_weights="math=0.25,roleplay:6")
    assert counts["chat"] == {"read": 40, "excluded": 2, "duplicate": 0, "holdout": 4, "mixed out": 0, "kept": 34}
    assert counts["math"] == {"read": 60, "excluded": 0, "duplicate": 1, "holdout": 0, "mixed out": 45, "kept": 14}
    assert counts["roleplay"]["holdout"] == 4 and counts["roleplay"]["kept"] == 6
    # the holdout is spread evenly over (source, category) strata and reaches no split
    assert Counter(map(stratum, chat_eval)) == {"chat/chat": 4, "roleplay/roleplay": 4}
    data = {fold(p) for p in _prompts(train + held)}
    assert not data & {fold(p) for p in _prompts(chat_eval)}
    assert fold(BENCH_PROMPT) not in data and "please keep this one out." not in data
    assert len(train) + len(held) == 34 + 14 + 6 and held


def test_holdout_is_spread_over_categories_and_stays_put(corpus):
    _, _, a, _ = _select(corpus, holdout_prompts=9)
    assert Counter(map(stratum, a)) == {"chat/chat": 3, "roleplay/roleplay": 3, "math/math": 3}
    # another mix and another regeneration seed leave the holdout where it was; its own seed moves it
    _, _, b, _ = _select(corpus, holdout_prompts=9, source_weights="math=0.1", mix_seed=5)
    _, _, c, _ = _select(corpus, holdout_prompts=9, holdout_seed=1)
    assert _prompts(a) == _prompts(b) and _prompts(a) != _prompts(c)


def test_the_mix_is_deterministic_under_its_seed(corpus):
    one = _prompts(_select(corpus, source_weights="math=0.25")[0])
    assert one == _prompts(_select(corpus, source_weights="math=0.25")[0])
    assert one != _prompts(_select(corpus, source_weights="math=0.25", mix_seed=1)[0])


def test_quotas_share_a_total_by_weight():
    sizes = {"a": 100, "b": 100, "c": 10}
    assert mix.quotas(sizes, mix.parse("a=3"), None) == {"a": 100, "b": 33, "c": 3}
    q = mix.quotas(sizes, mix.parse("a=3"), 60)
    assert 57 <= sum(q.values()) <= 60 and q["a"] == pytest.approx(3 * q["b"], abs=3)
    q = mix.quotas(sizes, mix.parse("a=3"), 150)  # a is whole at 100; b and c fill the rest evenly
    assert q["a"] == 100 and 147 <= sum(q.values()) <= 150 and q["b"] == pytest.approx(10 * q["c"], abs=10)
    assert mix.quotas(sizes, mix.parse("b:20,c=0"), None) == {"a": 100, "b": 20, "c": 0}
    assert mix.quotas(sizes, {}, 1000) == sizes


def test_weight_specs_parse_from_flags_and_recipes():
    want = {"a": {"weight": 3.0}, "b": {"cap": 20, "weight": 0.5}, "c": {"weight": 0.0}}
    assert mix.parse(["a=3, b:20", "b=0.5,c=0"]) == want
    assert mix.parse({"a": 3, "b": {"cap": 20, "weight": 0.5}, "c": 0}) == want
    for bad in ("a", "a=x", "b:-1", "b:1.5", "=2"):
        with pytest.raises(mix.EyasError, match="--source-weights"):
            mix.parse(bad)


def test_unknown_source_names_are_refused_with_the_known_ones(corpus):
    with pytest.raises(mix.EyasError,
                       match="(?s)--source-weights names mth.*the sources here are: chat, math, roleplay"):
        _select(corpus, source_weights="mth=0.2")
    with pytest.raises(mix.EyasError, match="--holdout-sources names chatt"):
        _select(corpus, holdout_prompts=3, holdout_sources=["chatt"])


def test_prepare_cli_reads_the_corpus_and_regenerates_it(corpus, tmp_path, capsys):
    """`eyas prepare --input FOLDER` end to end on the tiny target: greedy answers to corpus prompts,
    the holdout file in a form eyas eval and bench read, the summary printed and in meta.json."""
    model = save_tiny_model(tmp_path / "tiny")
    out, chosen = tmp_path / "out", tmp_path / "chosen"
    flags = ["--input", str(corpus), "--source-weights", "math=0.1", "--holdout-prompts", "4",
             "--holdout-sources", "chat,roleplay", "--exclude", "bench", "--held-out", "0"]
    assert main(["prepare", "--out", str(chosen), "--select-only", *flags]) == 0  # no model: the default is not loaded
    selected = capsys.readouterr().out
    rc = main(["prepare", "--model", str(model), "--out", str(out), "--device", "cpu", *flags,
               "--regenerate", "--temperature", "0", "--max-new-tokens", "3"])
    assert rc == 0
    # the model-free selection chose what the full run chose, holdout file byte for byte
    assert (chosen / "holdout-prompts.jsonl").read_bytes() == (out / "holdout-prompts.jsonl").read_bytes()
    def users(f):
        return sorted(json.loads(line)["messages"][0]["content"] for line in f.open())

    assert users(chosen / "train.jsonl") == users(out / "train.jsonl")
    assert "prompts per source:" in selected and json.loads((chosen / "selection.json").read_text())["per_source"]
    held = [json.loads(line) for line in (out / "holdout-prompts.jsonl").open()]
    assert len(held) == 4 and {h["source"] for h in held} == {"chat", "roleplay"} and all(h["category"] for h in held)
    rows = [json.loads(line) for line in (out / "train.jsonl").open()]
    assert {r["source"] for r in rows} == {"chat", "math", "roleplay"} and all(r["regenerated"] for r in rows)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["per_source"]["math"]["kept"] == 5 and meta["holdout"]["prompts"] == 4
    assert meta["mix"]["source_weights"] == {"math": {"weight": 0.1}}
    printed = capsys.readouterr().out
    table = printed[printed.index("prompts per source:"):]
    assert all(name in table for name in ("chat", "math", "roleplay", "duplicate", "holdout", "mixed out"))


def test_a_source_weighted_twice_is_refused():
    """--source-weights a=1 --source-weights a=2 kept the last value without a word."""
    with pytest.raises(mix.EyasError, match="gives gsm8k-train two weights: gsm8k-train=1 and gsm8k-train=2"):
        mix.parse(["gsm8k-train=1", "gsm8k-train=2"])
    assert mix.parse("a=2,a:10,a=2") == {"a": {"weight": 2.0, "cap": 10}}  # the same value twice, and a cap: fine


def test_a_holdout_larger_than_the_prompts_alone_says_so(corpus):
    """Conversations with answers are never held out: asking for more than the bare prompts hold sets aside what
    there is, and says so (once it set aside none of a ShareGPT file without a word)."""
    cfg = PrepareConfig(inputs=[str(corpus)], held_out=0.1, holdout_prompts=500, holdout_sources=["roleplay"])
    logs = []
    _, _, chat_eval = select(list(read_inputs(cfg.inputs)), cfg, Ledger(), log=logs.append)
    assert len(chat_eval) == 20
    assert any("--holdout-prompts 500: only 20 records of source roleplay are a prompt alone" in m for m in logs)


def test_lone_surrogates_are_mended_and_eval_reads_gzip(tmp_path):
    """Scraped chat dumps hold lone UTF-16 surrogates (a JSON \\ud800 escape without its pair): no UTF-8 text can
    hold one, so the split's hash, the writer and the tokenizer each raised. Read as U+FFFD; a pair stays its
    character. ``eyas eval --prompts`` reads the corpus's gzipped files as ``prepare --input`` does."""
    from eyas.data.files import prompt_file_records

    path = tmp_path / "dump.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write('{"prompt": "lone \\ud800 here"}\n{"prompt": "pair \\ud83d\\ude00 ok"}\n')
        f.write('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a \\udfff"}]}\n')
    records = list(read_inputs([str(path)]))
    texts = [m["content"] for r in records for m in r["messages"]]
    assert texts == ["lone \ufffd here", "pair \U0001f600 ok", "q", "a \ufffd"]
    assert all(t.encode("utf-8") for t in texts)  # each one writable and tokenizable now
    assert [m[0]["content"] for m, _ in prompt_file_records(path)] == ["lone \ufffd here", "pair \U0001f600 ok", "q"]


def test_limit_without_a_builtin_source_is_refused(corpus, tmp_path, capsys):
    """--limit caps built-in sources only: with --input files alone it kept every prompt without a word (a
    'small run' that would regenerate all 70,905). Refused, pointing to --max-prompts and NAME:N caps."""
    assert main(["prepare", "--out", str(tmp_path / "o"), "--input", str(corpus), "--limit", "3",
                 "--select-only"]) == 2
    err = capsys.readouterr().err
    assert "no --source is given" in err and "--max-prompts 3" in err


def test_a_rerun_without_a_holdout_leaves_no_stale_holdout_file(corpus, tmp_path):
    """A second --select-only into the same folder, without --holdout-prompts, kept the first run's holdout file
    beside a selection.json that names none."""
    out = tmp_path / "o"
    assert main(["prepare", "--out", str(out), "--input", str(corpus), "--holdout-prompts", "5", "--select-only"]) == 0
    assert (out / "holdout-prompts.jsonl").is_file()
    assert main(["prepare", "--out", str(out), "--input", str(corpus), "--select-only"]) == 0
    assert not (out / "holdout-prompts.jsonl").exists()
    assert json.loads((out / "selection.json").read_text())["holdout"]["file"] is None


def test_train_on_a_select_only_folder_is_refused_before_the_target_loads(corpus, tmp_path, capsys, monkeypatch):
    """eyas train loaded the target (minutes for a large one) and only then said the folder holds no tokens."""
    import eyas.models.loading as loading

    monkeypatch.setattr(loading, "load_target", lambda *a, **k: pytest.fail("the target was loaded first"))
    sel = tmp_path / "sel"
    assert main(["prepare", "--out", str(sel), "--input", str(corpus), "--select-only"]) == 0
    assert main(["train", "--data", str(sel), "--output", str(tmp_path / "run")]) == 2
    assert "written by `eyas prepare --select-only`" in capsys.readouterr().err
