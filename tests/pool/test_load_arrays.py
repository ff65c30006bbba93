"""`load_samples(as_arrays=True)`: numeric list fields as ``np.array(the saved list)``, nothing
else changed; and the read-ahead that inflates chunk k+1 while chunk k is decoded."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from archive_manager import RolloutArchive, Sample, TensorRef
from archive_manager import codec as codec_module
from archive_manager.codec import ChunkReader, decode_chunk, encode_chunk
from archive_manager.codec.dtypes import NotHeldError, check_dtypes
from archive_manager.errors import IntegrityError, InvalidInputError

NUMERIC = ("tokens", "loss_mask", "rollout_log_probs")


def as_arrays(samples: list) -> list:
    """Every sample of one chunk, decoded with ``as_arrays=True``."""
    enc = encode_chunk(samples)
    reader = ChunkReader(enc.data, digest=enc.digest)
    return [reader.sample(i, as_arrays=True) for i in range(len(reader))]


def assert_array_of(value: Any, saved: list[Any] | None) -> None:
    expected = np.array(saved)
    assert type(value) is np.ndarray
    assert value.dtype == expected.dtype and value.shape == expected.shape
    # Bit for bit: NaN payloads and -0.0 included.
    assert value.tobytes() == expected.tobytes()
    assert value.flags.writeable


int64s = st.integers(-(2**63), 2**63 - 1)
number_lists = st.one_of(
    st.lists(st.integers(0, 151_999), min_size=1, max_size=40),
    st.lists(st.integers(0, 1), min_size=1, max_size=40),
    st.lists(int64s, min_size=1, max_size=40),
    st.lists(st.floats(width=32), min_size=1, max_size=40),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=40),
)


@settings(max_examples=200, deadline=None)
@given(values=number_lists)
def test_numeric_list_fields_are_np_array_of_the_saved_list(values: list) -> None:
    # Short lists live in the JSON tree, long ones in the array section: both paths.
    for stored in (values, values * 10):
        (back,) = as_arrays([{"v": stored, "w": list(stored)}])
        assert_array_of(back["v"], stored)
        assert_array_of(back["w"], stored)


def test_realistic_samples_keep_every_other_field() -> None:
    samples = codec_module_rollout()
    plain = decode_chunk(encode_chunk(samples).data)
    for saved, fast, slow in zip(samples, as_arrays(samples), plain, strict=True):
        assert type(fast) is Sample
        for name in NUMERIC:
            assert_array_of(getattr(fast, name), getattr(saved, name))
            assert type(getattr(slow, name)) is list
        rest = {k: v for k, v in vars(fast).items() if k not in NUMERIC}
        assert rest == {k: v for k, v in vars(slow).items() if k not in NUMERIC}


def codec_module_rollout() -> list:
    from archive_manager.interop.synthetic import make_rollout

    return make_rollout(6, seed=4, prompt_len=20, response_min=5, response_max=40)


@pytest.mark.parametrize(
    "value",
    [
        [True, False] * 8,
        [1, 2.5] * 8,
        [2**70] * 8,
        [1, None] * 8,
        ["a", "b"] * 8,
        [[1, 2], [3, 4]],
        {"nested": list(range(20))},
        "text",
        7,
        (1, 2, 3),
    ],
    ids=repr,
)
def test_other_values_stay_as_saved(value: Any) -> None:
    (back,) = as_arrays([{"v": value}])
    assert type(back["v"]) is type(value)
    assert back["v"] == value


def test_nested_numeric_lists_stay_lists() -> None:
    sample = Sample(tokens=list(range(50)), metadata={"ids": list(range(50))})
    (back,) = as_arrays([sample])
    assert_array_of(back.tokens, list(range(50)))
    assert type(back.metadata["ids"]) is list and back.metadata["ids"] == list(range(50))


def test_tensors_and_numpy_arrays_are_unchanged() -> None:
    t = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    a = np.arange(5, dtype=np.float32)
    (back,) = as_arrays([{"t": t, "a": a}])
    assert type(back["t"]) is torch.Tensor and torch.equal(back["t"], t)
    assert back["a"].dtype == np.float32 and np.array_equal(back["a"], a)


def test_arrays_are_independent_of_each_other_and_of_later_loads() -> None:
    enc = encode_chunk([{"v": list(range(100)), "f": [0.5] * 100}])
    reader = ChunkReader(enc.data)
    first = reader.sample(0, as_arrays=True)
    first["v"][:] = -1
    first["f"][:] = 9.0
    again = ChunkReader(enc.data).sample(0, as_arrays=True)
    assert again["v"].tolist() == list(range(100))
    assert again["f"].tolist() == [0.5] * 100


# --------------------------------------------------------------------------- through the pool


def test_load_samples_as_arrays_on_a_pool(open_pool, rollout) -> None:
    pool = open_pool(chunk_size=4)
    samples = rollout(10, seed=21)
    arc = pool.save("arr", samples, rollout_id=0)
    loaded = arc.load_samples(as_arrays=True)
    assert len(loaded) == 10
    for saved, back in zip(samples, loaded, strict=True):
        for name in NUMERIC:
            assert_array_of(getattr(back, name), getattr(saved, name))
        assert back.response == saved.response and back.status is saved.status
    (one,) = arc.load_samples(sample_key="sample:6", as_arrays=True)
    assert_array_of(one.tokens, samples[6].tokens)
    group = arc.load_samples(task_key=samples[9].task_key, as_arrays=True)
    assert [s.index for s in group] == [8, 9]
    assert_array_of(
        arc.load_sample(5, as_arrays=True).rollout_log_probs, samples[5].rollout_log_probs
    )
    # The default is untouched.
    assert type(arc.load_samples()[0].tokens) is list


def test_facade_passes_as_arrays_through(tmp_path, rollout) -> None:
    samples = rollout(5, seed=22)
    path = tmp_path / "rollout_0.json"
    RolloutArchive.save(path, samples, rollout_id=0)
    with RolloutArchive(path) as arc:
        loaded = arc.load_samples(as_arrays=True)
    assert_array_of(loaded[2].loss_mask, samples[2].loss_mask)


@pytest.mark.parametrize("flag", [1, 0, "yes", None, np.bool_(True)])
def test_as_arrays_must_be_a_bool(pool, rollout, flag) -> None:
    arc = pool.save("flag", rollout(3), rollout_id=0)
    with pytest.raises(InvalidInputError, match="as_arrays"):
        arc.load_samples(as_arrays=flag)
    with pytest.raises(InvalidInputError, match="as_arrays"):
        arc.load_sample(0, as_arrays=flag)


def test_tensor_refs_stay_lazy_with_as_arrays(open_pool, rollout) -> None:
    pool = open_pool(inline_limit=256)
    samples = rollout(3, seed=23, r3_layers=2)
    (back,) = pool.save("r3", samples, rollout_id=0).load_samples(
        sample_key="sample:1", as_arrays=True
    )
    ref = back.rollout_routed_experts
    assert isinstance(ref, TensorRef) and not ref.loaded
    assert torch.equal(ref.materialize(), samples[1].rollout_routed_experts)


# --------------------------------------------------------------------------- read-ahead


def test_many_chunks_load_in_order_and_leave_no_thread(open_pool, rollout, same_samples) -> None:
    pool = open_pool(chunk_size=3)
    samples = rollout(20, seed=24)
    arc = pool.save("ahead", samples, rollout_id=0)
    # Threads are compared as sets: the save's own threads (its lease renewal) may still be
    # winding down, and ending, while the loads run.
    before = set(threading.enumerate())
    same_samples(arc.load_samples(), samples)
    same_samples(arc.load_samples(task_key=samples[17].task_key), samples[16:20])
    assert set(threading.enumerate()) - before == set()


def test_damaged_chunk_mid_archive_names_it_and_leaves_no_thread(
    open_pool, rollout, blob_files_of
) -> None:
    pool = open_pool(chunk_size=3)
    arc = pool.save("dmg", rollout(20, seed=25), rollout_id=0)
    files = blob_files_of(pool)
    chunks = files.chunks("dmg")
    assert len(chunks) == 7
    files.flip_bit(chunks[3], pool.store.size(chunks[3]) // 2)
    before = set(threading.enumerate())
    for flag in (False, True):
        with pytest.raises(IntegrityError) as err:
            arc.load_samples(as_arrays=flag)
        assert "'dmg'" in str(err.value) and chunks[3] in str(err.value)
    assert set(threading.enumerate()) - before == set()


def _forge_record(data: bytes, i: int, how: str) -> bytes:
    """Chunk bytes whose record ``i`` is damaged in a way the blob digest would not show
    (the reader is given the bytes directly); of a version 2 chunk, its text part."""
    out = bytearray(data)
    if struct.unpack_from("<H", data, 8) == (2,):
        index2 = codec_module._INDEX2
        at = codec_module._HEAD.size + i * index2.size
        entry = list(index2.unpack_from(out, at))
        assert entry[5] == codec_module._ZSTD
        if how == "size":
            entry[2] += 1
            index2.pack_into(out, at, *entry)
        else:
            out[entry[0] : entry[0] + 4] = b"\0\0\0\0"
        return bytes(out)
    at = codec_module._HEAD.size + i * codec_module._INDEX.size
    offset, stored, raw_len, method = codec_module._INDEX.unpack_from(out, at)
    assert method == codec_module._ZSTD
    if how == "size":  # the index states a size the frame disagrees with
        codec_module._INDEX.pack_into(out, at, offset, stored, raw_len + 1, method)
    else:  # not a zstd frame at all
        out[offset : offset + 4] = b"\0\0\0\0"
    return bytes(out)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("how", ["size", "frame"])
@pytest.mark.parametrize("n", [300, 100_000])  # 100k: each record inflated on its own
def test_inflate_ahead_leaves_a_bad_record_to_sample(how: str, version: int, n: int) -> None:
    samples = [
        {"v": list(range(i, i + n)), "response": " ".join(map(str, range(i, i + n // 2)))}
        for i in range(5)
    ]
    data = _forge_record(encode_chunk(samples, version=version).data, 2, how)
    reader = ChunkReader(data, digest="d")
    for texts_only in (True, False):
        reader.inflate(range(5), texts_only=texts_only)  # never raises: left for `sample`
    for i in (0, 1, 3, 4):
        assert reader.sample(i)["v"] == samples[i]["v"]
    with pytest.raises(IntegrityError, match="record 2"):
        reader.sample(2)


def test_inflate_ahead_gives_the_same_records(monkeypatch) -> None:
    samples = [{"v": [float(i)] * 400, "n": i} for i in range(9)]
    data = encode_chunk(samples).data
    plain = [ChunkReader(data).sample(i) for i in range(9)]
    ahead = ChunkReader(data)
    ahead.inflate([8, 0, 3, 3, 42, -1])

    def no_inflate(*args: Any) -> bytes:
        raise AssertionError("a record inflated ahead was inflated again")

    monkeypatch.setattr(codec_module, "_inflate", no_inflate)
    for i in (8, 0, 3):
        assert ahead.sample(i) == plain[i] == samples[i]
    monkeypatch.undo()
    for i in range(9):  # the rest, and those again, inflate on demand
        assert ahead.sample(i) == samples[i]


def test_a_zstd_frame_past_its_stated_size_is_refused() -> None:
    # Guards the bound every inflate keeps: raw <= stored * ratio + slack.
    body = memoryview(b"\x28\xb5\x2f\xfd" + bytes(20))
    with pytest.raises(IntegrityError, match="implausible"):
        codec_module._check_frame(body, 10**12)


def test_inflate_ahead_keeps_the_blob_ratio_bound_on_an_aliasing_index() -> None:
    # A forged index whose 64 records all name one highly compressed frame: each passes the
    # per-record bound, so inflating all of them at once would allocate 64x that; read-ahead
    # stops at the bound for the whole blob and leaves the rest to `sample`.
    one = encode_chunk([{"v": [i % 7 for i in range(300_000)]}], version=1).data
    head, index = codec_module._HEAD, codec_module._INDEX
    _, stored, raw_len, method = index.unpack_from(one, head.size)
    frame = one[-stored:]
    count = 64
    at = head.size + count * index.size
    forged = (
        head.pack(codec_module.CHUNK_MAGIC, 1, 0, count)
        + index.pack(at, stored, raw_len, method) * count
        + frame
    )
    reader = ChunkReader(forged, digest="forged")
    reader.inflate(range(count))
    inflated = sum(view.nbytes for view in reader._inflated.values())
    assert 0 < inflated <= len(forged) * codec_module._MAX_RATIO + codec_module._RATIO_SLACK
    assert len(reader._inflated) < count
    assert reader.sample(count - 1)["v"][:8] == [0, 1, 2, 3, 4, 5, 6, 0]


@pytest.mark.parametrize(
    ("dtype", "values"),
    [
        ("uint64", [2**64 - 1, 5] * 8),
        ("bool", [True, False] * 8),
        ("complex64", [1 + 2j, 3j] * 8),
        ("float16", [0.5, 1.5] * 8),
    ],
)
def test_list_dtypes_the_encoder_never_writes_are_judged_by_their_values(
    dtype: str, values: list
) -> None:
    # A chunk from another writer may store a list in any dtype the format names; with
    # as_arrays it must come back as np.array(the list it decodes to), never wrapped or cast.
    enc = encode_chunk([{"v": list(range(20))}])
    record = _replace_list_dtype(enc.data, dtype, values)
    plain = ChunkReader(record).sample(0)["v"]
    assert plain == values
    back = ChunkReader(record).sample(0, as_arrays=True)["v"]
    expected = codec_module._number_array(values)
    if expected is None:
        assert type(back) is list and back == values
    else:
        assert_array_of(back, values)


def _replace_list_dtype(chunk: bytes, dtype: str, values: list) -> bytes:
    """A one-record chunk whose field ``v`` is ``values`` stored as a raw ``dtype`` list."""
    arr = np.array(values, dtype=np.dtype(dtype) if dtype != "bool" else np.bool_)
    tree = {"c": None, "f": {"v": {"$t": "list", "d": dtype, "o": 0, "n": arr.nbytes, "s": False}}}
    tree_bytes = json.dumps(tree).encode()
    head_len = 4 + len(tree_bytes)
    raw = struct.pack("<I", len(tree_bytes)) + tree_bytes + b"\0" * (-head_len % 8) + arr.tobytes()
    head, index = codec_module._HEAD, codec_module._INDEX
    at = head.size + index.size
    return (
        head.pack(codec_module.CHUNK_MAGIC, 1, 0, 1)
        + index.pack(at, len(raw), len(raw), codec_module._RAW)
        + raw
    )


def test_dict_samples_with_odd_keys_get_arrays_too() -> None:
    sample = {"tokens": list(range(30)), 7: [0.25] * 3, "nested": {"x": [1, 2, 3]}}
    (back,) = as_arrays([sample])
    assert_array_of(back["tokens"], list(range(30)))
    assert_array_of(back[7], [0.25] * 3)
    assert back["nested"] == {"x": [1, 2, 3]}


def test_a_load_in_an_atexit_hook_reads_every_chunk(tmp_path) -> None:
    # At interpreter shutdown no new thread may start: the read-ahead steps aside.
    script = f"""
import atexit
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout

pool = ArchiveManager.open({str(tmp_path / "pool")!r}, chunk_size=2)
samples = make_rollout(7, seed=1, prompt_len=10, response_min=5, response_max=20)
pool.save("r", samples, rollout_id=0)

def at_exit():
    back = pool.open_archive("r").load_samples()
    assert [s.tokens for s in back] == [s.tokens for s in samples]
    print("loaded", len(back))

atexit.register(at_exit)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "loaded 7" in done.stdout, done.stderr


def test_a_damaged_record_names_archive_chunk_and_blob(pool, rollout, monkeypatch) -> None:
    arc = pool.save("named", rollout(5, seed=26), rollout_id=0)
    (chunk,) = [row["digest"] for row in arc.chunks()]

    def damaged(self: Any, node: Any) -> Any:
        raise IntegrityError("malformed array descriptor")

    monkeypatch.setattr(codec_module._Decoder, "fields", damaged)
    with pytest.raises(IntegrityError) as err:
        arc.load_samples()
    assert "'named'" in str(err.value) and "chunk 0" in str(err.value)
    assert chunk in str(err.value) and "record 0" in str(err.value)


# --------------------------------------------------------------------------- narrow dtypes

NARROW = {"tokens": "int32", "loss_mask": np.int8, "rollout_log_probs": torch.float32}


def _mixed_samples() -> list[Sample]:
    """Samples whose numeric lists the record stores in different dtypes (int8 vs int32
    token ids, float32-exact vs float64 log-probs, 0/1 vs 0..2 masks), short and long."""
    return [
        Sample(index=0, tokens=list(range(100)), loss_mask=[1, 0] * 50,
               rollout_log_probs=[0.5, -0.25] * 50),
        Sample(index=1, tokens=list(range(150_000, 150_100)), loss_mask=[2] * 100,
               rollout_log_probs=[0.1, -0.2] * 50),
        Sample(index=2, tokens=[1, 2, 3], loss_mask=[1, 1, 0], rollout_log_probs=[-1.0, 0.3, 2.0]),
    ]  # fmt: skip


def test_dtypes_give_those_dtypes_whatever_the_values(open_pool) -> None:
    """Issue 35: as_arrays widened int8 masks and float32 log-probs to 64 bits, and no dtype
    could be asked for."""
    samples = _mixed_samples()
    arc = open_pool(chunk_size=2).save("narrow", samples, rollout_id=0)
    loads = [
        arc.load_samples(as_arrays=True, dtypes=NARROW),
        list(arc.iter_samples(as_arrays=True, dtypes=NARROW)),
        [arc.load_sample(i, as_arrays=True, dtypes=NARROW) for i in range(3)],
    ]
    for loaded in loads:
        for saved, back in zip(samples, loaded, strict=True):
            assert back.tokens.dtype == np.int32 and back.tokens.tolist() == saved.tokens
            assert back.loss_mask.dtype == np.int8 and back.loss_mask.tolist() == saved.loss_mask
            assert back.rollout_log_probs.dtype == np.float32
            assert np.array_equal(
                back.rollout_log_probs, np.asarray(saved.rollout_log_probs, np.float32)
            )
            assert back.tokens.flags.writeable and back.rollout_log_probs.flags.writeable
    # the fields no dtype names stay np.array(the list)
    (back,) = arc.load_samples(sample_key="sample:1", as_arrays=True, dtypes={"tokens": "int64"})
    assert_array_of(back.rollout_log_probs, samples[1].rollout_log_probs)
    assert_array_of(back.loss_mask, samples[1].loss_mask)


def test_dtypes_leave_tensors_arrays_and_other_values_as_saved() -> None:
    t = torch.arange(12, dtype=torch.int16).reshape(3, 4)
    a = np.linspace(0, 1, 6, dtype=np.float16).reshape(2, 3)
    sample = {"t": t, "a": a, "s": "text", "n": [[1, 2]], "e": [], "v": [1, 2, 3]}
    enc = encode_chunk([sample])
    back = ChunkReader(enc.data).sample(
        0, as_arrays=True, dtypes={k: np.dtype(np.int8) for k in ("t", "a", "s", "n", "e", "v")}
    )
    assert back["t"].dtype == torch.int16 and torch.equal(back["t"], t)
    assert back["a"].dtype == np.float16 and back["a"].shape == (2, 3)
    assert np.array_equal(back["a"], a)
    assert (back["s"], back["n"]) == ("text", [[1, 2]])
    assert back["v"].dtype == np.int8 and back["v"].tolist() == [1, 2, 3]


def test_an_empty_list_is_an_empty_array_of_the_dtype_asked_for(open_pool) -> None:
    """An aborted sample's empty loss mask and log-probs came back as [] beside the arrays of
    the others (a replay's torch.from_numpy failed on them). An empty list records no dtype:
    the one ``dtypes`` names, else np.array([])'s; nested empty lists stay lists."""
    samples = [
        {"mask": [1, 0], "lp": [-0.5, -0.25], "meta": {"ids": []}},
        {"mask": [], "lp": [], "meta": {"ids": []}},
    ]
    arc = open_pool().save("aborted", samples, rollout_id=0)
    narrow = {"mask": "int8", "lp": "float32"}
    for back in (
        arc.load_samples(as_arrays=True, dtypes=narrow)[1],
        arc.load_sample(1, as_arrays=True, dtypes=narrow),
        list(arc.iter_samples(as_arrays=True, dtypes=narrow))[1],
    ):
        assert type(back["mask"]) is np.ndarray and back["mask"].dtype == np.int8
        assert type(back["lp"]) is np.ndarray and back["lp"].dtype == np.float32
        assert back["mask"].shape == back["lp"].shape == (0,)
        assert back["meta"] == {"ids": []}
        assert torch.from_numpy(back["mask"]).dtype == torch.int8
    plain = arc.load_samples(as_arrays=True)[1]
    assert_array_of(plain["mask"], [])  # float64, as np.array([])
    assert arc.load_samples()[1]["mask"] == []  # lists as saved without as_arrays


@pytest.mark.parametrize(
    ("values", "dtype", "expected"),
    [
        ([0, 255] * 20, "uint8", [0, 255] * 20),
        ([-(2**31), 2**31 - 1] * 20, "int32", [-(2**31), 2**31 - 1] * 20),
        ([2**24, -(2**24)] * 20, "float32", [2.0**24, -(2.0**24)] * 20),
        ([2**40] * 20, "float32", [2.0**40] * 20),  # past 2**24, still exact
        ([0.1, 1e40, -1e-50] * 20, "float32", [np.float32(0.1), np.inf, -0.0] * 20),
        ([0.5, 70000.0] * 20, "float16", [0.5, np.inf] * 20),
    ],
)
def test_dtypes_hold_ints_exactly_and_round_floats(
    values: list, dtype: str, expected: list
) -> None:
    for stored in (values[:2], values):  # in the JSON tree, and in the array section
        (back,) = as_arrays_with([{"v": stored}], {"v": dtype})
        assert back["v"].dtype == np.dtype(dtype)
        assert (
            back["v"].tolist()
            == [float(x) if "float" in dtype else x for x in expected][: len(stored)]
        )


def as_arrays_with(samples: list, dtypes: dict) -> list:
    enc = encode_chunk(samples)
    reader = ChunkReader(enc.data, digest=enc.digest)
    checked = check_dtypes(dtypes)
    return [reader.sample(i, as_arrays=True, dtypes=checked) for i in range(len(reader))]


@pytest.mark.parametrize(
    ("values", "dtype", "bad"),
    [
        ([1, 128] * 20, "int8", "128"),
        ([-1, 3] * 20, "uint32", "-1"),
        ([2**24 + 1] * 20, "float32", str(2**24 + 1)),
        ([2**53 + 1, 0] * 20, "float64", str(2**53 + 1)),
        ([0.5, 1.0] * 20, "int64", "floats"),
    ],
)
def test_dtypes_refuse_what_they_cannot_hold(open_pool, values: list, dtype: str, bad: str) -> None:
    with pytest.raises(NotHeldError, match=rf"record 0: field 'v' holds {bad}"):
        as_arrays_with([{"v": values}], {"v": dtype})
    arc = open_pool().save("held", [{"v": [0] * 40}, {"v": values}], rollout_id=0)
    with pytest.raises(InvalidInputError, match=rf"archive 'held', chunk 0: .*record 1: .*{bad}"):
        arc.load_samples(as_arrays=True, dtypes={"v": dtype})
    assert arc.load_sample(0, as_arrays=True, dtypes={"v": dtype})["v"].dtype == np.dtype(dtype)


@pytest.mark.parametrize(
    ("dtypes", "message"),
    [
        (["tokens"], "must map field names"),
        ("int8", "must map field names"),
        ({"tokens": bool}, "is not one of"),
        ({"tokens": "complex64"}, "is not one of"),
        ({"tokens": ">i4"}, "is not one of"),
        ({"tokens": torch.bfloat16}, "is not one of"),
        ({"tokens": None}, "is not one of"),
        ({"tokens": "nope"}, "is not one of"),
        ({3: "int8"}, "is not a field name"),
    ],
    ids=repr,
)
def test_dtypes_must_name_fields_and_number_dtypes(pool, rollout, dtypes, message) -> None:
    arc = pool.save("bad-dtypes", rollout(3), rollout_id=0)
    for call in (arc.load_samples, arc.iter_samples, lambda **kw: arc.load_sample(0, **kw)):
        with pytest.raises(InvalidInputError, match=message):
            call(as_arrays=True, dtypes=dtypes)
    with pytest.raises(InvalidInputError, match="as_arrays=True"):
        arc.load_samples(dtypes={"tokens": "int32"})
    # torch and numpy dtypes, their names and numpy's scalar types are all dtypes
    for spec in (torch.int32, np.dtype("int32"), np.int32, "int32"):
        (one,) = arc.load_samples(sample_key="sample:0", as_arrays=True, dtypes={"tokens": spec})
        assert one.tokens.dtype == np.int32
