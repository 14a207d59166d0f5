"""Hypothesis profiles for the property tests.

``ci`` (the default) runs each property with the example count written at the test, sized so
this directory takes well under three minutes on two cores; ``HYPOTHESIS_PROFILE=deep`` runs
25 times as many examples (``fspyre.testing.examples`` scales the counts by the profile).
Failures print a ``@reproduce_failure`` blob and the drawn graph's builder source.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(
    deadline=None,  # compile + interpret time varies with the drawn sizes; speed lives in benchmarks/
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("ci", max_examples=100, **_COMMON)
settings.register_profile("deep", max_examples=2500, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
