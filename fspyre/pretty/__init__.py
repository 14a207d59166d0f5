"""Printers: data -> text. ``pretty`` prints any stage artifact (compact or detailed),
``to_dot`` draws a graph or loop tree for graphviz, ``render`` runs ``dot`` when present."""

from html import escape

from fspyre.pretty.dot import render, svg, to_dot
from fspyre.pretty.text import pretty


def html_text(text: str) -> str:
    """Printed text as a notebook's HTML: preformatted, escaped."""
    return f"<pre>{escape(text)}</pre>"


__all__ = ["html_text", "pretty", "render", "svg", "to_dot"]
