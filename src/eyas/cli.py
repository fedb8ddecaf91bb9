"""``eyas`` command line: one subcommand per capability, each defined beside its code.

A subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func(args) -> int``. Errors of type ``EyasError`` print as a message and a fix, without a
traceback, and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import EyasError

# subcommand modules, in the order ``eyas --help`` lists them
COMMANDS = [
    "eyas.generate",
    "eyas.data.cli",
    "eyas.train.cli",
    "eyas.train.eval_cli",
    "eyas.serve.cli",
    "eyas.doctor.cli",
    "eyas.bench.cli",
    "eyas.bench.tune",
    "eyas.demo",
    "eyas.export",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eyas", description="Train, serve and verify EAGLE-3 draft models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (e.name == name or name.startswith(e.name + ".")):
                continue  # that capability is not part of this build
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except EyasError as e:
        print(f"eyas: error: {e.problem}", file=sys.stderr)
        if e.fix:
            print(f"  fix: {e.fix}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
