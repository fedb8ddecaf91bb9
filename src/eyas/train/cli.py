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
    p.add_argument("--resume", default=None,
                   help="a run folder (its newest intact checkpoint) or one of its checkpoints/step-N; without "
                        "--recipe, the run's recipe.yaml")
    p.add_argument("--allow-pickle", action="store_true",
                   help="resume from a checkpoint of an older eyas (its state.pt needs NumPy objects unpickled)")
    p.add_argument("--allow-recipe-change", action="store_true",
                   help="resume although the recipe differs from the checkpoint's (the new values apply)")
    p.add_argument("--print-recipe", action="store_true", help="print the resolved recipe and exit")
    p.set_defaults(func=run)


def run(args) -> int:
    from .recipe import load_recipe

    overrides = list(args.set)
    for key, value in (("data.path", args.data), ("output", args.output), ("target", args.model_path)):
        if value is not None:
            overrides.append(f"{key}={value}")
    recipe_file = args.recipe
    if args.resume and recipe_file is None:
        from .checkpoint import run_recipe

        recipe_file = run_recipe(args.resume)
        if recipe_file is None:
            from ..errors import EyasError

            raise EyasError(f"--resume {args.resume}: no recipe.yaml in that run folder to resume with",
                            "pass the run's --recipe and the same --set overrides it was started with")
        overrides.insert(0, f"output={recipe_file.parent}")  # the run continues where it is now
    recipe = load_recipe(recipe_file, overrides)
    if args.print_recipe:
        import yaml

        print(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
        return 0
    from .trainer import Trainer

    trainer = Trainer(recipe)
    if args.resume:
        trainer.resume(args.resume, args.allow_pickle, args.allow_recipe_change)
    summary = trainer.fit()
    trainer.print(f"done: {summary['steps']} steps, {summary['tokens_per_s']:.0f} tokens/s on {summary['ranks']} rank(s); "
                  f"draft saved to {trainer.out / 'draft'}")
    if summary.get("heldout"):
        trainer.print(f"held-out accuracy per TTT step: {summary['heldout']['acc']}")
    trainer.ctx.close()
    return 0
