"""Model output rendered as Markdown on the server, so that it can never inject markup.

markdown-it-py (CommonMark, imported on first use: an optional extra) with raw HTML off:
``<script>`` in a response becomes the text ``&lt;script&gt;``.  Images are off too (an
image would make the browser fetch a URL the model wrote; the page's CSP would refuse it
anyway), and links keep markdown-it's check that refuses ``javascript:``, ``vbscript:``,
``file:`` and ``data:`` URLs.  The result is the only HTML of the viewer not escaped by
Jinja, which is why it comes from one function with those settings fixed.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from markupsafe import Markup

from ..errors import MissingDependencyError, extra_hint

__all__ = ["markdown_available", "render_markdown"]

#: Longest text rendered as Markdown; a longer one is shown as plain text.  Rendering is
#: CPU-bound and can be slow on hostile input (a 64 KiB table: about 0.2 s on this project's
#: benchmark machine, an 800 KB one 14 s), so both one text and one page are bounded.
MAX_MARKDOWN = 64 << 10
#: Most text one page renders as Markdown (a group page shows up to 256 responses); past it
#: the page's further responses are shown as plain text.
MAX_MARKDOWN_PAGE = 512 << 10


@lru_cache(maxsize=1)
def _renderer() -> Any:
    try:
        from markdown_it import MarkdownIt
    except ModuleNotFoundError as exc:
        raise MissingDependencyError(
            "rendering Markdown needs markdown-it-py; " + extra_hint("lens")
        ) from exc
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable("table")
    md.disable("image")
    return md


def markdown_available() -> bool:
    """Whether markdown-it-py is installed."""
    try:
        _renderer()
    except MissingDependencyError:
        return False
    return True


def render_markdown(text: str) -> Markup:
    """``text`` as HTML from Markdown, raw HTML in it shown as text.

    Raises:
        MissingDependencyError: markdown-it-py is not installed.
    """
    return Markup(_renderer().render(text))  # html off: see the module docstring
