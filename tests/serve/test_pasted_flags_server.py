"""A real ``python -m eyas.serve`` started with a command line as SGLang and vLLM users write them: the positional
model, a --config file (the command line overriding it), vLLM's --speculative-config with a token tree,
--tokenizer-path, --tp 1, --chunked-prefill-size -1, --random-seed and --mem-fraction-static. Each must take
effect, as /server_info, /v1/models, the printout and a greedy answer show."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest
from serve_helpers import ServerProcess

openai = pytest.importorskip("openai")


def test_a_pasted_command_line_serves_as_it_says(models, engine, reference, tmp_path):
    from helpers import byte_tokenizer

    tiny, draft = models
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # the tiny's, spaced otherwise
    tok = byte_tokenizer()
    tok.chat_template = template
    tok.save_pretrained(tmp_path / "tokenizer")
    config = tmp_path / "serve.yaml"
    config.write_text(f"dtype: float64\nserved-model-name: pasted\nport: 1\nmax_running_requests: 4\n"
                      f"log-interval: 0\nmodel-path: {tmp_path / 'not-this-one'}\n")
    tree = "[(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]"  # depth 3, two children at most, 5 nodes
    spec = json.dumps({"method": "eagle3", "model": str(draft), "speculative_token_tree": tree})
    s = ServerProcess([str(tiny), "--config", str(config), "--speculative-config", spec, "--tp", "1",
                       "--chunked-prefill-size", "-1", "--tokenizer-path", str(tmp_path / "tokenizer"),
                       "--random-seed", "11", "--mem-fraction-static", "0.8"], tmp_path)  # the helper adds --port
    try:
        s.wait_ready()
        info = httpx.get(s.url + "/server_info", timeout=30).json()
        assert (info["algorithm"], info["num_steps"], info["eagle_topk"], info["num_draft_tokens"]) == \
            ("EAGLE3", 3, 2, 6)
        assert info["target"] == str(tiny) and info["dtype"] == "float64" and info["max_running_requests"] == 4
        assert info["chat_template_sha256_16"] == hashlib.sha256(template.encode()).hexdigest()[:16]
        out = s.stdout()
        assert "random seed: 11" in out and "--mem-fraction-static 0.8 has no effect here" in out  # generic path

        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert client.models.retrieve("pasted").id == "pasted"
        answer = client.chat.completions.create(model="pasted", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=16, temperature=0)
        prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         tokenize=False)
        want = reference([tok(prompt, add_special_tokens=False).input_ids], 16)[0]
        assert answer.choices[0].message.content == tok.decode(want, skip_special_tokens=True)
        assert answer.usage.model_dump()["spec_verify_ct"] >= 1
    finally:
        assert s.stop() == 0, s.stderr()
