"""Seeded synthetic rollouts shaped like real ones (docs/architecture/workload.md, "Workload"), for
demos, tests and benchmarks.  Nothing is downloaded; the same seed always gives the same rollout."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._util.lazy_torch import torch_module
from ..samples import Sample

__all__ = ["make_rollout"]

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "or",
    "at",
    "from",
    "we",
    "an",
    "which",
    "step",
    "so",
    "then",
    "let",
    "us",
    "compute",
    "answer",
    "value",
    "equation",
    "therefore",
    "sum",
    "number",
    "check",
    "each",
    "case",
    "because",
    "since",
    "where",
    "thus",
    "result",
    "first",
    "second",
    "next",
    "finally",
    "total",
    "true",
    "false",
    "solve",
    "given",
    "x",
    "y",
    "z",
    "n",
    "k",
    "f",
    "g",
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    "=",
    "+",
    "-",
    "*",
    "/",
    "(",
    ")",
    "\\frac",
    "\\sqrt",
    "boxed",
]


def _text(rng: np.random.Generator, n_tokens: int) -> str:
    # About 4 characters per token, as in real responses; word-level text compresses like
    # prose rather than like random bytes.
    words = rng.choice(len(_WORDS), size=max(1, n_tokens * 4 // 5))
    return " ".join(_WORDS[i] for i in words)


def make_rollout(
    n_samples: int = 256,
    *,
    seed: int = 0,
    rollout_id: int = 0,
    group_size: int = 8,
    prompt_len: int = 512,
    response_min: int = 1400,
    response_max: int = 4200,
    vocab: int = 152_000,
    r3_layers: int | None = None,
    r3_topk: int = 8,
    r3_numpy: bool = False,
    as_dict: bool = False,
) -> list[Sample] | list[dict[str, Any]]:
    """Generate one rollout of ``n_samples`` samples in groups of ``group_size``.

    The samples of a group share their prompt tokens; response lengths are uniform in
    ``[response_min, response_max]`` and a response at the cap is ``truncated``.  Token lists,
    loss masks and log-probs are Python lists (log-probs are float32 values held as Python
    floats), as slime keeps them.  With ``r3_layers``, every sample carries an int32 routed-expert
    tensor ``[len(tokens) - 1, r3_layers, r3_topk]`` (a numpy array with ``r3_numpy``, as slime
    hands them, and as a lean install without torch can hold them).  Each sample has a ``task_key`` attribute
    naming its prompt group.
    """
    rng = np.random.default_rng(seed)
    samples: list[Any] = []
    prompt: list[int] = []
    prompt_text = ""
    for i in range(n_samples):
        group = i // group_size
        if i % group_size == 0:
            prompt = rng.integers(0, vocab, size=prompt_len).tolist()
            prompt_text = _text(rng, prompt_len)
        length = int(rng.integers(response_min, response_max + 1))
        response = rng.integers(0, vocab, size=length).tolist()
        log_probs = (-rng.exponential(0.3, size=length)).astype(np.float32).tolist()
        truncated = length == response_max
        reward = float(rng.random() < 0.5) if not truncated else 0.0
        sample = Sample(
            group_index=group,
            index=i,
            prompt=prompt_text,
            tokens=prompt + response,
            response=_text(rng, length),
            response_length=length,
            label=str(int(rng.integers(0, 100))),
            reward=reward,
            loss_mask=[1] * length,
            rollout_log_probs=log_probs,
            status=Sample.Status.TRUNCATED if truncated else Sample.Status.COMPLETED,
            metadata={"source": "synthetic", "difficulty": int(rng.integers(1, 6))},
            weight_versions=[f"v{rollout_id}"],
        )
        sample.rollout_id = rollout_id
        if r3_layers:
            experts = rng.integers(
                0, 128, size=(prompt_len + length - 1, r3_layers, r3_topk), dtype=np.int32
            )
            sample.rollout_routed_experts = (
                experts if r3_numpy else torch_module().from_numpy(experts)
            )
        # task_key is no field of slime's Sample: the codec stores extra attributes too.
        sample.task_key = f"rollout-{rollout_id}/group-{group}"  # type: ignore[attr-defined]
        samples.append(sample.to_dict() if as_dict else sample)
    return samples
