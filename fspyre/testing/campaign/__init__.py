"""The random-program campaign: seeded programs, three oracles, classified outcomes.

    fspyre campaign --count 1000 --seed 0 --workers 2 --time-limit 600
    fspyre campaign --count 1000 --ray [--address HOST:PORT]      # on Ray
    fspyre campaign --count 1000 --shard 3/8 --json part3.jsonl   # one job of eight
    fspyre campaign --replay SEED

Each program (``generator.generate(seed)``) is compiled, checked and run; the outcome is one of

- ``ok``;
- ``refused``: compilation raised an ``FspyreError`` (a legitimate refusal), counted by cause;
- ``failure``: anything else, with a class:
  ``crash`` (a non-FspyreError exception anywhere), ``run_error`` (the compiled program raised
  at run time), ``memcheck:<kind>`` (``check_memory`` not clean), ``nondeterministic`` (two
  compilations differ), ``mutated_input``, and mismatches named after who disagrees:
  ``mismatch:run`` (the interpreter is off the numpy reference while ``evaluate`` is on it: the
  compiled program is wrong), ``mismatch:shared`` (interpreter and ``evaluate`` agree with each
  other but not with numpy: a semantics bug both share, or a reference bug), ``mismatch:eval``
  (only ``evaluate`` is off), ``inexact:pointwise`` (both within the bound, but a graph with no
  float reduction is not bit-identical between interpreter and ``evaluate``, which
  docs/semantics.md promises), ``lost_worker`` (the worker process running the seed died every
  time it ran it: ``fspyre.testing.engines``), ``proof_refuted`` (every oracle passed, but the
  static proof, ``fspyre.prove``, refutes the program: one of the two is wrong).

Each compiled program also records the proof's verdict (``Outcome.proof``: proved, refuted or
undecided; empty when it did not compile or islpy is missing).
"""

from __future__ import annotations

import re
import traceback
import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np

from fspyre.errors import FspyreError, FspyreWarning
from fspyre.testing import numpy_ref as R
from fspyre.testing.campaign.generator import Generated, generate

__all__ = ["Outcome", "check_generated", "classify_refusal", "generate", "lost_seed", "run_seed"]

# (cause, pattern on the message) in priority order; the first match names the refusal.
REFUSAL_CAUSES = (
    ("tile not whole sticks", r"cannot advance by one fixed address step|whole number of sticks|whole sticks"),
    # (an output-dim level inside a reduction-dim level, a consumer of a tiled reduction in its
    # nest and a tiled var compile since loop fission and spanning accumulators: no cause)
    ("reduction left invariant inside its reduction level", r"tiles no dim of .* but runs inside"),
    ("gather tiled over its reduction dim", r"no tile-by-tile combine"),
    ("dims of one level leave different tails", r"one loop cannot peel them all"),
    ("one level tiles output and reduction dim", r"tiles output dim .* and reduction dim .* at once"),
    ("one level tiles two dims of an op", r"at once; one counted loop"),
    ("reader not walking producer tiles", r"in tiles of .* moving|not one iteration variable per dim"),
    ("unmovable interloper", r"cannot reorder unhinted op"),
    ("work_div on a compiler-made helper op", r"^op \S+_(fill|combine|finish|copy)\d*: work_div"),
    ("work_div: dim the op does not iterate", r"work_div hint .* the op iterates .* not .* build it outside"),
    ("work_div: more slices than the dim has", r"work_div hint .* slices are more than dim"),
    ("work_div: other",
     r"work_div|reduction dims .* at most one reduction dim|may not be split|overrides the span split"),
    ("span limit", r"span limit"),
)


def classify_refusal(err: BaseException) -> str:
    msg = " ".join(str(err).split())
    for cause, pat in REFUSAL_CAUSES:
        if re.search(pat, msg):
            return cause
    return f"other {type(err).__name__}: {msg[:60]}"


@dataclass
class Outcome:
    seed: int
    status: Literal["ok", "refused", "failure", "generator"]
    cls: str = ""  # refusal cause or failure class
    detail: str = ""
    hinted: bool = False
    legal: bool = False
    features: frozenset[str] = field(default_factory=frozenset)
    proof: str = ""  # the static proof's verdict: proved | refuted | undecided ("" when not proved)

    # One JSON object per outcome (``--json``, the shards' files ``--merge`` reads), field by field:
    # a field added to Outcome travels without a change here.
    def to_json(self) -> dict[str, Any]:
        return {f.name: sorted(v) if isinstance(v := getattr(self, f.name), frozenset) else v for f in fields(self)}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Outcome:
        sets = {f.name for f in fields(cls) if str(f.type).startswith("frozenset")}
        values: dict[str, Any] = {k: frozenset(v) if k in sets else v for k, v in record.items()}
        return cls(**values)


def _first_diff(name: str, got: np.ndarray, ev: np.ndarray, ref: R.Ref, bad: np.ndarray) -> str:
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    g = np.asarray(got, dtype=np.float64)
    e = np.asarray(ev, dtype=np.float64)
    nbad = int(bad.sum())
    with warnings.catch_warnings():  # an all-NaN result is a finding, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        worst = np.nanmax(np.abs(g - ref.value)) if np.isfinite(g).any() else np.nan
    return (f"{name}{list(idx)} ({nbad}/{bad.size} elements): run={g[idx]!r} evaluate={e[idx]!r} "
            f"numpy={ref.value[idx]!r} bound={R.SAFETY * ref.err[idx]:.3g}; "
            f"max|run-numpy|={worst:.4g}")


def check_generated(gen: Generated, *, run=None, evaluate=None, prove: bool = True) -> Outcome:
    """Compile, memory-check, prove, run and compare one generated program. ``run``/``evaluate``
    default to fspyre's; tests pass others to prove the oracles can fail."""
    import fspyre
    from fspyre.ir.serialize import dumps
    from fspyre.machine.memcheck import check_memory

    run = run or fspyre.run
    evaluate = evaluate or fspyre.evaluate
    out = Outcome(seed=gen.seed, status="ok", hinted=gen.hinted, legal=gen.legal, features=gen.features)

    def fail(cls: str, detail: str) -> Outcome:
        out.status, out.cls, out.detail = "failure", cls, detail
        return out

    def compile_():
        # random hints are often redundant: their FspyreWarnings are expected, and kept as data
        # in the compilation, not printed once per program
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FspyreWarning)
            return fspyre.compile(gen.graph, gen.machine, tiling="auto", split_options=gen.split_options,
                                  allocation_options=gen.allocation_options)

    try:
        comp = compile_()
    except FspyreError as err:
        out.status, out.cls, out.detail = "refused", classify_refusal(err), " ".join(str(err).split())[:300]
        return out
    except Exception as err:  # noqa: BLE001 - any other exception is the finding
        return fail("crash", f"compile: {type(err).__name__}: {err}\n{traceback.format_exc(limit=-3)}")
    try:
        again = compile_()
        if again.program != comp.program or dumps(again.program) != dumps(comp.program):
            return fail("nondeterministic", "two compilations of the same graph differ")
        mem = check_memory(comp.program)
    except Exception as err:  # noqa: BLE001
        return fail("crash", f"recompile/memcheck: {type(err).__name__}: {err}")
    if not mem.clean:
        kinds = sorted({i.kind for i in mem.issues})
        return fail("memcheck:" + ",".join(kinds), str(mem.issues[0]))
    refutation = ""
    if prove and _has_islpy():
        try:
            proof = fspyre.prove(comp)
        except Exception as err:  # noqa: BLE001
            return fail("crash", f"prove: {type(err).__name__}: {err}\n{traceback.format_exc(limit=-3)}")
        out.proof = "proved" if proof.proved else "refuted" if proof.refuted else "undecided"
        refutation = str(proof.refuted[0]) if proof.refuted else ""
    before = {k: v.copy() for k, v in gen.inputs.items()}
    try:
        got = run(comp, gen.inputs)
    except FspyreError as err:
        return fail("run_error", f"{type(err).__name__}: {err}")
    except Exception as err:  # noqa: BLE001
        return fail("crash", f"run: {type(err).__name__}: {err}\n{traceback.format_exc(limit=-3)}")
    if any(not np.array_equal(before[k], gen.inputs[k]) or before[k].dtype != gen.inputs[k].dtype
           for k in before):
        return fail("mutated_input", "run changed an input array")
    try:
        ev = evaluate(gen.graph, gen.inputs, gen.machine)
    except Exception as err:  # noqa: BLE001
        return fail("crash", f"evaluate: {type(err).__name__}: {err}")
    exact = not ({"sum", "mean", "prod", "var", "matmul"} & gen.features)
    for name, ref in gen.refs.items():
        g, e = np.asarray(got[name]), np.asarray(ev[name])
        if g.shape != ref.value.shape:
            return fail("crash", f"{name}: run gave shape {g.shape}, expected {ref.value.shape}")
        run_ok, ev_ok = R.accept(g, ref), R.accept(e, ref)
        if not run_ok.all() or not ev_ok.all():
            same = np.array_equal(g.astype(np.float64), e.astype(np.float64), equal_nan=True)
            cls = ("mismatch:shared" if same or not ev_ok.all() and not run_ok.all()
                   else "mismatch:run" if not run_ok.all() else "mismatch:eval")
            return fail(cls, _first_diff(name, g, e, ref, ~(run_ok & ev_ok)))
        if exact and not np.array_equal(g.astype(np.float64), e.astype(np.float64), equal_nan=True):
            bad = g.astype(np.float64) != e.astype(np.float64)
            return fail("inexact:pointwise", _first_diff(name, g, e, ref, bad))
    if refutation:
        return fail("proof_refuted", refutation)
    return out


def lost_seed(seed: int, why: str) -> Outcome:
    """The outcome of a seed whose worker process died every time it ran (``fspyre.testing.engines``):
    a failure, so the campaign exits 1 and ``--replay SEED`` shows what it does to a process."""
    return Outcome(seed=seed, status="failure", cls="lost_worker", detail=why)


def _has_islpy() -> bool:
    import importlib.util

    return importlib.util.find_spec("islpy") is not None


def run_seed(seed: int) -> Outcome:
    try:
        gen = generate(seed)
    except Exception as err:  # noqa: BLE001 - a generator bug, reported apart from fspyre's
        return Outcome(seed=seed, status="generator", cls=type(err).__name__,
                       detail=f"{err}\n{traceback.format_exc(limit=-4)}")
    return check_generated(gen)
