"""Incremental detokenizing: same text as a full decode, split characters held, stop strings exact."""

from __future__ import annotations

import copy

from helpers import byte_tokenizer

from eyas.serve.detokenize import Detokenizer

TOK = byte_tokenizer()


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False).input_ids


def stream(d: Detokenizer, tokens: list[int], chunk: int) -> tuple[str, list[int]]:
    out, kept = "", []
    for i in range(0, len(tokens), chunk):
        p = d.push(tokens[i:i + chunk])
        out += p.text
        kept += p.tokens
        if p.matched:
            break
    return out + d.flush(), kept


def test_matches_full_decode_for_any_chunking():
    text = "héllo wörld — ünïcode ✓ 日本語"
    t = ids(text)
    assert len(t) > len(text)  # multi-byte characters span several tokens
    for chunk in (1, 2, 3, 5, 64):
        assert stream(Detokenizer(TOK), t, chunk)[0] == text


def test_half_a_character_is_held_back():
    t = ids("✓")  # three byte tokens
    d = Detokenizer(TOK)
    assert d.push(t[:1]).text == "" and d.push(t[1:2]).text == ""
    assert d.push(t[2:]).text == "✓"


def test_special_tokens_skipped_or_kept():
    eos = TOK.convert_tokens_to_ids("<|im_end|>")
    assert stream(Detokenizer(TOK), ids("ab") + [eos], 1)[0] == "ab"
    assert stream(Detokenizer(TOK, skip_special_tokens=False), ids("ab") + [eos], 1)[0] == "ab<|im_end|>"


def test_stop_string_cuts_before_it_and_keeps_tokens_up_to_the_match():
    t = ids("one two three four")
    for chunk in (1, 4, 100):
        text, kept = stream(Detokenizer(TOK, stop=["three"]), t, chunk)
        assert text == "one two "
        assert kept == ids("one two three")


def test_earliest_of_several_stops_wins_and_prefix_is_held_while_streaming():
    d = Detokenizer(TOK, stop=["xyz", "two"])
    released = d.push(ids("one tw")).text
    assert released == "one "  # "tw" could begin "two": held back
    p = d.push(ids("o three"))
    assert p.matched == "two" and released + p.text == "one "
    assert d.push(ids("more")).tokens == []


def test_held_prefix_released_when_it_cannot_match():
    d = Detokenizer(TOK, stop=["two"])
    assert d.push(ids("one tw")).text == "one "
    assert d.push(ids("ice")).text == "twice"
    assert d.flush() == ""


def test_the_backends_decode_is_the_tokenizers_own():
    """The event loop decodes through the fast tokenizer's backend (``backend_decode``): the same text as
    ``tokenizer.decode`` for any ids, special tokens kept or skipped; a tokenizer without a backend keeps its own."""
    import random

    from eyas.serve.detokenize import backend_decode

    rng = random.Random(0)
    special = TOK.all_special_ids
    assert special and TOK._tokenizer is not None
    for _ in range(200):
        some = [rng.randrange(len(TOK)) for _ in range(rng.randrange(0, 12))] + rng.sample(special, 1)
        rng.shuffle(some)
        for skip in (True, False):
            want = TOK.decode(some, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
            assert backend_decode(TOK, skip)(some) == want

    class Slow:  # no ``_tokenizer``: its own decode
        def decode(self, ids, skip_special_tokens, clean_up_tokenization_spaces):
            return f"{ids}{skip_special_tokens}{clean_up_tokenization_spaces}"

    assert backend_decode(Slow(), True)([1, 2]) == "[1, 2]TrueFalse"
    fast = backend_decode(TOK, True)
    assert "backend" in fast.__code__.co_freevars  # the stock class: its backend directly

    class Own(type(TOK)):  # a class with a decode of its own keeps it
        def decode(self, ids, **kw):
            return "own"

    mine = copy.deepcopy(TOK)
    mine.__class__ = Own
    assert backend_decode(mine, True)([1, 2]) == "own"


def test_the_backends_stream_and_the_two_offsets_give_the_same_text():
    """A fast tokenizer streams through ``tokenizers``' ``DecodeStream``; any other takes two decodes a push.
    Random ids (split characters, special tokens) in chunks of 1 and 3: the same text either way, the full
    decode's; an unfinished character at the end decodes as it is on both."""
    import random

    rng = random.Random(1)
    special = TOK.all_special_ids
    for _ in range(60):
        some = ids(rng.choice(["héllo ✓ 日本語", " a  b", "✓✓", "x"])) + [rng.randrange(len(TOK)) for _ in range(8)]
        some += rng.sample(special, 1)
        rng.shuffle(some)
        for chunk in (1, 3):
            streamed = stream(Detokenizer(TOK), some, chunk)[0]
            offsets = Detokenizer(TOK)
            offsets._stream = None
            assert Detokenizer(TOK)._stream is not None
            assert streamed == stream(offsets, some, chunk)[0] == TOK.decode(some, skip_special_tokens=True)
    half = ids("ab✓")[:-1]  # the check mark's last byte never comes
    streamed, offsets = Detokenizer(TOK), Detokenizer(TOK)
    offsets._stream = None
    assert streamed.push(half).text + streamed.flush() == offsets.push(half).text + offsets.flush() == TOK.decode(half)
    assert streamed.text == offsets.text == "ab\ufffd"
