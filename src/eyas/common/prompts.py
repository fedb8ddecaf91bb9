"""Built-in prompt sets (chat, code, reasoning), written for eyas, and JSONL input.

Acceptance depends on the kind of text: code and lists are easier to draft than open prose, so a
benchmark should say which set it ran. A JSONL file holds one object per line with ``prompt``
(a string) or ``messages`` (OpenAI chat messages); the last user message is the prompt; an optional
``category`` (or ``source``) names the group its acceptance is reported under (``common.categories``).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import EyasError
from .categories import category_of

CHAT = [
    "Explain in a few sentences why the sky is blue.",
    "What are three good habits for getting better sleep?",
    "Write a short, friendly email inviting a colleague to lunch on Friday.",
    "Give me a packing list for a weekend hiking trip.",
    "What is the difference between weather and climate?",
    "Suggest five names for a small bakery that sells sourdough bread.",
    "How do I politely decline a meeting invitation?",
    "Describe the water cycle to a ten-year-old.",
    "What should I look for when buying a used bicycle?",
    "Summarise the plot of Romeo and Juliet in four sentences.",
    "Give me a simple recipe for tomato soup.",
    "What are the main benefits of regular exercise?",
    "Write a haiku about autumn leaves.",
    "How can I make my houseplants grow better?",
    "Explain what a budget is and how to start one.",
    "What is photosynthesis?",
    "Give three tips for a successful job interview.",
    "Write a two-sentence story about a lost cat finding its way home.",
    "Why do we have seasons on Earth?",
    "List the planets of the solar system in order from the Sun.",
    "How do vaccines help the body fight disease?",
    "What are some ways to reduce plastic waste at home?",
    "Explain the rules of tic-tac-toe.",
    "Write a thank-you note to a teacher.",
    "What is the capital of Japan, and what is it known for?",
    "How do I boil an egg so the yolk stays soft?",
    "Describe a peaceful morning at the beach.",
    "What are the primary colours, and how do they mix?",
    "Give me a short motivational message for a Monday morning.",
    "Explain how a rainbow forms.",
]

CODE = [
    "Write a Python function that returns the factorial of n.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that reverses a linked list.",
    "Write a JavaScript function that removes duplicates from an array.",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "Write a Python function that counts the words in a text file.",
    "Write a bash script that prints the five largest files in a directory.",
    "Write a Python class for a stack with push, pop and peek methods.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a function in C that swaps two integers through pointers.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function that flattens a nested list.",
    "Write a regular expression that matches an email address, and explain it.",
    "Write a Python function that computes the greatest common divisor of two numbers.",
    "Write a JavaScript function that debounces another function.",
    "Write a Python function that reads a CSV file and returns the average of one column.",
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that sorts a list of dictionaries by a key.",
    "Write an HTML page with a button that shows an alert when clicked.",
    "Write a Python function that converts Celsius to Fahrenheit, with a docstring.",
    "Write a binary search in Python.",
    "Write a Python generator that yields the lines of a file without newlines.",
    "Write a Rust function that returns the largest element of a slice.",
    "Write a Python function that counts how often each character appears in a string.",
    "Write a unit test with pytest for a function add(a, b).",
    "Write a Python function that validates a date string in YYYY-MM-DD format.",
    "Write a Go function that reverses a string.",
    "Write a Python function that returns the transpose of a matrix given as a list of lists.",
    "Write a Python decorator that prints how long a function took.",
    "Write a Python function that finds the second largest number in a list.",
]

REASONING = [
    "A train leaves at 3 pm and travels 180 km at 60 km/h. When does it arrive? Explain step by step.",
    "If a shirt costs 40 dollars after a 20 percent discount, what was the original price? Show your work.",
    "Tom is older than Ann, and Ann is older than Ben. Who is the youngest? Explain.",
    "What is 17 times 24? Work it out step by step.",
    "A rectangle has a perimeter of 30 cm and a width of 5 cm. What is its area? Explain.",
    "If it takes 5 machines 5 minutes to make 5 widgets, how long do 100 machines take to make 100 widgets?",
    "Is 91 a prime number? Explain your reasoning.",
    "A farmer has 17 sheep and all but 9 run away. How many are left? Explain.",
    "What is the next number in the sequence 2, 6, 12, 20, 30? Explain the pattern.",
    "Sarah has twice as many apples as John. Together they have 18. How many does each have?",
    "A car uses 6 litres of fuel per 100 km. How much fuel does it need for 350 km? Show the steps.",
    "Which is larger, 3/8 or 5/12? Explain.",
    "If today is Wednesday, what day of the week will it be in 100 days? Explain.",
    "A recipe for 4 people needs 300 g of flour. How much is needed for 10 people? Explain.",
    "Three friends split a bill of 84 dollars with a 15 percent tip. How much does each pay?",
    "What is the sum of the integers from 1 to 100? Explain the method.",
    "A clock shows 3:15. What is the angle between the hour and minute hands? Explain.",
    "If all bloops are razzies and all razzies are lazzies, are all bloops lazzies? Explain.",
    "How many minutes are there in a week? Show the calculation.",
    "A tank fills in 6 hours with one pipe and 3 hours with another. How long with both? Explain.",
    "What is 15 percent of 240? Explain two ways to compute it.",
    "Two dice are rolled. What is the probability that the sum is 7? Explain.",
    "An investment of 1000 dollars grows 10 percent a year. What is it worth after 3 years? Show the steps.",
    "A snail climbs 3 m up a well each day and slips 2 m each night. The well is 10 m deep. When does it get out?",
    "If x + 2y = 10 and x - y = 1, what are x and y? Solve step by step.",
    "A bat and a ball cost 1.10 dollars; the bat costs 1 dollar more than the ball. What does the ball cost?",
    "How many handshakes happen when 6 people each shake hands once with everyone else? Explain.",
    "What is the average of 12, 15, 20 and 33? Explain.",
    "A shop sells pens in packs of 3 for 2 dollars. How much do 12 pens cost? Explain.",
    "Convert 2.5 hours into minutes and seconds. Explain.",
]

SETS = {"chat": CHAT, "code": CODE, "reasoning": REASONING}


def builtin_set(name: str) -> list[tuple[str, str]] | None:
    """A built-in set by name, or ``all`` for every set interleaved, as (set name, prompt) pairs;
    None when ``name`` is neither."""
    if name == "all":
        return [pair for group in zip(*([(n, p) for p in prompts] for n, prompts in SETS.items())) for pair in group]
    if name in SETS:
        return [(name, p) for p in SETS[name]]
    return None


def prompt_set(name: str) -> list[str]:
    """A built-in set by name, ``all`` for every set interleaved, or a JSONL file path."""
    return [p for p, _ in prompt_records(name)]


def prompt_records(name: str) -> list[tuple[str, str | None]]:
    """``prompt_set`` with each prompt's category: a built-in set's name, a JSONL line's ``category_of``
    (None where the line has neither ``category`` nor ``source``)."""
    builtin = builtin_set(name)
    if builtin is not None:
        return [(p, set_name) for set_name, p in builtin]
    path = Path(name)
    if path.suffix in (".jsonl", ".json") or path.is_file():
        return read_jsonl_records(path)
    raise EyasError(f"unknown prompt set {name!r}", f"use one of {', '.join([*SETS, 'all'])}, or a .jsonl file")


def read_jsonl(path) -> list[str]:
    return [p for p, _ in read_jsonl_records(path)]


def read_jsonl_records(path) -> list[tuple[str, str | None]]:
    """(prompt, category or None) per line of a JSONL file."""
    path = Path(path)
    if not path.is_file():
        raise EyasError(f"prompt file {path} does not exist", "pass a JSONL file: one {\"prompt\": ...} per line")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise EyasError(f"{path}:{n} is not JSON: {e}", "one JSON object per line") from None
        text = rec.get("prompt") if isinstance(rec, dict) else None
        if text is None and isinstance(rec, dict) and isinstance(rec.get("messages"), list):
            users = [m.get("content") for m in rec["messages"] if isinstance(m, dict) and m.get("role") == "user"]
            text = users[-1] if users else None
        if not isinstance(text, str) or not text.strip():
            raise EyasError(f"{path}:{n} has no prompt",
                            "each line needs \"prompt\": \"...\" or \"messages\": [{\"role\": \"user\", ...}]")
        out.append((text, category_of(rec)))
    if not out:
        raise EyasError(f"{path} holds no prompts", "one {\"prompt\": ...} object per line")
    return out


def chat_ids(tokenizer, text: str) -> list[int]:
    """One user message as the target sees it: through its chat template when it has one, plain text otherwise."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=False)
        return tokenizer(rendered, add_special_tokens=False).input_ids
    return tokenizer(text).input_ids
