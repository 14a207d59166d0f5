"""Every op the front end claims passes every eligible OpInfo sample it is given (a bounded,
deterministic draw: 2 per op and dtype; `fspyre coverage` draws more), against eager with the tolerances stated in
fspyre.frontend.coverage; the first sample of each op also runs on the machine model."""

from __future__ import annotations

import pytest

pytest.importorskip("expecttest", reason="torch.testing's OpInfo database needs the expecttest package")

from fspyre.frontend import coverage  # noqa: E402


@pytest.fixture(scope="module")
def table():
    return coverage.coverage_table(coverage.CLAIMED, samples=2, run=1)


def test_claimed_ops_pass_all_their_samples(table) -> None:
    bad = [r for r in table if r.failing or r.unsupported or r.passing == 0]
    assert not bad, "\n" + coverage.format_table(bad, verbose=True)


def test_every_claimed_op_ran_on_the_machine_model(table) -> None:
    assert all(r.ran == 1 for r in table)


def test_main_prints_the_table(capsys) -> None:
    assert coverage.main(["--ops", "add,sum", "--samples", "1", "--run", "0"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["op", "passing", "failing", "unsupported", "machine-run"]
    assert lines[1].split()[0] == "add" and lines[2].split()[0] == "sum" and lines[3].startswith("total")


def test_main_rejects_unknown_ops(capsys) -> None:
    assert coverage.main(["--ops", "no_such_op"]) == 2
    assert "not OpInfo names" in capsys.readouterr().err


# The ops whose backward graphs hold the ops that appear only in training: threshold_backward
# (relu), the layer-norm and softmax backward decompositions, sums to a broadcast operand's
# size (add, mul), matmul transposes, slice and select backward (narrow, select, cat), and
# gelu's, whose torch decomposition needs erf.
GRAD_OPS = ("nn.functional.relu", "nn.functional.layer_norm", "nn.functional.rms_norm", "softmax", "log_softmax",
            "add", "mul", "sum", "mean", "var", "amax", "mm", "bmm", "narrow", "select", "cat",
            "nn.functional.silu", "nn.functional.gelu", "sigmoid", "tanh", "abs")


def test_gradients_of_the_backward_only_ops_run_on_fspyre_and_match() -> None:
    rows = coverage.coverage_table(GRAD_OPS, samples=1, grad=True)
    assert [r.op for r in rows] == list(GRAD_OPS)
    bad = [r for r in rows if r.failing or r.unsupported or r.passing == 0 or r.ran != r.passing]
    assert not bad, "\n" + coverage.format_table(bad, verbose=True)
