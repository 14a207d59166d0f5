"""The model zoo of issue 23: every family in ``tests/models/zoo.py`` (whole tiny models and MoE
blocks from ``transformers``, random weights) through both front ends, against eager.

Per family, each in a fresh process (CPU time, ``time.process_time``):
- capture: ``from_torch`` + ``fspyre.compile`` + a run on the interpreter: ok, or why not;
- torch.compile(backend="fspyre"): ops on fspyre / ops in eager (from the partition report;
  "all" when none is left in eager), the first call's time (trace, split, compile, run) and a
  later call's time, as a ratio to the eager call;
- the larger of the two paths' max |error| against float64 eager, and the tolerance: twice
  torch's own float32 error (tests/models/test_zoo.py derives that factor).

    python benchmarks/zoo.py [--tiling auto|none] [--timeout S] [family ...]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))

FACTOR = 2.0  # fspyre's float32 error may be twice torch's (test_zoo.py says why)


def _cpu(fn):
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def one(name: str, tiling: str) -> dict:
    """Measure one family (run in its own process)."""
    import numpy as np
    import torch
    from zoo import FAMILIES

    import fspyre
    from fspyre.frontend import capture
    from fspyre.frontend.dynamo import fspyre_backend

    warnings.simplefilter("ignore")
    fam = FAMILIES[name]
    module, args = fam.build(), fam.inputs()
    out: dict = {"name": name}
    with torch.no_grad():
        exact = copy.deepcopy(module).double()(*(a.double() if a.is_floating_point() else a for a in args))
        exact = exact.numpy()
        want, _ = _cpu(lambda: module(*args))
        _, eager_t = _cpu(lambda: module(*args))
        theirs = float(np.abs(want.double().numpy() - exact).max())
        out["tolerance"] = FACTOR * theirs
        out["eager_s"] = eager_t
        errors = []
        try:
            cap = capture(module, args)
            got = fspyre.run(fspyre.compile(cap.graph, fspyre.machine.spyre(cores=8), tiling=tiling),
                             cap.inputs(*args))[cap.output_names[0]]
            errors.append(float(np.abs(np.asarray(got, np.float64) - exact).max()))
            out["capture"] = "ok"
        except Exception as e:  # noqa: BLE001  (the table reports it)
            out["capture"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"
        reports = []

        def backend(gm, inputs):
            return fspyre_backend(gm, inputs, options={"tiling": tiling, "cores": 8, "on_report": reports.append})

        torch._dynamo.reset()
        try:
            compiled = torch.compile(module, backend=backend)
            got, first = _cpu(lambda: compiled(*args))
            _, later = _cpu(lambda: compiled(*args))
            errors.append(float(np.abs(got.double().numpy() - exact).max()))
            out["on_fspyre"] = sum(sum(r.on_fspyre) for r in reports)
            out["in_eager"] = sum(len(r.eager) for r in reports)
            out["eager_ops"] = sorted({f"{e.op} ({e.reason})" for r in reports for e in r.eager})
            out["compile_s"], out["call_s"] = first, later
        except Exception as e:  # noqa: BLE001
            out["compile"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"
    out["error"] = max(errors) if errors else None
    return out


def row(r: dict) -> str:
    if "timeout" in r:
        return f"| {r['name']} | timeout ({r['timeout']:.0f} s) | | | | |"
    ops = ("all " + str(r["on_fspyre"]) if r.get("in_eager") == 0 else
           f"{r['on_fspyre']} / {r['in_eager']}") if "on_fspyre" in r else r.get("compile", "?")[:60]
    cap = "ok" if r.get("capture") == "ok" else "no"
    err = r.get("error")
    within = "" if err is None else ("yes" if err <= r["tolerance"] else "NO")
    times = (f"{r['compile_s']:.1f} s | {r['call_s'] / r['eager_s']:.2g}x" if "compile_s" in r else " | ")
    tol = r["tolerance"]
    errors = "" if err is None else f"{err:.2g} / {tol:.2g} {within}"
    return f"| {r['name']} | {cap} | {ops} | {times} | {errors} |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("families", nargs="*")
    p.add_argument("--tiling", default="auto", choices=("none", "auto"))  # auto: compile as users call it
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--json", help="append each family's record to this file")
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.tiling)))
        return
    from zoo import FAMILIES

    names = a.families or list(FAMILIES)
    print(f"tiling={a.tiling}, load average {os.getloadavg()[0]:.1f}")
    print("| family | capture + compile + run | torch.compile: ops on fspyre / in eager | first call | "
          "later call vs eager | max error / tolerance |")
    print("|---|---|---|---|---|---|")
    for name in names:
        try:
            done = subprocess.run([sys.executable, __file__, "--one", name, "--tiling", a.tiling],
                                  capture_output=True, text=True, timeout=a.timeout)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            r = json.loads(lines[-1]) if lines else {"name": name, "capture": done.stderr.strip()[-160:],
                                                       "compile": "crashed", "tolerance": 0.0}
        except subprocess.TimeoutExpired:
            r = {"name": name, "timeout": a.timeout}
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(r) + "\n")
        print(row(r), flush=True)


if __name__ == "__main__":
    main()
