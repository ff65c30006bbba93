"""Seed (vime/slime straw) archives in: opened read-only by the facade, imported into a pool
losslessly and verified; damaged and foreign indexes refused with the pool left as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("straw")
torch = pytest.importorskip("torch")

import _seed  # noqa: E402

from archive_manager import ArchiveManager, RolloutArchive  # noqa: E402
from archive_manager.errors import IntegrityError, UnsupportedFormatError  # noqa: E402


def _samples() -> list:
    import numpy as np

    S = _seed.Sample
    samples: Any = [
        S(
            index=i,
            group_index=i // 4,
            tokens=[i, i + 1, i + 2],
            response_length=2,
            loss_mask=[1, 1],
            rollout_log_probs=[-0.5, -0.25],
            reward=float(i),
            status=S.Status.COMPLETED,
        )
        for i in range(130)
    ]
    samples[129].index = 128
    s: Any = samples[0]
    s.rollout_routed_experts = torch.arange(12, dtype=torch.int32).reshape(2, 3, 2)
    s.multimodal_train_inputs = {"pixel_values": torch.ones(2, 2)}
    s.metadata = {"arr": np.arange(3), "blob": b"\x00\x01", "pair": (1, "a")}
    s._queue_lease = {"task_id": "prompt:21"}
    s._queue_branch = "b1"
    samples[1]._queue_receipt = {"task_id": "prompt:22"}
    samples[2].index = None
    return samples


@pytest.fixture
def seed_index(tmp_path: Path) -> Path:
    path = tmp_path / "seed" / "rollout_7.straw.json"
    path.parent.mkdir()
    assert _seed.seed_save(path, _samples(), rollout_id=7) is None
    return path


def test_facade_opens_a_seed_index_read_only(seed_index: Path) -> None:
    with RolloutArchive(seed_index) as arc:
        keys = arc.keys()
        assert keys[:3] == [
            ("sample:0", "prompt:21"),
            ("sample:1", "prompt:22"),
            ("position:2", None),
        ]
        assert keys.count(("sample:128", None)) == 2 and len(arc) == 130
        assert arc.index["rollout_id"] == 7
        (s,) = arc.load_samples(sample_key="sample:0")
        # vime's own class, with its nested Status and helpers, where this process has it
        assert type(s) is _seed.Sample and s.status is _seed.Sample.Status.COMPLETED
        assert type(s.spec_info) is _seed.Sample.SpecInfo
        ref: Any = s.rollout_routed_experts  # a TensorRef
        assert torch.equal(ref.load(), torch.arange(12, dtype=torch.int32).reshape(2, 3, 2))
        assert not hasattr(s, "_queue_lease") and vars(s)["_queue_branch"] == "b1"
        with pytest.raises(KeyError) as missing:
            arc.load_samples(sample_key="sample:404")
        assert missing.value.args == (("sample:404", None),)


def test_import_straw_is_lossless_and_verified(seed_index: Path, tmp_path: Path) -> None:
    with ArchiveManager.open(tmp_path / "pool") as pool:
        arc = pool.import_straw(seed_index)
        with RolloutArchive(seed_index) as src:
            assert arc.keys() == src.keys()
        assert arc.rollout_id == 7 and len(arc) == 130
        first: Any = arc.load_samples(sample_key="sample:0", materialize=True)[0]
        assert type(first) is _seed.Sample and first.status is _seed.Sample.Status.COMPLETED
        assert torch.equal(
            first.rollout_routed_experts, torch.arange(12, dtype=torch.int32).reshape(2, 3, 2)
        )
        assert vars(first)["_kept_queue_branch"] == "b1" and first.metadata["blob"] == b"\x00\x01"
        assert [s.tokens for s in arc.load_samples(sample_key="sample:128")] == [
            [128, 129, 130],
            [129, 130, 131],
        ]


def test_foreign_and_damaged_indexes_leave_the_pool_as_it_was(
    seed_index: Path, tmp_path: Path
) -> None:
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"format": "something.else", "version": 1}))
    damaged = tmp_path / "seed" / "damaged.straw.json"
    index = json.loads(seed_index.read_text())
    index["manifest"]["digest"] = "0" * 64
    damaged.write_text(json.dumps(index))
    with ArchiveManager.open(tmp_path / "pool") as pool:
        with pytest.raises(UnsupportedFormatError, match="not a seed archive index"):
            pool.import_straw(foreign)
        with pytest.raises((IntegrityError, UnsupportedFormatError)):
            pool.import_straw(damaged)
        shutil.rmtree(tmp_path / "seed" / "straw-data" / "raw")
        with pytest.raises((IntegrityError, UnsupportedFormatError)):
            pool.import_straw(seed_index)
        assert pool.find() == []


def test_a_vime_rollout_comes_in_as_vime_samples(tmp_path: Path) -> None:
    """Every field of vime's Sample (nested Status, SpecInfo, PrefixCacheInfo, numpy top-k,
    torch top-p and routed-expert tensors, chunked routes, extra attributes) survives the
    seed's archive and the import, as vime's own classes."""
    import sys

    from helpers import assert_same

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "frameworks"))
    from rollouts import make_vime_rollout

    rows = make_vime_rollout(10, seed=5)
    for s in rows:
        s.multimodal_inputs = None  # the seed's own codec stores PIL images as PNG (left out here)
    path = tmp_path / "seed" / "rollout_3.straw.json"
    path.parent.mkdir()
    _seed.seed_save(path, rows, rollout_id=3)
    with ArchiveManager.open(tmp_path / "pool") as pool:
        back = pool.import_straw(path).load_samples(materialize=True)
    assert [type(s) for s in back] == [_seed.Sample] * len(rows)
    for got, want in zip(back, rows, strict=True):
        assert got.status is want.status and got.spec_info == want.spec_info
        assert got.prefix_cache_info == want.prefix_cache_info
        routes = want.materialize_rollout_routed_experts(replace=False)
        assert torch.equal(got.rollout_routed_experts, routes)
        for name in ("tokens", "loss_mask", "rollout_log_probs", "metadata", "reward"):
            assert_same(getattr(got, name), getattr(want, name), name)


def test_an_import_that_does_not_verify_publishes_nothing(
    seed_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read-back comparison runs before the writer publishes: a difference rolls the
    save back, so neither the archive nor a blob of it is left."""
    from helpers import snapshot_pool

    from archive_manager.interop import straw

    real = straw._same

    def same(a: object, b: object) -> bool:  # sample 77 read back differs from its source
        return not (type(a) is _seed.Sample and a.index == 77) and real(a, b)

    monkeypatch.setattr(straw, "_same", same)
    with ArchiveManager.open(tmp_path / "pool") as pool:
        before = snapshot_pool(pool)
        with pytest.raises(IntegrityError, match=r"sample 77 .*nothing was published"):
            pool.import_straw(seed_index)
        assert pool.find(state=None) == []
        assert snapshot_pool(pool).blobs == before.blobs


def _rewrite_index_record(src: Path, dst: Path, mutate: Any) -> None:
    """A copy of the seed index ``src`` at ``dst`` whose index record (entries, chunks) was
    changed by ``mutate``: written back through the seed's own record store, as damage to
    the record (not to the JSON file) would look."""
    _seed.rewrite_contents(src, dst, mutate)


@pytest.mark.parametrize(
    "damage",
    [
        {"offset": 99},
        {"offset": "0"},
        {"offset": -1},  # Python's indexing would pick the chunk's last sample
        {"offset": True},
        {"sample_key": "sample:999"},
        {"chunk": 7},
    ],
    ids=["offset-past-end", "offset-str", "offset-negative", "offset-bool", "key", "chunk"],
)
def test_a_damaged_entry_is_refused_and_the_pool_is_left_as_it_was(
    seed_index: Path, tmp_path: Path, damage: dict
) -> None:
    from helpers import snapshot_pool

    damaged = tmp_path / "seed" / "damaged.straw.json"
    _rewrite_index_record(seed_index, damaged, lambda c: c["entries"][0].update(damage))
    with ArchiveManager.open(tmp_path / "pool") as pool:
        before = snapshot_pool(pool)
        with pytest.raises(IntegrityError):
            pool.import_straw(damaged)
        assert snapshot_pool(pool) == before
        assert pool.find(state=None) == []
    if "sample_key" not in damage:  # the seed itself reads such an entry (it never checks)
        with pytest.raises(IntegrityError), RolloutArchive(damaged) as arc:
            arc.load_samples()


@pytest.mark.parametrize(
    "facts", [{"rollout_id": "7"}, {"rollout_id": 7.0}, {"evaluation": "false"}]
)
def test_index_facts_of_the_wrong_type_are_refused_not_coerced(
    seed_index: Path, tmp_path: Path, facts: dict
) -> None:
    index = json.loads(seed_index.read_text())
    index.update(facts)
    odd = seed_index.with_name("odd.straw.json")
    odd.write_text(json.dumps(index))
    with ArchiveManager.open(tmp_path / "pool") as pool:
        with pytest.raises(UnsupportedFormatError, match=r"rollout_id|evaluation"):
            pool.import_straw(odd)
        assert pool.find(state=None) == []


def test_indexes_of_one_file_name_in_two_runs_import_side_by_side(tmp_path: Path) -> None:
    paths = []
    for run in ("run1", "run2"):
        path = tmp_path / run / "rollout_7.straw.json"
        path.parent.mkdir()
        _seed.seed_save(path, _samples()[:3], rollout_id=7)
        paths.append(path)
    with ArchiveManager.open(tmp_path / "pool") as pool:
        names = [pool.import_straw(p).name for p in paths]
    assert len(set(names)) == 2 and all("run" in n for n in names)
