"""Groups and rewards as the frameworks hand them over (`archive_manager.lens.groups`):
slime marks a prompt's completions with ``group_index`` and saves no task key; rewards come
as 0-d tensors, numpy scalars or bools; task ids come as ints and numpy ints."""

from __future__ import annotations

import json
import math
import random
import sqlite3
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from alembic import command
from helpers import Backend, open_on

from archive_manager import ArchiveManager, Sample
from archive_manager.catalog import current_revision, head_revision, make_engine, migrate
from archive_manager.catalog.migrate import VERSION_TABLE, migration_connection
from archive_manager.errors import InvalidInputError
from archive_manager.lens.groups import ADVANTAGE_EPS, Group
from archive_manager.lens.stats import RolloutStats
from archive_manager.samples import check_task_key, long_task_key, task_key_of

FRAMEWORKS = Path(__file__).resolve().parents[1] / "frameworks"
if str(FRAMEWORKS) not in sys.path:
    sys.path.insert(0, str(FRAMEWORKS))

from rollouts import make_slime_rollout, make_vime_rollout  # noqa: E402


def slime_rollout(seed: int, prompts: int = 4, n: int = 4) -> list[Sample]:
    """A slime-shaped rollout: ``group_index`` per prompt, no task key."""
    rng = random.Random(seed)
    out = []
    for g in range(prompts):
        for k in range(n):
            reward: float | None = float(rng.choice([0, 1, 0.5, 0.25]))
            if g == 0:
                reward = 1.0  # every completion right: a group that teaches nothing
            if g == 1 and k == 0:
                reward = None
            out.append(
                Sample(
                    group_index=g,
                    index=g * n + k,
                    tokens=[1, 2, 3],
                    response_length=rng.randint(1, 40),
                    reward=reward,
                )
            )
    return out


def test_groups_by_group_index_match_grpo(tmp_path: Path, backend: Backend) -> None:
    """Samples without a task key are grouped by ``group_index``; each group's mean, std and
    advantages are what GRPO computes (torch: std with n - 1). Saved without task keys, the
    rollout was one group of every sample."""
    samples = slime_rollout(seed=7)
    with open_on(backend, tmp_path / "pool") as pool:
        pool.save("r", samples, rollout_id=1)
        groups = pool.groups("r")
    assert [(g.task_key, g.group_index) for g in groups] == [(None, g) for g in range(4)]
    for g in groups:
        members = [s for s in samples if s.group_index == g.group_index]
        rewards = [s.reward for s in members if s.reward is not None]
        t = torch.tensor(rewards, dtype=torch.float64)
        assert g.size == len(members) and g.rewarded == len(rewards)
        assert g.reward_mean == pytest.approx(t.mean().item())
        assert g.reward_std == pytest.approx(t.std().item())
        expected = ((t - t.mean()) / (t.std() + ADVANTAGE_EPS)).tolist()
        got = [m.normalized_advantage for m in g.members if m.reward is not None]
        assert got == pytest.approx(expected)
        assert [m.sample_key for m in g.members] == [f"sample:{s.index}" for s in members]
        assert g.as_dict()["group_index"] == g.group_index
        assert g.zero_variance is (len(set(rewards)) == 1)
    assert groups[0].zero_variance


def test_task_key_first_then_group_index_then_ungrouped(tmp_path: Path) -> None:
    """The rule: a sample's task key groups it; without one its ``group_index``; without
    either it is in the one ungrouped group (never flagged as of zero variance)."""
    samples = [
        {"task_key": "q", "group_index": 0, "reward": 1.0},
        {"group_index": 0, "reward": 0.0},
        {"task_key": "q", "group_index": 1, "reward": 0.0},
        {"group_index": 0, "reward": 1.0},
        {"reward": 1.0},
        {"reward": 1.0},
        {"group_index": 1, "reward": 0.5},
    ]
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("r", samples, rollout_id=1)
        groups = pool.groups("r")
    got = [(g.task_key, g.group_index, [m.position for m in g.members]) for g in groups]
    assert got == [("q", None, [0, 2]), (None, 0, [1, 3]), (None, None, [4, 5]), (None, 1, [6])]
    ungrouped = groups[2]
    assert ungrouped.rewarded == 2 and not ungrouped.zero_variance


# Rewards as the frameworks return them, and the number the catalog should record.
FRAMEWORK_REWARDS: list[tuple[Any, float]] = [
    (torch.tensor(0.5), 0.5),
    (torch.tensor(1.0, dtype=torch.bfloat16), 1.0),
    (torch.tensor(2), 2.0),
    (torch.tensor(True), 1.0),
    (np.float32(0.25), 0.25),
    (np.int64(3), 3.0),
    (np.bool_(True), 1.0),
    (np.bool_(False), 0.0),
    (True, 1.0),
    (False, 0.0),
    (1, 1.0),
    (0.75, 0.75),
]


def test_framework_rewards_count_in_stats_query_and_groups(
    tmp_path: Path, backend: Backend
) -> None:
    """A 0-d tensor, a numpy scalar or a bool reward is stored, and the catalog records it as
    a number: `stats`, `query(min_reward=)` and `groups` count it. It was recorded as none,
    and all three silently skipped the sample."""
    samples = [
        Sample(group_index=0, index=i, response_length=1, reward=reward)
        for i, (reward, _) in enumerate(FRAMEWORK_REWARDS)
    ]
    want = [number for _, number in FRAMEWORK_REWARDS]
    with open_on(backend, tmp_path / "pool") as pool:
        pool.save("r", samples, rollout_id=1)
        (stat,) = pool.stats()
        assert stat.rewarded == len(want)
        assert stat.reward_mean == pytest.approx(sum(want) / len(want))
        found = pool.query(min_reward=0.5)
        assert sorted(r.position for r in found) == [i for i, v in enumerate(want) if v >= 0.5]
        assert [r.reward for r in pool.query(min_reward=-1.0)] == want
        (group,) = pool.groups("r")
        assert group.rewarded == len(want)
        assert [m.reward for m in group.members] == want
        back = pool.open_archive("r").load_samples()
    # the stored values are the framework's own: a tensor stays a tensor, a bool a bool
    for sample, (reward, _) in zip(back, FRAMEWORK_REWARDS, strict=True):
        assert type(sample.reward) is type(reward)


def test_nan_rewards_stay_unrecorded(tmp_path: Path) -> None:
    """NaN, as a float, a 0-d tensor or a numpy scalar, is no number the catalog records
    (PostgreSQL's JSON refuses it): the sample is stored and left out of the reward figures."""
    samples = [
        {"reward": float("nan"), "group_index": 0},
        {"reward": torch.tensor(float("nan")), "group_index": 0},
        {"reward": np.float32("nan"), "group_index": 0},
        {"reward": 1.0, "group_index": 0},
    ]
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("r", samples, rollout_id=1)
        (stat,) = pool.stats()
        (group,) = pool.groups("r")
    assert stat.rewarded == 1 and group.rewarded == 1 and group.size == 4


def test_dict_rewards_stay_stored_and_unrecorded(tmp_path: Path) -> None:
    """A dict of named rewards is stored as it is and recorded as no number (a later item
    picks one of its keys)."""
    samples = [{"reward": {"acc": 1.0, "len": torch.tensor(0.5)}, "group_index": 0}]
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("r", samples, rollout_id=1)
        (group,) = pool.groups("r")
        (back,) = pool.open_archive("r").load_samples()
    assert group.rewarded == 0 and group.size == 1
    assert back["reward"]["acc"] == 1.0 and torch.equal(back["reward"]["len"], torch.tensor(0.5))


@pytest.mark.parametrize(
    ("key", "text"),
    [
        (7, "7"),
        (-3, "-3"),
        (np.int64(42), "42"),
        (np.int32(5), "5"),
        (np.uint64(2**64 - 1), str(2**64 - 1)),
        ("q", "q"),
        (np.str_("prompt-1"), "prompt-1"),
    ],
)
def test_int_and_numpy_task_keys(tmp_path: Path, key: Any, text: str) -> None:
    """An int or numpy int task key is kept as its decimal text (the catalog's task keys are
    text); a str subclass (numpy.str_) as its text, a plain str. np.int64 was refused."""
    got = check_task_key(key)
    assert got == text and type(got) is str
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("r", [{"reward": 1.0}, {"reward": 0.0}], rollout_id=1, task_keys=[key, key])
        (group,) = pool.groups("r")
        assert group.task_key == text and group.size == 2
        assert len(pool.query(task_key=text)) == 2
        assert [h.rollout_id for h in pool.prompt_history(text)] == [1]


def test_task_key_of_gives_plain_text() -> None:
    for key, text in [(np.int64(9), "9"), (np.str_("a"), "a"), (11, "11")]:
        got = task_key_of({"task_key": key})
        assert got == text and type(got) is str


@pytest.mark.parametrize("key", [True, np.bool_(False), 1.5, np.float32(2.0), b"q", [1]])
def test_other_task_keys_are_refused(key: Any) -> None:
    """A bool is no task id (True would become key "True" or "1"); floats and bytes are
    refused as before."""
    with pytest.raises(InvalidInputError):
        check_task_key(key)


# --------------------------------------------------------------------------- stats = groups


def assert_agree(stat: RolloutStats, groups: list[Group]) -> None:
    """`stats` counts the prompt groups `groups` lists: those with two or more rewards, the
    zero-variance ones, and the mean of their reward stds."""
    counted = [g for g in groups if g.field is not None and g.rewarded >= 2]
    assert stat.groups == len(counted) > 0
    assert stat.zero_variance_groups == sum(g.zero_variance for g in groups)
    stds = [g.reward_std for g in counted if g.reward_std is not None]
    assert stat.group_std_mean == pytest.approx(math.fsum(stds) / len(stds))


def test_stats_count_the_groups_that_groups_lists(tmp_path: Path, backend: Backend) -> None:
    """A slime rollout saved without task keys: `stats` counts its prompt groups by
    ``group_index``, as `groups` lists them (it counted none: its summary grouped by task key
    alone), and a task key still comes first."""
    samples = make_slime_rollout(24, seed=3)
    with open_on(backend, tmp_path / "pool") as pool:
        pool.save("slime", samples, rollout_id=1)
        mixed = [{"group_index": i // 3, "reward": float(i % 2)} for i in range(9)]
        pool.save("mixed", mixed, rollout_id=2, task_keys=["q", "q", None] * 3)
        one, two = pool.stats()
        assert_agree(one, pool.groups("slime"))
        assert_agree(two, pool.groups("mixed"))
        assert [(g.field, g.value) for g in pool.groups("mixed")] == [
            ("task_key", "q"),
            ("group_index", 0),
            ("group_index", 1),
            ("group_index", 2),
        ]


def test_an_upgrade_counts_the_groups_of_older_summaries(tmp_path: Path) -> None:
    """A catalog of revision 0008 kept summaries that grouped by task key alone: the upgrade
    computes those of archives with samples without task keys again (and leaves the others)."""
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("slime", make_slime_rollout(16, seed=4), rollout_id=1)
        pool.save("keyed", [{"reward": float(i % 2)} for i in range(4)], rollout_id=2,
                  task_keys=["a", "a", "b", "b"])  # fmt: skip
        want = [(s.groups, s.zero_variance_groups, s.group_std_mean) for s in pool.stats()]
    # A real catalog of revision 0008 (stamping the number alone would leave later revisions'
    # schema behind for the upgrade to trip on).
    engine = make_engine(f"sqlite:///{root / 'catalog.db'}")
    with migration_connection(engine) as conn:
        command.downgrade(migrate._config(conn), "0008")
    engine.dispose()
    with sqlite3.connect(root / "catalog.db") as db:
        # What revision 0008 stored for the rollout without task keys: no group.
        db.execute(
            "UPDATE archive_summaries SET groups = 0, zero_variance_groups = 0, group_stds = 0, "
            "group_std_mean = NULL WHERE archive_id = (SELECT id FROM archives WHERE name = "
            "'slime')"
        )
        assert db.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone() == ("0008",)
    db.close()
    with ArchiveManager.open(root) as pool:
        assert current_revision(pool.catalog.engine) == head_revision()
        got = [(s.groups, s.zero_variance_groups, s.group_std_mean) for s in pool.stats()]
        assert got == want
        assert_agree(pool.stats(1)[0], pool.groups("slime"))


def _by_field(samples: list[Any], read: Any) -> dict[Any, list[int]]:
    found: dict[Any, list[int]] = defaultdict(list)
    for position, sample in enumerate(samples):
        found[read(sample)].append(position)
    return found


@pytest.mark.parametrize(
    ("group_by", "read"),
    [
        ("label", lambda s: s.label),
        ("metadata.rm_type", lambda s: s.metadata["rm_type"]),
        ("remove_sample", lambda s: s.remove_sample),
        ("group_index", lambda s: s.group_index),
    ],
)
def test_group_by_any_field(tmp_path: Path, group_by: str, read: Any) -> None:
    """``group_by`` names the field the groups share: a field the catalog does not hold is
    decoded from the chunks (that field alone), a dotted name walks into a dict; `stats` with
    the same ``group_by`` counts what `groups` lists."""
    samples = make_vime_rollout(20, seed=5)
    for i, sample in enumerate(samples):
        sample.label = str(i % 3)  # three answers across the prompts
        if not isinstance(sample.reward, float):
            sample.reward = float(i % 2)
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("vime", samples, rollout_id=1)
        groups = pool.groups("vime", group_by=group_by)
        want = _by_field(samples, read)
        assert {g.value: [m.position for m in g.members] for g in groups} == want
        assert {g.field for g in groups} == {group_by}
        (stat,) = pool.stats(group_by=group_by)
        assert_agree(stat, groups)
        default = pool.stats()[0]
        assert (stat.samples, stat.rewarded, stat.reward_mean) == (
            default.samples,
            default.rewarded,
            pytest.approx(default.reward_mean),
        )


def test_group_by_task_key_alone_and_values_as_text(tmp_path: Path) -> None:
    """``group_by="task_key"`` leaves samples without one ungrouped; a list value groups by
    its JSON text, and 1, True and "1" are three groups."""
    samples = [
        {"group_index": 0, "reward": 1.0, "tag": 1},
        {"group_index": 0, "reward": 0.0, "tag": True},
        {"group_index": 1, "reward": 1.0, "tag": "1"},
        {"group_index": 1, "reward": 1.0, "tag": [1, "a"]},
        {"group_index": 1, "reward": 0.0, "tag": [1, "a"]},
        {"group_index": 1, "reward": 0.0},
    ]
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("r", samples, rollout_id=1, task_keys=["k", "k", None, None, None, None])
        by_key = pool.groups("r", group_by="task_key")
        assert [(g.field, g.value, g.size) for g in by_key] == [
            ("task_key", "k", 2),
            (None, None, 4),
        ]
        by_tag = pool.groups("r", group_by="tag")
        assert [(g.value, g.size) for g in by_tag] == [
            (1, 1),
            (True, 1),
            ("1", 1),
            (json.dumps([1, "a"]), 2),
            (None, 1),
        ]
        assert_agree(pool.stats(group_by="tag")[0], by_tag)


@pytest.mark.parametrize("group_by", ["", ".x", "a..b", 5, "x" * 256])
def test_a_group_by_that_names_no_field_is_refused(tmp_path: Path, group_by: Any) -> None:
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("r", [{"reward": 1.0}], rollout_id=1)
        with pytest.raises(InvalidInputError):
            pool.groups("r", group_by=group_by)
        with pytest.raises(InvalidInputError):
            pool.stats(group_by=group_by)


def test_a_field_that_keys_no_group_is_refused(tmp_path: Path) -> None:
    """A tensor is no group key: a clear error, not a group per object."""
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("r", make_slime_rollout(4, seed=1), rollout_id=1)
        with pytest.raises(InvalidInputError, match="rollout_routed_experts"):
            pool.groups("r", group_by="rollout_routed_experts")


# --------------------------------------------------------------------------- reward keys


def _slime_scored(n: int, seed: int) -> list[Any]:
    """A slime rollout whose dict rewards (every third sample: ``score``, ``acc``, ``pred``)
    and float rewards mix, as slime's reward models hand them back; the scores differ from
    the ``acc`` flags."""
    samples = make_slime_rollout(n, seed=seed)
    for i, sample in enumerate(samples):
        if isinstance(sample.reward, dict):
            sample.reward["score"] = (i % 4) / 4
    return samples


def _value(reward: Any, key: str) -> float | None:
    if isinstance(reward, dict):
        part = reward.get(key)
        return None if part is None or isinstance(part, str) else float(part)
    return None if reward is None else float(reward)


def _scored(reward: Any, key: str) -> float:
    """`_value` of a sample the test's rewards all score."""
    value = _value(reward, key)
    assert value is not None, reward
    return value


def test_reward_key_at_save_scores_dict_rewards(tmp_path: Path, backend: Backend) -> None:
    """``reward_key`` at save picks the part of a dict reward that is the reward, as slime's
    ``--reward-key``: `stats`, `query(min_reward=)` and `groups` count those samples (a dict
    reward gave none, and the lens went blank for them); the key is kept with the archive."""
    samples = _slime_scored(24, seed=1)
    want = [_scored(s.reward, "score") for s in samples]
    assert any(isinstance(s.reward, dict) for s in samples)
    with open_on(backend, tmp_path / "pool") as pool:
        arc = pool.save("r", samples, rollout_id=1, reward_key="score")
        assert arc.reward_key == "score" == pool.open_archive("r").reward_key
        (stat,) = pool.stats()
        assert stat.rewarded == len(want) and stat.unscored == 0
        assert stat.reward_mean == pytest.approx(math.fsum(want) / len(want))
        assert stat.reward_keys == ("score",) and stat.reward_note is None
        assert stat.reward_components == ("acc", "score")
        rows = pool.query(min_reward=0.5)
        assert [r.position for r in rows] == [i for i, v in enumerate(want) if v >= 0.5]
        assert {r.reward_key for r in rows} == {"score"}
        groups = pool.groups("r")
        assert [m.reward for g in groups for m in g.members] == want
        assert {g.reward_key for g in groups} == {"score"}
        assert_agree(stat, groups)


def test_dict_rewards_without_a_key_are_counted_and_named(tmp_path: Path) -> None:
    """Saved without a key, dict rewards give no number, and `stats` says so: how many, the
    keys their dicts hold (numbers only: ``pred`` is text), and how to choose one."""
    samples = _slime_scored(12, seed=2)
    dicts = sum(isinstance(s.reward, dict) for s in samples)
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("r", samples, rollout_id=1)
        (stat,) = pool.stats()
        assert stat.unscored == dicts > 0 and stat.rewarded == len(samples) - dicts
        assert stat.reward_components == ("acc", "score") and stat.reward_keys == ()
        assert stat.reward_note is not None and "reward_key" in stat.reward_note
        assert "acc, score" in stat.reward_note
        assert stat.as_dict()["unscored"] == dicts
        assert sum(g.unscored for g in pool.groups("r")) == dicts


@pytest.mark.parametrize("saved", [None, "score"])
def test_reward_key_overrides_read_the_catalog(
    tmp_path: Path, backend: Backend, saved: str | None
) -> None:
    """A key given to `stats`, `query` or `groups` reads that part of every dict reward from
    the catalog, whatever key the archive was saved with; a key no dict holds leaves them
    unscored, and says so."""
    samples = _slime_scored(24, seed=3)
    want = [_scored(s.reward, "acc") for s in samples]
    with open_on(backend, tmp_path / "pool") as pool:
        pool.save("r", samples, rollout_id=1, reward_key=saved)
        (stat,) = pool.stats(reward_key="acc")
        assert stat.rewarded == len(want) and stat.unscored == 0
        assert stat.reward_mean == pytest.approx(math.fsum(want) / len(want))
        assert stat.reward_keys == ("acc",)
        groups = pool.groups("r", reward_key="acc")
        assert [m.reward for g in groups for m in g.members] == want
        assert {g.reward_key for g in groups} == {"acc"}
        assert_agree(stat, groups)
        rows = pool.query(min_reward=1.0, reward_key="acc", limit=100)
        assert [r.position for r in rows] == [i for i, v in enumerate(want) if v >= 1.0]
        assert {r.reward_key for r in rows} == {"acc"}
        (missing,) = pool.stats(reward_key="nope")
        dicts = sum(isinstance(s.reward, dict) for s in samples)
        assert missing.unscored == dicts and missing.rewarded == len(samples) - dicts
        assert missing.reward_note is not None and "'nope'" in missing.reward_note
        # the stored summaries still answer without a key, and with the key saved
        (plain,) = pool.stats()
        assert plain.reward_keys == (() if saved is None else (saved,))


def test_a_key_every_archive_was_saved_with_reads_the_summaries(tmp_path: Path) -> None:
    """When every archive asked about was saved with the key given, `stats` answers from the
    stored summaries (no sample row read), as without a key."""
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("r", _slime_scored(8, seed=4), rollout_id=1, reward_key="score")
        from archive_manager.lens import stats as stats_module

        calls: list[Any] = []
        original = stats_module._sample_facts

        def spy(*args: Any, **kwargs: Any) -> Any:
            calls.append(args)
            return original(*args, **kwargs)

        stats_module._sample_facts = spy  # type: ignore[assignment]
        try:
            assert pool.stats(reward_key="score") == pool.stats()
            assert not calls
            pool.stats(reward_key="acc")
            assert calls
        finally:
            stats_module._sample_facts = original  # type: ignore[assignment]


def test_reward_key_survives_a_rebuild_and_a_reference(tmp_path: Path) -> None:
    """The key is kept in the manifest: a catalog rebuilt from the blobs keeps it, and the
    rewards it chose; a reference save keeps its source's key, or chooses another from the
    parts its source recorded."""
    root = tmp_path / "pool"
    samples = _slime_scored(12, seed=5)
    with ArchiveManager.open(root) as pool:
        pool.save("r", samples, rollout_id=1, reward_key="score")
        pool.save("same", None, rollout_id=2, reference="r")
        pool.save("acc", None, rollout_id=3, reference="r", reward_key="acc")
        before = {r.rollout_id: r for r in pool.stats()}
    assert before[2].reward_keys == ("score",) and before[3].reward_keys == ("acc",)
    assert before[1].reward_mean == before[2].reward_mean != before[3].reward_mean
    for path in root.glob("catalog.db*"):
        path.unlink()
    with ArchiveManager.open(root, recover=True) as pool:
        pool.rebuild_catalog()
        assert pool.open_archive("r").reward_key == "score"
        assert {r.rollout_id: r for r in pool.stats()} == before
        (stat,) = pool.stats(1, reward_key="acc")
        assert stat.reward_mean == before[3].reward_mean


@pytest.mark.parametrize("key", ["", 5, "x" * 256, "a\x00b"])
def test_a_reward_key_that_names_no_part_is_refused(tmp_path: Path, key: Any) -> None:
    with ArchiveManager.open(tmp_path / "pool") as pool:
        with pytest.raises(InvalidInputError):
            pool.save("r", [{"reward": {"a": 1.0}}], rollout_id=1, reward_key=key)
        assert pool.find(state=None) == []
        pool.save("r", [{"reward": {"a": 1.0}}], rollout_id=1)
        for call in (
            lambda: pool.stats(reward_key=key),
            lambda: pool.query(reward_key=key),
            lambda: pool.groups("r", reward_key=key),
        ):
            with pytest.raises(InvalidInputError):
                call()


def test_vime_rewards_and_numeric_parts(tmp_path: Path) -> None:
    """vime's samples as its reward models hand them: a dict of a float, a bool and text;
    parts that are 0-d tensors or numpy scalars are numbers too."""
    samples = make_vime_rollout(9, seed=6)
    samples[0].reward = {"score": torch.tensor(0.25), "acc": np.bool_(True), "note": "x"}
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("v", samples, rollout_id=1, reward_key="score")
        groups = pool.groups("v")
        first = next(m for g in groups for m in g.members if m.position == 0)
        assert first.reward == 0.25
        (row,) = pool.query(sample_key=next(r.sample_key for r in pool.query(limit=1)),
                            reward_key="acc", limit=1)  # fmt: skip
        assert row.reward == 1.0


# --------------------------------------------------------------------------- task keys


@pytest.mark.parametrize("key", [1.5, True, np.float64(2.0), np.bool_(True), b"q"])
def test_a_task_key_attribute_is_checked_as_task_keys_are(tmp_path: Path, key: Any) -> None:
    """A float or bool task key on the sample (or its queue receipt) is refused at save, as
    in ``task_keys``: it was saved as the text ``"1.5"`` / ``"True"``, while ``task_keys``
    refused the very same value. Nothing is written."""
    with ArchiveManager.open(tmp_path / "pool") as pool:
        with pytest.raises(InvalidInputError, match="task key"):
            pool.save("r", [{"reward": 1.0, "task_key": key}], rollout_id=1)
        with pytest.raises(InvalidInputError, match="task key"):
            pool.save("q", [{"reward": 1.0, "_queue_receipt": {"task_id": key}}], rollout_id=1)
        with pytest.raises(InvalidInputError):
            pool.save("k", [{"reward": 1.0}], rollout_id=1, task_keys=[key])
        assert pool.find(state=None) == []
    with pytest.raises(InvalidInputError):
        task_key_of({"task_key": key})


def _long_prompt(group: int) -> str:
    """A real prompt: a system turn and a problem, far over the catalog's 255 bytes."""
    return (
        "<|im_start|>system\nYou are a careful mathematician. Reason step by step, check "
        "every step, and put the final answer in \\boxed{}.<|im_end|>\n<|im_start|>user\n"
        f"Problem {group}: "
        + "Let x be the positive root of x^2 - 5x + 6 = 0. " * 6
        + "Find x.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_long_prompts_are_task_keys(tmp_path: Path, backend: Backend) -> None:
    """A prompt over 255 bytes is a task key: keyed by its digest (one prompt, one key, in
    every archive), its text kept and shown by `groups` and `prompt_changes`, and found by
    its text (`query`, `find`, `prompt_history`, `load_samples`). It was refused."""
    samples: list[Any] = make_slime_rollout(12, seed=7)
    prompts = [_long_prompt(s.group_index) for s in samples]
    assert all(len(p.encode()) > 255 for p in prompts)
    with open_on(backend, tmp_path / "pool") as pool:
        pool.save("r1", samples, rollout_id=1, task_keys=prompts)
        pool.save("r2", [{"reward": 0.0, "task_key": prompts[0]}] * 2, rollout_id=2)
        groups = pool.groups("r1")
        assert [g.task_text for g in groups] == [_long_prompt(g) for g in range(3)]
        assert [g.task_key for g in groups] == [long_task_key(_long_prompt(g)) for g in range(3)]
        assert all(g.task_key is not None and len(g.task_key) <= 255 for g in groups)
        assert groups[0].as_dict()["task_text"] == prompts[0]
        assert_agree(pool.stats(1)[0], groups)
        assert len(pool.query(task_key=prompts[0])) == 6
        assert [i.name for i in pool.find(task_key=prompts[0])] == ["r1", "r2"]
        assert [h.rollout_id for h in pool.prompt_history(prompts[0])] == [1, 2]
        assert len(pool.open_archive("r1").load_samples(task_key=prompts[4])) == 4
        (change,) = [c for c in pool.prompt_changes(1, 2) if c.task_key == groups[0].task_key]
        assert change.task_text == prompts[0]


def test_long_task_keys_survive_a_rebuild_and_a_reference(tmp_path: Path) -> None:
    """The texts are in the manifest: a rebuilt catalog shows them again, and a reference
    save shares them with its source."""
    root = tmp_path / "pool"
    text = _long_prompt(1)
    with ArchiveManager.open(root) as pool:
        pool.save("r", [{"reward": 1.0}, {"reward": 0.0}], rollout_id=1, task_keys=[text] * 2)
        pool.save("ref", None, rollout_id=2, reference="r")
        assert [g.task_text for g in pool.groups("ref")] == [text]
    for path in root.glob("catalog.db*"):
        path.unlink()
    with ArchiveManager.open(root, recover=True) as pool:
        pool.rebuild_catalog()
        for name in ("r", "ref"):
            assert [g.task_text for g in pool.groups(name)] == [text]


def test_a_manifest_text_must_be_its_keys(tmp_path: Path) -> None:
    """A damaged or forged manifest cannot show a text under another text's key."""
    from archive_manager.pool.manifest import Manifest

    text = _long_prompt(2)
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("r", [{"reward": 1.0}], rollout_id=1, task_keys=[text])
        manifest = pool.open_archive("r").manifest_digest
        assert manifest is not None
        data = Manifest.decode(pool.store.get(manifest)).to_dict()

    assert data["task_texts"] == {long_task_key(text): text}
    Manifest.from_dict(data)
    data["task_texts"] = {long_task_key(text): text + " (edited)"}
    with pytest.raises(ValueError, match="not the text of that key"):
        Manifest.from_dict(data)


@pytest.mark.parametrize("text", ["a\x00" * 200, "x" * ((1 << 20) + 1), "\ud800" * 300])
def test_texts_no_catalog_holds_are_refused(tmp_path: Path, text: str) -> None:
    with ArchiveManager.open(tmp_path / "pool") as pool:
        with pytest.raises(InvalidInputError):
            pool.save("r", [{"reward": 1.0}], rollout_id=1, task_keys=[text])
        assert pool.find(state=None) == []


def test_an_older_pool_takes_long_task_keys(tmp_path: Path) -> None:
    """tests/data/pool-r5.tar.gz (revision 0005): upgraded, its keys and groups are as they
    were, and an archive with long task keys saves beside them."""
    import tarfile

    with tarfile.open(Path(__file__).resolve().parents[1] / "data" / "pool-r5.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    with ArchiveManager.open(tmp_path / "pool-r5", rebind=True) as pool:
        before = {i.name: pool.open_archive(i.name).keys() for i in pool.find()}
        assert all(len(k or "") <= 255 for keys in before.values() for _, k in keys)
        text = _long_prompt(3)
        pool.save("long", [{"reward": 1.0}, {"reward": 0.5}], rollout_id=9, task_keys=[text] * 2)
        assert [g.task_text for g in pool.groups("long")] == [text]
        assert {n: pool.open_archive(n).keys() for n in before} == before
        assert all(g.task_text is None for n in before for g in pool.groups(n))
