"""Tiny models for fast CPU tests: a random Llama target with a byte-level tokenizer and a chat
template, and a draft briefly trained on it with the real TTT loss."""

from __future__ import annotations

import socket
import threading
import time

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from eyas.models.draft import Eagle3Draft
from eyas.models.target import Target

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-ins for the 256 byte values (what ByteLevel pre-tokenizing emits)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """256 byte tokens + 3 specials (ids 256..258); eos = <|im_end|>."""
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token="<|im_start|>", additional_special_tokens=SPECIALS)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(**overrides) -> LlamaConfig:
    kw = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
              initializer_range=0.08, tie_word_embeddings=False)
    tok = byte_tokenizer()
    kw.update(eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
    kw.update(overrides)
    return LlamaConfig(**kw)


def tiny_model(seed: int = 0, dtype=torch.float64, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = tiny_config(**overrides)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).to(dtype).eval()


def tiny_target(seed: int = 0, dtype=torch.float64, **overrides) -> Target:
    return Target(tiny_model(seed, dtype, **overrides), byte_tokenizer(), name="tiny-llama")


def save_tiny_model(path, seed: int = 0, dtype=torch.float32, **overrides):
    """A complete local HF folder (config, safetensors, tokenizer with chat template)."""
    model = tiny_model(seed, dtype, **overrides)
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path


def reference_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    """The target's own greedy continuation via Hugging Face generate (no eos stop)."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                         eos_token_id=None)
    return out[0, len(prompt):].tolist()


def train_draft(target: Target, steps: int = 120, seed: int = 0, ttt_steps: int = 3,
                draft_vocab_size=None) -> Eagle3Draft:
    """A draft trained for a few seconds on the target's own sampled text, with the real TTT loss."""
    from eyas.train.ttt import target_states, ttt_loss

    torch.manual_seed(seed)
    draft = Eagle3Draft.for_target(target, draft_vocab_size=draft_vocab_size, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    vocab = target.info.vocab_size
    prompts = torch.randint(0, min(256, target.info.vocab_size), (48, 3), generator=gen)
    data = target.model.generate(prompts, max_new_tokens=48, do_sample=True, temperature=0.6,
                                 pad_token_id=0, eos_token_id=None)
    aux, logits = target_states(target, data)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-3)
    for _ in range(steps):
        idx = torch.randint(0, len(data), (16,), generator=gen)
        r = ttt_loss(draft, data[idx], aux[idx], logits[idx], torch.ones_like(data[idx]), steps=ttt_steps)
        opt.zero_grad()
        r.loss.backward()
        opt.step()
    assert vocab == draft.config.vocab_size
    return draft.eval()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class InProcessServer:
    """uvicorn in a thread around ``create_app`` (signals stay with pytest)."""

    def __init__(self, app):
        import uvicorn

        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        end = time.time() + 60
        while not self.server.started:
            if time.time() > end or not self.thread.is_alive():
                raise RuntimeError("in-process server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)
