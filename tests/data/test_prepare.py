"""eyas prepare on the tiny target: JSONL in, tokenized splits + vocab counts + meta out."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import byte_tokenizer, save_tiny_model, tiny_target

from eyas.cli import main
from eyas.data.prepare import PrepareConfig, prepare
from eyas.data.regenerate import RegenConfig
from eyas.data.tokenized import TokenizedSplit
from eyas.errors import EyasError


def _jsonl(path, n=30, answers=True):
    with path.open("w") as f:
        for i in range(n):
            turns = [{"from": "human", "value": f"question number {i}"}]
            if answers:
                turns.append({"from": "gpt", "value": f"answer {i}"})
            f.write(json.dumps({"conversations": turns}) + "\n")
    return path


def test_prepare_from_jsonl(tmp_path):
    target = tiny_target(dtype=torch.float32)
    src = _jsonl(tmp_path / "in.jsonl")
    meta = prepare(target, PrepareConfig(inputs=[str(src)], held_out=0.2, max_length=64), tmp_path / "out",
                   log=lambda *a: None)
    train = TokenizedSplit(tmp_path / "out", "train")
    assert len(train) == meta["splits"]["train"]["rows"] and len(train) + meta["splits"]["heldout"]["rows"] == 30
    ids, mask = train.row(0)
    tok = byte_tokenizer()
    learned = tok.decode(ids[1:][mask[:-1].astype(bool)])
    assert learned.startswith("answer ") and learned.endswith("<|im_end|>\n")
    counts = np.load(tmp_path / "out" / "vocab_counts.npy")
    assert counts.sum() == train.loss_tokens and meta["chat"]["template_sha256_16"]



def test_prepare_counts_conversations_whose_prompt_fills_max_length(tmp_path):
    """A prompt as long as --max-length leaves no answer token; such rows were dropped without a
    count (train.jsonl 4 records, 3 rows, meta silent), and if all were, the error blamed missing answers."""
    target = tiny_target(dtype=torch.float32)
    src = _jsonl(tmp_path / "in.jsonl", n=3)
    with src.open("a") as f:
        f.write(json.dumps({"conversations": [{"from": "human", "value": "x" * 200}, {"from": "gpt", "value": "y"}]})
                + "\n")
    said = []
    meta = prepare(target, PrepareConfig(inputs=[str(src)], held_out=0.0, max_length=64), tmp_path / "out",
                   log=said.append)
    assert meta["splits"]["train"]["rows"] == 3 and meta["splits"]["train"]["prompt_fills_max_length"] == 1
    assert any("1 of 4 conversations dropped: the prompt fills --max-length 64" in m for m in said)
    with pytest.raises(EyasError, match="every prompt fills --max-length 16"):
        prepare(target, PrepareConfig(inputs=[str(src)], held_out=0.0, max_length=16), tmp_path / "o2",
                log=lambda *a: None)

def test_prepare_regenerates_with_the_target(tmp_path):
    target = tiny_target(dtype=torch.float32)
    src = _jsonl(tmp_path / "in.jsonl", n=6, answers=False)
    cfg = PrepareConfig(inputs=[str(src)], held_out=0.0, max_length=128, regenerate=True,
                        regen=RegenConfig(max_new_tokens=8, batch_size=4, temperature=0.8))
    meta = prepare(target, cfg, tmp_path / "out", log=lambda *a: None)
    stats = meta["regeneration"]["stats"]["train"]
    assert stats["prompts"] == 6 and stats["answer_tokens"] > 0 and meta["regeneration"]["temperature"] == 0.8
    rows = [json.loads(line) for line in (tmp_path / "out" / "train.jsonl").open()]
    assert all(r["regenerated"] and r["messages"][-1]["role"] == "assistant" for r in rows)


def test_prepare_refuses_conversations_without_answers(tmp_path):
    target = tiny_target(dtype=torch.float32)
    src = _jsonl(tmp_path / "in.jsonl", n=5, answers=False)
    with pytest.raises(EyasError, match="no conversation has an assistant turn"):
        prepare(target, PrepareConfig(inputs=[str(src)], held_out=0.0, max_length=64), tmp_path / "o",
                log=lambda *a: None)


def test_prompts_alone_beside_conversations_are_named_when_left_out(tmp_path):
    """Without --regenerate a prompt has no answer to learn: beside conversations that have one, the prompts are
    left out, and the log says how many and the fix (once only meta.json's no_assistant_turn counted them)."""
    target = tiny_target(dtype=torch.float32)
    answered = _jsonl(tmp_path / "a.jsonl", n=4, answers=True)
    bare = tmp_path / "b.jsonl"
    bare.write_text("".join(json.dumps({"prompt": f"bare prompt {i}"}) + "\n" for i in range(3)))
    logs = []
    meta = prepare(target, PrepareConfig(inputs=[str(answered), str(bare)], held_out=0.0, max_length=128),
                   tmp_path / "o", log=logs.append)
    assert meta["splits"]["train"]["rows"] == 4 and meta["splits"]["train"]["no_assistant_turn"] == 3
    assert any("3 of 7 records have no assistant turn" in m and "--regenerate" in m for m in logs)


def test_prepare_cli_errors_cleanly(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "tiny")
    rc = main(["prepare", "--model", str(model), "--out", str(tmp_path / "o"), "--device", "cpu",
               "--max-length", "4096", "--input", str(_jsonl(tmp_path / "in.jsonl", n=3))])
    assert rc == 2 and "longer than the target's context" in capsys.readouterr().err


def test_prepare_keeps_given_answers_beside_regenerated_ones(tmp_path):
    target = tiny_target(dtype=torch.float32)
    src = _jsonl(tmp_path / "in.jsonl", n=6, answers=True)
    cfg = PrepareConfig(inputs=[str(src)], held_out=0.0, max_length=128, regenerate=True, keep_answers=True,
                        regen=RegenConfig(max_new_tokens=8, batch_size=4, temperature=0.0))
    meta = prepare(target, cfg, tmp_path / "out", log=lambda *a: None)
    rows = [json.loads(line) for line in (tmp_path / "out" / "train.jsonl").open()]
    given = sorted(r["messages"][-1]["content"] for r in rows if not r.get("regenerated"))
    assert given == sorted(f"answer {i}" for i in range(6))
    assert sum(bool(r.get("regenerated")) for r in rows) == 6
    assert meta["splits"]["train"]["rows"] == 12 and meta["regeneration"]["keep_answers"]


def test_prepare_cli_refuses_keep_answers_without_regenerate(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "tiny")
    rc = main(["prepare", "--model", str(model), "--out", str(tmp_path / "o"), "--device", "cpu",
               "--keep-answers", "--input", str(_jsonl(tmp_path / "in.jsonl", n=3))])
    assert rc == 2 and "--keep-answers only means something with --regenerate" in capsys.readouterr().err


def test_greedy_answers_from_the_engine_equal_hf_generate():
    """The engine path (forced on the CPU) answers token for token as HF ``generate`` does, eos kept,
    cut rows marked, in prompt order, over batches of mixed lengths that fill and shrink."""
    from eyas.data.regenerate import generate_batched

    target = tiny_target(dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (5, 9, 3, 12, 7, 4, 10)]
    eos = target.eos_token_ids[0]
    prompts.append(prompts[0][:2] + [eos])  # a prompt whose answer may stop at once
    hf = generate_batched(target, prompts,
                          RegenConfig(temperature=0.0, max_new_tokens=12, batch_size=3, engine="generic"),
                          progress=False)
    eng = generate_batched(target, prompts,
                           RegenConfig(temperature=0.0, max_new_tokens=12, batch_size=3, engine="native"),
                           progress=False)
    assert eng == hf
    assert target.info.max_context == tiny_target().info.max_context  # the caller's target is not resized


def test_hf_answers_split_a_batch_that_runs_out_of_memory(monkeypatch, capsys):
    """HF ``generate`` at ``--batch-size`` past what the device holds (2048 prompts on an H100 ran out of its
    80 GB): the batch is split in two until it fits, and the answers are those of batches that fit."""
    from eyas.data.regenerate import generate_hf

    target = tiny_target(dtype=torch.float32)
    prompts = [[5 + i, 9, 3 + i] for i in range(7)]
    cfg = RegenConfig(temperature=0.0, max_new_tokens=4, batch_size=8, engine="generic")
    want = generate_hf(target, prompts, replace(cfg, batch_size=2), progress=False)
    real, sizes = target.model.generate, []

    def small_device(**kw):
        sizes.append(len(kw["input_ids"]))
        if sizes[-1] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.04 GiB")
        return real(**kw)

    monkeypatch.setattr(target.model, "generate", small_device)
    assert generate_hf(target, prompts, cfg, progress=False) == want
    assert sizes == [7, 4, 2, 2, 2, 1]  # 7 fail, 4 fail, then batches of 2 (the last has 1 left)
    assert "7 prompts at once ran out of device memory; 4 a batch from here" in capsys.readouterr().err


def test_sampled_answers_from_the_engine_do_not_depend_on_the_batching():
    """Each prompt is sampled with a seed of its own (``cfg.seed`` and its index), so its answer is the
    same in batches of 3 or 8 and beside other prompts; another ``cfg.seed``, or the same prompt at
    another index, gives another answer. A row that reached eos keeps it as its last token; a row
    without one is max_new_tokens long and cut."""
    from eyas.data.regenerate import generate_batched

    target = tiny_target(dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (5, 9, 3, 12, 7, 4, 10, 6, 8, 11, 2, 13)] * 3
    extra = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (6, 3, 9, 12, 2)]

    def sample(ps, batch_size, seed=7):
        cfg = RegenConfig(temperature=0.8, top_p=0.95, max_new_tokens=16, batch_size=batch_size, seed=seed,
                          engine="native")
        return generate_batched(target, ps, cfg, progress=False)

    answers, cut = sample(prompts, 3)
    assert sample(prompts, 8) == (answers, cut)
    beside, cut_beside = sample(prompts + extra, 8)
    assert (beside[: len(prompts)], cut_beside[: len(prompts)]) == (answers, cut)
    other, _ = sample(prompts, 3, seed=8)
    assert sum(a != b for a, b in zip(answers, other)) > len(prompts) // 2
    assert sum(answers[i] != answers[i + 12] for i in range(12)) >= 10  # the same prompt at another index
    eos = set(target.eos_token_ids)
    for a, c in zip(answers, cut):
        assert not eos & set(a[:-1]) and c == (a[-1] not in eos) and (len(a) == 16 if c else len(a) <= 16)
    assert 0 < sum(cut) < len(prompts)  # both kinds of row are checked


def test_sampled_answers_from_the_engine_follow_the_targets_distribution():
    """4000 one-token answers to one prompt, each with its own seed, against softmax(logits / T) cut to
    the top-p nucleus from the HF model's own forward: nothing outside the nucleus, and a chi-square
    fit that a temperature off by 15%, or shared seeds, fails."""
    from scipy.stats import chisquare

    from eyas.data.regenerate import generate_batched

    target = tiny_target(dtype=torch.float32)
    prompt, n, temperature, top_p = [72, 101, 108, 108, 111], 4000, 0.5, 0.9
    cfg = RegenConfig(temperature=temperature, top_p=top_p, max_new_tokens=1, batch_size=256, engine="native")
    answers, _ = generate_batched(target, [prompt] * n, cfg, progress=False)
    counts = torch.bincount(torch.tensor([a[0] for a in answers]), minlength=target.info.vocab_size).double()
    with torch.no_grad():
        logits = target.model(torch.tensor([prompt])).logits[0, -1].double()
    p = torch.softmax(logits / temperature, -1)
    desc, order = p.sort(descending=True)
    nucleus = order[(desc.cumsum(0) - desc) < top_p]  # the smallest prefix holding top_p (mass before < top_p)
    outside = torch.ones_like(p, dtype=torch.bool)
    outside[nucleus] = False
    assert counts[outside].sum() == 0
    exact = p[nucleus] / p[nucleus].sum()
    big = exact * n >= 5  # cells of small expected count pooled into one
    obs = torch.cat([counts[nucleus][big], counts[nucleus][~big].sum()[None]])
    ex = torch.cat([exact[big], exact[~big].sum()[None]]) * n
    keep = ex > 0
    assert chisquare(obs[keep].numpy(), ex[keep].numpy() * obs[keep].sum().item() / ex[keep].sum().item()).pvalue > 1e-3


def test_engine_regeneration_names_its_flag_when_the_model_cannot_run_natively(monkeypatch):
    from eyas.data.regenerate import generate_batched
    from eyas.models import native

    monkeypatch.setattr(native, "native_support", lambda model: "GPT2LMHeadModel is not in the Llama family")
    with pytest.raises(EyasError, match="--regen-engine native cannot run this model: GPT2LMHeadModel") as e:
        generate_batched(tiny_target(dtype=torch.float32), [[5, 6]], RegenConfig(temperature=0.0, engine="native"))
    assert "--regen-engine auto" in e.value.fix


def test_magpie_prompts_continue_the_templates_user_turn(monkeypatch):
    """The target is given exactly its template's opening of a user turn (system turn included);
    what it writes becomes distinct user prompts; cut, short and repeated ones are dropped."""
    from eyas.data import regenerate as rg

    target = tiny_target(dtype=torch.float32)
    tok = target.tokenizer
    seen = {}
    texts = ["How do I bake bread at home?", "How do  I bake BREAD at home?", "short", "What is a prime number?",
             "cut off"]

    def fake(t, prompts, cfg, progress=True):
        seen["prompt"], seen["cfg"] = prompts[0], cfg
        eos = t.eos_token_ids[0]
        return [tok(x, add_special_tokens=False).input_ids + [eos] for x in texts], [False, False, False, False, True]

    monkeypatch.setattr(rg, "generate_batched", fake)
    got = rg.magpie_prompts(target, 5, RegenConfig(temperature=0.0, system_prompt="Be brief.", engine="native"),
                            progress=False)
    assert [r["messages"][0]["content"] for r in got] == ["How do I bake bread at home?", "What is a prime number?"]
    assert all(r["source"] == "magpie" and r["messages"][0]["role"] == "user" for r in got)
    opening = tok.decode(seen["prompt"])
    full = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                                   tokenize=False)
    assert full.startswith(opening) and opening.endswith("user\n") and "Be brief." in opening
    assert seen["cfg"].temperature == 1.0 and seen["cfg"].engine == "native"  # the caller's engine, sampling


def test_magpie_source_end_to_end_and_benchmark_prompts_excluded(tmp_path):
    """`eyas prepare --source magpie` on the tiny target writes and answers its own prompts; --exclude
    drops conversations whose user turn is in a prompt set, whatever their case and spacing."""
    target = tiny_target(dtype=torch.float32)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n"
                           for p in ("  what is PHOTOSYNTHESIS? ", "keep me")))
    logs = []
    cfg = PrepareConfig(inputs=[str(src)], sources=["magpie"], magpie_prompts=6, exclude=["chat"], held_out=0.0,
                        max_length=256, regenerate=True,
                        regen=RegenConfig(max_new_tokens=6, batch_size=4, temperature=0.0))
    meta = prepare(target, cfg, tmp_path / "out", log=logs.append)
    rows = [json.loads(line) for line in (tmp_path / "out" / "train.jsonl").open()]
    users = [r["messages"][-2]["content"] for r in rows]
    assert "keep me" in users and not any("photosynthesis" in u.lower() for u in users)
    assert meta["excluded"] == {"sets": ["chat"], "records": 1} and meta["magpie_prompts"] == 6
    assert any(line.startswith("source magpie: ") and line.endswith("from 6 openings of a user turn") for line in logs)


def test_limit_caps_the_sources_the_target_writes_too(monkeypatch):
    """--limit N: at most N prompts from each built-in source, self and magpie included (asked of the target
    N times, self's requests spread over its topics), as from chatterbot and pydoc."""
    import eyas.data.prepare as prep

    asked = {}
    monkeypatch.setattr(prep, "self_prompts", lambda t, xs, regen: asked.setdefault("self", xs))
    monkeypatch.setattr(prep, "magpie_prompts", lambda t, n, regen: [{"n": i} for i in range(n)])
    got = prep.collect(None, PrepareConfig(sources=["self", "magpie", "pydoc"], limit=5, magpie_prompts=50,
                                           self_per_topic=8), log=lambda *_: None)
    assert len(asked["self"]) == 5 and len({r["source"] for r in asked["self"]}) == 5  # five topics, not one
    assert sum("n" in r for r in got) == 5 and len(got) == 15


@pytest.mark.parametrize("flags,needle", [
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
    (["--max-length", "-5"], "--max-length must be at least 1, got -5"),
    (["--limit", "-1"], "--limit must be at least 1, got -1"),
    (["--temperature", "-1"], "--temperature -1.0 must be in [0, 100]"),
    (["--top-p", "0"], "--top-p 0.0 must be in (0, 1]"),
    (["--top-p", "2"], "--top-p 2.0 must be in (0, 1]"),
    (["--template-kwargs", "[1]"], "--template-kwargs must be a JSON object"),  # once a TypeError in the template
])
def test_prepare_refuses_numbers_no_run_can_use_before_loading(tmp_path, capsys, monkeypatch, flags, needle):
    import eyas.models.loading as loading

    monkeypatch.setattr(loading, "load_target", lambda *a, **k: pytest.fail("a model was loaded first"))
    assert main(["prepare", "--out", str(tmp_path / "out"), "--source", "pydoc", "--regenerate", *flags]) == 2
    err = capsys.readouterr().err
    assert needle in err and "fix:" in err and "Traceback" not in err


def test_prepare_refuses_an_out_that_is_a_file(tmp_path, capsys, monkeypatch):
    """It died in a FileExistsError traceback after the target had loaded and answered every prompt."""
    import eyas.models.loading as loading

    monkeypatch.setattr(loading, "load_target", lambda *a, **k: pytest.fail("a model was loaded first"))
    (tmp_path / "out").write_text("x")
    assert main(["prepare", "--out", str(tmp_path / "out"), "--source", "pydoc", "--regenerate"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_prepare_on_a_full_disk_is_an_error_not_a_traceback(tmp_path, capsys, monkeypatch):
    import eyas.data.prepare as prepare_module

    def full(path, records):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prepare_module, "write_jsonl", full)
    src = _jsonl(tmp_path / "in.jsonl", n=3)
    assert main(["prepare", "--out", str(tmp_path / "out"), "--input", str(src), "--select-only"]) == 2
    err = capsys.readouterr().err
    assert "could not write" in err and "No space left on device" in err and "free disk space" in err


def test_regeneration_skips_prompts_that_fill_max_length(tmp_path):
    """A prompt longer than --max-length (here longer than the target's 1024-token context too) was
    answered, past the context, and its row then dropped; now it is not sent, and counted."""
    target = tiny_target(dtype=torch.float32)
    src = _jsonl(tmp_path / "in.jsonl", n=2, answers=False)
    with src.open("a") as f:
        f.write(json.dumps({"prompt": "hello " * 300}) + "\n")
    said = []
    cfg = PrepareConfig(inputs=[str(src)], held_out=0.0, max_length=1024, regenerate=True,
                        regen=RegenConfig(max_new_tokens=4, batch_size=4, temperature=0.0, engine="generic"))
    meta = prepare(target, cfg, tmp_path / "out", log=said.append)
    assert meta["regeneration"]["stats"]["train"]["prompts"] == 2
    assert meta["splits"]["train"]["rows"] == 2 and meta["splits"]["train"]["prompt_fills_max_length"] == 1
    assert any("1 prompts not sent for answers" in m for m in said)


def test_training_on_a_select_only_folder_says_what_it_is(tmp_path):
    """It said 'no train split ... run eyas prepare first' of a folder eyas prepare had just written."""
    src = _jsonl(tmp_path / "in.jsonl", n=3, answers=False)
    assert main(["prepare", "--out", str(tmp_path / "sel"), "--input", str(src), "--select-only"]) == 0
    with pytest.raises(EyasError, match="written by `eyas prepare --select-only`") as e:
        TokenizedSplit(tmp_path / "sel", "train")
    assert "without --select-only" in e.value.fix


def test_select_only_never_overwrites_answered_data(tmp_path, capsys):
    """--select-only over a full run's folder replaced its answered train.jsonl with bare prompts and left
    its tokens and meta.json in place; an earlier --select-only folder is still rewritten, as a full run
    rewrites its own."""
    src = _jsonl(tmp_path / "in.jsonl", n=10)
    prepare(tiny_target(dtype=torch.float32), PrepareConfig(inputs=[str(src)], held_out=0.2, max_length=64),
            tmp_path / "full", log=lambda *a: None)
    answered = (tmp_path / "full" / "train.jsonl").read_text()
    assert main(["prepare", "--out", str(tmp_path / "full"), "--input", str(src), "--select-only"]) == 2
    err = capsys.readouterr().err
    assert "holds the output of an `eyas prepare` run with a model (meta.json" in err and "new --out" in err, err
    assert (tmp_path / "full" / "train.jsonl").read_text() == answered
    assert not (tmp_path / "full" / "selection.json").exists()
    for _ in range(2):
        assert main(["prepare", "--out", str(tmp_path / "sel"), "--input", str(src), "--select-only"]) == 0


def test_prepare_on_a_gpu_this_machine_lacks_is_an_error(tmp_path, capsys):
    """--device cuda on a CPU-only PyTorch died in an AttributeError traceback from torch.cuda.set_device."""
    src = _jsonl(tmp_path / "in.jsonl", n=3)
    assert main(["prepare", "--out", str(tmp_path / "out"), "--input", str(src), "--device", "cuda:99"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda:99" in err and "Traceback" not in err


def test_prompts_whose_answer_is_empty_are_counted(tmp_path, monkeypatch):
    """A prompt the target answered with its end-of-turn token alone left no row, and nothing said so:
    'regenerated 6 prompts', 5 rows, meta.json silent."""
    import eyas.data.regenerate as regen_module

    target = tiny_target(dtype=torch.float32)
    eos = target.eos_token_ids[0]
    monkeypatch.setattr(regen_module, "generate_batched",
                        lambda t, prompts, cfg, progress=True: ([[eos]] + [[65, 66, eos]] * (len(prompts) - 1),
                                                                [False] * len(prompts)))
    said = []
    cfg = PrepareConfig(inputs=[str(_jsonl(tmp_path / "in.jsonl", n=6, answers=False))], held_out=0.0, max_length=128,
                        regenerate=True, regen=RegenConfig(max_new_tokens=8))
    meta = prepare(target, cfg, tmp_path / "out", log=said.append)
    assert meta["splits"]["train"]["rows"] == 5 and meta["regeneration"]["stats"]["train"]["no_answer"] == 1
    assert any("1 of 6 prompts got no answer" in m for m in said)
