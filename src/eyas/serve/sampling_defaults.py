"""What an OpenAI request samples with where it leaves a field out: the model's own recommendation, as vLLM serves.

A model's ``generation_config.json`` carries the sampling its makers recommend (Llama 3.1 Instruct: temperature
0.6, top_p 0.9; Qwen3: temperature 0.6, top_p 0.95, top_k 20). vLLM takes those as the defaults of every
OpenAI request (``--generation-config auto``, its default), and so does ``eyas serve``:

- ``--generation-config auto`` (default): the target's own ``generation_config.json`` (a model folder, or a hub
  model's cached copy), where it has one; a GGUF file's llama.cpp sampling metadata
  (general.sampling.*) is not read: --override-generation-config sets those values;
- ``--generation-config vllm`` (or ``openai``, ``none``): OpenAI's defaults, whatever the model says;
- ``--generation-config FOLDER``: that folder's ``generation_config.json``.

``--override-generation-config '{"temperature": 0.5}'`` (vLLM's flag) sets fields over either. The fields read
are vLLM's: temperature, top_p, top_k, min_p, repetition_penalty, and max_new_tokens (the default max_tokens);
the rest of the file (do_sample, num_beams, max_length, ...) is not a sampling default and is left alone, as
vLLM does. A request's own fields always win. ``/generate`` (SGLang's native API) keeps its documented
defaults. The banner prints what applies and where it came from, and ``/get_server_info`` returns it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..errors import EyasError
from ..sample.sampling import SamplingParams

FILE = "generation_config.json"
BUILT_IN = ("vllm", "openai", "none")  # --generation-config values that keep OpenAI's defaults (SGLang: openai)
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")  # SamplingParams' own names
FIELDS = (*SAMPLING_FIELDS, "max_tokens")
OPENAI_MAX_TEMPERATURE = 2.0  # OpenAI's bound on its routes; /generate keeps SamplingParams' own (SGLang's)


@dataclass(frozen=True)
class SamplingDefaults:
    """A request's sampling where it sends no value (OpenAI's, unless the model or the flags say otherwise)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = None  # None: the route's own default (chat: the rest of the context)
    source: str = "OpenAI's"  # where the values came from, for the banner

    def changed(self) -> dict:
        """The fields that differ from OpenAI's defaults."""
        base = SamplingDefaults()
        return {f: getattr(self, f) for f in FIELDS if getattr(self, f) != getattr(base, f)}

    def describe(self) -> str:
        """The banner's line."""
        changed = self.changed()
        if not changed:
            return f"sampling defaults: OpenAI's (temperature 1, top_p 1): {self.source}"
        values = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in changed.items())
        return (f"sampling defaults: {values} ({self.source}) where a request leaves them out; "
                "--generation-config vllm: OpenAI's")

    def as_json(self) -> dict:
        return asdict(self)


OPENAI = SamplingDefaults()  # what OpenAI's API does for a field left out


def sampling_defaults(choice: str | None, model_path: str | None, override: str | None = None) -> SamplingDefaults:
    """The defaults ``--generation-config CHOICE`` and ``--override-generation-config JSON`` ask for, for the target
    at ``model_path``. Raises ``EyasError`` for a file or an override that cannot be used, naming the fix."""
    choice = (choice or "auto").strip()
    defaults = SamplingDefaults(source=f"--generation-config {choice}")
    if choice.lower() in ("auto", "model"):
        found = model_file(model_path)
        defaults = (from_file(found, f"the target's {FILE}") if found is not None
                    else SamplingDefaults(source=f"the target has no {FILE}"))
    elif choice.lower() not in BUILT_IN:
        folder = Path(choice).expanduser()
        if not (folder / FILE).is_file():
            raise EyasError(f"--generation-config {choice!r}: no {FILE} in that folder",
                            f"name a folder holding {FILE}, or 'auto' (the model's own) or 'vllm' (OpenAI's)")
        defaults = from_file(folder / FILE, str(folder / FILE))
    if override:
        source = "--override-generation-config" if not defaults.changed() else f"{defaults.source} and the override"
        defaults = with_values(parse_override(override), defaults, "--override-generation-config", source)
    return defaults


def model_file(model_path: str | None) -> Path | None:
    """The target's ``generation_config.json``: in its folder, or a hub model's cached copy (never fetched)."""
    if not model_path:
        return None
    path = Path(model_path).expanduser()
    if path.is_dir():
        return path / FILE if (path / FILE).is_file() else None
    if path.exists() or model_path.count("/") != 1:  # a file (GGUF) or a built-in name: no generation config
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_path, FILE)
    except Exception:  # noqa: BLE001 - not a repo id the cache knows
        return None
    return Path(cached) if isinstance(cached, str) else None


def from_file(path: Path, label: str) -> SamplingDefaults:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise EyasError(f"{path} cannot be read as JSON ({e})",
                        "fix the file, or serve with --generation-config vllm (OpenAI's defaults)") from None
    if not isinstance(data, dict):
        raise EyasError(f"{path} holds no JSON object", "fix the file, or serve with --generation-config vllm")
    values = {k: data[k] for k in SAMPLING_FIELDS if data.get(k) is not None}
    if data.get("max_new_tokens") is not None:
        values["max_tokens"] = data["max_new_tokens"]
    return with_values(values, SamplingDefaults(), str(path), label if values else f"{label} sets none")


def parse_override(text: str) -> dict:
    try:
        values = json.loads(text)
    except ValueError as e:
        raise EyasError(f"--override-generation-config is not JSON ({e})",
                        """pass an object, e.g. --override-generation-config '{"temperature": 0.6, "top_p": 0.9}'"""
                        ) from None
    if not isinstance(values, dict):
        raise EyasError("--override-generation-config must be a JSON object", """e.g. '{"temperature": 0.6}'""")
    if "max_new_tokens" in values:
        values["max_tokens"] = values.pop("max_new_tokens")
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise EyasError(f"--override-generation-config names {', '.join(unknown)}, which are not sampling defaults",
                        f"set only {', '.join(SAMPLING_FIELDS)} or max_new_tokens")
    return values


def with_values(values: dict, defaults: SamplingDefaults, where: str, source: str) -> SamplingDefaults:
    """``defaults`` with ``values`` set, held to what a request's own fields are held to: OpenAI's temperature
    range and ``SamplingParams``' checks."""
    fix = ("""--override-generation-config with a valid value (e.g. '{"temperature": 0.7}'), or --generation-config """
           "vllm (OpenAI's defaults)")
    out = {}
    for name, value in values.items():
        integral = name in ("top_k", "max_tokens")
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or (integral and not float(value).is_integer())):
            raise EyasError(f"{where} sets {name} to {value!r}; it must be {'an integer' if integral else 'a number'}",
                            fix)
        out[name] = int(value) if integral else float(value)
    if not 0 <= out.get("temperature", 0.0) <= OPENAI_MAX_TEMPERATURE:
        raise EyasError(f"{where} sets temperature to {out['temperature']:g}; it must be in [0, "
                        f"{OPENAI_MAX_TEMPERATURE:g}] (OpenAI's range)", fix)
    if out.get("max_tokens", 1) < 1:
        raise EyasError(f"{where} sets max_tokens to {out['max_tokens']}; it must be at least 1", fix)
    try:
        SamplingParams(**{k: v for k, v in out.items() if k in SAMPLING_FIELDS})
    except EyasError as e:
        raise EyasError(f"{where}: {e.problem}", fix) from None
    if out.get("top_k") == -1:
        out["top_k"] = 0
    return replace(defaults, **out, source=source)
