"""Which number is a sample's reward, when the caller chooses the key of a dict reward
(``reward_key=`` of `ArchiveManager.stats`, ``query`` and ``groups``; docs/lens.md, "Rewards").

A save records each sample's reward as a number: the reward itself when it is one, else the
part of a dict reward its archive's ``reward_key`` names (`describe_sample`).  Every numeric
part of a reward that is not a number is kept in ``sample_rewards`` (a row of component ""
marks such a sample), so another key is chosen from the catalog alone, with no payload read:
a sample whose reward is not a number gets the part the key names (none if its dict lacks
it); one whose reward is a number keeps it.  Archives saved before revision 0011 recorded no
parts: a key chosen later finds none in their dict rewards.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, select
from sqlalchemy.sql import ColumnElement

from .._util.reward_keys import check_reward_key
from ..catalog import sample_metadata_table, sample_rewards_table
from ..pool.summary import unscored_flag

__all__ = ["check_reward_key", "reward_column"]


def reward_column(reward_key: str | None) -> ColumnElement[Any]:
    """The reward of a ``sample_metadata`` row as ``reward_key`` chooses it: the recorded
    reward when None (the key given at save); else, of a sample whose reward is not a number,
    its part of that key (``sample_rewards``, by primary key), and of the others the recorded
    number."""
    m, r = sample_metadata_table, sample_rewards_table
    if reward_key is None:
        return m.c.reward
    part = (
        select(r.c.value)
        .where(
            r.c.archive_id == m.c.archive_id,
            r.c.position == m.c.position,
            r.c.component == reward_key,
        )
        .scalar_subquery()
    )
    return case((unscored_flag(), part), else_=m.c.reward)
