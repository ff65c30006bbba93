"""The read side: round trips, keys, metadata without blobs, export, release, and damage
(missing, corrupt or truncated blobs) that must raise `IntegrityError`, never return wrong
data."""

from __future__ import annotations

import gc
import math
import os
import weakref
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from helpers import local_store
from sqlalchemy import event

from archive_manager import Sample, TensorRef, codec, describe_sample
from archive_manager.errors import (
    ArchiveError,
    ArchiveReleasedError,
    IntegrityError,
    InvalidInputError,
)
from archive_manager.samples import sample_to_fields

# --------------------------------------------------------------------------- round trips


def test_realistic_rollout_round_trips_in_two_chunks(
    pool, open_pool, rollout, same_samples, blob_files_of
) -> None:
    samples = rollout(70, seed=1, rollout_id=3)
    arc = pool.save("r3", samples, rollout_id=3)
    assert len(blob_files_of(pool).chunks("r3")) == 2  # 64 + 6 samples
    assert (arc.name, arc.rollout_id, arc.evaluation, arc.state) == ("r3", 3, False, "published")
    assert len(arc) == 70
    loaded = arc.load_samples()
    assert all(type(s) is Sample for s in loaded)
    same_samples(loaded, samples)
    assert loaded[0].status is Sample.Status.COMPLETED
    # Durable: a new handle on the pool reads the same.
    pool.close()
    same_samples(open_pool().open_archive("r3").load_samples(), samples)


def test_dict_samples_round_trip(pool, rollout, same_samples) -> None:
    samples = rollout(70, seed=2, as_dict=True)
    assert isinstance(samples[0], dict)
    loaded = pool.save("d", samples, rollout_id=0).load_samples()
    assert all(type(s) is dict for s in loaded)
    same_samples(loaded, samples)


def _mixed_samples() -> list:
    """Every value kind the public API promises (README), and the edge cases of each."""
    long_text = "tokens are words " * 100 + "\ud800 lone surrogate, ünïcödé, 漢字"
    first = {
        "none": None,
        "flags": [True, False],
        "int": -(2**63),
        "bigint": 2**80,
        "float": 0.1,
        "specials": [math.inf, -math.inf, -0.0, math.nan, 1e-310],
        "text": long_text,
        "short": "",
        "ints": list(range(-5, 300)),
        "bools_list": [True, False] * 8,
        "floats32": [float(np.float32(x)) for x in np.linspace(-3, 3, 50)],
        "floats64": [0.1 * i for i in range(20)],
        "mixed_list": [1, 2.5, "x", None, True, [1], {"k": 2}] * 2,
        "nested": {"a": {"b": [{"c": 1}], "empty": {}}, "l": []},
        "tuple": (1, "two", 3.0),
        "tensor_i32": torch.arange(24, dtype=torch.int32).reshape(2, 3, 4),
        "tensor_bf16": torch.linspace(-2, 2, 7).to(torch.bfloat16),
        "tensor_0d": torch.tensor(3.5),
        "tensor_empty": torch.empty(0, 5, dtype=torch.int64),
        "tensor_bool": torch.tensor([True, False, True]),
        "tensor_strided": torch.arange(20, dtype=torch.float64).reshape(4, 5).t(),
        "tensor_list": [torch.ones(2, 2, dtype=torch.int16), torch.zeros(1, 2, dtype=torch.int16)],
        "tensor_dict": {"pixel_values": torch.rand(3, 4, 4)},
        "ndarray": np.arange(6, dtype=np.uint16).reshape(2, 3),
        "index": 7,
    }
    plain = {"index": None, "tokens": [1, 2, 3], "reward": {"acc": 1.0, "fmt": 0.5}}
    sample: Any = Sample(index=8, tokens=[5] * 9, reward=None, status=Sample.Status.ABORTED)
    sample.framework_extra = {"engine": "sglang", "ids": [1, 2, 3]}
    sample.rollout_topk_log_probs = torch.randn(4, 3)
    return [first, plain, sample]


def test_mixed_value_kinds_round_trip_exactly(pool, same_samples) -> None:
    samples = _mixed_samples()
    loaded = pool.save("mixed", samples, rollout_id=1).load_samples()
    same_samples(loaded, samples)
    assert isinstance(loaded[0]["tensor_strided"], torch.Tensor)
    assert loaded[0]["tensor_strided"].is_contiguous()  # values equal, layout normalised
    assert loaded[2].framework_extra == {"engine": "sglang", "ids": [1, 2, 3]}


def test_empty_archive(pool) -> None:
    arc = pool.save("empty", [], rollout_id=0)
    assert len(arc) == 0
    assert arc.keys() == []
    assert arc.load_samples() == []
    assert arc.sample_metadata() == []
    with pytest.raises(KeyError):
        arc.load_samples(sample_key="sample:0")


def test_big_tensors_become_lazy_tensor_blobs(open_pool, rollout, same_samples, blob_files_of):
    pool = open_pool(inline_limit=256)
    samples = rollout(10, seed=3, r3_layers=2)
    # An identical tensor in two samples is stored once.
    samples[9].rollout_routed_experts = samples[8].rollout_routed_experts.clone()
    arc = pool.save("r3", samples, rollout_id=0)
    files = blob_files_of(pool)
    tensors = files.digests("r3", "tensor")
    assert len(tensors) == 9
    assert len(files.files()) == 1 + 9 + 1  # chunk, tensors, manifest

    loaded = arc.load_samples()
    refs = [s.rollout_routed_experts for s in loaded]
    assert all(isinstance(r, TensorRef) and not r.loaded for r in refs)
    assert sorted({r.digest for r in refs}) == tensors
    # Shape and dtype are known without reading the blob.
    assert refs[0].shape == samples[0].rollout_routed_experts.shape
    assert refs[0].dtype == torch.int32
    assert not refs[0].loaded
    assert torch.equal(refs[0], samples[0].rollout_routed_experts)
    assert refs[0].loaded and not refs[1].loaded
    same_samples(loaded, samples)


def test_big_numpy_arrays_are_blobs_loaded_as_the_callers_own(
    open_pool, rollout, same_samples, blob_files_of
) -> None:
    """Routed experts as slime hands them (numpy int32 ``[T-1, layers, topk]``) above the
    inline limit are blobs of their own, as tensors are (issue 37's R3 numpy load): stored
    once however often held (an identical array in two samples, a tensor of the same values),
    loaded as the arrays saved (writable, each load its own), one key reading its sample's
    blob alone; a flipped byte is found on load; release and gc reclaim them."""
    pool = open_pool(inline_limit=256)
    samples = rollout(10, seed=3, r3_layers=2, r3_numpy=True)
    samples[9].rollout_routed_experts = samples[8].rollout_routed_experts.copy()
    samples[7].metadata["experts_tensor"] = torch.from_numpy(samples[6].rollout_routed_experts)
    arc = pool.save("r3", samples, rollout_id=0)
    files = blob_files_of(pool)
    assert len(files.digests("r3", "tensor")) == 9
    assert len(files.files()) == 1 + 9 + 1  # chunk, blobs, manifest
    loaded = arc.load_samples(materialize=True)
    same_samples(loaded, samples)
    experts = [s.rollout_routed_experts for s in loaded]
    assert all(type(e) is np.ndarray and e.flags.writeable for e in experts)
    experts[0][:] = -7
    assert np.array_equal(
        pool.open_archive("r3").load_samples()[0].rollout_routed_experts,
        samples[0].rollout_routed_experts,
    )
    read: list[str] = []
    one = pool.open_archive("r3")
    with one.reads_reported(read.append):
        (got,) = one.load_samples(sample_key=one.keys()[4][0])
    digest = codec.encode_array_blob(samples[4].rollout_routed_experts).digest
    assert np.array_equal(got.rollout_routed_experts, samples[4].rollout_routed_experts)
    assert [d for d in read if d in files.digests("r3", "tensor")] == [digest]
    files.flip_bit(digest, pool.store.size(digest) - 1)
    with pytest.raises(IntegrityError, match=digest):
        arc.load_samples()
    arc.release()
    pool.gc(grace=0)
    assert files.files() == []


def test_an_array_blob_gone_with_its_released_archive_says_released(
    open_pool, rollout, blob_files_of
) -> None:
    """An array blob read while its sample is decoded, gone because its archive was released
    and reclaimed (the chunk read before it): `ArchiveReleasedError`, as a chunk gone so
    says, not the record called malformed."""
    pool = open_pool(inline_limit=256)
    samples = rollout(2, seed=3, r3_layers=2, r3_numpy=True)
    arc = pool.save("r3", samples, rollout_id=0)
    arc.release()
    blob_files_of(pool).delete(codec.encode_array_blob(samples[1].rollout_routed_experts).digest)
    with pytest.raises(ArchiveReleasedError, match="released"):
        arc.load_samples()


def test_a_tensor_loaded_from_its_blob_is_the_callers_own(open_pool, rollout, blob_files_of):
    """A materialized tensor blob is writable, and what is written reaches neither the blob
    nor another load of it (on local files it is a copy-on-write map of the blob); a flipped
    byte of the blob is still found when it is loaded."""
    pool = open_pool(inline_limit=256)
    samples = rollout(2, seed=3, r3_layers=2)
    arc = pool.save("r3", samples, rollout_id=0)
    first = arc.load_samples(materialize=True)[0].rollout_routed_experts
    assert isinstance(first, torch.Tensor)
    expected = samples[0].rollout_routed_experts
    first.view(-1)[:5] = -7
    first.add_(1)
    again = pool.open_archive("r3").load_samples(materialize=True)[0].rollout_routed_experts
    assert torch.equal(again, expected)
    assert torch.equal(pool.open_archive("r3").load_samples()[0].rollout_routed_experts, expected)
    digest = arc.load_samples()[0].rollout_routed_experts.digest
    pool.store.check(digest)
    blob_files_of(pool).flip_bit(digest, pool.store.size(digest) - 1)
    with pytest.raises(IntegrityError, match=digest):
        arc.load_samples(materialize=True)


def test_tensors_held_from_their_blobs_hold_no_descriptors(open_pool, rollout, monkeypatch) -> None:
    """A replay buffer holding many tensors loaded from their blobs (each over a map of its
    file) under a low ``ulimit -n``: the loads and the process's other opens go on (a map
    that kept a descriptor, as Python's mmap does, used one per held tensor: at the limit
    every open failed, 'Too many open files')."""
    import resource

    from archive_manager.blobs import local

    monkeypatch.setattr(local, "_MAP_MIN", 1)  # these 4 KiB tensors mapped, as large ones are
    pool = open_pool(inline_limit=256)
    pool.save("r3", rollout(120, seed=5, r3_layers=2), rollout_id=0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 40, hard))
    try:
        held = []
        for _ in range(3):  # 360 tensors held, each from its own map
            held += [
                s.rollout_routed_experts
                for s in pool.open_archive("r3").load_samples(materialize=True)
            ]
        with open(os.devnull) as other:  # the process's own opens are not starved
            assert other.readable()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len(held) == 360 and all(isinstance(t, torch.Tensor) for t in held)


# --------------------------------------------------------------------------- keys


def test_load_by_sample_key_task_key_and_both(pool, rollout, same_samples) -> None:
    samples = rollout(70, seed=4)  # groups of 8: group-7 = 56..63 (chunk 0), group-8 = 64..69
    arc = pool.save("k", samples, rollout_id=0)
    same_samples(arc.load_samples(sample_key="sample:65"), [samples[65]])
    same_samples(arc.load_samples(sample_key="sample:0"), [samples[0]])
    same_samples(arc.load_samples(task_key="rollout-0/group-7"), samples[56:64])
    same_samples(arc.load_samples(task_key="rollout-0/group-8"), samples[64:70])
    same_samples(
        arc.load_samples(sample_key="sample:60", task_key="rollout-0/group-7"), [samples[60]]
    )
    # Both keys exist, but not on one sample: the intersection is empty.
    with pytest.raises(KeyError, match="sample:60"):
        arc.load_samples(sample_key="sample:60", task_key="rollout-0/group-8")
    with pytest.raises(KeyError):
        arc.load_samples(sample_key="sample:70")
    with pytest.raises(KeyError):
        arc.load_samples(task_key="rollout-0/group-9")
    with pytest.raises(KeyError):
        arc.load_samples(sample_key="sample:1", task_key="nope")


def test_a_keyed_load_reads_the_catalog_in_one_statement(pool, rollout, same_samples) -> None:
    """A load by key on an open archive asks the catalog one question (its entries joined
    with their chunks' rows), not one for the entries and one for their chunks: on the
    1024-sample rollout the second cost a third of a one-key load (docs/performance.md)."""
    samples = rollout(70, seed=4)
    arc = pool.save("k", samples, rollout_id=0)
    selects: list[str] = []

    def record(conn, cursor, statement, params, *rest) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            selects.append(statement)

    event.listen(pool.catalog.engine, "before_cursor_execute", record)
    try:
        for keys in (
            {"sample_key": "sample:65"},
            {"task_key": "rollout-0/group-7"},
            {"sample_key": "sample:60", "task_key": "rollout-0/group-7"},
            {},
        ):
            selects.clear()
            got = arc.load_samples(**keys)
            assert len(selects) == 1, (keys, selects)
        same_samples(got, samples)
    finally:
        event.remove(pool.catalog.engine, "before_cursor_execute", record)


def test_a_load_hands_what_it_built_to_the_oldest_generation(pool, rollout) -> None:
    """The lists a load makes are not left young: the next young collections would traverse
    every number of every list to free nothing (docs/performance.md).  A process that froze
    its objects (gc.freeze() before a fork) keeps them frozen."""
    samples = rollout(70, seed=4)
    arc = pool.save("g", samples, rollout_id=0)

    def lists(loaded: list) -> list[list]:
        return [v for s in loaded for v in vars(s).values() if type(v) is list and v]

    for load in (arc.load_samples, lambda: list(arc.iter_samples())):
        gc.collect()
        got = load()
        assert gc.isenabled()
        oldest = {id(o) for o in gc.get_objects(generation=2)}
        assert lists(got) and all(id(v) in oldest for v in lists(got))
    kept = [object()]  # frozen: gc.get_objects() lists no frozen object
    gc.freeze()
    try:
        got = arc.load_samples()
        assert all(id(o) != id(kept) for o in gc.get_objects())
    finally:
        gc.unfreeze()


def test_loads_that_promote_young_objects_leave_full_collections_their_turn() -> None:
    """gc.freeze() zeroes the counts that start older collections: a process loading more
    often than 100 young collections apart never ran a full one again, and the garbage
    cycles each load promoted piled up for good.  Once enough was promoted, a full
    collection runs instead."""

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    garbage = Cycle()
    freed = weakref.ref(garbage)
    del garbage  # a young cycle when the next load ends: promoted with what the load built
    for _ in range(1_000):  # 5 M objects promoted at most: more than a quarter of any test's heap
        with codec.values.gc_paused(promote=True):
            built: list[list[int]] = [[] for _ in range(5_000)]  # a load's lists
        del built
        if freed() is None:
            break
    assert freed() is None


def test_keys_order_and_length(pool, rollout) -> None:
    samples = rollout(70, seed=5)
    arc = pool.save("k", samples, rollout_id=0)
    keys = arc.keys()
    assert len(keys) == len(arc) == 70
    assert keys == [(f"sample:{i}", f"rollout-0/group-{i // 8}") for i in range(70)]


def test_duplicate_indices_share_a_sample_key(pool, rollout, same_samples) -> None:
    samples = rollout(12, seed=6)
    samples[3].index = 1
    samples[10].index = 1
    arc = pool.save("dup", samples, rollout_id=0)
    assert [sk for sk, _ in arc.keys()].count("sample:1") == 3
    same_samples(arc.load_samples(sample_key="sample:1"), [samples[1], samples[3], samples[10]])
    same_samples(
        arc.load_samples(sample_key="sample:1", task_key="rollout-0/group-1"), [samples[10]]
    )


def test_samples_without_index_get_position_keys(pool, same_samples) -> None:
    samples = [
        Sample(index=None, tokens=[1]),
        {"tokens": [2]},
        Sample(index=5, tokens=[3]),
        {"index": None, "tokens": [4]},
    ]
    arc = pool.save("pos", samples, rollout_id=0)
    assert [sk for sk, _ in arc.keys()] == ["position:0", "position:1", "sample:5", "position:3"]
    same_samples(arc.load_samples(sample_key="position:3"), [samples[3]])
    with pytest.raises(KeyError):
        arc.load_samples(sample_key="position:2")  # sample 2 has an index


def test_task_keys_argument_overrides_the_samples(pool, rollout, same_samples) -> None:
    samples = rollout(5, seed=7)
    task_keys = ["t0", None, "t0", 42, None]
    arc = pool.save("tk", samples, rollout_id=0, task_keys=task_keys)
    assert [tk for _, tk in arc.keys()] == ["t0", None, "t0", "42", None]
    same_samples(arc.load_samples(task_key="t0"), [samples[0], samples[2]])
    same_samples(arc.load_samples(task_key="42"), [samples[3]])
    with pytest.raises(KeyError):
        arc.load_samples(task_key="rollout-0/group-0")  # the samples' own key was overridden
    # The samples themselves are stored unchanged (their task_key attribute included).
    assert arc.load_samples()[1].task_key == "rollout-0/group-0"


def test_task_keys_for_a_sequence_longer_than_its_len_are_refused_cleanly(
    pool, rollout, snapshot
) -> None:
    """A sequence that yields more samples than its ``len()`` said (the keys were counted
    against it) is refused with InvalidInputError, leaving the pool as it was; it raised a
    bare IndexError."""
    samples = rollout(6, seed=3)

    class Longer(list):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 4

    before = snapshot(pool)
    with pytest.raises(InvalidInputError, match="task_keys has 4 keys"):
        pool.save("lk", Longer(samples), rollout_id=0, task_keys=["t"] * 4)
    assert snapshot(pool) == before
    assert len(pool.save("lk", samples[:4], rollout_id=0, task_keys=["t"] * 4)) == 4


def test_queue_handles_give_task_keys_and_are_never_stored(pool, same_samples) -> None:
    receipt: Any = Sample(index=0, tokens=[1, 2])
    receipt._queue_receipt = {"task_id": 17, "ack": "not storable either"}
    lease: Any = Sample(index=1, tokens=[3])
    lease._queue_lease = SimpleNamespace(task_id="task-9", renew=lambda: None)
    lease._queue_other = object()  # would be unencodable, but is live control state
    own_key: Any = Sample(index=2)
    own_key.task_key = "explicit"
    own_key._queue_receipt = {"task_id": "ignored"}
    as_dict = {"index": 3, "_queue_receipt": {"task_id": "d-1"}, "_queue_x": object()}
    plain = Sample(index=4)
    samples = [receipt, lease, own_key, as_dict, plain]

    arc = pool.save("q", samples, rollout_id=0)
    assert arc.keys() == [
        ("sample:0", "17"),
        ("sample:1", "task-9"),
        ("sample:2", "explicit"),
        ("sample:3", "d-1"),
        ("sample:4", None),
    ]
    loaded = arc.load_samples()
    for sample in loaded:
        names = sample if isinstance(sample, dict) else vars(sample)
        assert not [n for n in names if n.startswith("_queue_")]
    same_samples(loaded, samples)  # compares stored fields, i.e. without _queue_*
    same_samples(arc.load_samples(task_key="task-9"), [lease])
    assert loaded[3] == {"index": 3}


@pytest.mark.parametrize(
    "keys",
    [
        {"sample_key": 1},
        {"sample_key": b"sample:1"},
        {"task_key": 1.5},
        {"task_key": ["rollout-0/group-0"]},
        {"sample_key": "sample:1", "task_key": object()},
    ],
)
def test_load_samples_refuses_keys_of_wrong_types(pool, rollout, keys) -> None:
    arc = pool.save("k", rollout(3), rollout_id=0)
    with pytest.raises(InvalidInputError):
        arc.load_samples(**keys)


# --------------------------------------------------------------------------- catalog only


def test_sample_metadata_reads_no_blob(pool, rollout, blob_files_of) -> None:
    samples = rollout(70, seed=8, r3_layers=1)
    pool.save("m", samples, rollout_id=4, evaluation=True)
    expected = [describe_sample(s) for s in samples]
    assert expected[0]["tensors"]["rollout_routed_experts"]["dtype"] == "int32"

    assert blob_files_of(pool).delete_all() == 3  # two chunks and the manifest
    arc = pool.open_archive("m")  # reads the catalog only
    assert arc.sample_metadata() == expected
    assert len(arc) == 70
    assert arc.keys()[69] == ("sample:69", "rollout-0/group-8")
    assert [i.name for i in pool.find(task_key="rollout-0/group-8")] == ["m"]
    assert arc.info().samples == 70
    # The blobs really are gone.
    with pytest.raises(IntegrityError):
        arc.load_samples(sample_key="sample:0")


def test_find_filters_and_archive_info(open_pool, clock, rollout, blob_files_of) -> None:
    pool = open_pool(clock=clock)
    a = pool.save("a", rollout(10, rollout_id=1), rollout_id=1)
    clock.advance(60)
    pool.save("b", rollout(5, seed=1, rollout_id=2), rollout_id=2, evaluation=True)
    pool.save("c", rollout(3, seed=2, rollout_id=1), rollout_id=1, task_keys=["x", "y", None])
    pool.save("ref", None, rollout_id=0, reference="b")

    def names(infos) -> list[str]:
        return [info.name for info in infos]

    assert names(pool.find()) == ["ref", "a", "c", "b"]  # by rollout id, then name
    assert names(pool.find(rollout_id=1)) == ["a", "c"]
    assert names(pool.find(evaluation=True)) == ["b"]
    assert names(pool.find(evaluation=False)) == ["ref", "a", "c"]
    assert names(pool.find(task_key="rollout-1/group-0")) == ["a"]
    assert names(pool.find(task_key="rollout-2/group-0")) == ["ref", "b"]
    assert names(pool.find(task_key="y")) == ["c"]
    assert names(pool.find(rollout_id=1, task_key="y")) == ["c"]
    assert pool.find(rollout_id=1, evaluation=True) == []
    assert pool.find(task_key="nope") == []
    assert pool.find(rollout_id=99) == []

    clock.advance(60)
    assert a.release() is True
    assert names(pool.find(rollout_id=1)) == ["c"]
    assert names(pool.find(state="released")) == ["a"]
    assert names(pool.find(state=None)) == ["ref", "a", "c", "b"]
    assert names(pool.find(state="published", task_key="rollout-1/group-0")) == []
    assert names(pool.find(state=None, task_key="rollout-1/group-0")) == ["a"]

    (info,) = pool.find(state=None, rollout_id=1, task_key="rollout-1/group-0")
    assert (info.name, info.rollout_id, info.evaluation, info.state, info.samples) == (
        "a",
        1,
        False,
        "released",
        10,
    )
    assert info.created_at.timestamp() == clock.now - 120
    assert info.created_at.tzinfo is not None
    assert info.published_at is not None and info.published_at.timestamp() == clock.now - 120
    assert info.released_at is not None and info.released_at.timestamp() == clock.now
    assert info.bytes == sum(pool.store.size(d) for d in blob_files_of(pool).digests("a"))
    (b_info,) = pool.find(evaluation=True)
    assert b_info.evaluation is True and b_info.state == "published" and b_info.samples == 5


@pytest.mark.parametrize(
    "filters",
    [{"state": "gone"}, {"rollout_id": "1"}, {"evaluation": "yes"}, {"task_key": 1.5}],
)
def test_find_refuses_bad_filters(pool, filters) -> None:
    with pytest.raises(InvalidInputError):
        pool.find(**filters)


# --------------------------------------------------------------------------- export, release


def test_export_pt_is_self_contained(open_pool, rollout, tmp_path, same_samples) -> None:
    pool = open_pool(inline_limit=256)
    samples = rollout(70, seed=9, rollout_id=6, r3_layers=2)
    arc = pool.save("x", samples, rollout_id=6)
    target = tmp_path / "exports" / "deep" / "rollout_6.pt"
    assert arc.export_pt(target) == target
    data = torch.load(target, weights_only=True)
    assert set(data) == {"rollout_id", "samples", "archive_manager"}
    assert data["rollout_id"] == 6
    exported = data["samples"]
    assert all(type(s) is dict for s in exported)
    assert all(type(s["rollout_routed_experts"]) is torch.Tensor for s in exported)
    same_samples(exported, [sample_to_fields(s)[1] for s in samples])
    assert exported[0]["status"] in {"completed", "truncated"}
    # slime rebuilds its samples from the dicts.
    same_samples([Sample.from_dict(s) for s in exported], samples)
    assert not list(target.parent.glob("*.tmp"))


def test_export_pt_of_every_value_kind_loads_weights_only(pool, tmp_path) -> None:
    samples = _mixed_samples()
    samples[1]["np_scalar"] = np.float32(0.25)
    arc = pool.save("mixed", samples, rollout_id=None)
    target = arc.export_pt(tmp_path / "mixed.pt")
    data = torch.load(target, weights_only=True)  # no pickled numpy, no code
    assert data["rollout_id"] is None
    first, second, third = data["samples"]
    # numpy values come back as their torch / Python equivalents.
    assert first["ndarray"].dtype == torch.uint16 and first["ndarray"].shape == (2, 3)
    assert first["ndarray"].to(torch.int64).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert second["np_scalar"] == 0.25 and type(second["np_scalar"]) is float
    assert first["tuple"] == (1, "two", 3.0)
    assert first["bigint"] == 2**80
    assert first["text"] == samples[0]["text"]
    assert torch.equal(first["tensor_i32"], samples[0]["tensor_i32"])
    assert third["status"] == "aborted" and third["framework_extra"]["engine"] == "sglang"


def test_release_is_idempotent_and_keeps_rows(pool, rollout, same_samples) -> None:
    samples = rollout(20, seed=10)
    arc = pool.save("rel", samples, rollout_id=0)
    keys = arc.keys()
    metadata = arc.sample_metadata()
    assert arc.release() is True
    assert arc.release() is False
    assert arc.state == "released"
    reopened = pool.open_archive("rel")
    assert reopened.state == "released"
    assert reopened.release() is False
    assert reopened.keys() == keys
    assert reopened.sample_metadata() == metadata
    assert len(reopened) == 20
    # Without a GC the payload is still there.
    same_samples(reopened.load_samples(), samples)
    assert pool.find() == []
    assert [i.name for i in pool.find(state="released")] == ["rel"]


def test_released_and_reclaimed_payload_raises_released_error(pool, rollout, blob_files_of):
    arc = pool.save("rel", rollout(5), rollout_id=0)
    arc.release()
    blob_files_of(pool).delete_all()  # what GC does to an unowned archive's blobs
    with pytest.raises(ArchiveReleasedError, match="rel"):
        arc.load_samples()


# --------------------------------------------------------------------------- damage


def test_indexed_read_needs_only_its_own_chunk(pool, rollout, same_samples, blob_files_of):
    samples = rollout(70, seed=11)
    arc = pool.save("idx", samples, rollout_id=0)
    files = blob_files_of(pool)
    chunk0, chunk1 = files.chunks("idx")

    files.delete(chunk1)
    same_samples(arc.load_samples(sample_key="sample:5"), [samples[5]])
    same_samples(arc.load_samples(task_key="rollout-0/group-7"), samples[56:64])
    with pytest.raises(IntegrityError) as err:
        arc.load_samples(sample_key="sample:66")
    assert "'idx'" in str(err.value) and chunk1 in str(err.value)
    with pytest.raises(IntegrityError, match=chunk1):
        arc.load_samples()

    other = pool.save("idx2", samples, rollout_id=0)  # heals chunk 1 (same bytes)
    assert files.chunks("idx2") == [chunk0, chunk1]
    files.delete(chunk0)
    same_samples(other.load_samples(sample_key="sample:66"), [samples[66]])
    same_samples(arc.load_samples(task_key="rollout-0/group-8"), samples[64:])
    with pytest.raises(IntegrityError) as err:
        arc.load_samples(sample_key="sample:63")
    assert "'idx'" in str(err.value) and chunk0 in str(err.value)


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_corrupt_chunk_blob_raises_integrity_error(pool, rollout, blob_files_of, where):
    samples = rollout(70, seed=12)
    arc = pool.save("bad", samples, rollout_id=0)
    files = blob_files_of(pool)
    chunk0, _ = files.chunks("bad")
    size = pool.store.size(chunk0)
    files.flip_bit(chunk0, {"start": 0, "middle": size // 2, "end": size - 1}[where])
    for keys in [{}, {"sample_key": "sample:0"}, {"task_key": "rollout-0/group-3"}]:
        with pytest.raises(IntegrityError) as err:
            arc.load_samples(**keys)
        assert "'bad'" in str(err.value) and chunk0 in str(err.value)
    assert len(arc.load_samples(sample_key="sample:64")) == 1  # chunk 1 is fine


def test_truncated_chunk_blob_raises_integrity_error(pool, rollout, blob_files_of) -> None:
    arc = pool.save("trunc", rollout(10), rollout_id=0)
    files = blob_files_of(pool)
    (chunk,) = files.chunks("trunc")
    path = local_store(pool).path(chunk)
    files.flip_bit(chunk)  # makes it writable; the truncation is what matters
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(IntegrityError, match=chunk):
        arc.load_samples(sample_key="sample:0")


@pytest.mark.parametrize("damage", ["delete", "flip_bit"])
def test_damaged_tensor_blob_raises_when_touched(open_pool, rollout, blob_files_of, damage):
    pool = open_pool(inline_limit=256)
    samples = rollout(4, seed=13, r3_layers=2)
    arc = pool.save("t", samples, rollout_id=0)
    first, second = arc.load_samples(sample_key="sample:0") + arc.load_samples(
        sample_key="sample:1"
    )
    ref = first.rollout_routed_experts
    getattr(blob_files_of(pool), damage)(ref.digest)
    assert ref.shape == samples[0].rollout_routed_experts.shape  # no read needed
    with pytest.raises(IntegrityError) as err:
        ref.materialize()
    assert "'t'" in str(err.value) and ref.digest in str(err.value)
    with pytest.raises(IntegrityError):
        torch.equal(first.rollout_routed_experts, samples[0].rollout_routed_experts)
    with pytest.raises(IntegrityError):
        arc.export_pt(pool.root.parent / "out.pt")
    # Other samples' tensors are untouched.
    assert torch.equal(second.rollout_routed_experts, samples[1].rollout_routed_experts)
    assert isinstance(err.value, ArchiveError)
