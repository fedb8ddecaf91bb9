"""``eyas train``: the recipe, overrides, resume, and torchrun for many GPUs.

    eyas train --recipe recipes/smollm2-135m-instruct.yaml --set data.path=data/smollm2
    torchrun --nproc-per-node 2 -m eyas train --recipe ... --resume runs/draft
"""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("train", help="train an EAGLE-3 draft (training-time test), on one GPU or many via torchrun")
    p.add_argument("--recipe", default=None, help="YAML recipe (see recipes/)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe key, e.g. --set optim.lr=3e-4 (repeat)")
    p.add_argument("--data", default=None, help="shortcut for --set data.path=...")
    p.add_argument("--output", default=None, help="shortcut for --set output=...")
    p.add_argument("--model-path", "--model", default=None, help="shortcut for --set target=...")
    p.add_argument("--resume", default=None, help="a run folder or one of its checkpoints/step-N")
    p.add_argument("--print-recipe", action="store_true", help="print the resolved recipe and exit")
    p.set_defaults(func=run)


def run(args) -> int:
    from .recipe import load_recipe

    overrides = list(args.set)
    for key, value in (("data.path", args.data), ("output", args.output), ("target", args.model_path)):
        if value is not None:
            overrides.append(f"{key}={value}")
    recipe = load_recipe(args.recipe, overrides)
    if args.print_recipe:
        import yaml

        print(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
        return 0
    from .trainer import Trainer

    trainer = Trainer(recipe)
    if args.resume:
        trainer.resume(args.resume)
    summary = trainer.fit()
    trainer.print(f"done: {summary['steps']} steps, {summary['tokens_per_s']:.0f} tokens/s on {summary['ranks']} rank(s); "
                  f"draft saved to {trainer.out / 'draft'}")
    if summary.get("heldout"):
        trainer.print(f"held-out accuracy per TTT step: {summary['heldout']['acc']}")
    trainer.ctx.close()
    return 0
