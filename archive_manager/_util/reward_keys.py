"""The names of a dict reward's parts (docs/lens.md, "Rewards"): what a reward key may be.

Apart from `archive_manager.metadata` so that the catalog verbs (``stats``, ``query``) check a
``--reward-key`` without importing the codec (docs/architecture/start-up.md, "Start-up")."""

from __future__ import annotations

from ..errors import InvalidInputError

__all__ = ["check_reward_key", "reward_component"]


def reward_component(key: object) -> str | None:
    """``key`` if it can name a part of a dict reward in the catalog (a non-empty str of at
    most 255 characters and UTF-8 bytes, no NUL), else None."""
    if type(key) is not str or not key or len(key) > 255 or "\x00" in key:
        return None
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return None
    return key if size <= 255 else None


def check_reward_key(reward_key: object) -> str | None:
    """A reward key as given: None or the name of a part of a dict reward.

    Raises:
        InvalidInputError: not a str, empty, over 255 characters or UTF-8 bytes, or holding
            NUL or a lone surrogate.
    """
    if reward_key is None:
        return None
    if not isinstance(reward_key, str):
        raise InvalidInputError(
            f"reward_key must be a str (the key of a dict reward), not {type(reward_key).__name__}"
        )
    key = reward_component(str.__str__(reward_key))
    if key is None:
        raise InvalidInputError(
            f"reward_key {reward_key!r:.80} cannot name a part of a reward: give a non-empty "
            "key of at most 255 characters"
        )
    return key
