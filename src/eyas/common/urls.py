"""A server's base URL as a command line gives it (``--url``, ``--baseline-url`` of ``eyas doctor`` and
``eyas bench``)."""

from __future__ import annotations


def server_url(text: str) -> str:
    """``host:port`` as ``http://host:port`` (what curl and a browser assume), without a trailing slash: the
    routes are appended to it."""
    text = text.strip()
    if "://" not in text:
        text = "http://" + text
    return text.rstrip("/")
