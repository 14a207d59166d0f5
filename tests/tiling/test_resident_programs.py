"""keep_resident's programs, pinned by digest: its jobs live in one module each (hoisting,
copies, pins, guards, trials), and moving code between them must not change a program.

Each entry is the SHA-256 of the serialized program (``fspyre.ir.serialize.dumps``: every op,
address, division and allocation) of the gallery (examples/*.py), the tiling examples and the
search's transformer block, compiled under `none`, the hints and `auto` on two machines. The
journal (tests/golden/test_resident_programs.txt) was recorded with keep_resident in one
module and holds unchanged with it split; a change to any stage that changes a program shows
here as a changed digest, beside the printed goldens that say what changed."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import pytest
from tiling_examples import EXAMPLES

import fspyre
from fspyre.frontend.files import load_torch_file
from fspyre.ir.serialize import dumps
from fspyre.machine.spyre import spyre
from fspyre.testing.transformer import transformer_stack

GALLERY = Path(__file__).resolve().parents[2] / "examples"
MACHINES = {"32c": spyre(), "4c64k": spyre(cores=4, lx_bytes=64 * 1024)}


def graphs() -> dict[str, fspyre.Graph]:
    out = {f"example.{name}": make() for name, make in EXAMPLES.items()}
    for path in sorted(GALLERY.glob("*.py")):
        if path.stem != "llama_decoder_layer":  # needs its S hint to capture
            out[f"gallery.{path.stem}"] = load_torch_file(path).graph
    out["transformer1"] = transformer_stack(1, seq=64, model=128, heads=2, hidden=256, hinted=True)
    return out


GRAPHS = graphs()


@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize("name", list(GRAPHS))
def test_the_program_digests_hold(name, machine, golden):
    lines = []
    for tiling in ("none", "hints", "auto"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                program = fspyre.compile(GRAPHS[name], MACHINES[machine], tiling=tiling).program
            except fspyre.FspyreError as err:
                lines.append(f"{tiling}: refused: {type(err).__name__}")
                continue
        lines.append(f"{tiling}: {hashlib.sha256(dumps(program).encode()).hexdigest()} {program!r}")
    golden.check(f"{name}.{machine}", "\n".join(lines))
