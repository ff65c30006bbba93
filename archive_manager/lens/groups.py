"""The RL lens from the catalog alone (docs/architecture/rl-lens.md, "The RL lens"): prompt groups
of one archive, a prompt's history across rollouts, and the prompts whose reward changed most
between two rollout ranges.

A *group* is the samples of one archive that share a task key (the N completions of one
prompt); a sample without a task key is grouped by its ``group_index`` (slime marks a prompt's
completions so and saves no task key), and one with neither is in the archive's one ungrouped
group; ``group_by`` names one field to group by instead (`lens.grouping`). Advantages are computed as GRPO does: ``reward - mean`` and
``(reward - mean) / (std + eps)``, with the sample standard deviation (``n - 1``, as
``torch.std``) and ``eps = 1e-6``. A sample whose reward is not a number (None, a dict) has no
advantage and is left out of the group's reward figures. No payload blob is read, unless
the groups are by a field the catalog does not hold.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from ..catalog import archives_table, entries_table, sample_metadata_table
from ..catalog.queries import archive_by_name, task_texts_of
from ..errors import ArchiveNotFoundError, IntegrityError, InvalidInputError
from ..pool.context import PoolContext
from ..pool.summary import unscored_flag
from ..samples import check_task_key
from .grouping import (
    CATALOG_FIELDS,
    GroupKey,
    catalog_group,
    check_group_by,
    payload_groups,
    shown_value,
)
from .rewards import check_reward_key, reward_column
from .stats import COUNTED_STATES, archive_filters, check_rollout_range, mean_std

if TYPE_CHECKING:
    from ..catalog import Catalog

__all__ = [
    "ADVANTAGE_EPS",
    "Group",
    "GroupMember",
    "PromptChange",
    "PromptRollout",
    "group_summaries",
    "prompt_changes",
    "prompt_history",
]

ADVANTAGE_EPS = 1e-6


@dataclass(frozen=True)
class GroupMember:
    """One completion of a group: where it is, its reward and advantages."""

    position: int
    sample_key: str
    reward: float | None
    advantage: float | None
    normalized_advantage: float | None
    response_length: int | None
    status: str | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Group:
    """The samples of one archive that share a task key, or, without one, a ``group_index``
    (or the field named by ``group_by``).

    ``field`` is what they share (``"task_key"``, ``"group_index"`` or the field grouped by;
    None for the ungrouped samples) and ``value`` its value (a key, an index, a field's value;
    a list or dict as its JSON text).  ``task_key`` is the key of a group by task key,
    ``group_index`` the index of a group by ``group_index``, else None.
    """

    task_key: str | None
    size: int
    rewarded: int  # members whose reward is a number
    reward_mean: float | None
    reward_std: float | None  # sample standard deviation (n - 1); None below two rewards
    reward_min: float | None
    reward_max: float | None
    length_mean: float | None
    statuses: dict[str, int]
    members: list[GroupMember] = dataclass_field(default_factory=list)
    group_index: int | None = None
    field: str | None = None
    value: Any = None
    # The part of a dict reward read as each member's reward: the key given, else the one
    # the archive was saved with (None: none); members whose reward is not a number and gave
    # none with it.
    reward_key: str | None = None
    unscored: int = 0
    # The whole text of a task key that is the digest of a long text (a prompt over 255
    # bytes: `samples.task_key_and_text`), else None.
    task_text: str | None = None

    @property
    def zero_variance(self) -> bool:
        """Every reward equal (at least two): the group teaches a GRPO step nothing.

        NOTE: never for the ungrouped samples (``field`` None), which share
        no prompt: flagged, they made ``groups`` count one zero-variance group more than
        ``stats``, which leaves them out (tests/lens/test_stats.py)."""
        return (
            (self.field is not None or self.task_key is not None or self.group_index is not None)
            and self.rewarded >= 2
            and self.reward_min == self.reward_max
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "task_key": self.task_key,
            "group_index": self.group_index,
            "field": self.field,
            "value": self.value,
            "reward_key": self.reward_key,
            "unscored": self.unscored,
            "task_text": self.task_text,
            "size": self.size,
            "rewarded": self.rewarded,
            "reward_mean": self.reward_mean,
            "reward_std": self.reward_std,
            "reward_min": self.reward_min,
            "reward_max": self.reward_max,
            "length_mean": self.length_mean,
            "statuses": self.statuses,
            "zero_variance": self.zero_variance,
            "members": [m.as_dict() for m in self.members],
        }


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _group(field: str | None, key: GroupKey, rows: list[Any], reward_key: str | None) -> Group:
    rewards = [r for r in (_finite(row.reward) for row in rows) if r is not None]
    mean, std = mean_std(rewards)
    lengths = [row.response_length for row in rows if row.response_length is not None]
    group = Group(
        task_key=key if field == "task_key" else None,
        size=len(rows),
        rewarded=len(rewards),
        reward_mean=mean,
        reward_std=std,
        reward_min=min(rewards) if rewards else None,
        reward_max=max(rewards) if rewards else None,
        length_mean=math.fsum(lengths) / len(lengths) if lengths else None,
        statuses=dict(Counter(row.status for row in rows if row.status is not None)),
        group_index=key if field == "group_index" else None,
        field=field,
        value=shown_value(key),
        reward_key=reward_key,
        unscored=sum(1 for row in rows if row.unscored and row.reward is None),
    )
    for row in rows:
        reward = _finite(row.reward)
        advantage = normalized = None
        if reward is not None and mean is not None:
            advantage = reward - mean
            normalized = advantage / ((std or 0.0) + ADVANTAGE_EPS)
        group.members.append(
            GroupMember(
                row.position,
                row.sample_key,
                reward,
                advantage,
                normalized,
                row.response_length,
                row.status,
            )
        )
    return group


def group_summaries(
    pool: PoolContext,
    name: str,
    *,
    group_by: str | None = None,
    reward_key: str | None = None,
) -> list[Group]:
    """Every group of archive ``name`` (published or released), in order of first appearance.

    The rule (``group_by`` None): a sample with a task key is in that key's group; one
    without is in the group of its ``group_index`` (as `describe_sample` recorded it); one
    with neither is in one ungrouped group (``field`` None; never flagged as of zero
    variance: its samples share no prompt).  ``group_by`` names the one field to group by
    instead (`lens.grouping`): ``"task_key"`` or ``"group_index"`` from the catalog, any
    other field decoded from the archive's chunks (that field alone; the only case that
    reads the payload).  ``reward_key`` chooses the part of dict rewards read as the
    reward instead of the key the archive was saved with, from the parts the catalog keeps
    (`lens.rewards`: no payload is read).

    Raises:
        ArchiveNotFoundError: no such archive.
        InvalidInputError: ``group_by`` is no field name, or a sample's value of it cannot
            key a group.
        ArchiveReleasedError: grouping by a payload field of an archive whose payload GC
            reclaimed.
    """
    group_by = check_group_by(group_by)
    reward_key = check_reward_key(reward_key)
    e, m = entries_table, sample_metadata_table
    with pool.catalog.read() as conn:
        row = archive_by_name(conn, name)
        if row is None or row.state not in COUNTED_STATES:
            raise ArchiveNotFoundError(f"archive {name!r} not found")
        rows = conn.execute(
            select(
                e.c.position,
                e.c.sample_key,
                e.c.task_key,
                reward_column(reward_key).label("reward"),
                m.c.response_length,
                m.c.status,
                m.c.description,
                unscored_flag().label("unscored"),
            )
            .join(
                m,
                (m.c.archive_id == e.c.archive_id) & (m.c.position == e.c.position),
                isouter=True,
            )
            .where(e.c.archive_id == row.id)
            .order_by(e.c.position)
        ).all()
        texts = task_texts_of(conn, {r.task_key for r in rows}, row.id)
    if group_by is None or group_by in CATALOG_FIELDS:
        keys = [catalog_group(group_by, r.task_key, r.description) for r in rows]
    else:
        keys = payload_groups(pool, name, group_by)
        if len(keys) != len(rows):
            raise IntegrityError(
                f"archive {name!r}: {len(keys)} samples in its chunks, {len(rows)} in the catalog"
            )
    groups: dict[GroupKey, list[Any]] = {}
    for key, r in zip(keys, rows, strict=True):
        groups.setdefault(key, []).append(r)
    used = reward_key if reward_key is not None else row.reward_key
    found = [_group(_field(group_by, key), key, members, used) for key, members in groups.items()]
    for group in found:
        if group.task_key is not None:
            group.task_text = texts.get(group.task_key)
    return found


def _field(group_by: str | None, key: GroupKey) -> str | None:
    """The field a group of key ``key`` shares (None: the ungrouped samples)."""
    if key is None:
        return None
    if group_by is not None:
        return group_by
    return "task_key" if isinstance(key, str) else "group_index"


@dataclass(frozen=True)
class PromptRollout:
    """How one rollout did on one prompt (every archive of that rollout id together)."""

    rollout_id: int | None
    evaluation: bool
    archives: tuple[str, ...]
    size: int
    rewarded: int
    reward_mean: float | None
    pass_rate: float | None  # share of numeric rewards above the threshold
    length_mean: float | None

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["archives"] = list(self.archives)
        return out


def _prompt_rows(
    catalog: Catalog,
    *,
    task_key: str | None,
    rollout_ids: object,
    evaluation: bool | None,
) -> list[Any]:
    a, e, m = archives_table, entries_table, sample_metadata_table
    where = archive_filters(check_rollout_range(rollout_ids), evaluation)
    if task_key is not None:
        where.append(e.c.task_key == task_key)
    else:
        where.append(e.c.task_key.is_not(None))
    with catalog.read() as conn:
        rows = conn.execute(
            select(
                a.c.name,
                a.c.rollout_id,
                a.c.evaluation,
                e.c.task_key,
                m.c.reward,
                m.c.response_length,
            )
            .join(e, e.c.archive_id == a.c.id)
            .join(
                m,
                (m.c.archive_id == e.c.archive_id) & (m.c.position == e.c.position),
                isouter=True,
            )
            .where(*where)
        ).all()
    return list(rows)


def _check_threshold(threshold: object) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise InvalidInputError("pass_threshold must be a number")
    value = float(threshold)
    if math.isnan(value):
        raise InvalidInputError("pass_threshold must not be NaN")
    return value


def _summarize(rows: list[Any]) -> tuple[int, list[float], list[int]]:
    rewards = [r for r in (_finite(row.reward) for row in rows) if r is not None]
    lengths = [row.response_length for row in rows if row.response_length is not None]
    return len(rows), rewards, lengths


def prompt_history(
    catalog: Catalog,
    task_key: str,
    *,
    rollout_ids: object = None,
    evaluation: bool | None = None,
    pass_threshold: float = 0.0,
) -> list[PromptRollout]:
    """Per rollout id (and evaluation flag) that saw prompt ``task_key``: the group's size,
    mean reward, pass rate (rewards above ``pass_threshold``) and mean length, in rollout
    order.  Published and released archives count, as in `ArchiveManager.stats`."""
    key = check_task_key(task_key)
    if key is None:
        raise InvalidInputError("give a task key")
    threshold = _check_threshold(pass_threshold)
    by_rollout: dict[tuple[int | None, bool], list[Any]] = defaultdict(list)
    for row in _prompt_rows(catalog, task_key=key, rollout_ids=rollout_ids, evaluation=evaluation):
        by_rollout[(row.rollout_id, bool(row.evaluation))].append(row)
    out = []
    for (rollout_id, evaluation_flag), rows in sorted(
        by_rollout.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1])
    ):
        size, rewards, lengths = _summarize(rows)
        out.append(
            PromptRollout(
                rollout_id=rollout_id,
                evaluation=evaluation_flag,
                archives=tuple(sorted({row.name for row in rows})),
                size=size,
                rewarded=len(rewards),
                reward_mean=mean_std(rewards)[0],
                pass_rate=sum(r > threshold for r in rewards) / len(rewards) if rewards else None,
                length_mean=math.fsum(lengths) / len(lengths) if lengths else None,
            )
        )
    return out


@dataclass(frozen=True)
class PromptChange:
    """One prompt seen in both rollout ranges, and how its mean reward moved."""

    task_key: str
    before: float
    after: float
    before_samples: int
    after_samples: int
    # The whole text of a key that is the digest of a long text, else None.
    task_text: str | None = None

    @property
    def change(self) -> float:
        return self.after - self.before

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "change": self.change}


def prompt_changes(
    catalog: Catalog,
    before: object,
    after: object,
    *,
    evaluation: bool | None = None,
    direction: str | None = None,
    limit: int | None = None,
) -> list[PromptChange]:
    """The prompts with numeric rewards in both rollout ranges (an int, a ``range`` or an
    inclusive ``(low, high)``), ranked by the change of their mean reward: largest drop first
    with ``direction="regressed"``, largest gain first with ``"improved"``, largest change
    either way otherwise."""
    if direction not in (None, "regressed", "improved"):
        raise InvalidInputError("direction must be None, 'regressed' or 'improved'")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise InvalidInputError("limit must be an int >= 0")
    sides: list[dict[str, list[float]]] = []
    for bounds in (before, after):
        if bounds is None:
            raise InvalidInputError("give both rollout ranges")
        rewards: dict[str, list[float]] = defaultdict(list)
        for row in _prompt_rows(catalog, task_key=None, rollout_ids=bounds, evaluation=evaluation):
            reward = _finite(row.reward)
            if reward is not None:
                rewards[row.task_key].append(reward)
        sides.append(rewards)
    old, new = sides
    changes = [
        PromptChange(
            key,
            mean_std(old[key])[0],  # type: ignore[arg-type]
            mean_std(new[key])[0],  # type: ignore[arg-type]
            len(old[key]),
            len(new[key]),
        )
        for key in sorted(old.keys() & new.keys())
    ]
    if changes:
        with catalog.read() as conn:
            texts = task_texts_of(conn, (c.task_key for c in changes))
        changes = [dataclasses.replace(c, task_text=texts.get(c.task_key)) for c in changes]
    if direction == "regressed":
        changes = sorted((c for c in changes if c.change < 0), key=lambda c: (c.change, c.task_key))
    elif direction == "improved":
        changes = sorted(
            (c for c in changes if c.change > 0), key=lambda c: (-c.change, c.task_key)
        )
    else:
        changes.sort(key=lambda c: (-abs(c.change), c.task_key))
    return changes if limit is None else changes[:limit]
