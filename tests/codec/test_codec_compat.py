"""Records written before `Sample` records listed their converted fields load as they did.

``tests/data/chunk-v1-sample-helpers.bin`` was written by the encoder of commit d7c76e6 (the
format of every archive saved before): `Sample`s with a None status, a dict, None or a helper
with an extra attribute in ``spec_info``/``prefix_cache_info``, and a registered dataclass
with enum fields.  Its records have no ``"s"`` list, so they are read through slime's
``from_dict`` rules, exactly as that release read them; only the NaN-valued enum member,
which that release loaded as a bare float (a fidelity bug), now loads as the member it saved
(docs/architecture/samples-and-values.md, "Samples and values").
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import struct
from pathlib import Path

from archive_manager import Sample
from archive_manager.codec import ChunkReader, decode_chunk, encode_chunk
from archive_manager.samples import register_sample_class

FIXTURE = Path(__file__).parents[1] / "data" / "chunk-v1-sample-helpers.bin"


class Mood(enum.Enum):
    CALM = "calm"
    MISSING = math.nan


@dataclasses.dataclass
class Rated:
    mood: Mood = Mood.CALM
    score: float = 0.0


register_sample_class(Rated, "tests.codec_compat.Rated")


def _trees(data: bytes) -> list[dict]:
    reader = ChunkReader(data)
    trees = []
    for i in range(len(reader)):
        record = reader._record(i)["r"]  # the whole record, or a version 2 record's rest
        (n,) = struct.unpack_from("<I", record, 0)
        trees.append(json.loads(bytes(record[4 : 4 + n])))
    return trees


def test_records_of_the_previous_encoder_load_as_that_release_loaded_them() -> None:
    data = FIXTURE.read_bytes()
    assert all("s" not in tree for tree in _trees(data))
    s0, s1, s2, s3, r0, r1 = decode_chunk(data)
    assert [type(s) for s in (s0, s1, s2, s3)] == [Sample] * 4
    assert s0.status is Sample.Status.PENDING  # saved as None
    assert s0.spec_info == Sample.SpecInfo() and s0.prefix_cache_info == Sample.PrefixCacheInfo()
    assert vars(s1.spec_info) == vars(Sample.SpecInfo(spec_accept_token_num=3))  # from a dict
    assert s2.status is Sample.Status.TRUNCATED
    assert vars(s2.spec_info) == vars(Sample.SpecInfo())  # its extra attribute was dropped
    assert s2.prefix_cache_info == Sample.PrefixCacheInfo(cached_tokens=5)
    assert s3.spec_info == Sample.SpecInfo()  # saved as None
    assert s3.prefix_cache_info == Sample.PrefixCacheInfo(cached_tokens=2)
    assert r0 == Rated(Mood.CALM, 1.5)
    assert r1.mood is Mood.MISSING  # that release loaded a float nan here


def test_the_same_samples_saved_now_load_as_saved() -> None:
    none_status = Sample(index=0, status=None)  # type: ignore[arg-type]
    as_dict = Sample(index=1)
    as_dict.spec_info = {"spec_accept_token_num": 3, "engine": "sglang"}  # type: ignore[assignment]
    extra = Sample(index=2, status=Sample.Status.TRUNCATED)
    extra.spec_info.custom_counter = 7  # type: ignore[attr-defined]
    saved = [none_status, as_dict, extra]
    data = encode_chunk(saved).data
    assert [t["s"] for t in _trees(data)] == [
        ["spec_info", "prefix_cache_info"],
        ["status", "prefix_cache_info"],
        ["status", "spec_info", "prefix_cache_info"],
    ]
    loaded = decode_chunk(data)
    assert [vars(s) for s in loaded] == [vars(s) for s in saved]
    assert loaded[2].spec_info.custom_counter == 7
