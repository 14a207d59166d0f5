"""LX memory map as SVG: LX address against program time, one box per buffer.

Time is the op index in program order (loop bodies once, as the allocator counts it); a box
spans its buffer's lifetime ``[start, end)`` and its per-core bytes at its LX address. Cores
whose maps are identical share one panel ("cores 0-31"); when cores hold different boxes
(a producer running on fewer cores, uneven slices) each distinct map gets its own panel.
Plain SVG text, no graphviz; the same program always gives the same bytes.
"""

from __future__ import annotations

from html import escape

from fspyre.ir.program import Program
from fspyre.machine.formats import FORMATS
from fspyre.machine.memcheck import program_accesses
from fspyre.machine.rules import box_bytes, lx_box, program_timeline

_PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
            "#bab0ac")
_W, _H, _LEFT, _TOP, _BOTTOM = 720, 300, 90, 34, 56


def _ranges(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    parts, start = [], 0
    for i in range(1, len(cores) + 1):
        if i == len(cores) or cores[i] != cores[i - 1] + 1:
            lo, hi = cores[start], cores[i - 1]
            parts.append(f"{lo}" if lo == hi else f"{lo}-{hi}")
            start = i
    return ", ".join(parts)


def lx_memmap_svg(program: Program | object) -> str:
    """The LX map of a Program (or of a Compilation's program)."""
    program = getattr(program, "program", program)
    assert isinstance(program, Program)
    ops, _ = program_timeline(program)
    accesses, live, nops = program_accesses(program)
    boxes: dict[str, dict[int, int]] = {}  # tensor -> core -> bytes
    address: dict[str, int] = {}
    for acc in accesses:
        if acc.arg.memory != "lx":
            continue
        _, ext = lx_box(acc.lows, acc.highs, acc.arg.device_size)
        nbytes = box_bytes(ext, FORMATS[acc.arg.device_dtype].nbytes)
        per = boxes.setdefault(acc.arg.name, {})
        for c in range(len(nbytes)):
            if acc.cores[c]:
                per[c] = max(per.get(c, 0), int(nbytes[c]))
        address[acc.arg.name] = acc.arg.address
    names = list(boxes)
    panels: dict[tuple, list[int]] = {}
    for c in range(program.cores):
        sig = tuple((n, boxes[n][c]) for n in names if boxes[n].get(c))
        if sig:
            panels.setdefault(sig, []).append(c)
    top = max((address[n] + b for sig in panels for n, b in sig), default=0)
    ymax = max(top, 128)
    tmax = max(nops, 1)
    width = _LEFT + _W + 20
    height = max(len(panels), 1) * (_H + _TOP + _BOTTOM) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="11">',
           f'<text x="10" y="18" font-size="13">LX memory map of {escape(program.name)}: '
           f'{len(names)} LX buffer(s), high water {top} of {program.lx_bytes} bytes per core</text>']
    if not panels:
        out.append('<text x="10" y="44">no buffer lives in LX</text>')
    colour = {n: _PALETTE[i % len(_PALETTE)] for i, n in enumerate(names)}
    for p, (sig, cores) in enumerate(panels.items()):
        y0 = 30 + p * (_H + _TOP + _BOTTOM) + _TOP
        label = f"core {cores[0]}" if len(cores) == 1 else f"cores {_ranges(cores)}"
        out.append(f'<text x="{_LEFT}" y="{y0 - 8}" font-size="12">{label}</text>')
        out.append(f'<rect x="{_LEFT}" y="{y0}" width="{_W}" height="{_H}" fill="#fafafa" stroke="#333"/>')
        for t in range(tmax + 1):
            x = _LEFT + t * _W / tmax
            out.append(f'<line x1="{x:.1f}" y1="{y0 + _H}" x2="{x:.1f}" y2="{y0 + _H + 4}" stroke="#333"/>')
            if t < tmax:
                name = escape(ops[t][1].name or ops[t][1].op) if t < len(ops) else ""
                out.append(f'<text x="{x + _W / tmax / 2:.1f}" y="{y0 + _H + 16}" text-anchor="middle">{t}</text>')
                out.append(f'<text x="{x + _W / tmax / 2:.1f}" y="{y0 + _H + 28}" text-anchor="middle" '
                           f'fill="#666">{name}</text>')
        for frac in (0.0, 0.5, 1.0):
            tick_y = y0 + _H - frac * _H
            out.append(f'<text x="{_LEFT - 6}" y="{tick_y + 4:.1f}" text-anchor="end">{int(frac * ymax)}</text>')
        out.append(f'<text x="{_LEFT + _W / 2}" y="{y0 + _H + 44}" text-anchor="middle">program time (op index)</text>')
        out.append(f'<text x="14" y="{y0 + _H / 2}" transform="rotate(-90 14 {y0 + _H / 2})" '
                   f'text-anchor="middle">LX address (bytes)</text>')
        for n, size in sig:
            s, e = live[n]
            x = _LEFT + s * _W / tmax
            w = (e - s) * _W / tmax
            h = max(size * _H / ymax, 1.0)
            top_y = y0 + _H - (address[n] + size) * _H / ymax
            tip = f"{n}: LX [{address[n]}, {address[n] + size}) live [{s}, {e})"
            out.append(f'<rect x="{x:.1f}" y="{top_y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{colour[n]}" '
                       f'fill-opacity="0.75" stroke="#222"><title>{escape(tip)}</title></rect>')
            if h >= 12 and w >= 7 * len(n):
                out.append(f'<text x="{x + 4:.1f}" y="{top_y + min(h, 24) / 2 + 4:.1f}" fill="#000">{escape(n)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
