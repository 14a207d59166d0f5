"""Where the campaign runs changes nothing it finds: one process, a pool on this host, the
shares of ``--shard i/N`` and a real local Ray cluster give the same seeds with the same
verdicts, and a Ray worker killed mid-run loses no seed and repeats none."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fspyre.cli import main
from fspyre.errors import BatchError
from fspyre.testing.campaign import Outcome, lost_seed, run_seed
from fspyre.testing.engines import Engine, Shard, run_batch

SEEDS = range(40, 48)
VICTIM = 42  # the seed whose worker is killed


@pytest.fixture(scope="module")
def one_process() -> dict[int, dict]:
    """The verdicts of one process, seed by seed: what every engine must reproduce."""
    return {s: run_seed(s).to_json() for s in SEEDS}


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _by_seed(records: list[dict]) -> dict[int, dict]:
    seeds = [r["seed"] for r in records]
    assert len(seeds) == len(set(seeds)), f"a seed reported twice: {sorted(seeds)}"
    return {r["seed"]: r for r in records}


@given(st.integers(0, 200), st.integers(1, 9))
def test_shards_partition_any_batch_in_order(n, count):
    items = range(1000, 1000 + n)
    shares = [Shard(index=i, count=count).of(items) for i in range(count)]
    assert [x for share in shares for x in share] == list(items)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1  # balanced: a job's share is n/N, rounded


def test_bad_shards_and_engines_are_refused_by_name():
    for text in ("2/2", "1/0", "-1/2", "a/b", "3"):
        with pytest.raises(BatchError, match="--shard"):
            Shard.parse(text)
    with pytest.raises(BatchError, match="--workers 0"):
        Engine(workers=0)


def test_outcome_json_round_trips_every_field():
    o = Outcome(seed=3, status="failure", cls="crash", detail="x\ny", hinted=True, legal=True,
                features=frozenset({"sum", "split"}))
    assert Outcome.from_json(json.loads(json.dumps(o.to_json()))) == o


def test_shards_and_a_pool_give_the_verdicts_of_one_process(tmp_path, one_process, capsys):
    args = ["campaign", "--seed", str(SEEDS.start), "--count", str(len(SEEDS))]
    files = [tmp_path / f"shard{i}.jsonl" for i in range(2)]
    for i, f in enumerate(files):
        assert main([*args, "--shard", f"{i}/2", "--json", str(f)]) == 0
    assert [r["seed"] for r in _records(files[0])] == list(SEEDS[:len(SEEDS) // 2])  # contiguous blocks
    assert _by_seed(_records(files[0]) + _records(files[1])) == one_process
    assert main([*args, "--merge", *map(str, files)]) == 0
    assert f"programs tried: {len(SEEDS)};" in capsys.readouterr().out
    pool = tmp_path / "pool.jsonl"
    assert main([*args, "--workers", "2", "--json", str(pool)]) == 0
    assert _by_seed(_records(pool)) == one_process


def test_merge_refuses_a_missing_or_repeated_seed(tmp_path, capsys):
    f = tmp_path / "a.jsonl"
    f.write_text("".join(json.dumps(Outcome(seed=s, status="ok").to_json()) + "\n" for s in (0, 1, 1)))
    assert main(["campaign", "--seed", "0", "--count", "3", "--merge", str(f)]) == 2
    err = capsys.readouterr().err
    assert "1 missing [2], 1 twice [1]" in err


# -- on a real local Ray cluster -----------------------------------------------------------------

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray is not installed: pip install 'fspyre[ray]' (make test installs it)")


@needs_ray

def test_ray_workers_give_the_verdicts_of_one_process(tmp_path, one_process):
    """The command as a user runs it: it starts a local cluster of 2 CPUs and stops it."""
    out = tmp_path / "ray.jsonl"
    assert main(["campaign", "--seed", str(SEEDS.start), "--count", str(len(SEEDS)), "--ray", "--workers", "2",
                 "--json", str(out)]) == 0
    assert _by_seed(_records(out)) == one_process


@pytest.fixture(scope="module")
def cluster():
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    # the checks below are this module's functions, which Ray's workers cannot import by name
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


def _killed_once(seed: int, marks: str) -> Outcome:
    """``run_seed``, except that the first run of VICTIM waits to be killed (its pid in a file)."""
    if seed == VICTIM and not (Path(marks) / "killed").exists():
        (Path(marks) / "pid").write_text(str(os.getpid()))
        time.sleep(300)
    return run_seed(seed)


@needs_ray
def test_a_killed_ray_worker_loses_no_seed(tmp_path, cluster, one_process):
    marks = tmp_path
    killed: list[int] = []

    def kill_the_victims_worker() -> None:
        pid_file = marks / "pid"
        deadline = time.monotonic() + 240
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)  # the pid is written whole
        pid = int(pid_file.read_text())
        (marks / "killed").touch()  # before the kill: the rerun must not wait again
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_the_victims_worker, daemon=True)
    killer.start()
    engine = Engine(ray=True, workers=2, chunk=2)
    verdicts = [o.to_json() for o in run_batch(partial(_killed_once, marks=str(marks)), SEEDS, engine, lost_seed)]
    killer.join(timeout=5)
    assert killed and killed[0] != os.getpid(), "no worker was killed: the test tested nothing"
    assert _by_seed(verdicts) == one_process  # every seed, once, with its one-process verdict


def _kills_its_worker(seed: int) -> Outcome:
    if seed == VICTIM:
        os.kill(os.getpid(), signal.SIGKILL)
    return run_seed(seed)


@needs_ray
def test_a_seed_that_kills_every_worker_is_reported_and_the_rest_run(cluster, one_process):
    engine = Engine(ray=True, workers=2, chunk=4, attempts=2)
    verdicts = _by_seed([o.to_json() for o in run_batch(_kills_its_worker, SEEDS, engine, lost_seed)])
    lost = verdicts.pop(VICTIM)
    assert lost["status"] == "failure" and lost["cls"] == "lost_worker" and "died 2 times" in lost["detail"], lost
    assert verdicts == {s: v for s, v in one_process.items() if s != VICTIM}

