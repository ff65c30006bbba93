"""Seed (vime/slime straw) archives in: opened read-only by the facade, imported into a pool
losslessly and verified; damaged and foreign indexes refused with the pool left as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("straw")
torch = pytest.importorskip("torch")

from archive_manager import ArchiveManager, RolloutArchive  # noqa: E402
from archive_manager.errors import IntegrityError, UnsupportedFormatError  # noqa: E402
from tests import _seed  # noqa: E402


def _samples() -> list:
    import numpy as np

    S = _seed.Sample
    samples = [
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
    s = samples[0]
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
        assert torch.equal(
            s["rollout_routed_experts"].load(), torch.arange(12, dtype=torch.int32).reshape(2, 3, 2)
        )
        assert "_queue_lease" not in s and s["_queue_branch"] == "b1"
        with pytest.raises(KeyError) as missing:
            arc.load_samples(sample_key="sample:404")
        assert missing.value.args == (("sample:404", None),)


def test_import_straw_is_lossless_and_verified(seed_index: Path, tmp_path: Path) -> None:
    with ArchiveManager.open(tmp_path / "pool") as pool:
        arc = pool.import_straw(seed_index)
        with RolloutArchive(seed_index) as src:
            assert arc.keys() == src.keys()
        assert arc.rollout_id == 7 and len(arc) == 130
        first = arc.load_samples(sample_key="sample:0", materialize=True)[0]
        assert torch.equal(
            first["rollout_routed_experts"], torch.arange(12, dtype=torch.int32).reshape(2, 3, 2)
        )
        assert first["_kept_queue_branch"] == "b1" and first["metadata"]["blob"] == b"\x00\x01"
        assert [s["tokens"] for s in arc.load_samples(sample_key="sample:128")] == [
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
