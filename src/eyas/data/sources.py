"""Built-in prompt sources that need no download: chatterbot-corpus, Python's own docs, and
prompts the target writes itself from a topic list (files of conversations are read by ``files``).

Every source yields records ``{"messages": [...], "source": "name:detail"}`` of one user turn
(answers come from regeneration); the part before ``:`` names the source in weights and summaries.
"""

from __future__ import annotations

import importlib
import inspect
import random
from collections.abc import Iterator
from pathlib import Path

from ..errors import EyasError

BUILTIN = ("chatterbot", "pydoc", "self")


def chatterbot(limit: int | None = None) -> Iterator[dict]:
    """Opening lines of chatterbot-corpus conversations (English), as user prompts."""
    try:
        import chatterbot_corpus
        import yaml
    except ImportError as e:
        raise EyasError(f"the chatterbot source needs {e.name}", "pip install chatterbot-corpus pyyaml") from None
    root = Path(chatterbot_corpus.__file__).parent / "data" / "english"
    n = 0
    for f in sorted(root.glob("*.yml")):
        data = yaml.safe_load(f.read_text()) or {}
        for conv in data.get("conversations") or []:
            if conv and isinstance(conv[0], str) and conv[0].strip():
                yield {"messages": [{"role": "user", "content": conv[0].strip()}], "source": f"chatterbot:{f.stem}"}
                n += 1
                if limit and n >= limit:
                    return


PYDOC_TEMPLATES = (
    "What does `{name}` do in Python? Show a short example.",
    "Explain `{name}` from the Python standard library, with an example of when to use it.",
    "How do I use `{name}` in Python?",
    "The Python docs say: \"{doc}\" Explain this in simpler words.",
    "Write a small Python program that uses `{name}` and explain it.",
    "What are common mistakes when using `{name}` in Python?",
)
SKIP_MODULES = ("test", "idlelib", "tkinter", "turtle", "antigravity", "this", "lib2to3", "ensurepip", "pydoc_data",
                "xxsubtype", "__")


def _stdlib_modules() -> list[str]:
    import sys

    names = sorted(getattr(sys, "stdlib_module_names", ()))
    return [n for n in names if not n.startswith(SKIP_MODULES) and not n.startswith("_")]


def _documented(mod_name: str, mod) -> Iterator[tuple[str, str]]:
    """(qualified name, first docstring paragraph) of public functions, classes and their methods."""
    for attr, obj in sorted(vars(mod).items()):
        if attr.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
            continue
        if getattr(obj, "__module__", mod_name) not in (mod_name, None):
            continue
        items = [(f"{mod_name}.{attr}", obj)]
        if inspect.isclass(obj):
            members = [(m, v) for m, v in sorted(vars(obj).items()) if not m.startswith("_") and callable(v)]
            items += [(f"{mod_name}.{attr}.{m}", v) for m, v in members[:8]]
        for name, o in items:
            doc = (inspect.getdoc(o) or "").strip().split("\n\n")[0].replace("\n", " ")
            if len(doc) >= 20:
                yield name, doc


def pydoc(limit: int | None = None, seed: int = 0, per_item: int = 2) -> Iterator[dict]:
    """Questions about documented public functions, classes and methods of the standard library."""
    rng = random.Random(seed)
    n = 0
    for mod_name in _stdlib_modules():
        try:
            mod = importlib.import_module(mod_name)
        except Exception:  # platform-specific or side-effecting modules: skip them
            continue
        for name, doc in _documented(mod_name, mod):
            for template in rng.sample(PYDOC_TEMPLATES, per_item):
                text = template.format(name=name, doc=doc[:300])
                yield {"messages": [{"role": "user", "content": text}], "source": f"pydoc:{mod_name}"}
                n += 1
                if limit and n >= limit:
                    return


TOPICS = (
    "cooking pasta", "baking bread", "gardening", "houseplants", "climate change", "the water cycle", "volcanoes",
    "black holes", "the solar system", "photosynthesis", "the human heart", "sleep", "nutrition", "running",
    "learning a language", "job interviews", "writing a resume", "personal budgeting", "saving for retirement",
    "the stock market", "inflation", "the Roman Empire", "ancient Egypt", "the French Revolution", "World War I",
    "the printing press", "electricity", "magnets", "how computers work", "the internet", "encryption",
    "machine learning", "neural networks", "databases", "SQL queries", "git", "Linux commands", "web development",
    "JavaScript", "Python lists", "recursion", "sorting algorithms", "binary search", "data structures",
    "prime numbers", "fractions", "geometry", "probability", "statistics", "calculus", "chess", "music theory",
    "learning the guitar", "painting", "photography", "writing poetry", "short stories", "book recommendations",
    "travel in Japan", "travel in Italy", "packing for a trip", "dogs", "cats", "birds", "oceans", "rainforests",
    "recycling", "renewable energy", "electric cars", "bicycles", "first aid", "the immune system", "vaccines",
    "meditation", "stress", "time management", "productivity", "public speaking", "negotiation", "friendship",
    "parenting", "email etiquette", "philosophy", "ethics", "logic puzzles", "riddles", "word definitions",
    "grammar", "translation", "emails to a colleague", "birthday messages", "summarizing a text", "jokes",
    "movies", "video games", "board games", "football", "basketball", "the Olympics", "coffee", "tea", "wine",
    "chemistry", "atoms", "DNA", "evolution", "dinosaurs", "earthquakes", "weather", "maps", "astronomy",
)
SELF_INSTRUCTION = ("Write one question that a curious person might ask an AI assistant about {topic}. "
                    "Reply with the question only.")


def self_instruct_requests(per_topic: int, topics=TOPICS) -> list[dict]:
    """The requests the target answers with a prompt of its own (see ``regenerate.self_prompts``)."""
    return [{"messages": [{"role": "user", "content": SELF_INSTRUCTION.format(topic=t)}], "source": f"self:{t}"}
            for t in topics for _ in range(per_topic)]


def builtin(name: str, limit: int | None = None) -> Iterator[dict]:
    if name == "chatterbot":
        return chatterbot(limit)
    if name == "pydoc":
        return pydoc(limit)
    raise EyasError(f"unknown prompt source {name!r}", f"use one of {', '.join(BUILTIN)} or a .jsonl path")
