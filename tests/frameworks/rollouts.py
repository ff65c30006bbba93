"""Seeded slime- and vime-shaped rollouts: every field of the frameworks' ``Sample`` set to the
kinds of values their rollout code puts there (tensors, numpy arrays, nested dataclasses, the
``Status`` enum, bytes, lists of dicts, multimodal dicts of tensors, PIL images, extra
attributes, ``_queue_*`` live state)."""

from __future__ import annotations

import random
import uuid
from typing import Any

import numpy as np
import torch
from slime.utils.types import Sample as SlimeSample
from vime.utils.types import Sample as VimeSample

__all__ = ["make_slime_rollout", "make_vime_rollout"]

_NUM_LAYERS = 4  # MoE layers in the routed-experts replay (tiny on purpose)
_ROUTER_TOPK = 2  # experts per token
_NUM_EXPERTS = 16
_VOCAB = 32_000
_SC_TOPK = 4  # vime score-centering top-k width
_GROUP = 4  # n_samples_per_prompt

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc_score",
            "description": "Check a numeric answer.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string"}},
                "required": ["answer"],
            },
        },
    }
]


def _png_image(rng: random.Random, size: int = 8):
    """A small deterministic PIL image (upstream multimodal_inputs holds PIL
    images); falls back to raw PNG-like bytes if Pillow is missing."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow is normally present
        return b"\x89PNG\r\n\x1a\n" + bytes(rng.randrange(256) for _ in range(32))
    pixels = bytes(rng.randrange(256) for _ in range(size * size * 3))
    return Image.frombytes("RGB", (size, size), pixels)


def _ragged_top_p(gen: torch.Generator, response_length: int):
    """Ragged nucleus replay: ids int32 1-D, offsets int32 of length L+1, offsets[0]==0,
    offsets[-1]==len(ids); masked (tool) tokens get empty spans upstream."""
    widths = torch.randint(1, 5, (response_length,), generator=gen, dtype=torch.int32)
    offsets = torch.zeros(response_length + 1, dtype=torch.int32)
    offsets[1:] = torch.cumsum(widths, 0).to(torch.int32)
    ids = torch.randint(0, _VOCAB, (int(offsets[-1]),), generator=gen, dtype=torch.int32)
    return ids, offsets


def _common_fields(
    i: int, rng: random.Random, gen: torch.Generator, multimodal: bool
) -> dict[str, Any]:
    prompt_len = rng.randint(6, 12)
    model_len = rng.randint(5, 10)
    tool_len = rng.randint(2, 4) if i % 2 == 0 else 0  # multi-turn: tool observation tokens
    tail_len = rng.randint(1, 3) if tool_len else 0  # model continues after the tool
    response_length = model_len + tool_len + tail_len
    prompt_ids = [rng.randrange(_VOCAB) for _ in range(prompt_len)]
    response_ids = [rng.randrange(_VOCAB) for _ in range(response_length)]
    loss_mask = [1] * model_len + [0] * tool_len + [1] * tail_len
    log_probs = [
        round(-rng.random() * 3, 6) if m else 0.0 for m in loss_mask
    ]  # 0.0 for tool tokens

    if multimodal:
        # chat-message prompt whose content is a list of typed parts (slime data.py:_build_messages)
        prompt: Any = [
            {"role": "system", "content": "You are a helpful assistant."},
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": f"images/geo3k_{i:05d}.png"},
                    {"type": "text", "text": f"Find angle x in figure {i}."},
                ],
            },
        ]
        n_img = 1 + i % 2
        multimodal_inputs: dict[str, Any] | None = {
            "images": [_png_image(rng) for _ in range(n_img)],
            "videos": None,
        }
        patches = 4 * n_img
        multimodal_train_inputs: dict[str, Any] | None = {
            # typical HF Qwen-VL processor outputs minus input_ids/attention_mask
            "pixel_values": torch.randn(patches, 1176, generator=gen, dtype=torch.float32),
            "image_grid_thw": torch.tensor([[1, 2, 2]] * n_img, dtype=torch.int64),
        }
        mm_id: str | None = uuid.UUID(int=rng.getrandbits(128)).hex
    else:
        prompt = f"<|im_start|>user\nSolve problem {i}: what is {i} + {i * 3}?<|im_end|>\n<|im_start|>assistant\n"
        multimodal_inputs = None
        multimodal_train_inputs = None
        mm_id = None

    status = [
        SlimeSample.Status.COMPLETED,
        SlimeSample.Status.TRUNCATED,
        SlimeSample.Status.COMPLETED,
        SlimeSample.Status.ABORTED,
        SlimeSample.Status.FAILED,
    ][i % 5].value  # value string; converted per class below
    tool_records = [{"name": "calc_score", "answer": str(i * 4), "score": 1.0}] if tool_len else []
    metadata: dict[str, Any] = {
        "tools": _TOOLS,  # data.py puts the tool schema list here
        "rm_type": "math" if i % 3 else "deepscaler",
        "source_name": "geo3k" if multimodal else "dapo-math",
    }
    if tool_len:
        metadata["tool_calls"] = tool_records  # list of dicts (geo3k env tool_record shape)
        metadata["tool_call_count"] = len(tool_records)
    if i % 4 == 3:
        metadata["start_rollout_id"] = 2  # partial-rollout marker set on abort
        metadata["raw_reward"] = 0.5
    reward: Any = (
        float(rng.choice([0.0, 1.0])) if i % 3 else {"score": 1.0, "acc": True, "pred": str(i * 4)}
    )

    return dict(
        group_index=i // _GROUP,
        index=i,
        rollout_id=i,
        prompt=prompt,
        tokens=prompt_ids + response_ids,
        multimodal_inputs=multimodal_inputs,
        multimodal_train_inputs=multimodal_train_inputs,
        multimodal_train_input_id=mm_id,
        apply_chat_template_kwargs={"enable_thinking": bool(i % 2)},
        response=f'Let me compute. <tool_call>{{"name": "calc_score"}}</tool_call> answer {i * 4}',
        response_length=response_length,
        label=str(i * 4),
        reward=reward,
        loss_mask=loss_mask,
        weight_versions=[str(3 + i % 2)],  # strings, one per generate call that finished
        rollout_log_probs=log_probs,
        remove_sample=(i % 7 == 6),
        teacher_log_probs=[round(-rng.random() * 3, 6) for _ in range(response_length)]
        if i % 2
        else None,
        _status_value=status,
        metadata=metadata,
        generate_function_path="examples.geo3k_vlm_multi_turn.rollout.generate"
        if multimodal
        else None,
        custom_rm_path="my_project.rewards.math_rm" if i % 3 == 0 else None,
        train_metadata={"loss_type": "policy_loss"} if i % 2 else None,
        session_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        non_generation_time=round(rng.random() * 2, 6),
        _prompt_len=prompt_len,
    )


def _fill_infos(sample, rng: random.Random, prompt_len: int) -> None:
    sample.spec_info.add(
        {
            "spec_accept_token_num": rng.randint(0, 8),
            "spec_draft_token_num": 8,
            "spec_verify_ct": 3,
            "completion_tokens": sample.response_length,
        }
    )
    sample.prefix_cache_info.add(
        {"cached_tokens": rng.randint(0, prompt_len), "prompt_tokens": prompt_len}
    )


def make_slime_rollout(n: int, seed: int = 0) -> list[SlimeSample]:
    """``n`` slime-shaped samples; every field is non-default in at least one of them
    (n >= 4 covers all alternations)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    out: list[SlimeSample] = []
    for i in range(n):
        kw = _common_fields(i, rng, gen, multimodal=(i % 2 == 1))
        status = SlimeSample.Status(kw.pop("_status_value"))
        prompt_len = kw.pop("_prompt_len")
        ids, offsets = _ragged_top_p(gen, kw["response_length"])
        rows = len(kw["tokens"]) - 1
        routed = torch.randint(
            0, _NUM_EXPERTS, (rows, _NUM_LAYERS, _ROUTER_TOPK), generator=gen, dtype=torch.int32
        )
        s: Any = SlimeSample(
            **kw,
            status=status,
            rollout_top_p_token_ids=ids if i % 3 else ids.tolist(),  # tensor or plain list
            rollout_top_p_token_offsets=offsets if i % 3 else offsets.tolist(),
            rollout_routed_experts=routed if i % 3 else routed.tolist(),  # tensor or nested list
        )
        _fill_infos(s, rng, prompt_len)
        if i % 5 == 4:
            # examples/retool and strands attach extra attributes outside the dataclass fields
            s.tool_call_count = 1
            s.payload_text = s.response
        out.append(s)
    return out


def make_vime_rollout(n: int, seed: int = 0) -> list[VimeSample]:
    """``n`` vime-shaped samples.  Even samples carry score-centering top-k capture
    (numpy ``(L, k)`` int32 / float32), odd samples top-p capture (torch int32 ids +
    offsets, numpy float32 log-probs) -- upstream picks one by ``rollout_top_p``."""
    rng = random.Random(seed + 1_000_003)
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    out: list[VimeSample] = []
    for i in range(n):
        kw = _common_fields(i, rng, gen, multimodal=(i % 2 == 1))
        status = VimeSample.Status(kw.pop("_status_value"))
        prompt_len = kw.pop("_prompt_len")
        length = kw["response_length"]
        rows = len(kw["tokens"]) - 1
        routed = torch.randint(
            0, _NUM_EXPERTS, (rows, _NUM_LAYERS, _ROUTER_TOPK), generator=gen, dtype=torch.int32
        )
        if i % 3 == 2 and rows > 2:
            # vime keeps partial-rollout chunks as list[torch.Tensor] until materialized
            cut = rows // 2
            routed_value: Any = [routed[:cut].clone(), routed[cut:].clone()]
        else:
            routed_value = routed
        extra: dict[str, Any] = {}
        if i % 2 == 0:
            nrng = np.random.default_rng(seed * 7919 + i)
            extra["rollout_topk_token_ids"] = nrng.integers(
                0, _VOCAB, (length, _SC_TOPK), dtype=np.int32
            )
            extra["rollout_topk_log_probs"] = np.sort(
                -nrng.random((length, _SC_TOPK), dtype=np.float32) * 5, axis=1
            )[:, ::-1].copy()
        else:
            ids, offsets = _ragged_top_p(gen, length)
            nrng = np.random.default_rng(seed * 7919 + i)
            extra["rollout_top_p_token_ids"] = ids
            extra["rollout_top_p_token_offsets"] = offsets
            extra["rollout_top_p_log_probs"] = -nrng.random(int(offsets[-1]), dtype=np.float32) * 5
        s: Any = VimeSample(**kw, status=status, rollout_routed_experts=routed_value, **extra)
        _fill_infos(s, rng, prompt_len)
        # vime's queue transport attaches private dynamic attributes; archive.load_samples strips them
        s._queue_receipt = {"task_id": f"task-{seed}-{i}"}
        if i % 4 == 1:
            s.index = np.int64(i)  # sample_metadata.describe_sample tolerates numpy scalar indices
        out.append(s)
    return out
