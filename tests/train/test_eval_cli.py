"""eyas eval runs real speculative decoding and reports tau, rate and per-position acceptance, overall
and per prompt category."""

import json
from argparse import Namespace

import pytest
from helpers import byte_tokenizer, save_tiny_model
from train_fixtures import make_data, tiny_recipe

from eyas.cli import main
from eyas.train.eval_cli import load_prompts, read_prompts
from eyas.train.trainer import Trainer

SPEC = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"]


def trained(tmp_path):
    """(a tiny target's folder, a draft trained on it for a few seconds)."""
    model = save_tiny_model(tmp_path / "tiny")
    from eyas.models.loading import load_target

    target = load_target(str(model), "cpu", "float32")
    data = make_data(target, tmp_path / "data", rows=48)
    Trainer(tiny_recipe(data, tmp_path / "run", **{"train.max_steps": 60}), target=target).fit()
    return model, tmp_path / "run" / "draft"


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def eval_json(model, draft, prompts, out, *extra):
    rc = main(["eval", "--model-path", str(model), "--speculative-draft-model-path", str(draft),
               "--prompts", str(prompts), "--max-new-tokens", "16", "--json-out", str(out), *SPEC, *extra])
    assert rc == 0
    return json.loads(out.read_text())


def test_eval_cli_reports_acceptance(tmp_path, capsys):
    model, draft = trained(tmp_path)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"hello {i}"} for i in range(3)])
    res = eval_json(model, draft, prompts, tmp_path / "eval.json", "--baseline")
    assert res["accept_length"] > 1.0 and res["greedy_identical"] is True
    assert res["spec"]["eagle_topk"] == 2 and len(res["accepted_per_position"]) >= 1
    assert "per_category" not in res  # prompts without a category: the report is as it was
    out = capsys.readouterr().out
    assert "tau" in out and "category" not in out
    # sampled, as a server's clients ask: the settings reach the engine and the record
    sampled = ("--temperature", "0.8", "--top-p", "0.9", "--top-k", "20")
    res = eval_json(model, draft, prompts, tmp_path / "t.json", *sampled)
    assert (res["temperature"], res["top_p"], res["top_k"], res["min_p"]) == (0.8, 0.9, 20, 0.0)
    assert res["accept_length"] >= 1.0 and res["drafts"] > 0


def test_eval_cli_reports_tau_per_category(tmp_path, capsys):
    model, draft = trained(tmp_path)
    rows = [{"prompt": "hello 0", "category": "math/gsm8k"}, {"prompt": "say hi 1", "category": "coding"},
            {"prompt": "hello 0", "category": "coding"},  # a repeat of a math prompt: counted once, as math
            {"prompt": "what 2", "source": "gpteacher"}, {"prompt": "hello 3", "category": "math/arith/x"},
            {"prompt": "plain 4"}]
    res = eval_json(model, draft, write_jsonl(tmp_path / "p.jsonl", rows), tmp_path / "eval.json")
    cats = res["per_category"]
    assert {g: c["prompts"] for g, c in cats.items()} == {"(none)": 1, "coding": 1, "gpteacher": 1, "math": 2}
    assert sum(c["drafts"] for c in cats.values()) == res["drafts"] > 0
    assert sum(c["accepted_tokens"] for c in cats.values()) == res["accepted_tokens"]
    for c in cats.values():
        assert c["accept_length"] == round(1 + c["accepted_tokens"] / c["drafts"], 4)
    out = capsys.readouterr().out
    table = out[out.index("category "):].splitlines()
    assert table[0].split() == ["category", "prompts", "steps", "tau"] and len(table) == 5
    assert table[4].split() == ["math", "2", str(cats["math"]["drafts"]), f"{cats['math']['accept_length']:.3f}"]
    # the math group's figures are those of its two prompts decoded on their own
    alone = eval_json(model, draft, write_jsonl(tmp_path / "m.jsonl", [rows[0], rows[4]]), tmp_path / "m.json")
    assert (cats["math"]["drafts"], cats["math"]["accepted_tokens"]) == (alone["drafts"], alone["accepted_tokens"])


def test_a_draft_never_accepted_is_called_out():
    """tau 1.000 over many steps is a draft that does not work here (stop 45's sampled trees on a GPU), not a
    figure: eval says so, naming the checks; a short run, or any accepted token, stays quiet."""
    from eyas.train.eval_cli import nothing_accepted

    warning = nothing_accepted({"drafts": 400, "accepted_tokens": 0})
    assert "no draft token was accepted in 400 verify steps" in warning and "eyas doctor --draft" in warning
    assert "--temperature 0" in warning
    assert nothing_accepted({"drafts": 400, "accepted_tokens": 1}) is None
    assert nothing_accepted({"drafts": 5, "accepted_tokens": 0}) is None


def test_eval_counts_a_prompt_once_when_the_data_holds_two_answers(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"q{i % 3}"}, {"role": "assistant", "content": f"a{i}"}],
             "source": "pydoc:os", "category": ["stem/mmlu/astronomy", None, None][i % 3]} for i in range(6)]
    rows[2]["source"] = rows[5]["source"] = ""
    write_jsonl(tmp_path / "heldout.jsonl", rows)
    ids, _, groups = load_prompts(Namespace(data=str(tmp_path), prompts=None, num_prompts=10), byte_tokenizer())
    assert len(ids) == 3 and len({tuple(i) for i in ids}) == 3 and groups == ["stem", "pydoc", None]
    ids, _, groups = load_prompts(Namespace(data=str(tmp_path), prompts=None, num_prompts=2), byte_tokenizer())
    assert len(ids) == 2 and len(groups) == 2


def test_eval_takes_a_builtin_prompt_set_named_by_its_set():
    ids, _, groups = load_prompts(Namespace(data=None, prompts="all", num_prompts=4), byte_tokenizer())
    assert len(ids) == 4 and groups == ["chat", "code", "reasoning", "chat"]


def test_counts_below_one_are_refused_before_loading(monkeypatch, capsys):
    import eyas.pipeline as pipeline

    monkeypatch.setattr(pipeline, "build_engine", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    for flag, value in (("--batch-size", "0"), ("--num-prompts", "-1"), ("--max-new-tokens", "0")):
        assert main(["eval", "--prompts", "chat", flag, value]) == 2
        err = capsys.readouterr().err
        assert f"{flag} must be at least 1, got {value}" in err and "fix:" in err and "Traceback" not in err
    assert main(["eval", "--prompts", "chat", "--data", "d"]) == 2  # one would have been dropped unread
    assert "--data d and --prompts chat both name the prompts" in capsys.readouterr().err
    for flag, value, said in (("--top-p", "0", "top_p must be in (0, 1]"), ("--temperature", "-1", "temperature must"),
                              ("--min-p", "2", "min_p must be in [0, 1]")):
        assert main(["eval", "--prompts", "chat", flag, value]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err


def test_an_empty_held_out_split_names_the_way_out(tmp_path):
    """A data folder prepared with --held-out 0 (or too few prompts) said only 'the prompt set is empty'."""
    import pytest

    from eyas.errors import EyasError

    (tmp_path / "heldout.jsonl").write_text("")
    write_jsonl(tmp_path / "holdout-prompts.jsonl", [{"prompt": "hi"}])
    with pytest.raises(EyasError, match="held-out split of .* is empty") as e:
        load_prompts(Namespace(data=str(tmp_path), prompts=None, num_prompts=10), byte_tokenizer())
    assert f"--prompts {tmp_path / 'holdout-prompts.jsonl'}" in e.value.fix


def test_prompt_files_that_are_not_what_they_seem(tmp_path, monkeypatch, capsys):
    """A JSONL file with one broken line was read as a text file, so {"prompt": ...} became a prompt's
    text; a text line '42' died in a TypeError, a Latin-1 file in a UnicodeDecodeError, and a --json-out
    that is a folder in an IsADirectoryError after the whole evaluation."""
    import pytest

    import eyas.pipeline as pipeline
    from eyas.data.files import prompt_file_records as _file_records
    from eyas.errors import EyasError

    broken = tmp_path / "p.jsonl"
    broken.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(EyasError, match="p.jsonl:2 is not valid JSON"):
        _file_records(broken)
    text = tmp_path / "p.txt"
    text.write_text('42\nhello there\n"quoted"\n')
    assert [m[0]["content"] for m, _ in _file_records(text)] == ["42", "hello there", "quoted"]
    text.write_bytes(b"caf\xe9\n")
    with pytest.raises(EyasError, match="p.txt is not UTF-8 text"):
        _file_records(text)
    monkeypatch.setattr(pipeline, "build_engine", lambda *a, **k: pytest.fail("loaded before --json-out was checked"))
    assert main(["eval", "--prompts", "chat", "--json-out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_a_prompt_file_with_a_byte_order_mark_is_read_as_json_lines(tmp_path):
    """A JSONL prompt file saved with a BOM (Windows tools) did not start with '{', so each line, JSON and
    all, became the text of a prompt: tau measured on prompts nobody wrote, without a word."""
    from eyas.data.files import prompt_file_records as _file_records

    path = tmp_path / "p.jsonl"
    path.write_text("\ufeff" + json.dumps({"prompt": "hello", "category": "chat"}) + "\n", encoding="utf-8")
    assert _file_records(path) == [([{"role": "user", "content": "hello"}], "chat")]


def test_a_target_that_generates_nothing_is_an_error_not_a_result():
    """A broken target (here: NaN weights, as a negative rms_norm_eps makes them) ends every row before its first
    token: eval says so instead of reporting 0 tokens at tau 1.000."""
    import torch
    from helpers import tiny_target

    from eyas.config import Algorithm, SpecConfig
    from eyas.engine.engine import Engine
    from eyas.errors import EyasError
    from eyas.sample.sampling import SamplingParams
    from eyas.train.eval_cli import evaluate

    target = tiny_target()
    with torch.no_grad():
        target.model.model.norm.weight.fill_(float("nan"))
    engine = Engine(target, None, SpecConfig(Algorithm.NONE))
    with pytest.raises(EyasError, match="no prompt generated a token"):
        evaluate(engine, [[65, 66, 67]], SamplingParams(max_new_tokens=4))


@pytest.mark.parametrize("command, flags, rows", [("eval", ["--batch-size", "65"], 65), ("eval", [], 64),
                                                   ("bench", ["--concurrency", "1,80"], 80)])
def test_the_kv_cache_holds_the_rows_a_batch_size_asks_for(command, flags, rows, tmp_path, monkeypatch):
    """``eyas eval --batch-size`` and ``eyas bench --concurrency`` size the engine's batch (they have no
    --max-running-requests): 65 rows used to meet a 64-row KV cache and a message naming a flag eval lacks."""
    import eyas.pipeline as pipeline

    seen = []

    def build(args, *a, **k):
        seen.append(args.max_batch)
        raise SystemExit(0)

    monkeypatch.setattr(pipeline, "build_engine", build)
    with pytest.raises(SystemExit):
        main([command, "--model-path", "m", "--speculative-draft-model-path", "d", *flags,
              *(["--prompts", "chat"] if command == "eval" else ["--out", str(tmp_path)])])
    assert seen == [rows]


@pytest.mark.parametrize("lines, where, said", [
    ([{"messages": [{"role": "system", "content": "be brief"}]}], 1, "(system)"),
    ([{"prompt": "hi"}, {"messages": []}], 2, "(no message at all)"),
    ([{"prompt": "hi"}, {"messages": [{"role": "assistant", "content": "hello"}]}], 2, "(assistant)"),
])
def test_a_prompt_without_a_user_turn_is_refused_before_loading(lines, where, said, tmp_path, monkeypatch, capsys):
    """A system message alone, an empty list or an answer alone (the prompt is what comes before the last answer)
    is nothing to answer: the first two ended in a traceback of the chat template, after the model loaded."""
    import eyas.pipeline as pipeline

    monkeypatch.setattr(pipeline, "build_engine", lambda *a, **k: pytest.fail("loaded before the prompts were read"))
    path = tmp_path / "p.jsonl"
    path.write_text("\n" + "".join(json.dumps(rec) + "\n" for rec in lines))  # a blank first line: numbered as is
    assert main(["eval", "--prompts", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{where + 1}: the prompt has no user turn {said}" in err and "fix: give it a user message" in err
    assert "Traceback" not in err


def test_a_few_prompts_of_a_file_grouped_by_category_are_taken_in_turn(tmp_path):
    """The chat holdout lists its 21 strata one after another: --num-prompts 4 took four arena-hard prompts and
    reported one category. Fewer prompts than the file holds are taken in turn from each category; the file's
    order stays where there are no categories, and a .jsonl.gz file reads as the corpus's files do."""
    import gzip

    from eyas.train.eval_cli import in_turn

    rows = [{"prompt": f"{c} {i}", "category": c} for c in ("coding", "math", "roleplay") for i in range(3)]
    path = tmp_path / "holdout.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    records, _ = read_prompts(Namespace(data=None, prompts=str(path), num_prompts=4))
    assert [m[0]["content"] for m, _ in in_turn(records)[:4]] == ["coding 0", "math 0", "roleplay 0", "coding 1"]
    plain = [([{"role": "user", "content": str(i)}], None) for i in range(5)]
    assert in_turn(plain) == plain
