"""Render a conversation with the target's own chat template and mark the assistant tokens.

The mask is found by rendering, not by parsing: for assistant turn ``i`` the text of
``messages[:i]`` with the generation prompt is a prefix of the text of ``messages[:i + 1]``, and
the characters between them are what the assistant wrote, plus whatever the template closes the
turn with (``<|im_end|>\\n`` for ChatML). Tokens whose characters start in such a span are
assistant tokens. This works for any template that renders prefixes consistently, which is what
serving relies on too; a template that does not is refused with a message.

Alignment for training (see ``eyas.train.ttt``): ``loss_mask[t] = 1`` where the target's prediction
at ``t`` (of token ``t + 1``) is learned, i.e. ``loss_mask[t] = assistant[t + 1]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import EyasError
from .formats import normalize  # noqa: F401  (eyas eval reads held-out records through chat.normalize)


@dataclass
class Rendered:
    input_ids: list[int]
    assistant: list[int]  # 1 on tokens the assistant wrote (incl. the turn's end token)

    @property
    def loss_mask(self) -> list[int]:
        """1 at t where token t+1 is an assistant token (what ``ttt_loss`` expects)."""
        return self.assistant[1:] + [0]


def prompt_messages(messages: list[dict]) -> list[dict]:
    """Everything before the last assistant turn (what regeneration answers)."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages))
    return messages[:last]


def _render(tokenizer, messages, add_generation_prompt: bool, template_kwargs: dict) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **template_kwargs)


def render(tokenizer, messages: list[dict], template_kwargs: dict | None = None, cut: bool = False) -> Rendered:
    """Token ids of the whole conversation and the assistant-token mask. ``cut``: the last answer was cut at a
    token limit (it did not end there), so the template's end of turn after it is not learned: a draft taught
    that turns end where answers were cut would propose an end of turn where the target goes on."""
    if not getattr(tokenizer, "chat_template", None):
        raise EyasError("the target's tokenizer has no chat template",
                        "train from a chat (instruct) model, or set tokenizer.chat_template in its folder")
    kw = dict(template_kwargs or {})
    if not any(m["role"] == "assistant" for m in messages):
        raise EyasError("a conversation has no assistant turn, so nothing would be learned from it",
                        "regenerate answers (eyas prepare --regenerate) or drop such records")
    full = _render(tokenizer, messages, False, kw)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], True, kw) if i else ""
        through = _render(tokenizer, messages[: i + 1], False, kw)
        if not through.startswith(before) or not full.startswith(through):
            raise EyasError("the chat template does not render conversation prefixes as prefixes of the whole, "
                            "so assistant tokens cannot be located",
                            "use a template without history rewriting (e.g. no thinking-trace stripping), "
                            "or pass template options that keep earlier turns intact")
        spans.append((len(before), len(through)))
    content = messages[-1].get("content") if messages[-1]["role"] == "assistant" else None
    if cut and isinstance(content, str) and content:
        a, b = spans[-1]
        at = full.rfind(content, a, b)
        if at >= 0:
            spans[-1] = (a, at + len(content))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    assistant = [int(any(a <= s < b for a, b in spans)) for s, _ in enc["offset_mapping"]]
    return Rendered(ids, assistant)


def decode_masked(tokenizer, rendered: Rendered) -> list[str]:
    """The assistant spans as text, one string per contiguous run (for checking a template)."""
    runs, cur = [], []
    for t, a in zip(rendered.input_ids, rendered.assistant):
        if a:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tokenizer.decode(r) for r in runs]
