"""``python -m fspyre.testing.campaign --count N --seed S [--jobs J] [--time-limit SEC]``
or ``--replay SEED``. Exit 1 on any failure (or generator error)."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import Counter

from tqdm import tqdm


def _replay(seed: int) -> int:
    import fspyre
    from fspyre.pretty import pretty
    from fspyre.testing.campaign import check_generated, generate

    gen = generate(seed)
    print(f"# seed {seed}: machine {gen.machine}, {gen.split_options}, {gen.allocation_options}")
    print(f"# hinted={gen.hinted} legal={gen.legal} features={sorted(gen.features)}")
    print("# builder calls:\n" + "\n".join("#   " + s for s in gen.source))
    print(pretty(gen.graph))
    out = check_generated(gen)
    print(f"\n{out.status}{': ' + out.cls if out.cls else ''}{' (proof: ' + out.proof + ')' if out.proof else ''}"
          f"\n{out.detail}")
    del fspyre
    return 1 if out.status in ("failure", "generator") else 0


# features that known bug classes hinge on, shown beside each failure to sort them quickly
SUSPECT = frozenset({"bool_raw", "cast_bool", "cast_int32", "const_neg_inf", "split", "merge", "permute", "pow",
                     "matmul", "nested_hint", "logical_not", "where"})


def _pct(n: int, d: int) -> str:
    return f"{100.0 * n / d:5.1f}%" if d else "   - "


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fspyre.testing.campaign", description=__doc__)
    p.add_argument("--count", type=int, default=1000, help="programs to try (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="first program seed; programs use SEED..SEED+N-1")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--time-limit", type=float, default=None, metavar="SEC", help="stop starting programs after SEC")
    p.add_argument("--replay", type=int, default=None, metavar="SEED", help="run one program verbosely")
    p.add_argument("--json", metavar="PATH", help="also write every outcome as JSON lines to PATH")
    p.add_argument("--show", type=int, default=3, help="failures printed per class (default 3)")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    if args.replay is not None:
        return _replay(args.replay)
    if args.count < 1 or args.jobs < 1:
        p.error("--count and --jobs must be >= 1")

    from fspyre.testing.campaign import run_seed

    seeds = range(args.seed, args.seed + args.count)
    start = time.monotonic()
    outcomes = []

    def expired() -> bool:
        return args.time_limit is not None and time.monotonic() - start > args.time_limit

    # progress on a terminal only (stderr; the report goes to stdout)
    progress = tqdm(total=len(seeds), desc="campaign", unit="seed", disable=None, delay=1.0)
    if args.jobs == 1:
        for s in seeds:
            if expired():
                break
            outcomes.append(run_seed(s))
            progress.update()
    else:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(args.jobs) as pool:
            for o in pool.imap(run_seed, seeds, chunksize=4):
                outcomes.append(o)
                progress.update()
                if expired():
                    pool.terminate()
                    break
    progress.close()
    elapsed = time.monotonic() - start
    if args.json:
        import json

        with open(args.json, "w") as f:
            for o in outcomes:
                f.write(json.dumps({"seed": o.seed, "status": o.status, "cls": o.cls, "hinted": o.hinted,
                                    "legal": o.legal, "features": sorted(o.features), "proof": o.proof,
                                    "detail": o.detail.strip().splitlines()[0][:300] if o.detail.strip() else ""})
                        + "\n")
    print(report(outcomes, elapsed, show=args.show))
    return 1 if any(o.status in ("failure", "generator") for o in outcomes) else 0


def report(outcomes, elapsed: float, show: int = 3) -> str:
    n = len(outcomes)
    status = Counter(o.status for o in outcomes)
    lines = [f"programs tried: {n} in {elapsed:.1f} s ({n / max(elapsed, 1e-9):.1f} programs/s); "
             f"ok {status['ok']}, refused {status['refused']}, failures {status['failure']}, "
             f"generator errors {status['generator']}"]
    proofs = Counter(o.proof for o in outcomes if o.proof)
    if proofs:
        lines.append(f"static proof: proved {proofs['proved']}, refuted {proofs['refuted']}, "
                     f"undecided {proofs['undecided']}")
    legal = [o for o in outcomes if o.hinted and o.legal]
    nref = sum(o.status == "refused" for o in legal)
    lines.append(f"hinted programs: {sum(o.hinted for o in outcomes)}; legal hinted (every count divides, "
                 f"work_div within the cores): {len(legal)}, of which refused {nref} ({_pct(nref, len(legal))})")
    causes = Counter(o.cls for o in outcomes if o.status == "refused")
    legal_causes = Counter(o.cls for o in legal if o.status == "refused")
    if causes:
        lines.append("refusals by cause:            all programs   legal hinted")
        for cause, k in causes.most_common():
            lines.append(f"  {cause[:60]:<60} {k:5d} {_pct(k, n)}  {legal_causes[cause]:5d} "
                         f"{_pct(legal_causes[cause], len(legal))}")
    fails = [o for o in outcomes if o.status in ("failure", "generator")]
    if fails:
        lines.append("failures by class:")
        by = Counter(o.cls if o.status == "failure" else "generator:" + o.cls for o in fails)
        for cls, k in by.most_common():
            lines.append(f"  {cls}: {k}")
            for o in [o for o in fails if (o.cls if o.status == 'failure' else 'generator:' + o.cls) == cls][:show]:
                first = o.detail.strip().splitlines()[0][:240] if o.detail.strip() else ""
                tags = ",".join(sorted(o.features & SUSPECT))
                lines.append(f"    python -m fspyre.testing.campaign --replay {o.seed}   # [{tags}] {first}")
    else:
        lines.append("failures: 0")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
