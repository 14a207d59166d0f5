"""What ``fspyre zoo`` does and prints (its flags are ``fspyre.cli``'s): every family of
``FAMILIES`` through both front ends against eager, each in a fresh process, anywhere the
engine flags say (``fspyre.testing.engines``), with a progress bar and a table.

Per family (CPU time, ``time.process_time``, in the family's own process):
- capture: ``from_torch`` + ``fspyre.compile`` + a run on the interpreter: ok, refused (an
  ``FspyreError``: the MoE blocks' data-dependent routing), or a crash;
- torch.compile(backend="fspyre"): ops on fspyre / ops in eager (from the partition report),
  the first call's time (trace, split, compile, run) and a later call's, against an eager call;
- the larger of the two paths' max |error| against float64 eager, and the tolerance: twice
  torch's own float32 error (tests/models/test_zoo.py derives that factor).

A family passes when no path crashed, torch.compile left no op in eager, and the error is
within the tolerance.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import Any, Literal

from tqdm import tqdm

FACTOR = 2.0  # fspyre's float32 error may be twice torch's (tests/models/test_zoo.py says why)


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilyVerdict:
    name: str
    tolerance: float = 0.0  # FACTOR x torch's float32 error against float64 eager
    error: float | None = None  # the larger of the paths' max |error| against float64 eager
    capture: str = ""  # "ok", "refused: why" or "crash: why" (from_torch + compile + run)
    compiled: str = ""  # "ok" or "crash: why" (torch.compile with the fspyre backend)
    on_fspyre: int = 0
    in_eager: int = 0
    eager_ops: tuple[str, ...] = ()
    eager_s: float = 0.0
    compile_s: float = 0.0  # first compiled call: trace, split, compile, run
    call_s: float = 0.0  # a later compiled call

    @property
    def ok(self) -> bool:
        return (not self.capture.startswith("crash") and self.compiled == "ok" and self.in_eager == 0
                and self.error is not None and self.error <= self.tolerance)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> FamilyVerdict:
        return cls(**{**record, "eager_ops": tuple(record.get("eager_ops", ()))})


def _cpu(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def _why(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"


def verify_family(name: str, tiling: Literal["none", "auto"] = "auto") -> FamilyVerdict:
    """One family both ways against float64 eager (8 cores). Never raises: what went wrong is
    in the verdict."""
    import numpy as np
    import torch

    import fspyre
    from fspyre.errors import FspyreError
    from fspyre.frontend import capture, clear_dim_names
    from fspyre.frontend.dynamo import fspyre_backend
    from fspyre.testing.zoo import FAMILIES

    warnings.simplefilter("ignore")
    clear_dim_names()
    torch._dynamo.reset()
    verdict = FamilyVerdict(name=name)
    try:
        fam = FAMILIES[name]
        module, args = fam.build(), fam.inputs()
    except Exception as err:  # noqa: BLE001 - a family that cannot be built (transformers changed)
        return replace(verdict, capture=f"crash: building it: {_why(err)}", compiled="not run")
    with torch.no_grad():
        exact = copy.deepcopy(module).double()(*(a.double() if a.is_floating_point() else a for a in args))
        exact = exact.numpy()
        want, _ = _cpu(lambda: module(*args))
        _, eager_s = _cpu(lambda: module(*args))
        theirs = float(np.abs(want.double().numpy() - exact).max())
        verdict = replace(verdict, tolerance=FACTOR * theirs, eager_s=eager_s)
        errors = []
        try:
            cap = capture(module, args)
            got = fspyre.run(fspyre.compile(cap.graph, fspyre.machine.spyre(cores=8), tiling=tiling),
                             cap.inputs(*args))[cap.output_names[0]]
            errors.append(float(np.abs(np.asarray(got, np.float64) - exact).max()))
            verdict = replace(verdict, capture="ok")
        except FspyreError as err:
            verdict = replace(verdict, capture=f"refused: {_why(err)}")
        except Exception as err:  # noqa: BLE001 - the verdict reports it
            verdict = replace(verdict, capture=f"crash: {_why(err)}")
        reports: list[Any] = []

        def backend(gm, inputs):
            return fspyre_backend(gm, inputs, options={"tiling": tiling, "cores": 8, "on_report": reports.append})

        torch._dynamo.reset()
        try:
            compiled = torch.compile(module, backend=backend)
            got, first = _cpu(lambda: compiled(*args))
            _, later = _cpu(lambda: compiled(*args))
            errors.append(float(np.abs(got.double().numpy() - exact).max()))
            verdict = replace(verdict, compiled="ok", on_fspyre=sum(sum(r.on_fspyre) for r in reports),
                              in_eager=sum(len(r.eager) for r in reports),
                              eager_ops=tuple(sorted({f"{e.op} ({e.reason})" for r in reports for e in r.eager})),
                              compile_s=first, call_s=later)
        except Exception as err:  # noqa: BLE001
            verdict = replace(verdict, compiled=f"crash: {_why(err)}")
    return replace(verdict, error=max(errors) if errors else None)


def lost_family(name: str, why: str) -> FamilyVerdict:
    """A family whose worker process died every time it ran (``fspyre.testing.engines``)."""
    return FamilyVerdict(name=name, capture=f"crash: {why}", compiled="not run")


HEADER = ("| family | capture + compile + run | torch.compile: ops on fspyre / in eager | first call | "
          "later call / eager | max error / tolerance |\n|---|---|---|---|---|---|")


def row(v: FamilyVerdict) -> str:
    ops = (f"all {v.on_fspyre}" if v.in_eager == 0 else f"{v.on_fspyre} / {v.in_eager}") if v.compiled == "ok" \
        else v.compiled[:60]
    cap = "ok" if v.capture == "ok" else "no" if v.capture.startswith("refused") else v.capture[:60]
    times = f"{v.compile_s:.1f} s | {v.call_s / v.eager_s:.2g}x" if v.compiled == "ok" and v.eager_s else " | "
    err = "" if v.error is None else f"{v.error:.2g} / {v.tolerance:.2g} {'yes' if v.error <= v.tolerance else 'NO'}"
    return f"| {v.name} | {cap} | {ops} | {times} | {err} |"


def zoo(args: argparse.Namespace) -> int:
    from fspyre.errors import BatchError
    from fspyre.testing.engines import Engine, Shard, run_batch

    try:
        from fspyre.testing.zoo import FAMILIES
    except ImportError as err:
        raise BatchError(f"fspyre zoo needs torch and transformers ({err}): pip install 'fspyre[dev]'") from None
    unknown = [n for n in args.families if n not in FAMILIES]
    if unknown:
        raise BatchError(f"unknown zoo families {', '.join(unknown)}; choose from {', '.join(FAMILIES)}")
    names = (args.shard or Shard()).of(args.families or list(FAMILIES))
    # a fresh process per family: Dynamo's caches and the front end's names start empty, and the
    # first call's time is a first call's
    engine = Engine(workers=args.workers, ray=args.ray, address=args.address, fresh=True)
    print(f"tiling={args.tiling}, load average {os.getloadavg()[0]:.1f}\n{HEADER}", flush=True)
    verdicts = []
    out = open(args.json, "w") if args.json else contextlib.nullcontext()
    progress = tqdm(total=len(names), desc="zoo", unit="family", disable=None)
    with out as f, progress, contextlib.closing(
            run_batch(partial(verify_family, tiling=args.tiling), names, engine, lost_family)) as stream:
        for v in stream:
            verdicts.append(v)
            if f is not None:
                f.write(json.dumps(v.to_json()) + "\n")
                f.flush()
            progress.set_postfix_str(v.name)
            progress.update()
            progress.write(row(v))  # above the bar, as each family completes
    bad = [v.name for v in verdicts if not v.ok]
    print(f"{len(verdicts) - len(bad)} of {len(verdicts)} families pass" + (f"; failing: {', '.join(bad)}" if bad
                                                                             else ""))
    return 1 if bad else 0
