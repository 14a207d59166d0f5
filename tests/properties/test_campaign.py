"""A bounded slice of the random-program campaign (``make fuzz`` runs it long), and proof that
its oracles can fail: planted wrong results, a wrong reference and a raw exception must each
be reported in their class."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

import fspyre
from fspyre.cli import main
from fspyre.errors import TilingError
from fspyre.testing import numpy_ref as R
from fspyre.testing.campaign import check_generated, classify_refusal, generate, run_seed

SEEDS = list(range(62))
# Seeds that found a bug now fixed: each must keep passing (or be refused with a report, where
# the fix is a refusal).
FIXED = {
    16: "out-of-bounds program: a tile of 160 fp32 elements was not whole sticks (now a TilingError)",
    60: "out-of-bounds program: sub-stick tile of a float16 dim of 96 (now a TilingError)",
    1001: "out-of-bounds program: sub-stick tile of a K=320 fp16 matmul operand (now a TilingError)",
    1127: "-inf constant under DLFloat16 became NaN: maximum(x, -inf) gave NaN in run and evaluate alike",
    1260: "bool buffer kept raw values: cast(x, 'bool') then float arithmetic saw x, not 1",
    10260: "proof refuted an equal program: an amax recomputed afresh in each iteration of a loop over a dim it "
           "lacks was taken for a point counted twice",
    20155: "proof refuted an equal program (while 10260's fix was drafted): a prod's partial computed in a loop's "
           "first iteration and folded after the fill of each iteration was taken for points left out",
    30548: "proof refuted an equal program: a peeled tail recomputing a whole amax into its own accumulator, "
           "its finish writing the same output again, was taken for points counted twice",
}


@pytest.mark.parametrize("seed", sorted(FIXED))
def test_seeds_of_fixed_bugs_pass(seed):
    outcome = run_seed(seed)
    assert outcome.status in ("ok", "refused"), f"{FIXED[seed]}: {outcome.cls} {outcome.detail}"


def test_slice_has_no_failures():
    outcomes = [run_seed(s) for s in SEEDS]
    bad = [f"--replay {o.seed}: {o.cls}: {o.detail.splitlines()[0]}" for o in outcomes
           if o.status in ("failure", "generator")]
    assert not bad, "\n".join(bad)
    status = Counter(o.status for o in outcomes)
    assert status["ok"] >= 30, status  # most programs must get through, or the slice tests nothing
    seen = set().union(*(o.features for o in outcomes))
    assert {"matmul", "sum", "var", "prod", "amax", "split", "where", "hint", "nested_hint"} <= seen
    # every compiled program carries the static proof's verdict; none that passes is refuted
    verdicts = Counter(o.proof for o in outcomes if o.status == "ok")
    assert verdicts["proved"] >= 30 and not verdicts["refuted"] and not verdicts[""], verdicts


def _ok_seed(pred=lambda g: True) -> fspyre.testing.campaign.Generated:
    for s in SEEDS:
        gen = generate(s)
        if pred(gen) and check_generated(gen).status == "ok":
            return gen
    raise AssertionError("no passing seed with that property")


def test_generation_is_reproducible_from_one_integer():
    a, b = generate(7), generate(7)
    assert a.graph == b.graph and a.machine == b.machine and a.source == b.source
    assert all(np.array_equal(a.inputs[k], b.inputs[k]) for k in a.inputs)
    assert all(np.array_equal(a.refs[k].value, b.refs[k].value) for k in a.refs)


def test_planted_wrong_run_is_a_run_mismatch():
    gen = _ok_seed()

    def wrong_run(comp, inputs):
        outs = fspyre.run(comp, inputs)
        name = next(iter(gen.refs))
        bad = np.array(outs[name], copy=True)
        flat = bad.reshape(-1)
        flat[flat.size // 2] = flat[flat.size // 2] + 3 if bad.dtype != np.bool_ else ~flat[flat.size // 2]
        return {**outs, name: bad}

    out = check_generated(gen, run=wrong_run)
    assert out.status == "failure" and out.cls == "mismatch:run", out


def test_planted_wrong_reference_is_a_shared_mismatch():
    gen = _ok_seed()
    name = next(iter(gen.refs))
    ref = gen.refs[name]
    wrong = R.Ref(ref.names, ref.value + 1.0, ref.err, ref.dtype)  # off by one everywhere
    out = check_generated(dataclasses.replace(gen, refs={**gen.refs, name: wrong}))
    assert out.status == "failure" and out.cls == "mismatch:shared", out


def test_last_bit_difference_in_a_pointwise_graph_is_caught():
    gen = _ok_seed(lambda g: not ({"sum", "mean", "prod", "var", "matmul"} & g.features) and any(
        r.dtype in ("float16", "float32") and r.value.size for r in g.refs.values()))
    name = next(n for n, r in gen.refs.items() if r.dtype in ("float16", "float32") and r.value.size)

    def one_ulp_off(comp, inputs):
        outs = fspyre.run(comp, inputs)
        bad = np.array(outs[name], copy=True)
        flat = bad.reshape(-1)
        flat[0] = np.nextafter(flat[0], np.inf, dtype=flat.dtype)
        return {**outs, name: bad}

    out = check_generated(gen, run=one_ulp_off)
    assert out.status == "failure" and out.cls in ("inexact:pointwise", "mismatch:run"), out


def test_a_refuted_proof_of_a_passing_program_is_a_finding(monkeypatch):
    from fspyre.proof import Counterexample, Proof, PropertyResult

    gen = _ok_seed()
    planted = Proof(program="planted", properties=(PropertyResult(
        name="dataflow", verdict="refuted", reason="planted refutation",
        counterexample=Counterexample(op="op", tensor="t", iteration=(), core=0, point=(), memory="hbm",
                                      address=0)),))
    monkeypatch.setattr(fspyre, "prove", lambda comp: planted)
    out = check_generated(gen)
    assert out.status == "failure" and out.cls == "proof_refuted" and out.proof == "refuted", out
    assert "planted refutation" in out.detail


def test_raw_exception_is_a_crash_and_input_mutation_is_caught():
    gen = _ok_seed()

    def raising(comp, inputs):
        raise ValueError("planted")

    assert check_generated(gen, run=raising).cls == "crash"

    def mutating(comp, inputs):
        outs = fspyre.run(comp, inputs)
        arr = next(iter(inputs.values()))
        arr.reshape(-1)[0] = 1 if arr.dtype != np.bool_ else not arr.reshape(-1)[0]
        return outs

    gen = _ok_seed()
    assert check_generated(gen, run=mutating).cls == "mutated_input"


def test_refusals_are_classified_by_cause():
    err = TilingError("op buf3 (sum over ['K']): level 1 (hint scope 1 slices={'C': 2}) tiles no dim of buf3 but "
                      "runs inside level 0, which tiles its reduction dim K")
    assert classify_refusal(err) == "reduction left invariant inside its reduction level"
    assert classify_refusal(TilingError("something new")).startswith("other TilingError")


def test_reference_bound_is_tight_enough_to_see_one_rounding_step():
    # a float16 add is off by at most its rounding: 2 * (2^-10 |v| + ...) accepts one DLFloat16
    # ulp step at 1.0 (2^-9) but not four
    r = R.pointwise("add", [R.exact(("A",), np.array([0.5]), "float16"), 0.5], ("A",), (1,), "float16",
                    "SEN169_FP16")
    assert R.accept(np.array([1.0 + 2.0**-9]), r).all()
    assert not R.accept(np.array([1.0 + 4 * 2.0**-9]), r).all()


def test_runner_reports_and_exits_zero(capsys):
    assert main(["campaign", "--count", "3", "--seed", "0"]) == 0
    text = capsys.readouterr().out
    assert "programs tried: 3" in text and "failures: 0" in text
