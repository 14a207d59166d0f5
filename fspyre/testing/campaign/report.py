"""What ``fspyre campaign`` does and prints (its flags are ``fspyre.cli``'s): ``--count N --seed S``
with ``--workers W`` on this host, ``--ray`` / ``--address`` on a Ray cluster, or ``--shard i/N``
of the seeds in a batch scheduler's job; ``--merge`` the shards' ``--json`` files; ``--replay
SEED``. Exit 1 on any failure (or generator error)."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
import warnings
from collections import Counter
from typing import TYPE_CHECKING

from tqdm import tqdm

if TYPE_CHECKING:
    from fspyre.testing.campaign import Outcome


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


def campaign(args: argparse.Namespace) -> int:
    """``fspyre campaign``: replay one seed, merge shards' outcome files, or run the programs of
    seeds ``--seed``.. ``--seed + --count - 1`` (the share ``--shard`` names) on the engine the
    flags choose (``fspyre.testing.engines``)."""
    warnings.simplefilter("ignore")
    if args.replay is not None:
        return _replay(args.replay)
    from fspyre.errors import BatchError

    if args.count < 1:
        raise BatchError(f"--count {args.count}: give at least 1 program")
    seeds = range(args.seed, args.seed + args.count)
    if args.merge:
        return _merge(args.merge, seeds, args.show)

    from fspyre.testing.campaign import lost_seed, run_seed
    from fspyre.testing.engines import Engine, Shard, run_batch

    shard = args.shard or Shard()
    share = seeds[shard.span(len(seeds))]
    engine = Engine(workers=args.workers, ray=args.ray, address=args.address)
    start = time.monotonic()
    outcomes: list[Outcome] = []
    out = open(args.json, "w") if args.json else contextlib.nullcontext()
    # progress on a terminal only (stderr; the report goes to stdout)
    progress = tqdm(total=len(share), desc="campaign", unit="seed", disable=None, delay=1.0)
    with out as f, progress, contextlib.closing(run_batch(run_seed, share, engine, lost_seed)) as verdicts:
        for o in verdicts:
            outcomes.append(o)
            if f is not None:  # each outcome as it arrives: a run cut short keeps what it did
                f.write(json.dumps(o.to_json()) + "\n")
                f.flush()
            progress.update()
            if args.time_limit is not None and time.monotonic() - start > args.time_limit:
                break
    elapsed = time.monotonic() - start
    if len(outcomes) == len(share):
        _require_cover(outcomes, share, "this run")
    where = f"seeds {share.start}..{share.stop - 1}" + (f" (shard {shard} of {seeds.start}..{seeds.stop - 1})"
                                                          if shard.count > 1 else "")
    print(where + "\n" + report(outcomes, elapsed, show=args.show))
    return 1 if any(o.status in ("failure", "generator") for o in outcomes) else 0


def _require_cover(outcomes: list[Outcome], seeds: range, what: str) -> None:
    """Every seed once: an engine or a set of shards that lost or repeated one is a bug, not a result."""
    from fspyre.errors import BatchError

    counts = Counter(o.seed for o in outcomes)
    twice = sorted(s for s, k in counts.items() if k > 1)
    missing = [s for s in seeds if s not in counts]
    extra = sorted(s for s in counts if s not in seeds)
    if twice or missing or extra:
        raise BatchError(f"{what}: the outcomes do not cover seeds {seeds.start}..{seeds.stop - 1} once each: "
                         f"{len(missing)} missing {missing[:5]}, {len(twice)} twice {twice[:5]}, "
                         f"{len(extra)} outside {extra[:5]}; give the --seed/--count the shards ran with")


def _merge(files: list[str], seeds: range, show: int) -> int:
    """The report of the shards' ``--json`` files together, after checking they cover ``seeds``."""
    from fspyre.errors import BatchError
    from fspyre.testing.campaign import Outcome

    outcomes = []
    for name in files:
        try:
            with open(name) as f:
                outcomes += [Outcome.from_json(json.loads(line)) for line in f if line.strip()]
        except (OSError, ValueError, TypeError) as err:
            raise BatchError(f"--merge {name}: not a campaign's --json file ({' '.join(str(err).split())})") from None
    _require_cover(outcomes, seeds, f"--merge of {len(files)} files")
    outcomes.sort(key=lambda o: o.seed)
    print(f"seeds {seeds.start}..{seeds.stop - 1} from {len(files)} files\n" + report(outcomes, None, show=show))
    return 1 if any(o.status in ("failure", "generator") for o in outcomes) else 0


def report(outcomes, elapsed: float | None, show: int = 3) -> str:
    """The summary; ``elapsed`` None: outcomes merged from files, whose run times are not known."""
    n = len(outcomes)
    status = Counter(o.status for o in outcomes)
    took = "" if elapsed is None else f" in {elapsed:.1f} s ({n / max(elapsed, 1e-9):.1f} programs/s)"
    lines = [f"programs tried: {n}{took}; "
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
                lines.append(f"    fspyre campaign --replay {o.seed}   # [{tags}] {first}")
    else:
        lines.append("failures: 0")
    return "\n".join(lines)
