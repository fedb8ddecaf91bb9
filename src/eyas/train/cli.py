"""``eyas train``: the recipe, overrides, resume, and torchrun for many GPUs.

    eyas train --recipe recipes/smollm2-135m-instruct.yaml --set data.path=data/smollm2
    torchrun --nproc-per-node 2 -m eyas train --recipe ... --resume runs/draft
    eyas train --plan --recipe ... --model KIMI_CONFIG_FOLDER --gpu-memory 141
"""

from __future__ import annotations

from pathlib import Path

from ..common.outputs import check_output_folder
from ..errors import EyasError


def register(sub) -> None:
    p = sub.add_parser("train", help="train an EAGLE-3 draft (training-time test), on one GPU or many via torchrun")
    p.add_argument("--recipe", default=None, help="YAML recipe (see recipes/)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe key, e.g. --set optim.lr=3e-4 (repeat)")
    p.add_argument("--data", default=None, help="shortcut for --set data.path=...")
    p.add_argument("--output", default=None, help="shortcut for --set output=...")
    p.add_argument("--model-path", "--model", default=None, help="shortcut for --set target=...")
    p.add_argument("--report-to", default=None, metavar="NAMES",
                   help="experiment trackers through accelerate, comma-separated: tensorboard, wandb, mlflow, "
                        "comet_ml, aim, clearml, dvclive, swanlab, trackio; none = log.jsonl only. Replaces the "
                        "recipe's log.trackers (and log.tensorboard)")
    p.add_argument("--run-name", default=None, help="the run's name in the trackers (default: the output folder's)")
    p.add_argument("--resume", default=None,
                   help="a run folder (its newest intact checkpoint) or one of its checkpoints/step-N; without "
                        "--recipe, the run's recipe.yaml")
    p.add_argument("--allow-pickle", action="store_true",
                   help="read .bin/.pt pickles: a target's or draft.init_from's weights, or an older eyas checkpoint "
                        "(its state.pt holds NumPy objects); refused by default since unpickling can run code")
    p.add_argument("--allow-recipe-change", action="store_true",
                   help="resume although the recipe differs from the checkpoint's (the new values apply)")
    p.add_argument("--print-recipe", action="store_true", help="print the resolved recipe and exit")
    p.add_argument("--plan", action="store_true",
                   help="print what the run needs (memory per GPU, offline storage, fewest GPUs) from the target's "
                        "config and the recipe, and exit; no weights are read")
    p.add_argument("--gpu-memory", type=float, default=None, metavar="GB",
                   help="--plan: memory of one GPU in GB (default 80; an H200 has 141)")
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="--plan: show the figures per GPU for N GPUs (default: the fewest that hold the run)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow Python code shipped in the target's folder (auto_map) to run; refused by default")
    p.set_defaults(func=run)


def run(args) -> int:
    from .recipe import load_recipe, nested

    overrides = list(args.set)
    check_shortcuts(args)
    for key, value in (("data.path", args.data), ("output", args.output), ("target", args.model_path),
                       ("log.run_name", args.run_name)):
        if value is not None:  # text as given: a path or a name is not YAML ('runs/a #2', '2024.10', 'on')
            overrides.append(nested(key, str(value)))
    if args.report_to is not None:  # as HF Trainer's --report_to: the flag is the whole choice
        names = [n.strip() for n in args.report_to.split(",") if n.strip() and n.strip().lower() != "none"]
        overrides += [f"log.trackers=[{', '.join(names)}]", "log.tensorboard=false"]
    recipe_file = args.recipe
    if args.resume and not Path(args.resume).exists():
        raise EyasError(f"--resume {args.resume}: no such run folder or checkpoint",
                        "pass a run's output folder (the run's recipe.yaml is read from it) or one of its "
                        "checkpoints/step-N")
    if args.resume and recipe_file is None:
        from .checkpoint import run_recipe

        recipe_file = run_recipe(args.resume)
        if recipe_file is None:
            raise EyasError(f"--resume {args.resume}: no recipe.yaml in that run folder to resume with",
                            "pass the run's --recipe and the same --set overrides it was started with")
        overrides.insert(0, {"output": str(recipe_file.parent)})  # the run continues where it is now
    recipe = load_recipe(recipe_file, overrides)
    if args.print_recipe:
        return print_recipe(recipe)
    if args.plan:
        return print_plan(recipe, args)
    if args.gpus is not None:  # a run on N GPUs is N processes; this flag only shapes --plan's figures
        raise EyasError(f"--gpus {args.gpus} only sets how many GPUs --plan figures for; it does not start a run "
                        "on several GPUs", f"train on {args.gpus} GPUs with torchrun --nproc-per-node "
                        f"{args.gpus} -m eyas train ..., or add --plan to see what {args.gpus} GPUs need")
    if args.gpu_memory is not None:  # the same: a --plan figure, no cap on what a run takes
        raise EyasError(f"--gpu-memory {args.gpu_memory:g} only sets the GPU size --plan figures for; a run takes "
                        "what its recipe needs", "add --plan to see what fits, or lower data.tokens_per_batch "
                        "to make a run smaller")
    from .checkpoint import check_branch, check_continues, check_new_output
    from .trainer import Trainer

    # a folder under a file, or a place nothing can be written, is said here: Trainer met it after loading the target
    check_output_folder(recipe.output, "--output" if args.output is not None else "the recipe's output")

    if recipe.train.device != "auto":  # a GPU asked for on a machine without one: said before anything loads
        from ..pipeline import check_device

        try:
            check_device(recipe.train.device)
        except EyasError as e:  # pipeline words it for --device; here the recipe key is what to change
            raise EyasError(e.problem.replace("--device", "train.device", 1),
                            (e.fix or "").replace("pass --device cpu", "--set train.device=cpu")) from None
    if not args.resume:
        check_new_output(recipe.output)
    else:
        if args.recipe is not None:
            check_continues(args.resume, recipe.output if args.output is None else None, args.recipe)
        check_branch(args.resume, recipe.output)
    trainer = Trainer(recipe, trust_remote_code=args.trust_remote_code, allow_pickle=args.allow_pickle)
    if args.resume:
        trainer.resume(args.resume, args.allow_pickle, args.allow_recipe_change)
        if trainer.step >= trainer.total_steps:  # a finished run: fit() would rewrite its summary without eval
            trainer.print(f"nothing to train: the checkpoint is at step {trainer.step} and the run has "
                          f"{trainer.total_steps} steps; {trainer.out} is left as it is (to train on, raise "
                          "train.max_steps or train.epochs with --set)")
            trainer.ctx.close()
            return 0
    try:
        summary = trainer.fit()
    except KeyboardInterrupt:
        from .checkpoint import _steps

        steps = _steps(trainer.out)
        trainer.print(f"interrupted at step {trainer.step}; " + (
            f"the newest checkpoint is {steps[0].name}: continue with eyas train --resume {trainer.out}" if steps
            else f"no checkpoint was saved yet: start again (with --output {trainer.out})"))
        raise
    trainer.print(f"done: {summary['steps']} steps, {summary['tokens_per_s']:.0f} tokens/s on {summary['ranks']} "
                  f"rank(s); draft saved to {trainer.out / 'draft'}")
    if summary.get("heldout"):
        trainer.print(f"held-out accuracy per TTT step: {summary['heldout']['acc']}")
    ctx = trainer.ctx
    del trainer  # its modules and their collectives go before the process group (DistContext.close)
    ctx.close()
    return 0


# the shortcut flags, each with the recipe keys it sets (a --set of one of them, or of its section, is refused)
SHORTCUTS = {"--data": ("data", ("data.path",)), "--output": ("output", ("output",)),
             "--model": ("model_path", ("target",)), "--run-name": ("run_name", ("log.run_name",)),
             "--report-to": ("report_to", ("log.trackers", "log.tensorboard"))}


def check_shortcuts(args) -> None:
    """A shortcut and a --set of the same key: the shortcut used to win without a word."""
    from .recipe import parse_override

    def sets(tree, key: str) -> bool:  # --set data.path=B, or --set 'data={path: B}'
        for part in key.split("."):
            if not isinstance(tree, dict) or part not in tree:
                return False
            tree = tree[part]
        return True

    for flag, (dest, keys) in SHORTCUTS.items():
        if getattr(args, dest) is None:
            continue
        for text in args.set:
            key = next((k for k in keys if sets(parse_override(text), k)), None)
            if key is not None:
                spelled = flag + ("/--model-path" if flag == "--model" else "")
                raise EyasError(f"{spelled} {getattr(args, dest)} and --set {text} both set the recipe's {key}",
                                f"keep one of them ({flag} is short for --set {keys[0]}=...)")


def print_recipe(recipe) -> int:
    """The resolved recipe, checked as a run checks it; only data.path may still be empty, since printing
    the defaults to start a recipe from is a use of its own."""
    import copy
    import sys

    import yaml

    checked = copy.deepcopy(recipe)
    checked.data.path = checked.data.path or "-"
    checked.validate()
    print(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
    if not recipe.data.path:
        print("note: data.path is empty: a run needs --data DATA (a folder from `eyas prepare`)", file=sys.stderr)
    return 0


def print_plan(recipe, args) -> int:
    import copy

    from .plan import GB, format_plan, make_plan

    checked = copy.deepcopy(recipe)
    checked.data.path = checked.data.path or "-"  # the plan needs no data
    checked.validate()
    args.gpu_memory = 80.0 if args.gpu_memory is None else args.gpu_memory
    if not 0 < args.gpu_memory < float("inf") or (args.gpus is not None and args.gpus < 1):  # nan, inf too
        raise EyasError(f"--gpu-memory {args.gpu_memory} / --gpus {args.gpus}: need a positive size and count",
                        "e.g. --gpu-memory 80 --gpus 8")
    plan = make_plan(recipe, int(args.gpu_memory * GB), args.gpus, args.trust_remote_code)
    print(format_plan(plan, recipe))
    return 0
