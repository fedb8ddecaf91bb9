"""Chat rendering and the assistant-only loss mask, checked by decoding what the mask covers."""

import pytest
from helpers import byte_tokenizer

from eyas.data.chat import decode_masked, normalize, render
from eyas.errors import EyasError

CONV = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "It is 4."}]


def test_mask_covers_exactly_the_assistant_turns():
    tok = byte_tokenizer()
    r = render(tok, CONV)
    assert decode_masked(tok, r) == ["Hello! How can I help?<|im_end|>\n", "It is 4.<|im_end|>\n"]
    # loss_mask[t] = assistant[t + 1]: the prediction at t of an assistant token is learned
    assert r.loss_mask == r.assistant[1:] + [0]
    assert tok.decode(r.input_ids) == tok.apply_chat_template(CONV, tokenize=False)


def test_sharegpt_and_openai_shapes_agree():
    share = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}
    openai = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    assert normalize(share) == normalize(openai)
    with pytest.raises(EyasError, match="none of the known shapes"):
        normalize({"text": "x"})
    with pytest.raises(EyasError, match="unknown role"):
        normalize({"messages": [{"role": "robot", "content": "x"}]})


def test_no_assistant_turn_is_refused():
    with pytest.raises(EyasError, match="no assistant turn"):
        render(byte_tokenizer(), [{"role": "user", "content": "hello"}])


@pytest.mark.slow
def test_smollm2_mask_decodes_to_the_assistant_text():
    from transformers import AutoTokenizer

    from eyas.models.loading import resolve

    folder, gguf = resolve("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf, local_files_only=True)
    r = render(tok, CONV)
    assert decode_masked(tok, r) == ["Hello! How can I help?<|im_end|>\n", "It is 4.<|im_end|>\n"]
    text = tok.decode(r.input_ids)
    assert text.startswith("<|im_start|>system\n")  # SmolLM2's template adds its default system turn
    assert "You are a helpful AI assistant named SmolLM" not in "".join(decode_masked(tok, r))
    # an explicit system prompt is rendered and never learned
    r2 = render(tok, [{"role": "system", "content": "Be terse."}] + CONV)
    assert "Be terse." in tok.decode(r2.input_ids) and decode_masked(tok, r2) == decode_masked(tok, r)


def test_an_answer_cut_at_the_token_limit_teaches_no_end_of_turn():
    """A regenerated answer cut at max_new_tokens did not end there: its text is learned, the template's end of
    turn after it is not (the draft would learn to end turns where the target goes on)."""
    tok = byte_tokenizer()
    assert decode_masked(tok, render(tok, CONV, cut=True)) == ["Hello! How can I help?<|im_end|>\n", "It is 4."]
    assert render(tok, CONV, cut=True).input_ids == render(tok, CONV).input_ids  # the same tokens, less loss


def test_prepare_tokenizes_a_cut_answer_without_its_end_of_turn():
    """``eyas prepare`` marks answers cut at --max-new-tokens ``truncated``; their rows learn no end of turn."""
    from eyas.data.prepare import tokenize
    from eyas.data.prepare_config import PrepareConfig

    tok = byte_tokenizer()
    [(_, whole)] = tokenize(tok, [{"messages": CONV, "truncated": False}], PrepareConfig())[0]
    [(_, cut)] = tokenize(tok, [{"messages": CONV, "truncated": True}], PrepareConfig())[0]
    assert whole == render(tok, CONV).loss_mask and cut == render(tok, CONV, cut=True).loss_mask
    assert sum(cut) < sum(whole)


def test_developer_is_the_system_turn_and_tool_turns_are_named():
    """OpenAI's reasoning models call the system turn 'developer'; a tool result's turn was 'unknown role', whose
    fix listed ShareGPT's names."""
    rec = {"messages": [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "Hi"}]}
    assert normalize(rec) == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    with pytest.raises(EyasError, match="'tool' turn") as e:
        normalize({"messages": [{"role": "user", "content": "Hi"}, {"role": "tool", "content": "42"}]}, "f:3")
    assert "f:3: turn 1" in str(e.value) and "drop records with tool turns" in e.value.fix
