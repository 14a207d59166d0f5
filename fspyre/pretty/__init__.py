"""Printers: data -> text. ``pretty`` prints any stage artifact (compact or detailed),
``to_dot`` draws a graph or loop tree for graphviz, ``render`` runs ``dot`` when present."""

from fspyre.pretty.dot import render, to_dot
from fspyre.pretty.text import pretty

__all__ = ["pretty", "render", "to_dot"]
