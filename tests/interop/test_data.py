"""PyTorch datasets over a pool (docs/architecture/getting-data-out.md, "Getting data out"):
map-style and iterable, sharded across workers and ranks, pickled without connections, in a real
DataLoader with two workers; and pad_collate."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import small_rollout, tiny_rollout
from torch.utils.data import DataLoader

from archive_manager import ArchiveManager
from archive_manager.data import RolloutDataset, RolloutIterableDataset, pad_collate
from archive_manager.errors import InvalidInputError

FIELDS = ["archive", "position", "tokens", "loss_mask", "rollout_log_probs", "reward"]


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """Three rollouts of 10 tiny samples in chunks of 4 (3 chunks each), one evaluation."""
    root = tmp_path / "pool"
    with ArchiveManager.open(root, chunk_size=4) as pool:
        for i in range(3):
            samples = small_rollout(
                10, seed=i, rollout_id=i, prompt_len=8, response_min=4, response_max=12
            )
            pool.save(f"r{i}", samples, rollout_id=i, evaluation=i == 2)
    yield root


def test_map_style_reads_items_by_chunk_and_pickles_without_a_connection(root: Path) -> None:
    with ArchiveManager.open(root, read_only=True) as pool:
        expected = pool.open_archive("r1").load_samples()
        data = RolloutDataset(pool, fields=FIELDS, evaluation=False, cache_chunks=2)
    assert len(data) == 20
    item = data[13]
    assert (item["archive"], item["position"]) == ("r1", 3)
    assert item["tokens"].dtype == torch.int64 and item["tokens"].tolist() == expected[3].tokens
    assert item["rollout_log_probs"].dtype == torch.float32
    assert item["rollout_log_probs"].tolist() == expected[3].rollout_log_probs
    assert data[-1]["position"] == 9 and data[-1]["archive"] == "r1"
    copy = pickle.loads(pickle.dumps(data))
    assert copy._reader._pool is None and not copy._cache
    assert copy[0]["tokens"].tolist() == data[0]["tokens"].tolist()
    lists = RolloutDataset(root, fields=["tokens", "metadata"], as_tensors=False, min_rollout_id=2)
    assert len(lists) == 10 and isinstance(lists[0]["tokens"], list) and lists[0]["metadata"]
    with pytest.raises(IndexError):
        data[20]
    with pytest.raises(InvalidInputError, match="unknown filter 'rollout'"):
        RolloutDataset(root, rollout=3)
    with pytest.raises(InvalidInputError, match="'nope'"):
        RolloutDataset(root, fields=["nope"])[0]
    data.close()


def test_iterable_splits_samples_across_ranks_and_workers_and_shuffles_by_seed(
    root: Path,
) -> None:
    everything = [
        (d["archive"], d["position"]) for d in RolloutIterableDataset(root, fields=FIELDS)
    ]
    assert len(everything) == 30 and len(set(everything)) == 30
    shards = [
        RolloutIterableDataset(root, fields=FIELDS, rank=r, world_size=2, batch_size=4)
        for r in (0, 1)
    ]
    parts = [s.shard(w, 2) for s in shards for w in (0, 1)]
    in_order = RolloutIterableDataset(root, fields=FIELDS).shard()
    assert len(in_order) == 30 and sorted(k for p in parts for k in p) == sorted(in_order)
    assert shards[0].shard() + shards[1].shard() == in_order  # contiguous blocks by rank
    # rank 0's 15 samples are batches 0, 2 (worker 0) and 1, 3 (worker 1) of 4
    assert parts[0] == shards[0].shard()[0:4] + shards[0].shard()[8:12]
    assert parts[1] == shards[0].shard()[4:8] + shards[0].shard()[12:15]
    one = RolloutIterableDataset(root, fields=FIELDS, shuffle=True, seed=5)
    again = RolloutIterableDataset(root, fields=FIELDS, shuffle=True, seed=5)
    assert one.shard() == again.shard() != in_order
    one.set_epoch(1)
    assert one.shard() != again.shard() and sorted(one.shard()) == sorted(in_order)
    with pytest.raises(InvalidInputError, match="rank"):
        RolloutIterableDataset(root, rank=2, world_size=2)
    with pytest.raises(InvalidInputError, match="batch_size"):
        RolloutIterableDataset(root, batch_size=0)
    with pytest.raises(InvalidInputError, match="shuffle_buffer"):
        RolloutIterableDataset(root, shuffle_buffer=-1)


def test_dataloader_with_two_workers(root: Path) -> None:
    data = RolloutIterableDataset(
        root, fields=FIELDS, evaluation=False, shuffle=True, seed=1, batch_size=4
    )
    loader = DataLoader(data, batch_size=4, num_workers=2, collate_fn=pad_collate)
    assert len(loader) == 5
    seen = []
    for batch in loader:
        assert batch["tokens"].shape == batch["attention_mask"].shape
        seen += list(zip(batch["archive"], batch["position"].tolist(), strict=True))
    assert sorted(seen) == [(f"r{i}", p) for i in (0, 1) for p in range(10)]


def test_pad_collate_pads_right_with_an_attention_mask() -> None:
    items = [
        {
            "tokens": torch.tensor([5, 6, 7]),
            "loss_mask": torch.tensor([1, 1]),
            "reward": 1.0,
            "archive": "a",
        },
        {
            "tokens": torch.tensor([8]),
            "loss_mask": torch.tensor([0]),
            "reward": 0.0,
            "archive": "b",
        },
    ]
    batch = pad_collate(items, pad_id=-1)
    assert batch["tokens"].tolist() == [[5, 6, 7], [8, -1, -1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["loss_mask"].tolist() == [[1, 1], [0, 0]]
    assert batch["reward"].tolist() == [1.0, 0.0] and batch["archive"] == ["a", "b"]
    with pytest.raises(InvalidInputError):
        pad_collate([])


def test_pad_collate_keeps_an_attention_mask_the_items_bring() -> None:
    """Left-padded or packed samples carry their own mask: it is padded, never replaced."""
    items = [
        {"tokens": torch.tensor([0, 5, 6]), "attention_mask": torch.tensor([0, 1, 1])},
        {"tokens": torch.tensor([8]), "attention_mask": torch.tensor([1])},
    ]
    batch = pad_collate(items)
    assert batch["attention_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]


def test_ranks_yield_equal_counts_padded_or_cut_and_a_pickled_copy_keeps_its_epoch(
    root: Path,
) -> None:
    """Every rank yields as many samples as the others (a rank with fewer batches would hang
    DDP's next all-reduce): padded from the epoch's start by default, cut with drop_last."""
    for drop_last in (False, True):
        ranks = [
            RolloutIterableDataset(root, fields=FIELDS, rank=r, world_size=4, drop_last=drop_last)
            for r in range(4)
        ]
        counts = [len(list(rank)) for rank in ranks]
        assert len(set(counts)) == 1 and counts[0] == len(ranks[0]), counts
        seen = {(d["archive"], d["position"]) for rank in ranks for d in rank}
        if drop_last:
            assert 4 * counts[0] <= 30 and len(seen) == 4 * counts[0]
        else:
            assert 4 * counts[0] >= 30 and len(seen) == 30  # every sample, some twice
    data = RolloutIterableDataset(root, fields=FIELDS, shuffle=True, seed=3)
    data.set_epoch(7)
    copy = pickle.loads(pickle.dumps(data))
    assert copy.epoch == 7 and copy.shard() == data.shard()
    copy.set_epoch(8)
    assert data.epoch == 7  # a copy made outside a worker start shares nothing
    with pytest.raises(InvalidInputError, match="epoch"):
        data.set_epoch("1")  # type: ignore[arg-type]


def test_iterable_dataset_gives_every_rank_the_same_number_of_samples(
    tmp_path: Path,
) -> None:
    """Chunks are dealt whole to ranks, so rank 0 got 6 samples and rank 1 got 4: under DDP
    the rank with fewer batches leaves the others waiting in an all-reduce (a hang);
    torch's DistributedSampler pads or drops to equal counts for this reason."""
    with ArchiveManager.open(tmp_path / "pool", chunk_size=4) as pool:
        pool.save("a", tiny_rollout(10), rollout_id=1)
    counts = [
        len(
            list(
                RolloutIterableDataset(tmp_path / "pool", fields=["position"], rank=r, world_size=2)
            )
        )
        for r in (0, 1)
    ]
    assert counts[0] == counts[1], counts


def test_set_epoch_reshuffles_with_persistent_workers(tmp_path: Path) -> None:
    """set_epoch changes the shuffle only in the main process's copy: with
    DataLoader(persistent_workers=True) every epoch reads the chunks in epoch 0's order."""
    with ArchiveManager.open(tmp_path / "pool", chunk_size=2) as pool:
        pool.save("a", tiny_rollout(16), rollout_id=1)
    # batch_size=1: the loaders below yield one sample per item, which the dataset is told
    # (without it, two workers make it warn that len(loader) may undercount batches).
    data = RolloutIterableDataset(
        tmp_path / "pool", fields=["position"], shuffle=True, seed=0, batch_size=1
    )
    loader = DataLoader(data, batch_size=None, num_workers=2, persistent_workers=True)
    orders = []
    for epoch in range(2):
        data.set_epoch(epoch)
        orders.append([int(item["position"]) for item in loader])
    expected = []
    for epoch in range(2):
        data.set_epoch(epoch)
        expected.append(
            [int(item["position"]) for item in DataLoader(data, batch_size=None, num_workers=2)]
        )
    assert expected[0] != expected[1]  # the seeds do give different orders
    assert orders == expected


def test_datasets_take_every_filter_of_query(tmp_path: Path) -> None:
    # Break: RolloutDataset documents `ArchiveManager.query`'s filters, but refused
    # `rollout_ids` ("unknown filter 'rollout_ids'"), the range form issue 18 asks for
    # everywhere; only min_rollout_id/max_rollout_id worked.
    pytest.importorskip("torch")
    from archive_manager.data import RolloutDataset

    with ArchiveManager.open(tmp_path / "pool") as pool:
        for i in range(4):
            pool.save(f"r{i}", small_rollout(2, seed=i), rollout_id=i)
        for ids in ((1, 2), range(1, 3), (2, None), 3):
            want = [(r.archive, r.position) for r in pool.query(rollout_ids=ids)]
            dataset = RolloutDataset(pool, rollout_ids=ids, fields=["index"], as_tensors=False)
            assert len(dataset) == len(want) > 0, ids
        # The ends narrow a range as `query` narrows it.
        both: dict[str, Any] = dict(rollout_ids=(0, 2), min_rollout_id=1)
        assert len(RolloutDataset(pool, **both, as_tensors=False)) == len(pool.query(**both)) == 4


def test_rollout_filters_have_one_name_everywhere(root: Path) -> None:
    # find(rollout_id=) but query(rollout_ids=), and the datasets refused find's spelling.
    with ArchiveManager.open(root) as pool:
        assert [a.name for a in pool.find(rollout_ids=(1, 2), state=None)] == ["r1", "r2"]
        assert [a.name for a in pool.find(rollout_id=(1, 2), state=None)] == ["r1", "r2"]
        with pytest.raises(InvalidInputError, match="not both"):
            pool.find(rollout_id=1, rollout_ids=1)
        assert {r.archive for r in pool.query(rollout_ids=1)} == {"r1"}
    new = RolloutDataset(root, fields=["archive"], rollout_ids=1)
    old = RolloutDataset(root, fields=["archive"], rollout_id=1)
    assert len(new) == len(old) == 10
    assert {new[i]["archive"] for i in range(len(new))} == {"r1"}


@pytest.mark.parametrize("spelling", ["rollout_ids", "rollout_id"])
@pytest.mark.parametrize("ids", [1, (1, 2), (1, None), range(1, 3)], ids=repr)
def test_every_rollout_filter_takes_the_same_forms(
    root: Path, tmp_path: Path, spelling: str, ids: object
) -> None:
    """export_many took only a (low, high) tuple (an int: "cannot unpack"), and query and
    stats refused find's rollout_id= (TypeError): one parser, both spellings, everywhere."""
    want = {"r1", "r2"} if ids != 1 else {"r1"}
    arg: dict[str, Any] = {spelling: ids}
    with ArchiveManager.open(root) as pool:
        assert {a.name for a in pool.find(**arg)} == want
        assert {r.archive for r in pool.query(**arg)} == want
        assert {s.rollout_id for s in pool.stats(**arg)} == {int(n[1]) for n in want}
        assert set(pool.arrow_reader(**arg).read_all()["archive"].to_pylist()) == want
        done = pool.export_many(tmp_path / "out", format="jsonl", **arg)
        assert {p.stem for p in done} == want
    dataset = RolloutDataset(root, fields=["archive"], as_tensors=False, **arg)
    assert {dataset[i]["archive"] for i in range(len(dataset))} == want


def test_an_empty_numeric_list_is_an_empty_tensor_and_pads_into_its_batch(
    tmp_path: Path,
) -> None:
    """An aborted sample (empty loss mask and log-probs) gave [] items, and pad_collate then
    returned the batch's fields as Python lists. An empty list is an empty tensor: of the
    dtype ``dtypes`` names, else torch.tensor([])'s float32; a batch pads it into the dtype
    of its items that have values."""
    samples = [
        {"tokens": [5, 6, 7], "loss_mask": [1, 1], "rollout_log_probs": [-0.1, -0.2]},
        {"tokens": [5], "loss_mask": [], "rollout_log_probs": []},
    ]
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("s", samples, rollout_id=0)
    fields = ["tokens", "loss_mask", "rollout_log_probs"]
    item = RolloutDataset(root, fields=fields)[1]
    assert item["loss_mask"].dtype == item["rollout_log_probs"].dtype == torch.float32
    assert item["loss_mask"].shape == (0,)
    item = RolloutDataset(root, fields=fields, dtypes={"loss_mask": "int8"})[1]
    assert item["loss_mask"].dtype == torch.int8 and item["loss_mask"].shape == (0,)
    data = RolloutIterableDataset(root, fields=fields, batch_size=2)
    (batch,) = DataLoader(data, batch_size=2, collate_fn=pad_collate)
    assert batch["loss_mask"].dtype == torch.int64
    assert batch["loss_mask"].tolist() == [[1, 1], [0, 0]]
    assert batch["rollout_log_probs"].dtype == torch.float32
    assert batch["rollout_log_probs"].shape == (2, 2)
    # an empty item first in its batch takes the dtype of the others as well
    (first,) = DataLoader(
        RolloutDataset(root, fields=fields), batch_size=2, sampler=[1, 0], collate_fn=pad_collate
    )
    assert first["loss_mask"].dtype == torch.int64 and first["loss_mask"].tolist() == [
        [0, 0],
        [1, 1],
    ]


def test_items_have_one_dtype_per_field_whatever_the_values(tmp_path: Path) -> None:
    """Issue 35: log-prob tensors came back float32 or float64 as their values happened to
    be float32-exact or not (and a DataLoader batch then mixed the two); tensors and arrays
    keep the dtype and shape they were saved in."""
    samples: list[dict[str, Any]] = [
        {"lp": [0.5, -0.25] * 20, "mask": [1, 0] * 20, "ids": list(range(40)),

         "t": torch.zeros(2, 3, dtype=torch.bfloat16), "a": np.ones((4, 1), np.float16)},
        {"lp": [0.1, -0.2] * 20, "mask": [1] * 40, "ids": list(range(150_000, 150_040)),
         "t": torch.ones(1, 5, dtype=torch.bfloat16), "a": np.zeros((2, 2), np.float16)},
    ]  # fmt: skip
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("lp", samples, rollout_id=0)
    data = RolloutDataset(root, fields=["lp", "mask", "ids", "t", "a"])
    for item, saved in zip([data[0], data[1]], samples, strict=True):
        assert item["lp"].dtype == torch.float32
        assert torch.equal(item["lp"], torch.tensor(saved["lp"], dtype=torch.float32))
        assert item["mask"].dtype == item["ids"].dtype == torch.int64
        assert item["t"].dtype == torch.bfloat16 and item["t"].shape == saved["t"].shape
        assert item["a"].dtype == np.float16 and item["a"].shape == saved["a"].shape
    narrow = {"lp": torch.float64, "mask": "int8", "ids": np.int32}
    for dataset in (
        RolloutDataset(root, fields=["lp", "mask", "ids"], dtypes=narrow),
        RolloutIterableDataset(root, fields=["lp", "mask", "ids"], dtypes=narrow, batch_size=2),
    ):
        (batch,) = DataLoader(dataset, batch_size=2, collate_fn=pad_collate)
        assert batch["lp"].dtype == torch.float64 and batch["lp"][1, 0].item() == 0.1
        assert batch["mask"].dtype == torch.int8 and batch["ids"].dtype == torch.int32
        assert batch["ids"][1].tolist() == samples[1]["ids"]
    with pytest.raises(InvalidInputError, match=r"archive 'lp', sample 1: .*'ids' holds 150039"):
        RolloutDataset(root, dtypes={"ids": "int16"})[1]
    with pytest.raises(InvalidInputError, match="is not one of"):
        RolloutDataset(root, dtypes={"ids": "bool"})
    with pytest.raises(InvalidInputError, match="as_tensors=False"):
        RolloutIterableDataset(root, dtypes={"ids": "int16"}, as_tensors=False)
