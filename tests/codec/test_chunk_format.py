"""Chunk format version 2 (docs/architecture/chunk-format.md, "Chunk format", issue 19 item 4): each
record's prompt and response in a text part of their own, an xxh3-64 per record, and chunks
of version 1 (every pool saved before) read, searched and migrated byte for byte.

``tests/data/pool-r4.tar.gz`` was written by the release at catalog revision 0004, whose
chunks are all of format version 1.
"""

from __future__ import annotations

import re
import shutil
import struct
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xxhash
from helpers import local_store

import archive_manager.codec as codec
from archive_manager import ArchiveManager, Sample
from archive_manager.codec import (
    _HEAD,
    _INDEX2,
    CHUNK_VERSIONS,
    ChunkReader,
    build_chunk,
    decode_chunk,
    encode_chunk,
    encode_manifest,
    encode_tensor_blob,
)
from archive_manager.errors import IntegrityError, UnsupportedFormatError
from archive_manager.lens import search

DATA = Path(__file__).parents[1] / "data"


def _samples(n: int = 4) -> list[dict[str, Any]]:
    return [
        {
            "index": i,
            "prompt": f"question {i}: what is six times seven?",
            "tokens": list(range(100 + i)),
            "response": "intro\n" + "filler words. " * 60 + f"\nthe answer is {40 + i}",
            "rollout_log_probs": [-0.25 * k for k in range(50)],
            "reward": float(i % 2),
        }
        for i in range(n)
    ]


def _entry(data: bytes, i: int) -> tuple[int, ...]:
    return _INDEX2.unpack_from(data, _HEAD.size + i * _INDEX2.size)


@pytest.fixture
def pool_r4(tmp_path: Path) -> Path:
    with tarfile.open(DATA / "pool-r4.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "pool-r4"


def test_a_pool_of_version_1_chunks_loads_byte_for_byte_and_migrates(pool_r4: Path) -> None:
    with ArchiveManager.open(pool_r4) as pool:
        names = [info.name for info in pool.find()]
        assert len(names) == 6
        for name in names:
            arc = pool.open_archive(name)
            everything = arc.load_samples()
            loaded: list[Any] = []
            for chunk in arc.chunks():
                data = pool.store.get(chunk["digest"])
                assert ChunkReader(data).version == 1
                samples = everything[len(loaded) : len(loaded) + chunk["samples"]]
                # What this library loads from a chunk written before is what that release
                # saved: re-encoded as version 1, the very same bytes.
                assert encode_chunk(samples, version=1).data == data
                v2 = encode_chunk(samples)
                assert v2.data == encode_chunk(samples).data  # deterministic
                assert ChunkReader(v2.data).version == 2 and v2.data != data
                back = decode_chunk(v2.data, loader=arc._load_tensor)
                assert encode_chunk(back, version=1).data == data
                loaded += samples
            # Saved again (version 2 chunks), the archive loads the same samples.
            pool.save(f"{name}-v2", loaded, rollout_id=arc.info().rollout_id)
            again = pool.open_archive(f"{name}-v2")
            assert [ChunkReader(pool.store.get(c["digest"])).version for c in again.chunks()] == [
                2
            ] * len(arc.chunks())
            assert (
                encode_chunk(again.load_samples(), version=1).data
                == encode_chunk(loaded, version=1).data
            )
        # A search finds the same samples in both copies.
        for kwargs in (
            {"pattern": "rr"},
            {"pattern": "P", "ignore_case": True},
            {"pattern": r"r+", "regex": True},
        ):
            found = pool.search(limit=10_000, **kwargs).matches
            old = [
                (m.archive, m.position, m.field, m.line) for m in found if "-v2" not in m.archive
            ]
            new = [
                (m.archive.removesuffix("-v2"), m.position, m.field, m.line)
                for m in found
                if "-v2" in m.archive
            ]
            assert old and sorted(old) == sorted(new), kwargs


def test_text_parts_are_apart_and_each_record_has_its_checksum() -> None:
    samples = _samples()
    data = encode_chunk(samples).data
    reader = ChunkReader(data)
    for i in range(len(samples)):
        offset, t_stored, t_raw, r_stored, _r_raw, t_method, r_method, checksum = _entry(data, i)
        assert t_raw > 0 and t_method in (0, 1) and r_method in (0, 1)
        assert checksum == xxhash.xxh3_64_intdigest(data[offset : offset + t_stored + r_stored])
        # The text part alone holds the texts (a record of its own), none of the numbers.
        text = codec._inflate(memoryview(data)[offset : offset + t_stored], t_raw)
        assert codec.decode_fields(memoryview(text), ("prompt", "response")) == {
            "prompt": samples[i]["prompt"],
            "response": samples[i]["response"],
        }
        assert b'"tokens"' not in text and b'"prompt"' in text
        assert reader.sample(i) == samples[i]
        assert list(reader.sample(i)) == list(samples[i])  # the fields' order is kept

    # Damage in record 1's rest: its checksum refuses it, its text part still searches,
    # its neighbours load.
    offset, t_stored, _, r_stored, *_ = _entry(data, 1)
    damaged = bytearray(data)
    damaged[offset + t_stored + r_stored // 2] ^= 0x40
    broken = ChunkReader(bytes(damaged), digest="d")
    with pytest.raises(IntegrityError, match=r"chunk blob d, record 1: .*checksum"):
        broken.sample(1)
    with pytest.raises(IntegrityError, match="checksum"):
        broken.record(1)
    assert broken.fields(1, ("response",)) == {"response": samples[1]["response"]}
    assert broken.sample(0) == samples[0] and broken.sample(2) == samples[2]
    # ... and a damaged text part fails the checksum too.
    damaged = bytearray(data)
    damaged[offset + t_stored // 2] ^= 0x01
    with pytest.raises(IntegrityError, match="checksum"):
        ChunkReader(bytes(damaged)).sample(1)


def test_a_search_inflates_only_the_text_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = _samples(8)
    data = encode_chunk(samples).data
    reader = ChunkReader(data)
    sizes: list[int] = []
    real = codec.chunk._decompressor

    class Spy:
        def multi_decompress_to_buffer(self, frames: Any, decompressed_sizes: bytes) -> Any:
            sizes.extend(struct.unpack(f"<{len(frames)}Q", decompressed_sizes))
            return real().multi_decompress_to_buffer(frames, decompressed_sizes=decompressed_sizes)

    monkeypatch.setattr(codec.chunk, "_decompressor", Spy)
    reader.inflate(range(8), texts_only=True)
    assert sizes == [_entry(data, i)[2] for i in range(8)]  # text raw lengths only
    monkeypatch.setattr(codec, "_inflate", lambda *_: pytest.fail("inflated a rest part"))
    needle = re.compile(re.escape(b"answer is 43"))
    got = [reader.fields(i, ("prompt", "response"), require=needle) for i in range(8)]
    assert [i for i, g in enumerate(got) if g is not None] == [3]
    # A non-text field asked for comes from the rest, which is then inflated.
    monkeypatch.undo()
    assert reader.fields(5, ("reward", "prompt")) == {
        "reward": 1.0,
        "prompt": samples[5]["prompt"],
    }


@pytest.mark.parametrize(
    "sample",
    [
        {"tokens": [1, 2, 3]},  # no text field: the whole record is the rest
        {1: "x", "prompt": "a non-str key: not split"},
        {"$t": "tag-like key", "prompt": "p", "response": "r"},
        {"prompt": [{"role": "user", "content": "Q?" * 400}], "response": None},
        {"response": "é" * 600, "z": 1, "prompt": "p"},
    ],
)
def test_samples_of_every_shape_round_trip(sample: dict[Any, Any]) -> None:
    data = encode_chunk([sample]).data
    assert ChunkReader(data).version == 2
    loaded = decode_chunk(data)[0]
    assert loaded == sample and list(loaded) == list(sample)
    assert encode_chunk([loaded], version=1).data == encode_chunk([sample], version=1).data


def test_a_tensor_held_by_a_text_field_and_another_loads_as_one_object() -> None:
    t = torch.arange(6, dtype=torch.int32)
    arr = np.arange(4.0)
    sample = {"x": t, "prompt": [t, arr], "response": "r", "y": arr}
    for as_arrays in (False, True):
        loaded = ChunkReader(encode_chunk([sample]).data).sample(0, as_arrays=as_arrays)
        assert loaded["x"] is loaded["prompt"][0] and torch.equal(loaded["x"], t)
        assert loaded["y"] is loaded["prompt"][1] and np.array_equal(loaded["y"], arr)
    s = Sample(prompt="p", response="q" * 700, tokens=[1, 2])
    assert vars(decode_chunk(encode_chunk([s]).data)[0]) == vars(s)


def test_versions_written_and_refused() -> None:
    assert CHUNK_VERSIONS == (1, 2) and codec.FORMAT_VERSION == 2
    data = encode_chunk(_samples(1)).data
    assert struct.unpack_from("<H", data, 8) == (2,)
    newer = data[:8] + struct.pack("<H", 3) + data[10:]
    with pytest.raises(
        UnsupportedFormatError, match="version 3; this library reads version 1 and 2"
    ):
        ChunkReader(newer, digest="c")
    # A chunk with text parts cannot be written as version 1; version 1 records hold none.
    with pytest.raises(ValueError, match="version 1"):
        build_chunk(_samples(1)).pack(version=1)
    with pytest.raises(ValueError, match="version 7"):
        encode_chunk(_samples(1), version=7)
    assert build_chunk(_samples(1), version=1).texts == [b""]
    # Tensor and manifest blobs did not change: still version 1, the same bytes as before.
    blob = encode_tensor_blob(torch.arange(3))
    assert struct.unpack_from("<H", b"".join(bytes(p) for p in blob.parts), 8) == (1,)
    assert struct.unpack_from("<H", encode_manifest({"a": 1}), 8) == (1,)


def test_the_case_folding_table_of_the_prefilter_is_complete() -> None:
    letter = re.compile("[a-z]", re.IGNORECASE)
    beyond: dict[str, str] = {}
    for cp in range(128, 0x110000):
        c = chr(cp)
        if letter.fullmatch(c):
            folded = next(a for a in "abcdefghijklmnopqrstuvwxyz" if re.fullmatch(a, c, re.I))
            beyond[folded] = beyond.get(folded, "") + c
    assert beyond == search._FOLDS_BEYOND_ASCII


def test_a_case_folded_search_skips_records_without_the_letters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = ["KELVIN here", "\u212aelvin sign", "no such word", "x" * 600 + " kelvin"]
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("a", [{"response": t, "tokens": [1]} for t in texts], rollout_id=1)
        parsed: list[int] = []
        real = codec.chunk.decode_fields

        def decode_fields(rec: Any, names: Any, *loader: Any) -> Any:
            parsed.append(1)
            return real(rec, names, *loader)

        monkeypatch.setattr(codec.chunk, "decode_fields", decode_fields)

        found = pool.search("kelvin", ignore_case=True).matches
        assert [m.position for m in found] == [0, 1, 3] and len(parsed) == 3
        # not ASCII: its longest ASCII piece ("lvin") is looked for
        assert pool.search("kélvin", ignore_case=True).matches == []
        assert len(parsed) == 6
        assert pool.search("é", ignore_case=True).matches == []  # no ASCII piece: all read
        assert len(parsed) == 10


def test_chunks_of_version_1_and_2_search_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = _samples(6)
    samples[5]["prompt"] = [{"role": "user", "content": "chat question"}]
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("new", samples, rollout_id=1)
        with monkeypatch.context() as m:
            real_pack = codec.RawChunk.pack
            m.setattr(codec.RawChunk, "pack", lambda self: real_pack(self, version=1))
            real_encode = codec.encode_sample
            m.setattr(codec, "encode_sample", lambda s, **kw: real_encode(s, texts=(), **kw))
            pool.save("old", samples, rollout_id=1)
        versions = {
            name: {
                ChunkReader(pool.store.get(c["digest"])).version
                for c in pool.open_archive(name).chunks()
            }
            for name in ("new", "old")
        }
        assert versions == {"new": {2}, "old": {1}}
        for kwargs in (
            {"pattern": "answer is 4"},
            {"pattern": "ANSWER", "ignore_case": True},
            {"pattern": r"is 4[13]\b", "regex": True},
            {"pattern": "chat", "fields": "prompt"},
            {"pattern": "six", "fields": "response"},
        ):
            found = pool.search(**kwargs).matches
            by = {
                name: [(m.position, m.field, m.line, m.start) for m in found if m.archive == name]
                for name in ("new", "old")
            }
            assert by["new"] == by["old"], kwargs
        assert pool.open_archive("old").load_samples() == samples
        assert pool.open_archive("new").load_samples() == samples
    shutil.rmtree(tmp_path / "pool")


def _odd_samples() -> list[Any]:
    """Texts of every shape a search meets: long (stored as UTF-8) and short (in the JSON
    tree), chat prompts, escaped characters, non-ASCII and the letters ``re`` folds from
    beyond ASCII, raw text parts (zstd does not pay), no text part, a dict with odd keys."""
    out: list[Any] = []
    for i, text in enumerate(
        [
            "the answer is 42",
            "x" * 700 + " The ANSWER is \\boxed{7}",
            "\u212aelvin said: answer",
            'she said "answer" \\ ok\tdone',
            "caf\u00e9 \u2615 na\u00efve answer \u017fo",
            "ab",
            "\u0130stanbul answers " * 40,
        ]
    ):
        out.append({"prompt": f"q{i}", "response": text, "tokens": [i]})
    out.append({"prompt": [{"role": "user", "content": "chat answer"}], "response": "ok"})
    out.append({"tokens": [1, 2]})  # no text part
    out.append({7: "answer", "prompt": "answer in a dict with an int key", "response": "r"})
    out.append(Sample(prompt="p", response="sample answer " * 50, tokens=[3]))
    return out


def test_the_batched_scan_finds_what_the_record_by_record_scan_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ChunkReader.search_texts` (one zstd call, the C prefilter) against the path of one
    record at a time (`ChunkReader.fields`) and the Python prefilter: the same matches for
    every kind of pattern."""
    with ArchiveManager.open(tmp_path / "pool", chunk_size=8) as pool:
        pool.save("a", _odd_samples() * 3, rollout_id=1)
        digests = [c["digest"] for c in pool.open_archive("a").chunks()]
        raw_parts = [
            _entry(pool.store.get(d), i)[5] == 0
            for d in digests
            for i in range(len(ChunkReader(pool.store.get(d))))
        ]
        assert any(raw_parts) and not all(raw_parts)  # both kinds of text parts are searched
        cases: list[dict[str, Any]] = [
            {"pattern": "answer"},
            {"pattern": "ANSWER", "ignore_case": True},
            {"pattern": "kelvin", "ignore_case": True},
            {"pattern": "STANBUL", "ignore_case": True},
            {"pattern": "SO", "ignore_case": True},
            {"pattern": '"answer" \\'},
            {"pattern": "\u2615 na\u00efve"},
            {"pattern": "caf\u00c9", "ignore_case": True},  # its ASCII piece, "caf"
            {"pattern": "\u00e9", "ignore_case": True},  # no prefilter: no ASCII piece
            {"pattern": 'd "answer', "ignore_case": True},
            {"pattern": "ok\tdone"},
            {"pattern": r"\\boxed\{\d+\}", "regex": True},
            {"pattern": r"(?i)answer\b", "regex": True},
            {"pattern": "chat", "fields": "prompt"},
            {"pattern": "answer", "fields": "response"},
        ]

        def run() -> list[list[tuple[Any, ...]]]:
            return [
                [
                    (m.position, m.field, m.line, m.start, m.end, m.sample_key)
                    for m in pool.search(limit=10_000, **kwargs).matches
                ]
                for kwargs in cases
            ]

        batched = run()
        assert all(batched)
        with monkeypatch.context() as m:
            m.setattr(codec.chunk, "_texts_holding", codec.chunk._holding_py)
            assert run() == batched
        with monkeypatch.context() as m:
            m.setattr(ChunkReader, "_text_batch", lambda *_: {})
            assert run() == batched
        with monkeypatch.context() as m:  # no prefilter at all: every record decoded
            m.setattr(search, "_prefilter", lambda *_: None)
            assert run() == batched


def test_a_damaged_chunk_is_never_searched(tmp_path: Path) -> None:
    """A byte changed in a chunk's text part (which zstd would inflate to other text without
    a word: its frames carry no checksum) fails the search with the blob named."""
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("a", _samples(4), rollout_id=1)
        digest = pool.open_archive("a").chunks()[0]["digest"]
        assert len(pool.search("answer is 42").matches) == 1
        path = local_store(pool).path(digest)
        data = bytearray(path.read_bytes())
        offset, t_stored, *_ = _entry(bytes(data), 2)
        data[offset + t_stored - 4] ^= 0x01  # in the frame's last block
        path.chmod(0o644)
        path.write_bytes(bytes(data))
        with pytest.raises(IntegrityError, match=digest):
            pool.search("answer is 42")
        with pytest.raises(IntegrityError, match=digest):
            pool.search("zebra", ignore_case=True)


@pytest.mark.parametrize(
    ("pattern", "literal"),
    [
        (r"\bboxed( boxed){3}\b", "boxed boxed boxed boxed"),
        (r"\\boxed\{\d+\}", "boxed{"),  # a backslash is escaped in the record: left out
        (r"is 4[13]\b", "is 4"),
        (r"(ab){2,3}cd", "ab"),
        (r"a{2}bc", "aabc"),
        (r"(?>abc)d", "abcd"),
        (r"(foo|bar)baz", "baz"),
        (r"ans(?i:wer)x", "ans"),
        (r'say "hi" now', "say "),
        (r"(?P<n>ab)(?P=n)cd", "ab"),
        (r"(?i)answer", None),  # case folded
        (r"(?x) a b c", None),
        (r"foo|bar", None),
        (r"(?:abc){e<=1}", None),  # regex's fuzzy matching: re would read literal braces
        (r"x{,}yz", None),
        (r"[[:alpha:]]x", None),  # a POSIX class: re warns (a nested set)
        (r"\p{L}foo", None),
        (r"(*SKIP)abc", None),
        (r"(?V1)abc", None),
        (r"\N{BULLET} item", None),
    ],
)
def test_the_literal_every_match_of_a_regex_holds(pattern: str, literal: str | None) -> None:
    assert search._regex_literal(pattern) == literal


def _regexes() -> Any:
    from hypothesis import strategies as st

    atom = st.sampled_from(["a", "b", "ab", "ba", ".", "[ab]", "[^a]", r"\b", "x", "aa"])
    return st.recursive(
        atom,
        lambda inner: st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map(lambda t: f"(?:{t[0]}|{t[1]})"),
            inner.map(lambda r: f"({r})"),
            st.tuples(
                inner, st.sampled_from(["*", "+", "?", "{2}", "{1,2}", "{0}", "+?", "++"])
            ).map(lambda t: f"(?:{t[0]}){t[1]}"),
            inner.map(lambda r: f"(?={r})"),
        ),
        max_leaves=6,
    )


def test_a_regex_match_always_holds_its_literal() -> None:
    """What the regex prefilter relies on, tried on random patterns and texts: every match
    (in the `regex` module, which runs the search) holds the literal read with `re`'s parser."""
    import regex
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=500, deadline=None)
    @given(pattern=_regexes(), texts=st.lists(st.text("abx \n", max_size=12), max_size=6))
    def check(pattern: str, texts: list[str]) -> None:
        literal = search._regex_literal(pattern)
        compiled = regex.compile(pattern)
        for text in texts:
            if literal is not None and compiled.search(text) is not None:
                assert literal in text, (pattern, text, literal)

    check()


def test_a_regex_search_finds_the_same_with_and_without_its_prefilter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ArchiveManager.open(tmp_path / "pool", chunk_size=8) as pool:
        pool.save("a", _odd_samples() * 2, rollout_id=1)
        patterns = [
            r"answer\b",
            r"\\boxed\{\d+\}",
            r'"answer" \\',
            r"(?:answr){e<=1}",
            r"(?i)KELVIN",
            r"\N{HOT BEVERAGE} na",
            r"\u212aelvin",
            r"chat (answer)+",
            r"(an)(s)wer \w+",
            r"x{3}",
            r"[[:alpha:]]nswer",
            r"a(?=nswer)",
        ]

        def run() -> list[list[tuple[Any, ...]]]:
            return [
                [
                    (m.position, m.field, m.line, m.start, m.end)
                    for m in pool.search(p, regex=True, limit=10_000).matches
                ]
                for p in patterns
            ]

        with_prefilter = run()
        assert sum(map(bool, with_prefilter)) >= 9
        monkeypatch.setattr(search, "_regex_literal", lambda _: None)
        assert run() == with_prefilter
