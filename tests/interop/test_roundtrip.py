"""Nothing the pool knows is lost on the way out and back in: every export format carries
the archive's facts (name, rollout id, evaluation, attrs) and each sample's keys and class,
and its import restores them, so the imported archive is the exported one, whole
(`_roundtrip.assert_same_archive`).  Arguments of an import override what the file says."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _roundtrip import FORMATS, ArchiveFormat, assert_same_archive
from click.testing import CliRunner
from helpers import snapshot_pool, tiny_rollout

from archive_manager import ArchiveManager, Sample
from archive_manager.cli import cli
from archive_manager.errors import InvalidInputError, UnsupportedFormatError


@pytest.fixture
def sqlite_pool(tmp_path: Path) -> Iterator[ArchiveManager]:
    """A pool on SQLite: the tests past the first are about files, not the catalog."""
    with ArchiveManager.open(tmp_path / "a") as pool:
        yield pool


@pytest.fixture(params=sorted(FORMATS))
def fmt(request: pytest.FixtureRequest) -> ArchiveFormat:
    """Each export format in turn."""
    return FORMATS[request.param]


def _samples() -> list[Sample]:
    """Samples with routed-expert tensors (blobs: the pools below inline nothing), every
    status, reward dicts and an extra attribute."""
    samples = tiny_rollout(6, seed=4, rollout_id=7)
    statuses = list(Sample.Status)
    for i, sample in enumerate(samples):
        sample.status = statuses[i % len(statuses)]
        sample.reward = {"acc": 1.0, "fmt": 0} if i % 3 == 0 else sample.reward
        sample.framework_extra = {"engine": "sglang", "step": i}
    return samples


def test_round_trip_keeps_the_whole_archive(tmp_path: Path, open_pool, fmt) -> None:
    source = open_pool(tmp_path / "a", inline_limit=0)
    target = open_pool(tmp_path / "b", inline_limit=0)
    samples = _samples()
    task_keys = [None if i == 2 else f"task-{i % 2}" for i in range(len(samples))]
    arc = source.save(
        "eval-7",
        samples,
        rollout_id=7,
        evaluation=True,
        task_keys=task_keys,
        attrs={"model": "qwen3-4b", "step": 7, "tags": ["a", None], "lr": 1e-6},
    )
    path = fmt.export(arc, tmp_path / f"eval-7{fmt.suffix}")
    copy = fmt.import_(target, path)
    assert_same_archive(copy, arc)
    assert [k for _, k in copy.keys()] == task_keys
    # ... and into the same pool under another name, with everything else kept.
    assert_same_archive(fmt.import_(source, path, name="eval-7b"), arc, name="eval-7b")


def test_round_trip_of_dict_samples_without_indices(tmp_path: Path, sqlite_pool, fmt) -> None:
    source = sqlite_pool
    samples: list[Any] = [
        {"tokens": [1, 2, 3], "reward": 0.5, "meta": {"empty": {}, "n": [1, 2]}},
        {"index": 4, "tokens": [], "reward": None, "t": torch.arange(6).reshape(2, 3)},
        {"tokens": [9], "nested": [{"a": (1, "x")}]},
    ]
    arc = source.save("dicts", samples, rollout_id=None)
    assert arc.keys()[0] == ("position:0", None)
    with ArchiveManager.open(tmp_path / "b") as target:
        copy = fmt.import_(target, fmt.export(arc, tmp_path / f"d{fmt.suffix}"))
        assert_same_archive(copy, arc)
        assert all(type(s) is dict for s in copy.load_samples())


def test_import_arguments_override_the_file(tmp_path: Path, sqlite_pool, fmt) -> None:
    pool = sqlite_pool
    arc = pool.save("r", _samples(), rollout_id=7, evaluation=True, attrs={"k": 1})
    path = fmt.export(arc, tmp_path / f"r{fmt.suffix}")
    by_group = fmt.import_(
        pool, path, name="r2", rollout_id=None, evaluation=False, task_key_field="group_index"
    )
    keys = [(sk, str(s.group_index)) for (sk, _), s in zip(arc.keys(), _samples(), strict=True)]
    assert_same_archive(by_group, arc, name="r2", rollout_id=None, evaluation=False, keys=keys)
    # A dotted path into a dict field; ints become their decimal string, None stays None.
    metadata = fmt.import_(pool, path, name="r3", task_key_field="framework_extra.step")
    assert [k for _, k in metadata.keys()] == [str(i) for i in range(len(arc))]
    assert (metadata.rollout_id, metadata.evaluation) == (7, True)


def test_a_missing_task_key_field_is_refused_naming_it(tmp_path: Path, sqlite_pool, fmt) -> None:
    pool = sqlite_pool
    arc = pool.save("r", _samples(), rollout_id=7)
    path = fmt.export(arc, tmp_path / f"r{fmt.suffix}")
    before = snapshot_pool(pool)
    with pytest.raises(InvalidInputError, match=r"sample 0 has no field 'metadata\.nope'"):
        fmt.import_(pool, path, name="x", task_key_field="metadata.nope")
    with pytest.raises(InvalidInputError, match="sample 0, task key field 'reward'"):
        fmt.import_(pool, path, name="x", task_key_field="reward")  # a dict: not a key
    with pytest.raises(InvalidInputError, match="not a field name"):
        fmt.import_(pool, path, name="x", task_key_field="metadata..x")
    assert snapshot_pool(pool) == before


# --------------------------------------------------------------------------- .pt specifics


def test_pt_facts_that_do_not_fit_the_samples_are_refused(tmp_path: Path, sqlite_pool) -> None:
    pool = sqlite_pool
    arc = pool.save("r", tiny_rollout(4), rollout_id=1)
    dump = torch.load(arc.export_pt(tmp_path / "r.pt"), weights_only=True)
    before = snapshot_pool(pool)

    def refused(content: dict, match: str) -> None:
        path = tmp_path / "bad.pt"
        torch.save(content, path)
        with pytest.raises(UnsupportedFormatError, match=match):
            pool.import_pt(path, name="bad")

    facts = dump["archive_manager"]
    refused({**dump, "archive_manager": {**facts, "version": 2}}, "version 2; this library")
    refused({**dump, "archive_manager": [1]}, "block is malformed: a list")
    refused({**dump, "archive_manager": {**facts, "task_keys": [None]}}, "'task_keys' must")
    refused({**dump, "archive_manager": {**facts, "evaluation": 1}}, "'evaluation' must")
    edited = [dict(s) for s in dump["samples"]]
    edited[1]["index"] = 99  # changed after the export: its key no longer fits
    refused({**dump, "samples": edited}, "sample 1 has sample key 'sample:99'")
    status = [dict(s) for s in dump["samples"]]
    status[0]["status"] = "bogus"
    refused({**dump, "samples": status}, "sample 0: cannot rebuild")
    assert snapshot_pool(pool) == before


def test_cli_import_pt_options(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("r", tiny_rollout(4), rollout_id=1, evaluation=True).export_pt(tmp_path / "r.pt")
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(cli, ["--root", str(root), "import-pt", str(tmp_path / "r.pt"), *args])

    result = run("--name", "r2", "--rollout-id", "9", "--no-evaluation", "--task-key-field",
                 "index", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    with ArchiveManager.open(root) as pool:
        arc = pool.open_archive("r2")
        assert (arc.rollout_id, arc.evaluation) == (9, False)
        assert [k for _, k in arc.keys()] == ["0", "1", "2", "3"]
        assert pool.import_pt(tmp_path / "r.pt", name="r3").evaluation is True
    result = run("--name", "r4", "--task-key-field", "metadata.nope")
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "sample 0 has no field 'metadata.nope'" in result.output
    assert run("--rollout-id", "x").exit_code == 2
