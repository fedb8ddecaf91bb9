"""EAGLE-3 draft folders in the field's formats (eyas, SGLang/SpecForge, vLLM's speculators, the official
release): ``read`` recognises, reads and loads them, ``write`` writes eyas's drafts out in each, ``names``
holds what each ecosystem calls a draft's parts, ``checks`` a folder's tensor checks. The engine never
imports this package: the draft it runs is built here and handed down."""

from .read import DraftFolder, build_draft, detect_format, load_draft, read_config, read_draft

__all__ = ["DraftFolder", "build_draft", "detect_format", "load_draft", "read_config", "read_draft"]
