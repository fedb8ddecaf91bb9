"""``eyas`` command line: one subcommand per capability, each defined beside its code.

A subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func(args) -> int``. Errors of type ``EyasError`` print as a message and a fix, without a
traceback, and exit with status 2. An unknown flag is reported under the subcommand's own usage,
with the closest flag it has when one is close (``Parser``).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import sys
from pathlib import Path

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


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that refuses unknown arguments itself, so a subcommand's mistake is printed under
    that subcommand's usage (argparse would hand them up to the top-level parser), with a suggestion.

    With ``config_file=True`` it reads ``--config FILE`` as SGLang's ``launch_server`` does: a YAML or JSON
    mapping of flag names to values, placed before the command line's own flags, which therefore win.
    The values the file set are kept as ``namespace.config_values`` ({dest: value})."""

    def __init__(self, *args, config_file: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.config_file = config_file

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        values: dict = {}
        if self.config_file:
            args, values, path = with_config_file(self, args)
            options = {o for a in self._actions if a.dest in values for o in a.option_strings}
            self._from_file = (path, options)  # what ``error`` names
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(unrecognized(self, extras))
        if self.config_file:
            namespace.config_values = values
        return namespace, extras

    def error(self, message: str):
        """argparse's error; for a flag the config file sets, naming the file (its value may be the wrong one)."""
        path, options = getattr(self, "_from_file", (None, ()))
        flag = message.split(":", 1)[0].removeprefix("argument ")
        if path and any(o in options for o in flag.split("/")):
            message += f" (--config {path} sets {flag})"
        super().error(message)

    def flags(self) -> list[str]:
        return [s for a in self._actions for s in a.option_strings if s.startswith("--")]


def unrecognized(parser: Parser, extras: list[str]) -> str:
    """'unrecognized arguments: ...', naming the closest flag of this command for each unknown one."""
    hints = []
    for arg in extras:
        if arg.startswith("-"):
            close = difflib.get_close_matches(arg.split("=", 1)[0], parser.flags(), n=1, cutoff=0.75)
            if close:
                hints.append(f"{arg.split('=', 1)[0]}: did you mean {close[0]}?")
    return "unrecognized arguments: " + " ".join(extras) + "".join(f"\n  {h}" for h in hints)


def with_config_file(parser: Parser, argv: list[str]) -> tuple[list[str], dict, str | None]:
    """(the file's flags + ``argv``, {dest: value} the file set, the file) for ``--config FILE`` in ``argv``."""
    at = [i for i, a in enumerate(argv) if a == "--config" or a.startswith("--config=")]
    if not at:
        return argv, {}, None
    if len(at) > 1:
        raise EyasError("--config is given more than once", "merge the files into one")
    arg = argv[at[0]]
    path = arg.split("=", 1)[1] if "=" in arg else (argv[at[0] + 1] if at[0] + 1 < len(argv) else None)
    if path is None:
        return argv, {}, None  # argparse reports the missing value
    tokens, values = [], {}
    options = {o.lstrip("-").replace("-", "_"): (a, o) for a in parser._actions for o in a.option_strings
               if o.startswith("--") and o not in ("--help", "--config")}
    for key, value in read_config_file(path).items():
        name = str(key).replace("-", "_")
        if name not in options:
            close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.75)
            raise EyasError(f"--config {path}: unknown key {key!r}" + (f" (did you mean {close[0]}?)" if close else ""),
                            "keys are this command's flag names without the leading dashes, e.g. port: 30001 or "
                            "speculative-num-steps: 3 (see --help)")
        action, option = options[name]
        tokens += config_tokens(path, key, action, option, value)
        values[action.dest] = value
    return tokens + argv, values, path


def config_tokens(path: str, key, action: argparse.Action, option: str, value) -> list[str]:
    """The command-line form of one ``key: value`` of a config file (argparse then checks it as any flag)."""
    if action.nargs == 0:  # store_true and friends
        if not isinstance(value, bool):
            raise EyasError(f"--config {path}: {key} is a switch and takes true or false, got {value!r}",
                            f"write {key}: true")
        if value:
            return [option]
        # false: a plain switch stays off; --x/--no-x (BooleanOptionalAction) takes its other spelling
        return [o for o in action.option_strings if o.startswith("--no-") != option.startswith("--no-")][:1]
    if value is None:
        return []
    if isinstance(value, bool):
        raise EyasError(f"--config {path}: {key} takes a value, not {str(value).lower()}", f"see {option} in --help")
    if isinstance(value, list) and action.nargs in ("+", "*"):
        return [option, *map(str, value)]
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return [f"{option}={text}"]


def read_config_file(path: str) -> dict:
    import yaml

    file = Path(path).expanduser()
    if not file.is_file():
        raise EyasError(f"--config {path}: no such file", "pass the path of a YAML or JSON file of flags")
    try:
        text = file.read_text(encoding="utf-8")
        data = json.loads(text) if file.suffix.lower() == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as e:
        raise EyasError(f"--config {path} cannot be read: {type(e).__name__}: {str(e)[:300]}",
                        "write a YAML (or .json) mapping of flag names to values") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise EyasError(f"--config {path} holds a {type(data).__name__}, not a mapping of flags",
                        "write one flag per line, e.g. port: 30001")
    return data


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="eyas", description="Train, serve and verify EAGLE-3 draft models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
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
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 0
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
