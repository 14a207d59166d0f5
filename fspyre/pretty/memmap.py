"""Memory maps as SVG: address against program time, one box per tensor over its lifetime.

``lx_memmap_svg``: each core's LX scratchpad. Time is the op index in program order (loop
bodies once, as the allocator counts it); a box spans its buffer's lifetime ``[start, end)`` and
its per-core bytes at its LX address. Cores whose maps are identical share one panel ("cores
0-31"); when cores hold different boxes (a producer running on fewer cores, uneven slices) each
distinct map gets its own panel. The address axis runs to the LX capacity, with the high-water
mark drawn; when the high water is under a quarter of the capacity a detail panel scaled to it
follows, so small buffers stay visible.

``hbm_memmap_svg``: the kernel's HBM, shared by every core: kernel arguments for the whole
program, pool intermediates over their lifetimes, the axis running to the program's HBM bytes.

Each box has its tooltip (``<title>``) once, in the most readable panel; every tensor is named
in the legend with its address range, bytes and lifetime, so a box too small for its label is
still identified. Plain SVG text, no graphviz; the same program always gives the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from fspyre.ir.program import Program
from fspyre.machine.formats import FORMATS
from fspyre.machine.memcheck import program_accesses
from fspyre.machine.rules import box_bytes, device_bytes, lx_box

_W, _LEFT, _RIGHT, _TOP, _BOTTOM = 1200, 100, 30, 34, 44  # chart width and margins, px
_TALL, _SHORT = 300, 90  # a panel's height; a capacity overview's when a detail panel follows
_MAX_TICKS = 40  # op-index labels along the time axis at most
_LEGEND_COLUMNS, _LEGEND_ROW = 3, 16


@dataclass(frozen=True, slots=True)
class _Box:
    name: str
    address: int
    nbytes: int
    live: tuple[int, int]


def _colour(i: int) -> str:
    """Distinct hues for any number of tensors (golden-angle steps), light enough for black text."""
    return f"hsl({(i * 137.508) % 360:.1f}, 60%, 62%)"


def _ranges(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    parts, start = [], 0
    for i in range(1, len(cores) + 1):
        if i == len(cores) or cores[i] != cores[i - 1] + 1:
            lo, hi = cores[start], cores[i - 1]
            parts.append(f"{lo}" if lo == hi else f"{lo}-{hi}")
            start = i
    return ", ".join(parts)


def _bytes(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def _panel(out: list[str], y0: int, height: int, title: str, boxes: Sequence[_Box], colours: dict[str, str],
           top: int, nops: int, high_water: int, tips: bool, what: str) -> None:
    """One chart: ``boxes`` over time ``[0, nops)`` and addresses ``[0, top)``."""
    x_of = _W / max(nops, 1)
    out.append(f'<text x="{_LEFT}" y="{y0 - 8}" font-size="12">{escape(title)}</text>')
    out.append(f'<rect x="{_LEFT}" y="{y0}" width="{_W}" height="{height}" fill="#fafafa" stroke="#333"/>')
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = y0 + height - frac * height
        out.append(f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_LEFT + _W}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_bytes(int(frac * top))}</text>')
    step = max(1, math.ceil(nops / _MAX_TICKS))
    for t in range(0, nops, step):
        x = _LEFT + (t + 0.5) * x_of
        out.append(f'<text x="{x:.1f}" y="{y0 + height + 15}" text-anchor="middle">{t}</text>')
    out.append(f'<text x="{_LEFT + _W / 2}" y="{y0 + height + 32}" text-anchor="middle">program time (op index)'
               f'</text>')
    for b in boxes:
        x, w = _LEFT + b.live[0] * x_of, (b.live[1] - b.live[0]) * x_of
        h = max(b.nbytes * height / top, 2.0)
        y = y0 + height - (b.address + b.nbytes) * height / top
        span = f"{b.name}: {what} [{b.address}, {b.address + b.nbytes}) live [{b.live[0]}, {b.live[1]})"
        tip = f"<title>{escape(span)}</title>" if tips else ""
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{colours[b.name]}" '
                   f'stroke="#222" stroke-width="0.5">{tip}</rect>')
        if h >= 13 and w >= 7 * len(b.name) + 6:
            out.append(f'<text x="{x + 3:.1f}" y="{y + min(h, 26) / 2 + 4:.1f}">{escape(b.name)}</text>')
    if 0 < high_water <= top:
        y = y0 + height - high_water * height / top
        out.append(f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_LEFT + _W}" y2="{y:.1f}" stroke="#c00" '
                   f'stroke-dasharray="6,3"/>')
        out.append(f'<text x="{_LEFT + _W - 4}" y="{y - 4:.1f}" text-anchor="end" fill="#c00">high water '
                   f'{_bytes(high_water)}</text>')


def _legend(out: list[str], y0: int, boxes: dict[str, _Box], colours: dict[str, str]) -> int:
    """Every tensor with its colour, address range, bytes and lifetime; returns the height used."""
    out.append(f'<text x="10" y="{y0 + 4}" font-size="12">legend</text>')
    texts = {b.name: f"{b.name}: {_bytes(b.nbytes)} at {b.address}, ops {b.live[0]}-{b.live[1] - 1}"
             for b in boxes.values()}
    width = _LEFT + _W
    columns = max(1, min(_LEGEND_COLUMNS, width // (7 * max(map(len, texts.values())) + 30)))
    rows = math.ceil(len(boxes) / columns)
    for i, b in enumerate(boxes.values()):
        x, y = 10 + (i // rows) * (width // columns), y0 + 12 + (i % rows) * _LEGEND_ROW
        out.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{colours[b.name]}" stroke="#222" '
                   f'stroke-width="0.5"/>')
        out.append(f'<text x="{x + 16}" y="{y + 10}">{escape(texts[b.name])}</text>')
    return 16 + rows * _LEGEND_ROW


def _document(title: str, panels: list[tuple[str, list[_Box]]], capacity: int, nops: int, what: str) -> str:
    every: dict[str, _Box] = {}
    for _, boxes in panels:
        for b in boxes:
            every.setdefault(b.name, b)
    colours = {n: _colour(i) for i, n in enumerate(every)}
    high = max((b.address + b.nbytes for _, boxes in panels for b in boxes), default=0)
    top = max(capacity, high, 128)
    detail = 0 < high < top / 4  # the capacity view alone would squeeze every box into its bottom quarter
    out: list[str] = []
    y = 30 + _TOP
    if not panels:
        out.append(f'<text x="10" y="{y}">no buffer lives in {what}</text>')
        y += 20
    for name, boxes in panels:
        height = _SHORT if detail else _TALL
        _panel(out, y, height, f"{name}: to capacity, {_bytes(top)}", boxes, colours, top, nops, high,
               tips=not detail, what=what)
        y += height + _TOP + _BOTTOM
        if detail:
            zoom = 1 << max(high - 1, 1).bit_length()  # the next power of two: round tick labels
            _panel(out, y, _TALL, f"{name}: detail, first {_bytes(zoom)}", boxes, colours, zoom, nops, high,
                   tips=True, what=what)
            y += _TALL + _TOP + _BOTTOM
    y += _legend(out, y, every, colours) if every else 0
    width, height = _LEFT + _W + _RIGHT, y + 10
    head = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="11">',
            f'<rect width="{width}" height="{height}" fill="#fff"/>',
            f'<text x="10" y="20" font-size="14">{escape(title)}</text>']
    return "\n".join(head + out + ["</svg>"]) + "\n"


def lx_memmap_svg(program: Program | object) -> str:
    """The LX map of a Program (or of a Compilation's program)."""
    program = getattr(program, "program", program)
    assert isinstance(program, Program)
    accesses, live, nops = program_accesses(program)
    sizes: dict[str, dict[int, int]] = {}  # tensor -> core -> bytes
    address: dict[str, int] = {}
    for acc in accesses:
        if acc.arg.memory != "lx":
            continue
        _, ext = lx_box(acc.lows, acc.highs, acc.arg.device_size)
        nbytes = box_bytes(ext, FORMATS[acc.arg.device_dtype].nbytes)
        per = sizes.setdefault(acc.arg.name, {})
        for c in range(len(nbytes)):
            if acc.cores[c]:
                per[c] = max(per.get(c, 0), int(nbytes[c]))
        address[acc.arg.name] = acc.arg.address
    names = list(sizes)
    groups: dict[tuple, list[int]] = {}
    for c in range(program.cores):
        sig = tuple((n, sizes[n][c]) for n in names if sizes[n].get(c))
        if sig:
            groups.setdefault(sig, []).append(c)
    panels = [(f"core {cores[0]}" if len(cores) == 1 else f"cores {_ranges(cores)}",
               [_Box(n, address[n], size, live[n]) for n, size in sig]) for sig, cores in groups.items()]
    high = max((b.address + b.nbytes for _, boxes in panels for b in boxes), default=0)
    title = (f"LX memory map of {program.name}: {len(names)} LX buffer(s), high water {high} of "
             f"{program.lx_bytes} bytes per core")
    return _document(title, panels, int(program.lx_bytes), nops, "LX")


def hbm_memmap_svg(program: Program | object) -> str:
    """The HBM map of a Program: kernel arguments for the whole program, intermediates while live."""
    program = getattr(program, "program", program)
    assert isinstance(program, Program)
    accesses, live, nops = program_accesses(program)
    args = {a.buffer for a in program.kernel_args}
    boxes: dict[str, _Box] = {}
    for acc in accesses:
        arg = acc.arg
        if arg.memory != "hbm" or arg.name in boxes:
            continue
        nbytes = device_bytes(arg.device_size, FORMATS[arg.device_dtype].nbytes)
        span = (0, nops) if arg.name in args else live[arg.name]
        boxes[arg.name] = _Box(arg.name, int(arg.address), int(nbytes), span)
    ordered = sorted(boxes.values(), key=lambda b: (b.address, b.live))
    title = (f"HBM memory map of {program.name}: {len(ordered)} tensor(s) in {program.hbm_bytes} bytes "
             f"(kernel arguments live throughout)")
    return _document(title, [("HBM", ordered)] if ordered else [], int(program.hbm_bytes), nops, "HBM")
