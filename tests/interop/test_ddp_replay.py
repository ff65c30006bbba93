"""Replay that DDP can trust (issue 35): `RolloutIterableDataset` under a real
``torch.distributed`` gloo process group of two ranks, each a process iterating a DataLoader
over the same pool with an ``all_reduce`` per batch.

Pins the hang: with one step of 100 samples, 2 ranks, 2 workers and batch size 16, samples
were evened per rank then dealt to workers that each ended in a partial batch, so rank 0
yielded 4 batches and rank 1 yielded 5, and the extra all-reduce waited for the timeout.
Now every rank yields ``len(loader)`` batches for every worker count, batch size,
``drop_last`` and chunk layout. Also pins the sample-level shuffle (``shuffle_buffer``):
batches mix steps and prompt groups, reproducibly per (seed, epoch).

The ranks run this file as a script (``python test_ddp_replay.py RANK WORLD SPEC``); a rank
that waits in an all-reduce the other never makes fails on the group's timeout, and the test
on its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

WORLD = 2
#: the process group's timeout: an all-reduce that no other rank makes fails after it
GROUP_TIMEOUT_S = 20
#: all-reduces per rank for `_release`, plain and settled each
RELEASE_ROUNDS = 300
#: the whole run of both ranks (a hang fails the test instead of the suite's timeout)
RUN_TIMEOUT_S = 150


def _rank_main(rank: int, world: int, spec_path: str) -> None:
    """One rank: every case's DataLoader, an all-reduce per batch checking that both ranks
    are in the same case, the counts and samples written for the test to judge."""
    import faulthandler
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from archive_manager.data import RolloutIterableDataset, _settled_collective

    # NOTE: a signal handler, not `faulthandler.dump_traceback_later`: the DataLoader's forked
    # workers inherit it, where the latter's watchdog lock deadlocks a forked child
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    spec = json.loads(Path(spec_path).read_text())
    dist.init_process_group(
        "gloo",
        init_method=f"file://{spec['init_file']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=GROUP_TIMEOUT_S),
    )
    results: list[Any] = [_race(rank, world, race) for race in spec.get("races", [])]
    for case_id, case in enumerate(spec["cases"]):
        data = RolloutIterableDataset(
            case["pool"],
            fields=["archive", "position", "task_key"],
            as_tensors=False,
            batch_size=case["batch"],
            drop_last=case["drop_last"],
            shuffle=case.get("shuffle", False),
            shuffle_buffer=case.get("buffer", 0),
            seed=7,
        )
        assert (data.rank, data.world_size) == (rank, world)  # taken from torch.distributed
        loader = DataLoader(
            data,
            batch_size=case["batch"],
            num_workers=case["workers"],
            drop_last=case["drop_last"],
            collate_fn=list,
        )
        count, seen = 0, []
        for batch in loader:
            probe = torch.tensor([1.0, float(case_id)])
            # (a plain all_reduce here hung a later case's DataLoader worker: see
            # `_settled_collective`)
            _settled_collective(dist.all_reduce, probe)
            if probe.tolist() != [world, world * case_id]:
                raise SystemExit(f"rank {rank}, case {case}: the ranks' batches do not pair up")
            count += 1
            seen.append([[s["archive"], s["position"], s["task_key"]] for s in batch])
        results.append({"count": count, "len": len(loader), "batches": seen})
    if spec.get("release"):
        results.append(_release(spec["release"]))
    dist.barrier()
    Path(spec["out"], f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def _release(n: int) -> dict[str, int]:
    """Of ``n`` all-reduces each, how many returned while gloo's thread still held the
    tensor (its use count above one, or its Python object still referenced from C++):
    plain, and through `_settled_collective`."""
    import torch
    import torch.distributed as dist

    from archive_manager.data import _settled_collective, _tensor_references

    held = {"plain": 0, "settled": 0}
    for _ in range(n):
        for how in held:
            tensor = torch.ones(4)
            before = _tensor_references(tensor)[1]
            if how == "plain":
                dist.all_reduce(tensor)
            else:
                _settled_collective(dist.all_reduce, tensor)
            uses, refs = _tensor_references(tensor)
            held[how] += uses > 1 or refs > before
    return held


def _race(rank: int, world: int, race: dict[str, Any]) -> dict[str, Any]:
    """Rank 0 selects the samples, then a step matching the query is published, then rank 1
    builds its dataset: every rank must replay what rank 0 selected, whichever dataset and
    however it learnt the ranks (``race["kind"]``: the iterable dataset with the ranks taken
    from torch.distributed or given, the map-style one under a DistributedSampler)."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    import archive_manager.data as data_module
    from archive_manager import ArchiveManager

    select = data_module.selected_archives
    if rank == 0:

        def select_then_publish(*args: Any, **kwargs: Any) -> Any:
            found = select(*args, **kwargs)
            # stands in for the rollout engine, publishing the next step meanwhile
            with ArchiveManager.open(race["pool"]) as pool:
                late = [{"index": i, "reward": 0.0} for i in range(race["late"])]
                pool.save("rollout-000101", late, rollout_id=101)
            with open(race["fifo"], "w") as fifo:
                fifo.write("published")
            return found

        data_module.selected_archives = select_then_publish  # type: ignore[assignment]
    else:
        with open(race["fifo"]) as fifo:  # blocks until rank 0 has queried and published
            fifo.read()
    query: dict[str, Any] = {
        "rollout_ids": (100, None),
        "fields": ["archive", "position"],
        "as_tensors": False,
    }
    try:
        if race["kind"] == "map":
            mapped = data_module.RolloutDataset(race["pool"], **query)
            sampler: DistributedSampler[Any] = DistributedSampler(
                mapped, num_replicas=world, rank=rank, shuffle=False
            )
            loader = DataLoader(mapped, batch_size=16, sampler=sampler, collate_fn=list)
            total = len(mapped)
        else:
            ranks: dict[str, Any] = (
                {"rank": rank, "world_size": world} if race["kind"] == "given" else {}
            )
            data = data_module.RolloutIterableDataset(race["pool"], batch_size=16, **ranks, **query)
            loader = DataLoader(data, batch_size=16, collate_fn=list)
            total = data.total
    finally:
        data_module.selected_archives = select  # type: ignore[assignment]
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([len(loader)]))
    out: dict[str, Any] = {"total": total, "lengths": [int(n) for n in lengths]}
    batches = []
    if len(set(out["lengths"])) == 1:  # else the longer rank would wait in an all-reduce
        for batch in loader:
            probe = torch.ones(1)
            dist.all_reduce(probe)
            batches.append([[s["archive"], s["position"]] for s in batch])
    return {**out, "batches": batches}


def _run_ranks(
    tmp_path: Path, cases: list[dict[str, Any]], **extra: Any
) -> list[list[dict[str, Any]]]:
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {"init_file": str(tmp_path / "group"), "out": str(tmp_path), "cases": cases, **extra}
        )
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # each rank leads a session of its own, its DataLoader workers in it: one signal reaches
    # them all, even a worker its rank left behind (which would hold the output pipe open)
    ranks = [
        subprocess.Popen(
            [sys.executable, __file__, str(r), str(WORLD), str(spec)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for r in range(WORLD)
    ]
    outputs: list[str] = []
    try:
        for proc in ranks:
            outputs.append(proc.communicate(timeout=RUN_TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        # a hang: every process of both ranks prints its threads' stacks, then all are killed
        for proc in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGUSR1)
        time.sleep(2)
        for proc in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        told = "\n".join(
            f"--- rank {r} (rc {proc.wait()}):\n"
            + (outputs[r] if r < len(outputs) else proc.communicate()[0])[-8000:]
            for r, proc in enumerate(ranks)
        )
        pytest.fail(f"the ranks did not finish in {RUN_TIMEOUT_S} s (a hang)\n{told}")
    finally:
        for proc in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # and any worker left behind
            proc.wait()
    for r, proc in enumerate(ranks):
        assert proc.returncode == 0, f"rank {r} failed:\n{outputs[r][-4000:]}"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]


def _pool(root: Path, sizes: list[int], chunk_size: int, group_size: int = 2) -> str:
    from helpers import tiny_rollout

    from archive_manager import ArchiveManager

    with ArchiveManager.open(root, chunk_size=chunk_size) as pool:
        for i, n in enumerate(sizes):
            samples = tiny_rollout(n, seed=i, rollout_id=i, group_size=group_size, r3_layers=0)
            pool.save(f"step{i}", samples, rollout_id=i)
    return str(root)


#: the matrix: num_workers 0/1/2, batch sizes 1/16/7, drop_last (the dataset's and the
#: DataLoader's) both ways, over one step of 100 samples in chunks of 7 (the chunk size
#: divides neither N nor the batches) and over one sample (fewer than the ranks)
MATRIX: list[dict[str, Any]] = [
    {"pool": pool, "n": n, "workers": w, "batch": b, "drop_last": d}
    for pool, n in (("step", 100), ("one", 1))
    for w in (0, 1, 2)
    for b in (1, 16, 7)
    for d in (False, True)
]
#: three steps of 64 samples in prompt groups of 8, chunks of 16, batches of 16: chunks
#: shuffled only, then through a buffer of 96 samples with 0 and 2 workers
SHUFFLED: list[dict[str, Any]] = [
    {"pool": "groups", "batch": 16, "drop_last": False, "shuffle": True, **extra}
    for extra in (
        {"workers": 0, "buffer": 0},
        {"workers": 0, "buffer": 96},
        {"workers": 2, "buffer": 96},
    )
]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[list[dict[str, Any]]]:
    """Every case of MATRIX then SHUFFLED, run once by two ranks (one process group)."""
    tmp = tmp_path_factory.mktemp("ddp")
    pools = {
        "step": _pool(tmp / "step", [100], 7),
        "one": _pool(tmp / "one", [1], 4),
        "groups": _pool(tmp / "groups", [64, 64, 64], 16, group_size=8),
    }
    cases = [{**case, "pool": pools[case["pool"]]} for case in MATRIX + SHUFFLED]
    (tmp / "run").mkdir()
    return _run_ranks(tmp / "run", cases, release=RELEASE_ROUNDS)


def test_every_rank_yields_len_loader_batches_under_ddp(
    ranks: list[list[dict[str, Any]]],
) -> None:
    """Every case of MATRIX completes (no rank waits in an all-reduce), every rank's batch
    count is len(loader), as DistributedSampler's split gives it; with drop_last=False every
    sample is seen, with drop_last=True none twice."""
    for k, case in enumerate(MATRIX):
        got = [ranks[r][k] for r in range(WORLD)]
        what = {key: case[key] for key in ("n", "workers", "batch", "drop_last")}
        counts = [g["count"] for g in got]
        assert counts == [g["len"] for g in got] == [got[0]["len"]] * WORLD, (what, counts)
        n, batch = case["n"], case["batch"]
        per = n // WORLD if case["drop_last"] else -(-n // WORLD)
        assert got[0]["len"] == (per // batch if case["drop_last"] else -(-per // batch)), what
        samples = [tuple(s[:2]) for g in got for b in g["batches"] for s in b]
        if not case["drop_last"]:
            assert len(set(samples)) == n, what  # every sample at least once
        else:
            assert len(set(samples)) == len(samples), what  # none twice


def test_shuffle_buffer_mixes_steps_and_groups_under_ddp(
    ranks: list[list[dict[str, Any]]],
) -> None:
    """Chunk shuffling alone gives batches of consecutive samples of one step (two prompt
    groups of 8 per batch of 16); the buffer mixes steps and groups in every batch, the same
    whatever the worker count, and the ranks' samples are disjoint."""
    plain, mixed, mixed_workers = (
        [ranks[r][len(MATRIX) + i] for r in range(WORLD)] for i in range(3)
    )
    chunks_only = [b for got in plain for b in got["batches"]]
    assert all(len({s[0] for s in b}) == 1 for b in chunks_only)  # one step per batch
    assert all(len({s[2] for s in b}) == 2 for b in chunks_only)  # two groups per batch
    batches = [b for got in mixed for b in got["batches"]]
    assert sum(len({s[0] for s in b}) > 1 for b in batches) >= len(batches) * 3 // 4
    assert all(len({s[2] for s in b}) > 2 for b in batches)
    seen = [tuple(s[:2]) for b in batches for s in b]
    assert len(seen) == len(set(seen)) == 192  # disjoint across ranks, every sample once
    for r in range(WORLD):  # the workers change nothing of the order
        assert mixed[r]["batches"] == mixed_workers[r]["batches"]
        assert mixed[r]["count"] == mixed_workers[r]["count"] == mixed[r]["len"] == 6


def test_a_collective_returns_once_gloo_let_go_of_its_tensor(
    ranks: list[list[dict[str, Any]]],
) -> None:
    """`_settled_collective` (what the datasets' index sharing calls) returns only once gloo's
    thread dropped the tensor, so that no DataLoader worker forked next can inherit the
    interpreter lock that thread takes to drop it (a worker hung so before it ran, about one
    run of this module in ten under load: CPython before 3.12). The plain call returns
    earlier often enough to show the window is real (a fifth of the calls, quiet machine)."""
    held = [ranks[r][-1] for r in range(WORLD)]
    assert [h["settled"] for h in held] == [0] * WORLD, held
    assert sum(h["plain"] for h in held) > 0, held  # else torch changed: the wait is moot


def test_shuffle_buffer_is_a_function_of_seed_and_epoch(tmp_path: Path) -> None:
    from archive_manager.data import RolloutIterableDataset

    pool = _pool(tmp_path / "steps", [40, 40], 8)

    def order(seed: int, epoch: int, rank: int = 0, world: int = 1) -> list[tuple[int, int]]:
        data = RolloutIterableDataset(
            pool, shuffle=True, shuffle_buffer=24, seed=seed, rank=rank, world_size=world
        )
        data.set_epoch(epoch)
        return data.shard()

    assert order(1, 0) == order(1, 0) != order(1, 1)
    assert order(1, 0) != order(2, 0) and sorted(order(1, 1)) == sorted(order(2, 0))
    # what the ranks partition is the one order: their blocks, in turn, are rank 0's
    assert order(1, 3, 0, 2) + order(1, 3, 1, 2) == order(1, 3)
    # the buffer moves samples across chunk borders (the chunk shuffle keeps them in place)
    plain = RolloutIterableDataset(pool, shuffle=True, seed=1).shard()
    assert [k for k, _ in plain] != [k for k, _ in order(1, 0)]
    assert sum(a[0] != b[0] for a, b in zip(order(1, 0), order(1, 0)[1:], strict=False)) > 20


def test_a_step_published_while_the_ranks_build_changes_no_rank(tmp_path: Path) -> None:
    """Each rank queried the catalog itself: rank 0 saw one step (100 samples, 4 batches),
    a step was published, rank 1 saw both (164, 6 batches) and waited in the 5th all-reduce,
    and samples of the first step went to no rank. Every rank now replays rank 0's index:
    the iterable dataset with the ranks taken from torch.distributed (which alone shared it
    before) or given as ``rank``/``world_size``, and the map-style dataset under a
    DistributedSampler."""
    from archive_manager import ArchiveManager

    kinds = ["taken", "given", "map"]
    races = []
    for kind in kinds:
        root = tmp_path / kind
        with ArchiveManager.open(root, chunk_size=7) as pool:
            samples = [{"index": i, "reward": 1.0} for i in range(100)]
            pool.save("rollout-000100", samples, rollout_id=100)
        os.mkfifo(tmp_path / f"{kind}.published")
        races.append(
            {"pool": str(root), "fifo": str(tmp_path / f"{kind}.published"), "late": 64}
            | {"kind": kind}
        )
    (tmp_path / "run").mkdir()
    results = _run_ranks(tmp_path / "run", [], races=races)
    for k, kind in enumerate(kinds):
        got = [results[r][k] for r in range(WORLD)]
        assert [g["total"] for g in got] == [100, 100], kind
        assert got[0]["lengths"] == got[1]["lengths"] == [4, 4], kind
        seen = {tuple(s) for g in got for b in g["batches"] for s in b}
        assert seen == {("rollout-000100", i) for i in range(100)}, kind
        with ArchiveManager.open(tmp_path / kind) as pool:  # published (rank 0 just missed it)
            assert len(pool.open_archive("rollout-000101")) == 64


def test_share_index_is_checked_and_needs_torch_distributed(tmp_path: Path) -> None:
    from archive_manager.data import RolloutDataset, RolloutIterableDataset
    from archive_manager.errors import InvalidInputError

    pool = _pool(tmp_path / "steps", [10], 4)
    for make in (RolloutDataset, RolloutIterableDataset):
        with pytest.raises(InvalidInputError, match="not initialised"):
            make(pool, share_index=True)
        with pytest.raises(InvalidInputError, match="share_index"):
            make(pool, share_index=1)  # type: ignore[arg-type]  # an int where a bool goes
        assert len(make(pool, share_index=False)) == 10


@pytest.mark.parametrize(
    ("backend", "cpu"),
    [
        ("gloo", True),
        ("mpi", True),
        ("undefined", True),  # made without a backend: gloo, lazily
        ("cpu:gloo,cuda:nccl", True),
        ("cuda:nccl,cpu:gloo", True),
        ("nccl", False),
        ("cuda:nccl", False),  # sent CPU tensors to a group with no CPU backend before
    ],
)
def test_the_index_travels_on_the_device_the_group_takes(backend: str, cpu: bool) -> None:
    from archive_manager.data import _takes_cpu

    assert _takes_cpu(backend) is cpu


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
