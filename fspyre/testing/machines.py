"""Hypothesis strategies for machine configurations.

Core counts cover the whole 1..32 range with the interesting ones (1, primes, powers of two,
24) drawn more often; LX capacities run from none at all through a few sticks to the default
1,625,344-byte window, always a multiple of the 128-byte allocation granule.
"""

from __future__ import annotations

from hypothesis import strategies as st

from fspyre.machine.spyre import LX_ALIGN, MAX_CORES, Machine, lx_window

INTERESTING_CORES = (1, 2, 3, 4, 5, 7, 8, 16, 24, 32)
INTERESTING_LX = (0, LX_ALIGN, 4 * LX_ALIGN, 4096, 32 << 10, 256 << 10, lx_window())


def core_counts(max_cores: int = MAX_CORES) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([c for c in INTERESTING_CORES if c <= max_cores]), st.integers(1, max_cores))


def lx_capacities(max_bytes: int | None = None) -> st.SearchStrategy[int]:
    """Tiny (0 B) to the default LX window, multiples of 128 bytes."""
    top = lx_window() if max_bytes is None else max_bytes
    return st.one_of(st.sampled_from([b for b in INTERESTING_LX if b <= top]),
                     st.integers(0, top // LX_ALIGN).map(lambda k: k * LX_ALIGN))


def machines(cores: st.SearchStrategy[int] | None = None, lx_bytes: st.SearchStrategy[int] | None = None,
             fp16_format: st.SearchStrategy[str] = st.just("SEN169_FP16")) -> st.SearchStrategy[Machine]:
    return st.builds(lambda c, lx, f: Machine(cores=c, lx_bytes=lx, fp16_format=f),
                     cores if cores is not None else core_counts(),
                     lx_bytes if lx_bytes is not None else lx_capacities(),
                     fp16_format)
