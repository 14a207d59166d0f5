"""The ``Proof`` artifact: per property of a compiled program, proved, refuted with a
concrete counterexample, or undecided with the reason (docs/proof.md)."""

from __future__ import annotations

from dataclasses import dataclass

from fspyre.errors import FspyreError
from fspyre.ir.frozen import require_tuple

VERDICTS = ("proved", "refuted", "undecided")
PROPERTIES = ("memory_safety", "coverage", "dataflow")


@dataclass(frozen=True, slots=True, kw_only=True)
class Counterexample:
    """One access that breaks a property: the op and tensor, the iteration of each enclosing
    loop (outermost first), the core (-1: none), the op's iteration point (its symbols, in
    ``iteration_space`` order), the memory and byte address, and the symbolic sizes it needs
    (``sizes``: ``(dim, size)`` pairs; empty in a concrete program)."""

    op: str
    tensor: str
    iteration: tuple[int, ...]
    core: int
    point: tuple[int, ...]
    memory: str
    address: int
    sizes: tuple[tuple[str, int], ...] = ()

    def __str__(self) -> str:
        at = f" at {', '.join(f'|{d}|={n}' for d, n in self.sizes)}" if self.sizes else ""
        core = f" core {self.core}" if self.core >= 0 else ""
        return (f"op {self.op} tensor {self.tensor} iteration {list(self.iteration)}{core} point {list(self.point)} "
                f"{self.memory} address {self.address:#x}{at}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PropertyResult:
    """``verdict``: proved | refuted | undecided. ``reason`` says what was shown, what breaks
    it (with ``counterexample``) or why nothing could be decided."""

    name: str
    verdict: str
    reason: str
    counterexample: Counterexample | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise FspyreError(f"property {self.name}: verdict {self.verdict!r:.40} must be one of {list(VERDICTS)}")
        if (self.verdict == "refuted") != (self.counterexample is not None) and self.verdict != "undecided":
            raise FspyreError(f"property {self.name}: a refuted property carries a counterexample, a proved one none")

    def __str__(self) -> str:
        tail = f"\n    counterexample: {self.counterexample}" if self.counterexample is not None else ""
        return f"{self.name}: {self.verdict.upper()} -- {self.reason}{tail}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Proof:
    """The static proof of one program: one ``PropertyResult`` per property, in
    ``PROPERTIES`` order. ``assumptions``: the facts about symbolic sizes it holds under."""

    program: str
    properties: tuple[PropertyResult, ...]
    assumptions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        require_tuple(self.properties, f"proof of {self.program}: properties", FspyreError, PropertyResult)

    @property
    def proved(self) -> bool:
        return all(p.verdict == "proved" for p in self.properties)

    @property
    def refuted(self) -> tuple[PropertyResult, ...]:
        return tuple(p for p in self.properties if p.verdict == "refuted")

    def __getitem__(self, name: str) -> PropertyResult:
        for p in self.properties:
            if p.name == name:
                return p
        raise KeyError(name)

    def __str__(self) -> str:
        head = "PROVED" if self.proved else "REFUTED" if self.refuted else "UNDECIDED"
        under = f" (for all sizes with {'; '.join(self.assumptions)})" if self.assumptions else ""
        return "\n".join([f"proof of {self.program}: {head}{under}"] + [f"  {p}" for p in self.properties])
