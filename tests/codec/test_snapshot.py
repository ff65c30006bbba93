"""The snapshot `save_async` takes on the caller's thread (`codec.snapshot.take_samples`):
the copy encodes, byte for byte, and is described as the sample was when it was taken,
whatever the caller does to the sample afterwards; what it cannot copy that way it leaves to
the encoder (None).  Held for the C loops and the Python ones, on one thread and several.
"""

from __future__ import annotations

import dataclasses
import enum
import gc
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import tiny_rollout

from archive_manager import ArchiveManager, Sample, register_sample_class
from archive_manager.codec import snapshot
from archive_manager.codec.values import TakenList, list_array
from archive_manager.errors import UnencodableError
from archive_manager.interop.synthetic import make_rollout
from archive_manager.pool import writer as writer_module
from archive_manager.pool.writer import PreparedSample, prepare_sample
from archive_manager.samples import task_key_of


class Shade(enum.Enum):
    DARK = "dark"


@dataclasses.dataclass
class Note:
    text: str
    scores: list[float]
    _queue_mark: str = "declared"  # a field the class declares: stored, whatever its name


register_sample_class(Note)
register_sample_class(Shade)


@pytest.fixture(autouse=True)
def ahead_for_any_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # `lists_ahead` leaves batches of few numbers to the encoder; these tests' batches are
    # small, and are to be converted ahead (test_a_small_batch_is_left_to_the_encoder below)
    monkeypatch.setattr(snapshot, "_AHEAD_MIN", 0)


@pytest.fixture(params=["native", "python"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "native":
        if snapshot.native_fill_taken is None:
            pytest.skip("the C extension is not built")
    else:
        for name in ("native_take_dict", "native_take_object", "native_fill_taken"):
            monkeypatch.setattr(snapshot, name, None)
    yield request.param


@pytest.fixture(params=[1, 3])
def threads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(snapshot, "THREADS", request.param)
    return int(request.param)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[ArchiveManager]:
    with ArchiveManager.open(tmp_path / "pool") as opened:
        yield opened


def encoded(prepared: PreparedSample) -> tuple[Any, ...]:
    e = prepared.encoded
    blobs = {d: b"".join(bytes(p) for p in b.parts) for d, b in e.tensor_blobs.items()}
    return (
        e.record,
        e.text,
        blobs,
        prepared.description,
        prepared.sample_key,
        prepared.task_key,
        prepared.task_text,
    )


def from_copy(pool: ArchiveManager, sample: Any, copy: tuple[Any, int, bool], i: int) -> Any:
    """What the worker prepares from a copy (`background._Taken.prepare`)."""
    taken, _, queue = copy
    if queue:
        return encoded(prepare_sample(pool.context, taken, i, task_key_of(sample), copy=False))
    return encoded(prepare_sample(pool.context, taken, i, copy=False))


def rich(i: int) -> Sample:
    """A sample holding every kind of value the copy takes, shared and nested."""
    s = tiny_rollout(1, seed=i)[0]
    shared = [float(j) / 3 for j in range(9)]
    s.metadata = {
        "step": i,
        "nested": {"deep": {"ids": list(range(20))}, "again": shared},
        "again": shared,  # one list in two places: one array node, written twice
        "lists": [[1, 2, 3], ["a", None, True], (4.5, "b")],
        "big": [2**40 + j for j in range(10)],  # int64, beyond one CPython digit
        "doubles": [0.1 * j for j in range(12)],  # not float32-exact: float64
        "specials": [float("nan"), -0.0, float("inf"), 1.5, 2.5, 3.5, 4.5, 5.5],
        "bools": [True, False] * 5,
        "blob": b"\x00\x01" * 40,
        "mutable": bytearray(b"xyz"),
        "shade": Shade.DARK,
        "scalar": np.float32(1.25),
        "note": Note("n", [0.5] * 10),
        "empty": [],
        (1, "tuple key"): "value",
        7: "int key",
    }
    s.rollout_routed_experts = torch.arange(24, dtype=torch.int32).reshape(6, 2, 2) + i
    s.multimodal_inputs = {"pixels": np.arange(12, dtype=np.uint8) * i}
    s.spec_info.spec_draft_token_num = 4 + i
    s._queue_receipt = {"task_id": f"task-{i}"}  # type: ignore[attr-defined]
    return s


def samples_of_every_kind() -> list[Any]:
    out: list[Any] = []
    out += make_rollout(6, seed=1, prompt_len=16, response_min=8, response_max=40)
    out += make_rollout(3, seed=2, prompt_len=8, response_min=4, response_max=12, r3_layers=2)
    out += make_rollout(
        3, seed=3, prompt_len=8, response_min=4, response_max=12, r3_layers=2, r3_numpy=True
    )
    out += make_rollout(3, seed=4, prompt_len=8, response_min=4, response_max=12, as_dict=True)
    out += [rich(i) for i in range(4)]
    out.append({"tokens": list(range(30)), "_queue_lease": object(), "reward": [0.5] * 8})
    return out


def test_a_copy_encodes_as_the_sample_did(pool: ArchiveManager, mode: str, threads: int) -> None:
    samples = samples_of_every_kind()
    copies = snapshot.take_samples(samples)
    expected = [encoded(prepare_sample(pool.context, s, i)) for i, s in enumerate(samples)]
    for i, (sample, copy) in enumerate(zip(samples, copies, strict=True)):
        assert copy is not None
        assert from_copy(pool, sample, copy, i) == expected[i], f"sample {i}"


def test_the_copy_holds_nothing_the_caller_changes(
    pool: ArchiveManager, mode: str, threads: int
) -> None:
    samples, twins = [rich(i) for i in range(3)], [rich(i) for i in range(3)]
    copies = snapshot.take_samples(samples)
    s: Any  # the fields rich() fills are not None
    for s in samples:  # what a loop reusing its buffers does right after handing them over
        s.tokens[0] = -1
        s.loss_mask.clear()
        s.rollout_log_probs[:] = [0.0]
        s.metadata["nested"]["deep"]["ids"].append(99)
        s.metadata["again"][0] = 42.0
        s.metadata["lists"][0].append(4)
        s.metadata["mutable"][0] = 0
        s.metadata["note"].scores[0] = 9.0
        s.rollout_routed_experts.fill_(-7)
        s.multimodal_inputs["pixels"][:] = 3
        s.spec_info.spec_draft_token_num = 0
        s.reward = 123.0
        s._queue_receipt["task_id"] = "changed"  # type: ignore[attr-defined]
    for i, copy in enumerate(copies):
        assert copy is not None
        assert from_copy(pool, twins[i], copy, i) == encoded(
            prepare_sample(pool.context, twins[i], i)
        )


def view_of_a_tensor() -> Sample:
    s = tiny_rollout(1)[0]
    base = torch.arange(20, dtype=torch.float32)
    s.multimodal_inputs = {"a": base[2:], "b": base}
    return s


def two_tensors_over_one_array() -> Sample:
    s = tiny_rollout(1)[0]
    array = np.arange(20, dtype=np.int64)
    s.multimodal_inputs = {"a": torch.from_numpy(array), "b": array}
    return s


@pytest.mark.parametrize(
    "make",
    [
        view_of_a_tensor,
        two_tensors_over_one_array,
        lambda: {**tiny_rollout(1)[0].to_dict(), "arr": np.arange(10)[::2]},
        lambda: {"tokens": torch.nn.Parameter(torch.ones(3))},
        lambda: {"meta": OrderedDict(a=1)},
        lambda: {"meta": {"x": object()}},
        lambda: OrderedDict(tokens=[1] * 10),
        lambda: object(),
        lambda: {"index": list(range(10))},  # a list where the save reads a key
        # numbers first, yet no array: the encoder writes them item by item
        lambda: {"tokens": [1, 2.0, 3, 4, 5, 6, 7, 8, 9]},
        lambda: {"tokens": [2**70] * 9},
    ],
)
def test_what_it_does_not_copy_is_left_to_the_encoder(make: Any, mode: str) -> None:
    assert snapshot.take_samples([make(), tiny_rollout(1)[0]])[0] is None


def test_nesting_too_deep_is_left_to_the_encoder(mode: str) -> None:
    deep: Any = [1]
    for _ in range(5000):
        deep = {"d": [deep]}
    got = snapshot.take_samples([{"tokens": [1] * 8, "deep": deep}, {"tokens": [2] * 8}])
    assert got[0] is None and got[1] is not None


def test_the_numeric_lists_of_a_batch_convert_as_the_encoder_converts(
    mode: str, threads: int
) -> None:
    rng = np.random.default_rng(5)
    lists: list[list[Any]] = [
        rng.integers(0, 150_000, size=3000).tolist(),  # token ids: uint32
        [1] * 2500,  # a mask: int8
        (-rng.exponential(0.3, size=2000)).astype(np.float32).tolist(),  # float32-exact
        rng.random(100).tolist(),  # float64
        rng.integers(-(2**50), 2**50, size=50).tolist(),  # int64: beyond one digit
        [2**64] + [1] * 10,  # beyond int64: no array
        [1, 2, 3, 4, 5, 6, 7, 8.0],  # mixed: no array
        [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, None],  # a None: no array
        list(range(-5, 300)),  # int16
    ] * 7
    pending = []
    for values in lists:
        taken = TakenList()
        taken.length = len(values)
        pending.append((values, taken))
    bad = snapshot.fill(pending)
    assert bad == [i for i, values in enumerate(lists) if list_array(values) is None]
    for i, (values, taken) in enumerate(pending):
        if i not in bad:
            assert (taken.dtype, bytes(taken.data), taken.shuffled) == list_array(values)
            assert len(taken) == len(values)


def test_lists_converted_ahead_encode_as_the_lists_do(
    pool: ArchiveManager, mode: str, threads: int
) -> None:
    # `pool.save` converts a chunk's numeric lists ahead (`lists_ahead`) and the encoder
    # writes those arrays: the records are the bytes the lists themselves make.
    samples = samples_of_every_kind()
    ahead = snapshot.lists_ahead(samples)
    assert ahead  # the rollouts' tokens, masks and log-probs at least
    for i, sample in enumerate(samples):
        want = encoded(prepare_sample(pool.context, sample, i, copy=False))
        assert encoded(prepare_sample(pool.context, sample, i, copy=False, ahead=ahead)) == want


def test_lists_ahead_take_only_numeric_arrays_and_name_each_by_its_list(mode: str) -> None:
    mask, mixed, big = [1] * 10, [1, 2, 3, 4, 5, 6, 7, 8.5], [2**64] + [1] * 10
    got = snapshot.lists_ahead([{"a": mask, "b": mixed, "c": big, "d": [1, 2]}, object()])
    assert list(got) == [id(mask)]
    held, taken = got[id(mask)]
    assert held is mask and (taken.dtype, bytes(taken.data), taken.shuffled) == list_array(mask)


def test_a_small_batch_is_left_to_the_encoder(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    # below `_AHEAD_MIN` numbers starting the conversion's threads costs more than it saves
    monkeypatch.setattr(snapshot, "_AHEAD_MIN", 100)
    assert snapshot.lists_ahead([{"tokens": [1] * 60, "mask": [0] * 39}]) == {}
    tokens = [1] * 60
    got = snapshot.lists_ahead([{"tokens": tokens, "mask": [0] * 40}])
    assert got[id(tokens)][0] is tokens


def test_an_array_ahead_under_another_lists_id_is_not_written(pool: ArchiveManager) -> None:
    # The map holds each list it converted; an entry whose list is not the one met (however
    # it came to be there) is ignored, so no sample is written with another list's numbers.
    other, tokens = [9] * 20, [1] * 20
    wrong = snapshot.lists_ahead([{"tokens": other}])
    ahead = {id(tokens): wrong[id(other)]}
    sample = {"tokens": tokens}
    want = encoded(prepare_sample(pool.context, sample, 0, copy=False))
    assert encoded(prepare_sample(pool.context, sample, 0, copy=False, ahead=ahead)) == want


def test_a_save_lets_a_chunks_lists_go_before_it_converts_the_next(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each chunk's map holds its arrays: were the last one still held while the next is
    # made, a save's peak memory would hold two chunks' arrays instead of one.
    last: list[Any] = []
    holders: list[list[Any]] = []

    def spy(batch: list[Any]) -> dict[int, tuple[list[Any], TakenList]]:
        if last:
            holders.append([r for r in gc.get_referrers(last[0]) if r is not last])
        last[:] = [snapshot.lists_ahead(batch)]
        return last[0]  # type: ignore[no-any-return]

    monkeypatch.setattr(writer_module, "lists_ahead", spy)
    samples = [{"tokens": list(range(i, i + 40))} for i in range(5)]
    with ArchiveManager.open(pool.root.parent / "small-chunks", chunk_size=2) as small:
        small.save("a", samples, rollout_id=0)
    assert holders == [[], []]  # `last` alone


def test_a_save_refuses_a_sample_whose_dict_raises_as_the_encoder_does(
    pool: ArchiveManager,
) -> None:
    class Raising:
        @property
        def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
            raise RuntimeError("not a sample")

    with pytest.raises(UnencodableError, match="cannot store a sample of type"):
        pool.save("a", [{"tokens": [1] * 10}, Raising()], rollout_id=0)


def test_a_list_emptied_since_it_was_collected_is_no_array(mode: str, threads: int) -> None:
    # Python code may run between a list's collection and `fill` (another thread, a class's
    # own ``__dict__``): an empty list is left to the encoder, as any list that is no array.
    emptied, kept = [1] * 10, [2.5] * 10
    pending = []
    for values in (emptied, kept):
        taken = TakenList()
        taken.length = len(values)
        pending.append((values, taken))
    emptied.clear()
    assert snapshot.fill(pending) == [0]
    want = list_array(kept)
    assert want is not None
    assert (pending[1][1].dtype, bytes(pending[1][1].data)) == (want[0], bytes(want[1]))
    assert snapshot.fill(pending[:1]) == [0]  # a batch of empty lists only


def test_a_save_whose_sample_empties_a_list_of_its_chunk_refuses_as_the_encoder_does(
    pool: ArchiveManager, mode: str
) -> None:
    first = {"tokens": list(range(40))}

    class Emptying:
        @property
        def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
            first["tokens"].clear()
            return {}

    with pytest.raises(UnencodableError, match="cannot store a sample of type"):
        pool.save("a", [first, Emptying()], rollout_id=0)


def test_a_list_changed_in_length_since_it_was_converted_ahead_is_written_as_it_is(
    pool: ArchiveManager, mode: str
) -> None:
    # `pool.save` converts a chunk's lists before it encodes its samples, and hands the GIL
    # over meanwhile: a list another thread grew or shrank since is read again, so that its
    # record agrees with the description (which reads its length then).
    tokens, mask = list(range(40)), [1] * 40
    sample = {"tokens": tokens, "loss_mask": mask}
    ahead = snapshot.lists_ahead([sample])
    tokens.append(40)
    mask[:] = [0] * 30
    want = encoded(prepare_sample(pool.context, sample, 0, copy=False))
    assert encoded(prepare_sample(pool.context, sample, 0, copy=False, ahead=ahead)) == want


def test_a_save_of_samples_made_anew_at_each_access_stores_each_as_made(
    pool: ArchiveManager,
) -> None:
    # A sequence that makes a new sample (and new lists) at each access: the save reads each
    # once, so the lists converted ahead are the ones encoded.
    class Made:
        def __len__(self) -> int:
            return 150

        def __getitem__(self, i: int) -> dict[str, Any]:
            if i >= 150:
                raise IndexError(i)
            return {"tokens": list(range(i, i + 40)), "reward": float(i)}

    pool.save("made", Made(), rollout_id=0)  # type: ignore[arg-type]
    loaded = pool.open_archive("made").load_samples()
    assert [s["tokens"] for s in loaded] == [list(range(i, i + 40)) for i in range(150)]


def slab_of(taken: TakenList) -> tuple[int, int]:
    """``(id, address)`` of the memory a taken array is a view of."""
    owner = memoryview(taken.data).obj
    start = np.frombuffer(memoryview(owner), dtype=np.uint8).__array_interface__["data"][0]
    return id(owner), start


def batch(seed: int) -> list[tuple[list[Any], TakenList]]:
    rng = np.random.default_rng(seed)
    pending = []
    for _ in range(40):
        for values in (
            rng.integers(0, 150_000, size=3000).tolist(),
            [1] * 2500,
            (-rng.exponential(0.3, size=2000)).astype(np.float32).tolist(),
        ):
            taken = TakenList()
            taken.length = len(values)
            pending.append((values, taken))
    assert snapshot.fill(pending) == []
    return pending


def test_a_batchs_arrays_share_memory_a_later_batch_reuses_once_no_copy_holds_it(
    threads: int,
) -> None:
    if snapshot.native_fill_taken is None:
        pytest.skip("the C extension is not built")
    first = batch(1)
    slabs = {slab_of(taken) for _, taken in first}
    assert len(slabs) == 1  # one allocation (one set of pages to fault) for the batch
    [(_, first_address)] = slabs
    held = first[0][1]
    expected = (held.dtype, bytes(held.data), held.shuffled)
    assert memoryview(held.data).readonly
    del first
    # a copy still holds the first batch's memory: the next batch is written elsewhere
    second = batch(2)
    for values, taken in second:
        assert slab_of(taken)[1] != first_address
        assert (taken.dtype, bytes(taken.data), taken.shuffled) == list_array(values)
    assert (held.dtype, bytes(held.data), held.shuffled) == expected
    second_address = slab_of(second[0][1])[1]
    del held, second
    # no copy holds either: a batch as large is written into one of them again
    third = batch(3)
    assert slab_of(third[0][1])[1] in (first_address, second_address)
    for values, taken in third:
        assert (taken.dtype, bytes(taken.data), taken.shuffled) == list_array(values)


def test_the_c_loop_copies_lists_of_plain_leaves_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if snapshot.native_take_object is None:
        pytest.skip("the C extension is not built")
    samples: list[Any] = make_rollout(4, seed=1, prompt_len=16, response_min=8, response_max=40)
    for i, s in enumerate(samples):
        s.metadata = {"tags": ["a", b"bc", i, 2.5, None, True], "nested": [[i], "x"], "no": []}
    python = snapshot._HANDLERS[list]
    met: list[Any] = []

    def counted(taker: Any, value: list[Any]) -> Any:
        met.append(value)
        return python(taker, value)

    monkeypatch.setitem(snapshot._HANDLERS, list, counted)
    copies = snapshot.take_samples(samples)
    # weight_versions, tags and the empty list are copied in C; a list holding a list is not
    assert [id(v) for v in met] == [
        id(v) for s in samples for v in (s.metadata["nested"], s.metadata["nested"][0])
    ]
    for name in ("native_take_dict", "native_take_object", "native_fill_taken"):
        monkeypatch.setattr(snapshot, name, None)
    # the same copies and bytes as the Python loop's
    copy: Any
    again: Any
    for s, copy, again in zip(samples, copies, snapshot.take_samples(samples), strict=True):
        assert copy is not None and again is not None
        assert copy[0].weight_versions == again[0].weight_versions == s.weight_versions
        assert copy[0].metadata == again[0].metadata and copy[1:] == again[1:]
        assert copy[0].metadata["tags"] is not s.metadata["tags"]
