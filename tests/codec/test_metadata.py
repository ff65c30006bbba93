"""Tests for archive_manager.metadata: describe_sample and validate_sample_metadata."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from archive_manager.codec import TensorRef
from archive_manager.errors import MetadataError, UnencodableError
from archive_manager.metadata import (
    describe_sample,
    metadata_problems,
    validate_sample_metadata,
)
from archive_manager.samples import Sample

LAYERS, TOPK = 4, 2  # small MoE shape so tests stay fast; real runs use e.g. 48 x 8
PROBLEM_LINE = re.compile(r"^position \d+: [\w.]+: .+ \(expected .+, got .+\)$")


def make_sample(
    seed: int = 0,
    prompt_len: int = 12,
    response_len: int = 20,
    *,
    routed: bool = True,
    top_p: bool = False,
    topk: int | None = None,
    index: int | None = 0,
) -> Sample:
    """A seeded slime-like sample: lists for tokens/mask/log-probs, tensors for replay."""
    rng = random.Random(seed)
    n_tokens = prompt_len + response_len
    sample = Sample(
        index=index,
        group_index=0,
        prompt="What is 2+2?",
        tokens=[rng.randrange(152_000) for _ in range(n_tokens)],
        response="four" * response_len,
        response_length=response_len,
        reward=1.0,
        loss_mask=[1] * response_len,
        rollout_log_probs=[-rng.random() for _ in range(response_len)],
        status=Sample.Status.COMPLETED,
        metadata={"source": "gsm8k"},
    )
    if routed:
        sample.rollout_routed_experts = torch.randint(
            0, 64, (n_tokens - 1, LAYERS, TOPK), dtype=torch.int32
        )
    if top_p:
        kept = [rng.randint(1, 4) for _ in range(response_len)]
        offsets = [0]
        for count in kept:
            offsets.append(offsets[-1] + count)
        sample.rollout_top_p_token_offsets = torch.tensor(offsets, dtype=torch.int32)
        sample.rollout_top_p_token_ids = torch.randint(0, 1000, (offsets[-1],), dtype=torch.int32)
        sample.rollout_top_p_log_probs = -torch.rand(offsets[-1], dtype=torch.float32)
    if topk is not None:
        sample.rollout_topk_token_ids = torch.randint(
            0, 1000, (response_len, topk), dtype=torch.int32
        )
        sample.rollout_topk_log_probs = -torch.rand(response_len, topk)
    return sample


def args(**overrides: Any) -> SimpleNamespace:
    base: dict[str, Any] = {
        "use_rollout_routing_replay": False,
        "num_layers": LAYERS,
        "moe_router_topk": TOPK,
        "rollout_top_p": 1.0,
        "rollout_top_k": -1,
    }
    base.update(overrides)
    return SimpleNamespace(**base)


ROUTING = {"use_rollout_routing_replay": True}


def problems_of(sample_or_desc: Any, **arg_overrides: Any) -> list[str]:
    desc = sample_or_desc if isinstance(sample_or_desc, dict) else describe_sample(sample_or_desc)
    found = metadata_problems(desc, args(**arg_overrides))
    assert all(PROBLEM_LINE.match(line) for line in found), found
    return found


# --------------------------------------------------------------------------- describe


def test_describe_realistic_sample() -> None:
    desc = describe_sample(make_sample(prompt_len=12, response_len=20, topk=3, top_p=True))
    assert desc["index"] == 0 and desc["group_index"] == 0
    assert desc["status"] == "completed"
    assert desc["tokens"] == 32
    assert desc["response_length"] == 20
    assert desc["loss_mask"] == 20 and desc["rollout_log_probs"] == 20
    assert desc["reward"] == 1.0
    tensors = desc["tensors"]
    assert tensors["rollout_routed_experts"] == {"shape": [31, LAYERS, TOPK], "dtype": "int32"}
    assert tensors["rollout_topk_token_ids"] == {"shape": [20, 3], "dtype": "int32"}
    assert tensors["rollout_topk_log_probs"] == {"shape": [20, 3], "dtype": "float32"}
    assert tensors["rollout_top_p_token_offsets"] == {"shape": [21], "dtype": "int32"}
    assert set(tensors) == {
        "rollout_routed_experts",
        "rollout_topk_token_ids",
        "rollout_topk_log_probs",
        "rollout_top_p_token_offsets",
        "rollout_top_p_token_ids",
        "rollout_top_p_log_probs",
    }
    assert desc["lengths"] == {}


def test_describe_is_json_serializable() -> None:
    sample: Any = make_sample(top_p=True, topk=2)  # with numpy scalars where ints go
    sample.multimodal_inputs = {"pixel_values": torch.zeros(2, 3, 4, 4, dtype=torch.bfloat16)}
    sample.reward = np.float32(0.5)
    sample.index = np.int64(3)
    for item in (sample, sample.to_dict()):
        desc = describe_sample(item)
        assert json.loads(json.dumps(desc, allow_nan=False)) == desc
    assert describe_sample(sample)["index"] == 3


def test_describe_dict_sample_uses_its_keys() -> None:
    sample = make_sample()
    assert describe_sample(sample.to_dict()) == describe_sample(sample)
    desc = describe_sample({"status": "aborted", "response_length": 0})
    assert desc["status"] == "aborted"
    assert desc["tokens"] is None and desc["loss_mask"] is None and desc["index"] is None
    assert desc["tensors"] == {} and desc["reward"] is None


def test_describe_registered_dataclass_and_slots_dataclass() -> None:
    @dataclasses.dataclass(slots=True)
    class Compact:
        tokens: list[int]
        response_length: int
        experts: torch.Tensor

    desc = describe_sample(Compact([1, 2, 3], 2, torch.zeros(2, 1, 1, dtype=torch.int16)))
    assert desc["tokens"] == 3 and desc["response_length"] == 2
    assert desc["tensors"] == {"experts": {"shape": [2, 1, 1], "dtype": "int16"}}
    with pytest.raises(UnencodableError):
        describe_sample(object())


def test_list_of_tensor_chunks_is_one_concatenated_tensor() -> None:
    chunks = [
        torch.zeros(10, LAYERS, TOPK, dtype=torch.int32),
        torch.zeros(0, LAYERS, TOPK, dtype=torch.int32),
        torch.zeros(21, LAYERS, TOPK, dtype=torch.int32),
    ]
    desc = describe_sample(make_sample(routed=False).to_dict() | {"rollout_routed_experts": chunks})
    assert desc["tensors"]["rollout_routed_experts"] == {
        "shape": [31, LAYERS, TOPK],
        "dtype": "int32",
    }


def test_chunks_that_do_not_concatenate_have_no_shape() -> None:
    chunks = (torch.zeros(3, 4), torch.zeros(3, 5, dtype=torch.float64))
    desc = describe_sample({"bad": chunks, "scalar_chunks": [torch.tensor(1)]})
    assert desc["tensors"]["bad"] == {"shape": None, "dtype": "float64"}
    assert desc["tensors"]["scalar_chunks"]["shape"] is None


def test_mixed_lists_and_plain_lists_are_not_tensors() -> None:
    desc = describe_sample({"mixed": [torch.zeros(2), 5], "tokens": [1, 2, 3], "empty": []})
    assert desc["tensors"] == {}


def test_dict_of_tensors_one_level_deep() -> None:
    sample = make_sample(routed=False)
    sample.multimodal_inputs = {
        "pixel_values": torch.zeros(4, 3, 8, 8, dtype=torch.float16),
        "image_grid_thw": [torch.ones(1, 3, dtype=torch.int64), torch.ones(2, 3)],
        "nested": {"deeper": torch.zeros(1)},  # two levels deep: not described
        "caption": "a cat",
    }
    tensors = describe_sample(sample)["tensors"]
    assert tensors == {
        "multimodal_inputs.pixel_values": {"shape": [4, 3, 8, 8], "dtype": "float16"},
        # int64 and float32 chunks concatenate to float32, as torch.cat would
        "multimodal_inputs.image_grid_thw": {"shape": [3, 3], "dtype": "float32"},
    }


def test_tensor_ref_is_described_without_loading() -> None:
    ref = TensorRef("0" * 32, torch.int32, (5, 48, 8), 5 * 48 * 8 * 4)
    sample: Any = make_sample(routed=False, prompt_len=3, response_len=3)
    sample.rollout_routed_experts = ref
    sample.multimodal_inputs = {"pixel_values": ref}
    sample.chunks = [ref, ref]
    desc = describe_sample(sample)
    assert desc["tensors"]["rollout_routed_experts"] == {"shape": [5, 48, 8], "dtype": "int32"}
    assert desc["tensors"]["multimodal_inputs.pixel_values"]["shape"] == [5, 48, 8]
    assert desc["tensors"]["chunks"]["shape"] == [10, 48, 8]
    assert getattr(ref, "_tensor", None) is None  # never loaded (no loader: it would raise)
    validate_sample_metadata(
        desc, args(use_rollout_routing_replay=True, num_layers=48, moe_router_topk=8)
    )


def test_zero_dim_and_empty_tensors() -> None:
    desc = describe_sample({"scalar": torch.tensor(3.0), "empty": torch.zeros(0, 7)})
    assert desc["tensors"]["scalar"] == {"shape": [], "dtype": "float32"}
    assert desc["tensors"]["empty"] == {"shape": [0, 7], "dtype": "float32"}


def test_tensor_valued_lengths() -> None:
    desc = describe_sample(
        {
            "tokens": torch.arange(9),
            "response_length": 4,
            "loss_mask": torch.tensor([1, 0, 1, 0]),
            "rollout_log_probs": [0.0] * 4,
        }
    )
    assert desc["tokens"] == 9 and desc["loss_mask"] == 4 and desc["rollout_log_probs"] == 4
    assert desc["tensors"]["tokens"] == {"shape": [9], "dtype": "int64"}


@pytest.mark.parametrize(
    ("reward", "expected"),
    [
        (1.0, 1.0),
        (0, 0),
        (-3, -3),
        (np.float32(0.25), 0.25),
        (True, 1),
        (False, 0),
        (None, None),
        ({"acc": 1.0}, None),
        (float("nan"), None),
        (float("inf"), None),
        ("1.0", None),
    ],
)
def test_reward_only_when_a_real_number(reward: Any, expected: Any) -> None:
    assert describe_sample({"reward": reward})["reward"] == expected


@pytest.mark.parametrize(
    ("reward", "expected"),
    [
        (torch.tensor(0.5), 0.5),
        (torch.tensor(0.25, dtype=torch.bfloat16), 0.25),
        (torch.tensor(3), 3),
        (torch.tensor(True), 1),
        (torch.tensor(False), 0),
        (torch.tensor(float("nan")), None),
        (torch.tensor(float("inf")), None),
        (torch.tensor([1.0]), None),  # not 0-d: not one number
        (torch.tensor(1 + 2j), None),
        (np.float32(0.5), 0.5),
        (np.float64(-1.5), -1.5),
        (np.int64(3), 3),
        (np.uint8(7), 7),
        (np.bool_(True), 1),
        (np.bool_(False), 0),
        (np.float32("nan"), None),
        (np.float64("inf"), None),
        (np.array(0.75), 0.75),  # a 0-d array, as numpy reductions return some
        (np.array([0.75]), None),
        (np.complex64(1), None),
        (np.str_("1.0"), None),
    ],
)
def test_reward_of_frameworks_number_types(reward: Any, expected: Any) -> None:
    """A 0-d tensor, a numpy scalar and a bool are the reward frameworks hand over: recorded
    as a plain number (a bool as 0/1), so the catalog's stats, queries and groups count them.
    They were recorded as None, and the lens silently skipped those samples."""
    got = describe_sample({"reward": reward})["reward"]
    assert got == expected
    assert type(got) in (int, float, type(None))
    if expected is not None:
        assert type(got) is type(expected)


def test_queue_fields_are_not_described() -> None:
    sample: Any = make_sample(routed=False)
    sample._queue_lease = {"task_id": "t", "scratch": torch.zeros(3)}
    sample._queue_tensor = torch.zeros(2)
    assert describe_sample(sample)["tensors"] == {}


def test_list_valued_replay_fields_record_their_length() -> None:
    desc = describe_sample(
        {
            "rollout_top_p_token_ids": [1, 2, 3],
            "rollout_top_p_token_offsets": [0, 1, 3],
            "rollout_routed_experts": [[1, 2]] * 4,
            "weight_versions": ["a"],
        }
    )
    assert desc["lengths"] == {
        "rollout_top_p_token_ids": 3,
        "rollout_top_p_token_offsets": 3,
        "rollout_routed_experts": 4,
    }


class NoIterList(list):
    """A list that fails the test if anything walks its contents."""

    def __iter__(self) -> Any:
        raise AssertionError("describe_sample iterated over list contents")


def test_describe_never_walks_list_contents() -> None:
    sample: Any = make_sample(routed=False)  # with lists that refuse iteration
    sample.tokens = NoIterList(sample.tokens)
    sample.loss_mask = NoIterList(sample.loss_mask)
    sample.rollout_top_p_token_ids = NoIterList([1, 2, 3])
    desc = describe_sample(sample)
    assert desc["tokens"] == 32 and desc["loss_mask"] == 20
    assert desc["lengths"] == {"rollout_top_p_token_ids": 3}


# --------------------------------------------------------------------------- validate


def test_consistent_samples_pass_with_every_feature_on() -> None:
    samples = [make_sample(seed, top_p=True, topk=4, index=seed) for seed in range(4)]
    descs = [describe_sample(s) for s in samples]
    validate_sample_metadata(
        descs, args(use_rollout_routing_replay=True, rollout_top_p=0.9, rollout_topk=4)
    )
    validate_sample_metadata(descs[0], args())  # a single description works too


def test_response_length_within_tokens() -> None:
    assert problems_of(make_sample(prompt_len=0, response_len=5, routed=False)) == []
    desc = describe_sample(make_sample(routed=False)) | {"response_length": 40}
    found = problems_of(desc)
    assert any("response_length: longer than tokens" in line for line in found)
    negative = describe_sample(make_sample(routed=False)) | {"response_length": -1}
    assert problems_of(negative) == [
        "position 0: response_length: negative (expected >= 0, got -1)"
    ]
    missing = describe_sample({"tokens": [1, 2]})
    assert problems_of(missing) == [
        "position 0: response_length: missing or not an integer (expected an int >= 0, got None)"
    ]


@pytest.mark.parametrize("field", ["loss_mask", "rollout_log_probs"])
def test_mask_and_log_prob_lengths(field: str) -> None:
    sample = make_sample(routed=False)
    assert problems_of(sample) == []
    setattr(sample, field, getattr(sample, field)[:-1])
    assert problems_of(sample) == [
        f"position 0: {field}: length differs from response_length (expected 20, got 19)"
    ]
    setattr(sample, field, None)  # absent: nothing to check
    assert problems_of(sample) == []


def test_routed_experts_required_with_routing_replay() -> None:
    assert problems_of(make_sample(), **ROUTING) == []
    assert problems_of(make_sample(routed=False)) == []  # replay off: not needed
    found = problems_of(make_sample(routed=False), **ROUTING)
    assert found == [
        "position 0: rollout_routed_experts: missing with use_rollout_routing_replay "
        f"(expected shape [31, {LAYERS}, {TOPK}], got absent)"
    ]


def test_routed_experts_shape() -> None:
    sample = make_sample()
    sample.rollout_routed_experts = sample.rollout_routed_experts[:-1]
    assert problems_of(sample, **ROUTING) == [
        "position 0: rollout_routed_experts: wrong shape "
        f"(expected [31, {LAYERS}, {TOPK}], got [30, {LAYERS}, {TOPK}])"
    ]
    assert problems_of(make_sample(), use_rollout_routing_replay=True, num_layers=LAYERS + 1)


def test_routed_experts_integer_dtype() -> None:
    sample = make_sample()
    sample.rollout_routed_experts = sample.rollout_routed_experts.float()
    assert problems_of(sample, **ROUTING) == [
        "position 0: rollout_routed_experts: not an integer dtype "
        "(expected an integer dtype, got float32)"
    ]


def test_routed_experts_as_chunks_or_lists() -> None:
    sample = make_sample()
    experts = sample.rollout_routed_experts
    sample.rollout_routed_experts = [experts[:10], experts[10:]]
    assert problems_of(sample, **ROUTING) == []
    sample.rollout_routed_experts = [experts[:10], experts[10:, :1]]
    assert "do not concatenate" in problems_of(sample, **ROUTING)[0]
    sample.rollout_routed_experts = experts.tolist()  # plain lists: only rows are checked
    assert problems_of(sample, **ROUTING) == []
    sample.rollout_routed_experts = experts.tolist()[:-2]
    assert problems_of(sample, **ROUTING) == [
        "position 0: rollout_routed_experts: wrong length (expected 31, got 29)"
    ]


def test_top_p_replay_passes_and_is_required_below_one() -> None:
    assert problems_of(make_sample(top_p=True), rollout_top_p=0.9) == []
    assert problems_of(make_sample(), rollout_top_p=1.0) == []
    assert problems_of(make_sample(), rollout_top_p=None) == []
    found = problems_of(make_sample(), rollout_top_p=0.9)
    assert [line.split(":")[1].strip() for line in found] == [
        "rollout_top_p_token_ids",
        "rollout_top_p_token_offsets",
    ]
    assert "expected shape [21]" in found[1]


def test_top_p_offsets_shape() -> None:
    sample = make_sample(top_p=True)
    sample.rollout_top_p_token_offsets = sample.rollout_top_p_token_offsets[:-1]
    assert problems_of(sample, rollout_top_p=0.9) == [
        "position 0: rollout_top_p_token_offsets: wrong shape (expected [21], got [20])"
    ]


def test_top_p_ids_integer_dtype() -> None:
    sample = make_sample(top_p=True)
    sample.rollout_top_p_token_ids = sample.rollout_top_p_token_ids.double()
    assert problems_of(sample, rollout_top_p=0.9) == [
        "position 0: rollout_top_p_token_ids: not an integer dtype "
        "(expected an integer dtype, got float64)"
    ]


def test_top_p_log_probs_float_and_as_long_as_ids() -> None:
    sample = make_sample(top_p=True)
    n_ids = sample.rollout_top_p_token_ids.shape[0]
    sample.rollout_top_p_log_probs = torch.zeros(n_ids + 1, dtype=torch.int32)
    found = problems_of(sample, rollout_top_p=0.9)
    assert found == [
        f"position 0: rollout_top_p_log_probs: wrong shape (expected [{n_ids}], got [{n_ids + 1}])",
        "position 0: rollout_top_p_log_probs: not a floating-point dtype "
        "(expected a float dtype, got int32)",
    ]
    sample.rollout_top_p_log_probs = None  # optional: upstream slime records none
    assert problems_of(sample, rollout_top_p=0.9) == []


def test_top_p_fields_checked_when_present_even_if_top_p_is_off() -> None:
    sample = make_sample(top_p=True)
    sample.rollout_top_p_token_ids = None
    assert problems_of(sample) == [
        "position 0: rollout_top_p_token_ids: missing beside the other "
        "(expected top-p token ids, got absent)"
    ]


def test_top_p_as_plain_lists() -> None:
    sample = make_sample(top_p=True)
    sample.rollout_top_p_token_offsets = sample.rollout_top_p_token_offsets.tolist()
    sample.rollout_top_p_token_ids = sample.rollout_top_p_token_ids.tolist()
    assert problems_of(sample, rollout_top_p=0.9) == []
    sample.rollout_top_p_token_offsets.pop()
    assert problems_of(sample, rollout_top_p=0.9) == [
        "position 0: rollout_top_p_token_offsets: wrong length (expected 21, got 20)"
    ]


def test_topk_required_with_rollout_topk() -> None:
    assert problems_of(make_sample(topk=4), rollout_topk=4) == []
    assert problems_of(make_sample()) == []
    # slime's rollout_top_k is the sampling top-k, not replay: it requires nothing
    assert problems_of(make_sample(), rollout_top_k=20) == []
    found = problems_of(make_sample(), rollout_topk=4)
    assert found == [
        "position 0: rollout_topk_token_ids: missing with top-k replay "
        "(expected shape [20, 4], got absent)",
        "position 0: rollout_topk_log_probs: missing with top-k replay "
        "(expected shape [20, 4], got absent)",
    ]


def test_topk_shape_and_dtypes() -> None:
    sample = make_sample(topk=3)
    assert problems_of(sample) == []  # present without a configured k: any k
    found = problems_of(sample, rollout_topk=4)
    assert found == [
        "position 0: rollout_topk_token_ids: wrong shape (expected [20, 4], got [20, 3])",
        "position 0: rollout_topk_log_probs: wrong shape (expected [20, 4], got [20, 3])",
    ]
    sample.rollout_topk_token_ids = sample.rollout_topk_token_ids.float()
    sample.rollout_topk_log_probs = sample.rollout_topk_log_probs[:, :2].to(torch.int64)
    found = problems_of(sample)
    assert "position 0: rollout_topk_token_ids: not an integer dtype" in found[0]
    assert "rollout_topk_log_probs: not a floating-point dtype" in found[1]
    assert "rollout_topk_log_probs: shape differs from rollout_topk_token_ids" in found[2]


def test_topk_from_score_centering_settings() -> None:
    centering = {"use_score_centering": True, "score_centering_top_k": 3}
    assert problems_of(make_sample(topk=3), **centering) == []
    assert len(problems_of(make_sample(), **centering)) == 2
    # with top-p replay on, the score-centering fork records top-p instead of top-k
    assert problems_of(make_sample(top_p=True), rollout_top_p=0.9, **centering) == []


def test_every_violation_is_reported_with_its_position() -> None:
    good = make_sample(0, top_p=True)
    short_mask: Any = make_sample(1, top_p=True)
    short_mask.loss_mask = short_mask.loss_mask[:5]
    no_experts = make_sample(2, top_p=True, routed=False)
    bad_offsets = make_sample(3, top_p=True)
    bad_offsets.rollout_top_p_token_offsets = bad_offsets.rollout_top_p_token_offsets[:3]
    bad_offsets.rollout_log_probs = []
    descs = [describe_sample(s) for s in (good, short_mask, no_experts, bad_offsets)]
    with pytest.raises(MetadataError) as info:
        validate_sample_metadata(descs, args(use_rollout_routing_replay=True, rollout_top_p=0.95))
    error: Any = info.value  # `problems` is set on the instance (metadata.py)
    problems = error.problems
    assert [p.split(":")[0] for p in problems] == [
        "position 1",
        "position 2",
        "position 3",
        "position 3",
    ]
    assert "position 1: loss_mask:" in problems[0]
    assert "position 2: rollout_routed_experts: missing" in problems[1]
    assert "position 3: rollout_log_probs:" in problems[2]
    assert "position 3: rollout_top_p_token_offsets: wrong shape" in problems[3]
    message = str(info.value)
    assert message.startswith("4 sample metadata problem(s)")
    assert all(p in message for p in problems)
    assert isinstance(info.value, ValueError)  # MetadataError is also a ValueError


def test_malformed_metadata_is_reported_not_crashed_on() -> None:
    junk: Any = "junk"  # not a description: reported, not crashed on
    found = metadata_problems([{"response_length": 1, "tokens": 2}, junk], args())

    assert found == [
        "position 1: metadata: not a mapping (expected a describe_sample() dict, got str)"
    ]


@given(
    prompt_len=st.integers(min_value=1, max_value=30),
    response_len=st.integers(min_value=0, max_value=30),
    topk=st.integers(min_value=1, max_value=5),
    seed=st.integers(min_value=0, max_value=1000),
)
def test_well_formed_samples_always_validate(
    prompt_len: int, response_len: int, topk: int, seed: int
) -> None:
    sample = make_sample(seed, prompt_len, response_len, top_p=True, topk=topk)
    desc = describe_sample(sample)
    assert json.loads(json.dumps(desc)) == desc
    settings = args(use_rollout_routing_replay=True, rollout_top_p=0.7, rollout_topk=topk)
    validate_sample_metadata(desc, settings)


@given(
    tokens=st.integers(min_value=0, max_value=50),
    response_length=st.integers(min_value=-5, max_value=60),
    mask=st.none() | st.integers(min_value=0, max_value=60),
)
def test_length_rules_property(tokens: int, response_length: int, mask: int | None) -> None:
    desc = {"tokens": tokens, "response_length": response_length, "loss_mask": mask}
    ok = 0 <= response_length <= tokens and (mask is None or mask == response_length)
    assert (metadata_problems(desc, args()) == []) == ok
