"""eyas eval runs real speculative decoding and reports tau, rate and per-position acceptance."""

import json

from helpers import save_tiny_model
from train_fixtures import make_data, tiny_recipe

from eyas.cli import main
from eyas.train.trainer import Trainer


def test_eval_cli_reports_acceptance(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "tiny")
    from eyas.models.loading import load_target

    target = load_target(str(model), "cpu", "float32")
    data = make_data(target, tmp_path / "data", rows=48)
    Trainer(tiny_recipe(data, tmp_path / "run", **{"train.max_steps": 60}), target=target).fit()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"hello {i}"}) for i in range(3)) + "\n")
    out = tmp_path / "eval.json"
    rc = main(["eval", "--model-path", str(model), "--speculative-draft-model-path", str(tmp_path / "run" / "draft"),
               "--prompts", str(prompts), "--max-new-tokens", "16", "--baseline", "--json-out", str(out),
               "--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["accept_length"] > 1.0 and res["greedy_identical"] is True
    assert res["spec"]["eagle_topk"] == 2 and len(res["accepted_per_position"]) >= 1
    assert "tau" in capsys.readouterr().out


def test_eval_counts_a_prompt_once_when_the_data_holds_two_answers(tmp_path):
    from argparse import Namespace

    from helpers import byte_tokenizer

    from eyas.train.eval_cli import load_prompts

    rows = [{"messages": [{"role": "user", "content": f"q{i % 3}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(6)]
    (tmp_path / "heldout.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ids, _ = load_prompts(Namespace(data=str(tmp_path), prompts=None, num_prompts=10), byte_tokenizer())
    assert len(ids) == 3 and len({tuple(i) for i in ids}) == 3
    ids, _ = load_prompts(Namespace(data=str(tmp_path), prompts=None, num_prompts=2), byte_tokenizer())
    assert len(ids) == 2
