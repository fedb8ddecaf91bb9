"""``eyas generate``: speculative generation on a chat prompt, with speed and acceptance.

Runs the target alone and then with speculation on the same prompt, so the printout shows the
text, tokens/s of both, the speedup, acceptance length and per-position acceptance, and whether
the two greedy outputs match token for token.
"""

from __future__ import annotations

import sys
import time

from .common.prompts import chat_ids
from .errors import EyasError
from .pipeline import add_engine_arguments, build_engine, engine_args_from
from .sample.sampling import SamplingParams

DEFAULT_PROMPT = "Explain in a few sentences why the sky is blue."


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate with speculative decoding and report tokens/s and acceptance")
    add_engine_arguments(p)
    p.add_argument("--prompt", action="append", help="user message (repeat for a batch)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-baseline", action="store_true", help="skip the run without speculation")
    p.set_defaults(func=run)


def run(args) -> int:
    print("loading ...", flush=True)
    engine = build_engine(engine_args_from(args))
    tok = engine.target.tokenizer
    prompts = [chat_ids(tok, p) for p in (args.prompt or [DEFAULT_PROMPT])]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed)
    s = engine.spec
    info = engine.target.info
    print(f"target: {engine.target.name} ({info.num_layers} layers, hidden {info.hidden_size})")
    if s.speculative:
        h, ids = engine.target.info.hidden_size, engine.target.aux_layer_ids
        print(f"speculative: {s.algorithm.value}, draft {engine.draft_path}, "
              f"steps={s.num_steps} topk={s.eagle_topk} draft_tokens={s.num_draft_tokens}")
        print(f"aux hidden states: layers {ids}, {len(ids)} x {h} = {len(ids) * h} -> fc -> "
              f"{engine.draft.config.hidden_size}")
        from .common.training_record import context_warning

        warning = context_warning(engine)
        if warning:
            print(warning, file=sys.stderr, flush=True)
    else:
        print("speculative: NONE (no draft)")

    baseline = None
    if s.speculative and not args.no_baseline:
        from .config import Algorithm, SpecConfig
        from .engine.engine import Engine

        plain = Engine(engine.target, None, SpecConfig(Algorithm.NONE))
        engine.generate(prompts[:1], SamplingParams(max_new_tokens=4))  # warm-up
        t = time.perf_counter()
        baseline = plain.generate(prompts, params)
        base_s = time.perf_counter() - t
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    spec_s = time.perf_counter() - t

    for i, o in enumerate(outs):
        print(f"\n--- prompt {i}: {args.prompt[i] if args.prompt else DEFAULT_PROMPT}")
        print(tok.decode(o.output_ids, skip_special_tokens=True).strip())
    n = sum(len(o.output_ids) for o in outs)
    if all(o.finish_reason == "error" for o in outs):  # non-finite logits on every prompt (a NaN weight): no result
        raise EyasError("every prompt ended in an error before any output: the target's logits are not finite",
                        "check the target's weights (a NaN or inf value) and config, or try --dtype float32")
    print(f"\n{n} tokens in {spec_s:.2f} s: {n / spec_s:.1f} tok/s" + (" (speculative)" if s.speculative else ""))
    if s.speculative:
        from .engine.stats import SpecStats

        total = SpecStats()
        for o in outs:
            total.add(o.stats)
        print(f"acceptance length (tau): {total.accept_length:.2f}   acceptance rate: {total.accept_rate:.3f}   "
              f"accepted per position: {total.accepted_per_position}")
        if baseline is not None:
            nb = sum(len(o.output_ids) for o in baseline)
            speedup = f"{(n / spec_s) / (nb / base_s):.2f}x" if n and nb else "- (no tokens to compare)"
            print(f"baseline (no speculation): {nb / base_s:.1f} tok/s   speedup: {speedup}")
            if params.greedy:
                same = all(a.output_ids == b.output_ids for a, b in zip(outs, baseline))
                print(f"greedy outputs identical to the baseline: {'yes' if same else 'NO'}")
    return 0
