"""slime's ``torch.save`` rollout dumps: `ArchiveManager.import_pt` reads them safely (no code
runs unless the caller trusts the file), refuses what is not a dump with a clear error, and
`Archive.export_pt` writes exactly that format, so export then import is exact."""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from helpers import tiny_rollout

from archive_manager import ArchiveManager, Sample, TensorRef
from archive_manager.cli import cli
from archive_manager.errors import (
    ArchiveExistsError,
    InvalidInputError,
    UnsupportedFormatError,
)

# --------------------------------------------------------------------------- dump contents


class SlimeStatus(enum.Enum):
    """A status enum of another framework (module level, so that pickle can find it)."""

    COMPLETED = "completed"
    TRUNCATED = "truncated"


class SlimeSample:
    """A sample object of another framework: only full unpickling can rebuild it."""

    def __init__(self, index: int, tokens: list[int], status: SlimeStatus) -> None:
        self.index = index
        self.group_index = index // 2
        self.tokens = tokens
        self.response_length = 2
        self.loss_mask = [1, 1]
        self.status = status
        self.rollout_routed_experts = torch.arange(24, dtype=torch.int32).reshape(3, 2, 4)


UNPICKLED: list[int] = []


def _rebuild_sample(index: int) -> dict[str, Any]:
    """Runs when a dump is fully unpickled: proves whether code ran."""
    UNPICKLED.append(index)
    return {"index": index, "tokens": [index], "status": "completed"}


class CodeOnLoad:
    """Pickles as a call of `_rebuild_sample`, like any object with a custom __reduce__."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return _rebuild_sample, (self.index,)


def slime_samples(rollout) -> list[Sample]:
    """Samples carrying what slime's dumps hold: tensors of several dtypes and shapes,
    token lists, float lists, every status, reward dicts, extra attributes."""
    samples = rollout(12, seed=3, rollout_id=5, r3_layers=2)
    statuses = list(Sample.Status)
    for i, sample in enumerate(samples):
        sample.status = statuses[i % len(statuses)]
        n = sample.response_length
        sample.rollout_top_p_token_offsets = torch.arange(n + 1, dtype=torch.int64)
        sample.rollout_top_p_token_ids = torch.arange(n, dtype=torch.int32)
        sample.multimodal_train_inputs = {
            "pixel_values": torch.randn(2, 3, generator=torch.Generator().manual_seed(i)).to(
                torch.bfloat16
            ),
            "grid": torch.tensor(i),  # 0-d
            "empty": torch.empty(0, 4),
        }
        sample.teacher_log_probs = [-0.5, float("-inf"), -0.0]
        if i % 3 == 0:
            sample.reward = {"acc": 1.0, "format": 0}
        sample.weight_versions = ["v5", "v5-hot"]
    return samples


def save_dump(path: Path, content: Any) -> Path:
    torch.save(content, path)
    return path


def dump_of(samples: list, rollout_id: Any = 5) -> dict[str, Any]:
    """slime's dump: ``{"rollout_id": ..., "samples": [sample.to_dict(), ...]}``."""
    return {"rollout_id": rollout_id, "samples": [s.to_dict() for s in samples]}


# --------------------------------------------------------------------------- import


def test_import_slime_dump_as_samples(tmp_path: Path, pool, rollout, same_samples) -> None:
    samples = slime_samples(rollout)
    path = save_dump(tmp_path / "debug_rollout_5.pt", dump_of(samples))
    raw = torch.load(path, weights_only=True)
    assert isinstance(raw["samples"][0], dict) and raw["samples"][2]["status"] == "truncated"

    arc: Any = pool.import_pt(path)
    assert (arc.name, arc.rollout_id, len(arc), arc.state) == (
        "debug_rollout_5",
        5,
        12,
        "published",
    )
    loaded = arc.load_samples()
    assert all(type(s) is Sample for s in loaded)
    assert [s.status for s in loaded] == [s.status for s in samples]
    same_samples(loaded, samples)
    # Task keys come along (slime-side attributes are kept), so do extra fields.
    assert arc.keys() == [(f"sample:{s.index}", vars(s)["task_key"]) for s in samples]
    experts = loaded[0].rollout_routed_experts
    if isinstance(experts, TensorRef):
        experts = experts.materialize()
    assert experts.dtype is torch.int32 and experts.shape[1:] == (2, 8)
    assert arc.sample_metadata()[0]["tensors"]["rollout_routed_experts"]["dtype"] == "int32"


def test_import_names_and_rollout_ids(tmp_path: Path, pool, rollout) -> None:
    samples = rollout(3, seed=1)
    path = save_dump(tmp_path / "rollout_3.debug.pt", dump_of(samples, rollout_id=3))
    assert pool.import_pt(path).name == "rollout_3.debug"  # the stem
    named = pool.import_pt(str(path), name="replay-3")
    assert (named.name, named.rollout_id) == ("replay-3", 3)
    with pytest.raises(ArchiveExistsError):
        pool.import_pt(path)
    # A dump without a rollout id, and one with minimal dict samples (status missing).
    bare = save_dump(tmp_path / "bare.pt", {"samples": [{"index": 0, "tokens": [1, 2]}]})
    arc = pool.import_pt(bare)
    assert arc.rollout_id is None
    (sample,) = arc.load_samples()
    assert type(sample) is Sample and sample.status is Sample.Status.PENDING
    assert (sample.index, sample.tokens) == (0, [1, 2])
    # Evaluation and empty dumps.
    empty = pool.import_pt(save_dump(tmp_path / "empty.pt", {"rollout_id": 0, "samples": []}))
    assert (len(empty), empty.load_samples()) == (0, [])


# --------------------------------------------------------------------------- pickle


def test_dump_that_needs_pickle_is_refused_unless_trusted(
    tmp_path: Path, pool, snapshot, same_samples
) -> None:
    objects = [SlimeSample(i, [7, 8, 9], SlimeStatus.TRUNCATED) for i in range(3)]
    path = save_dump(tmp_path / "objects.pt", {"rollout_id": 1, "samples": objects})
    before = snapshot(pool)
    with pytest.raises(UnsupportedFormatError, match="trust_pickle=True") as refused:
        pool.import_pt(path)
    assert "SlimeSample" in str(refused.value) and "arbitrary code" in str(refused.value)
    assert snapshot(pool) == before

    arc = pool.import_pt(path, trust_pickle=True)
    loaded = arc.load_samples()
    assert all(type(s) is Sample for s in loaded)
    assert [s.status for s in loaded] == [Sample.Status.TRUNCATED] * 3
    assert [(s.index, s.group_index, s.tokens) for s in loaded] == [
        (0, 0, [7, 8, 9]),
        (1, 0, [7, 8, 9]),
        (2, 1, [7, 8, 9]),
    ]
    experts = loaded[0].rollout_routed_experts
    same_samples([{"e": experts}], [{"e": objects[0].rollout_routed_experts}])


def test_no_code_runs_unless_trusted(tmp_path: Path, pool) -> None:
    path = save_dump(tmp_path / "reduce.pt", {"rollout_id": 0, "samples": [CodeOnLoad(4)]})
    UNPICKLED.clear()
    with pytest.raises(UnsupportedFormatError, match="_rebuild_sample"):
        pool.import_pt(path)
    assert UNPICKLED == []  # the weights_only load ran first and refused
    arc = pool.import_pt(path, trust_pickle=True)
    assert UNPICKLED == [4]
    assert [(s.index, s.status) for s in arc.load_samples()] == [(4, Sample.Status.COMPLETED)]


@pytest.mark.parametrize(
    ("content", "what"),
    [
        ({"samples": [Sample(index=1, tokens=[1])]}, "Sample"),
        ({"samples": [{"index": 1, "tokens": np.arange(3)}]}, "numpy"),
    ],
)
def test_other_pickled_values_need_trust(
    tmp_path: Path, pool, same_samples, content: dict, what: str
) -> None:
    path = save_dump(tmp_path / "d.pt", content)
    with pytest.raises(UnsupportedFormatError, match=f"{what}.*trust_pickle"):
        pool.import_pt(path)
    (loaded,) = pool.import_pt(path, trust_pickle=True).load_samples()
    expected = content["samples"][0]
    same_samples(
        [loaded], [expected if isinstance(expected, Sample) else Sample.from_dict(expected)]
    )


# --------------------------------------------------------------------------- not a dump


def _garbage(path: Path) -> None:
    path.write_bytes(bytes(range(7, 256)) * 3)


def _text(path: Path) -> None:
    path.write_text("rollout_id,samples\n3,[]\n")


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _truncated(path: Path) -> None:
    torch.save({"rollout_id": 1, "samples": [{"tokens": torch.arange(500)}]}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _plain_pickle(path: Path) -> None:
    import pickle

    path.write_bytes(pickle.dumps({"rollout_id": 1, "samples": []}, protocol=4))


def _saved(content: Any):
    return lambda path: torch.save(content, path)


NOT_DUMPS = {
    "tensor": (_saved(torch.zeros(3)), "not a rollout dump"),
    "list of samples": (_saved([{"index": 0}]), "not a rollout dump"),
    "dict without samples": (_saved({"rollout_id": 1}), "not a rollout dump"),
    "samples not a list": (_saved({"samples": "abc"}), "not a rollout dump"),
    "samples of numbers": (_saved({"samples": [1, 2]}), "sample 0 is a int"),
    "unknown status": (
        _saved({"samples": [{"index": 0}, {"status": "exploded"}]}),
        "sample 1 does not fit Sample",
    ),
    "garbage bytes": (_garbage, "not a readable torch.save file"),
    "text": (_text, "not a readable torch.save file"),
    "empty file": (_empty, "not a readable torch.save file"),
    "truncated dump": (_truncated, "not a readable torch.save file"),
    "plain pickle": (_plain_pickle, "not a readable torch.save file"),
}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("case", list(NOT_DUMPS))
def test_files_that_are_not_dumps_give_clear_errors(
    tmp_path: Path, pool, snapshot, case: str
) -> None:
    write, pattern = NOT_DUMPS[case]
    path = tmp_path / "file.pt"
    write(path)
    before = snapshot(pool)
    with pytest.raises(UnsupportedFormatError, match=pattern) as refused:
        pool.import_pt(path)
    assert str(path) in str(refused.value)
    # Bytes that are no pickle at all are not blamed on pickle.
    assert ("trust_pickle" in str(refused.value)) is False
    with pytest.raises(UnsupportedFormatError):
        pool.import_pt(path, trust_pickle=True)
    assert snapshot(pool) == before


def test_missing_file_and_folder(tmp_path: Path, pool) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.pt"):
        pool.import_pt(tmp_path / "missing.pt")
    with pytest.raises(InvalidInputError, match="not a file"):
        pool.import_pt(tmp_path)


# --------------------------------------------------------------------------- export


def test_export_then_import_is_exact(tmp_path: Path, open_pool, rollout, same_samples) -> None:
    # inline_limit=0: every tensor is a blob of its own, so the export must materialize it.
    pool = open_pool(inline_limit=0)
    samples = slime_samples(rollout)
    arc = pool.save("train-5", samples, rollout_id=5)
    out = arc.export_pt(tmp_path / "exports" / "nested" / "train-5.pt")
    assert out == tmp_path / "exports" / "nested" / "train-5.pt"
    assert sorted(os.listdir(out.parent)) == ["train-5.pt"]  # no temp file left

    with pytest.raises(ArchiveExistsError):  # the default name is the exported one: taken
        pool.import_pt(out)
    copy = pool.import_pt(out, name="train-5-copy")
    assert (copy.rollout_id, len(copy)) == (5, 12)
    same_samples(copy.load_samples(), samples)
    same_samples(copy.load_samples(), arc.load_samples())
    assert copy.keys() == arc.keys()
    assert copy.sample_metadata() == arc.sample_metadata()

    # And again: exporting the import gives the same dump content.
    again = copy.export_pt(tmp_path / "again.pt")
    first, second = torch.load(out, weights_only=True), torch.load(again, weights_only=True)
    same_samples(second["samples"], first["samples"])


def test_export_is_slime_format_loadable_with_weights_only(
    tmp_path: Path, open_pool, rollout, same_samples
) -> None:
    pool = open_pool(inline_limit=0)
    samples = slime_samples(rollout)
    out = pool.save("r", samples, rollout_id=5).export_pt(tmp_path / "r.pt")
    dump = torch.load(out, weights_only=True)
    # slime's two keys, and the archive's facts under a key of their own (slime ignores it).
    assert list(dump) == ["rollout_id", "samples", "archive_manager"] and dump["rollout_id"] == 5
    assert all(type(d) is dict for d in dump["samples"])
    first = dump["samples"][0]
    assert first["status"] == samples[0].status.value  # a string, as slime writes it
    assert type(first["rollout_routed_experts"]) is torch.Tensor  # materialized, not a ref
    assert type(first["tokens"]) is list and type(first["rollout_log_probs"]) is list
    # What slime does with its dumps: rebuild each sample from its dict.
    same_samples([Sample.from_dict(d) for d in dump["samples"]], samples)

    # dict samples and numpy values export too, as weights_only-loadable torch values.
    other = pool.save(
        "dicts",
        [{"index": 0, "tokens": [1, 2], "extra": np.arange(3, dtype=np.int16), "x": np.float32(2)}],
        rollout_id=None,
    )
    dump = torch.load(other.export_pt(tmp_path / "dicts.pt"), weights_only=True)
    assert dump["rollout_id"] is None
    (d,) = dump["samples"]
    assert torch.equal(d["extra"], torch.arange(3, dtype=torch.int16)) and d["x"] == 2.0
    # An export records each sample's class: a dict sample imports back as a dict (a plain
    # slime dump's dicts become Samples, as slime's from_dict makes them).
    (imported,) = pool.import_pt(tmp_path / "dicts.pt", name="dicts-back").load_samples()
    assert type(imported) is dict and imported["tokens"] == [1, 2]


def _saved_pool(tmp_path: Path) -> ArchiveManager:
    pool = ArchiveManager.open(tmp_path / "pool", create=True)
    samples = tiny_rollout(2, seed=1, r3_layers=0)
    samples[0].response = "plain text"
    samples[1].task_key = "\x1b[31mred"  # type: ignore[attr-defined]
    pool.save("r1", samples, rollout_id=1)
    return pool


def test_import_pt_takes_an_existing_file_whose_name_looks_like_a_glob(tmp_path: Path) -> None:
    """A dump named 'rollout[1].pt' was taken for a glob (its [1] a character class) that
    matches nothing: the file could not be imported by its own path."""
    pytest.importorskip("torch")
    with _saved_pool(tmp_path) as pool:
        dump = tmp_path / "rollout[1].pt"
        pool.open_archive("r1").export_pt(dump)
    target = tmp_path / "other"
    ArchiveManager.open(target, create=True).close()
    result = CliRunner().invoke(cli, ["--root", str(target), "import-pt", str(dump)])
    assert result.exit_code == 0, result.output
    with ArchiveManager.open(target) as other:
        assert len(other.find()) == 1


def test_a_framework_sample_goes_out_as_a_pt_dump_and_comes_back(tmp_path: Path) -> None:
    """slime's own Sample (nested Status, SpecInfo, PrefixCacheInfo): the dump holds them as
    slime's to_dict() writes them (weights_only=True reads it, slime's from_dict too), and
    import_pt gives back slime's classes from the dump's facts."""
    import sys

    frameworks = str(Path(__file__).resolve().parents[1] / "frameworks")
    if frameworks not in sys.path:
        sys.path.insert(0, frameworks)
    from helpers import assert_same_samples
    from rollouts import make_slime_rollout
    from slime.utils.types import Sample as SlimeSample

    rows = make_slime_rollout(4, seed=2)
    for s in rows:
        s.multimodal_inputs = None  # PIL images are no torch.save value (the dump is weights_only)
    path = tmp_path / "rollout_3.pt"
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("s", rows, rollout_id=3).export_pt(path)
        dump = torch.load(path, weights_only=True)
        assert dump["samples"][0]["status"] == rows[0].status.value
        assert SlimeSample.from_dict(dump["samples"][0]).spec_info == rows[0].spec_info
        back = pool.import_pt(path, name="back").load_samples()
    assert_same_samples(back, rows)
    assert all(type(s.spec_info) is SlimeSample.SpecInfo for s in back)
