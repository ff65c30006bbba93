"""Lazy tensors where training code hands them to torch: ``torch.as_tensor``,
``default_collate``, pickling and ``torch.save`` take a `TensorRef` as its tensor (pickled as
the tensor: no pool, engine or connection travels), ``isinstance`` needs
``materialize=True``, and a real ``DataLoader(num_workers=2)`` over an archive works."""

from __future__ import annotations

import copy
import io
import pickle
import pickletools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from archive_manager import Archive, ArchiveManager, TensorRef

N = 6


def _samples() -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    return [
        {
            "index": i,
            "experts": torch.randint(0, 64, (3, 2, 4), generator=g, dtype=torch.int32),
            "logits": torch.randn(5, generator=g).to(torch.bfloat16),
            "reward": float(i),
        }
        for i in range(N)
    ]


@pytest.fixture
def arc(tmp_path: Path) -> Iterator[Archive]:
    # inline_limit=0: every tensor is a blob of its own, so every load gives refs.
    with ArchiveManager.open(tmp_path / "pool", inline_limit=0, chunk_size=4) as pool:
        yield pool.save("r", _samples(), rollout_id=1)


def _globals(data: bytes) -> set[str]:
    """The modules a pickle names (what unpickling would import)."""
    found: set[str] = set()
    strings: list[str] = []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            assert isinstance(arg, str)
            strings.append(arg)
        elif op.name == "STACK_GLOBAL":
            found.add(strings[-2])
        elif op.name == "GLOBAL":
            assert isinstance(arg, str)
            found.add(arg.split(" ")[0])
    return found


def test_refs_go_where_torch_takes_tensors(arc: Archive) -> None:
    expected = _samples()
    loaded = arc.load_samples()
    ref = loaded[0]["experts"]
    assert isinstance(ref, TensorRef) and not ref.loaded
    assert not isinstance(ref, torch.Tensor)  # a proxy cannot pass this: materialize=True

    as_tensor = torch.as_tensor(ref)
    assert type(as_tensor) is torch.Tensor and torch.equal(as_tensor, expected[0]["experts"])
    assert torch.as_tensor(loaded[1]["logits"], dtype=torch.float32).dtype == torch.float32
    assert torch.equal(torch.tensor(loaded[1]["logits"]), expected[1]["logits"])

    batch = default_collate(arc.load_samples()[:3])  # lazy refs, nothing read yet
    assert torch.equal(batch["experts"], torch.stack([s["experts"] for s in expected[:3]]))
    assert batch["logits"].dtype == torch.bfloat16 and batch["reward"].tolist() == [0.0, 1.0, 2.0]
    mixed = default_collate([expected[0]["experts"], arc.load_samples()[1]["experts"]])
    assert torch.equal(mixed, torch.stack([expected[0]["experts"], expected[1]["experts"]]))

    # pickle: the tensor itself, naming torch only (the loader holds the pool: never sent).
    fresh = arc.load_sample(2)
    data = pickle.dumps(fresh)
    named = _globals(data)
    assert named and all(m.split(".")[0] in {"torch", "collections", "builtins"} for m in named)
    back = pickle.loads(data)
    assert type(back["experts"]) is torch.Tensor
    assert torch.equal(back["experts"], expected[2]["experts"])

    # torch.save: a self-contained file that loads with weights_only=True.
    buffer = io.BytesIO()
    torch.save(arc.load_sample(3), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert type(saved["logits"]) is torch.Tensor and torch.equal(
        saved["logits"], expected[3]["logits"]
    )

    # copies stay lazy; deepcopy copies a loaded tensor.
    lazy = arc.load_sample(4)["experts"]
    twin = copy.deepcopy(lazy)
    assert isinstance(twin, TensorRef) and not twin.loaded and not lazy.loaded
    assert torch.equal(twin.materialize(), expected[4]["experts"])
    assert copy.deepcopy(twin).materialize().data_ptr() != twin.materialize().data_ptr()


def test_materialize_gives_plain_tensors(arc: Archive) -> None:
    expected = _samples()
    for samples in (
        arc.load_samples(materialize=True),
        list(arc.iter_samples(materialize=True)),
        [arc.load_sample(i, materialize=True) for i in range(N)],
    ):
        assert all(type(s["experts"]) is torch.Tensor for s in samples)
        assert all(
            torch.equal(s["experts"], e["experts"]) for s, e in zip(samples, expected, strict=True)
        )


def test_a_dataloader_with_two_workers_reads_an_archive(arc: Archive) -> None:
    expected = _samples()
    # The archive is the dataset (len and []); workers read their samples (fork: the
    # catalog's engine is disposed in the child), default_collate stacks the refs.
    # Any: a map-style dataset by what it does (len and []), which torch's stubs cannot say.
    dataset: Any = arc
    loader = DataLoader(dataset, batch_size=2, num_workers=2, multiprocessing_context="fork")
    batches = list(loader)
    assert len(batches) == N // 2
    experts = torch.cat([b["experts"] for b in batches])
    assert torch.equal(experts, torch.stack([s["experts"] for s in expected]))
    assert torch.cat([b["index"] for b in batches]).tolist() == list(range(N))
    # Unbatched: each sample, refs and all, is pickled from a worker to this process.
    single = list(
        DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork")
    )

    assert all(type(s["logits"]) is torch.Tensor for s in single)
    assert all(torch.equal(s["logits"], e["logits"]) for s, e in zip(single, expected, strict=True))
