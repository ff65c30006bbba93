"""The frameworks' own sample objects, saved as they are (docs/architecture/samples-and-values.md,
"Samples and values"): slime's and vime's ``Sample`` (nested ``Status`` enum, ``SpecInfo`` and
``PrefixCacheInfo`` dataclasses, tensors, numpy arrays, PIL images, bytes, extra attributes),
registered dataclasses and enums anywhere inside a field, and what a load gives a process that
registered nothing.

The classes come from tests/frameworks/, field-for-field stand-ins for the upstream modules
under their upstream module paths (``slime.utils.types``, ``vime.utils.types``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_same_samples, snapshot_pool

from archive_manager import ArchiveManager, RolloutArchive, register_sample_class
from archive_manager.errors import UnencodableError, UnregisteredClassWarning

FRAMEWORKS = Path(__file__).resolve().parents[1] / "frameworks"
if str(FRAMEWORKS) not in sys.path:
    sys.path.insert(0, str(FRAMEWORKS))

from rollouts import make_slime_rollout, make_vime_rollout  # noqa: E402
from slime.utils.types import Sample as SlimeSample  # noqa: E402
from vime.utils.types import Sample as VimeSample  # noqa: E402

# The upstream declarations, field for field (THUDM/slime 624b824a slime/utils/types.py;
# vllm-project/vime 2b83ea20 vime/utils/types.py): a field missing from a stand-in fails here.
_HEAD = [
    "group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs",
    "multimodal_train_inputs", "multimodal_train_input_id", "apply_chat_template_kwargs",
    "response", "response_length", "label", "reward", "loss_mask", "weight_versions",
    "rollout_log_probs",
]  # fmt: skip
_TAIL = [
    "remove_sample", "teacher_log_probs", "status", "metadata", "generate_function_path",
    "custom_rm_path", "train_metadata", "session_id", "non_generation_time", "spec_info",
    "prefix_cache_info",
]  # fmt: skip
UPSTREAM_FIELDS = {
    "slime": [
        *_HEAD,
        "rollout_top_p_token_ids",
        "rollout_top_p_token_offsets",
        "rollout_routed_experts",
        *_TAIL,
    ],
    "vime": [
        *_HEAD,
        "rollout_topk_token_ids",
        "rollout_topk_log_probs",
        "rollout_top_p_token_ids",
        "rollout_top_p_token_offsets",
        "rollout_top_p_log_probs",
        "rollout_routed_experts",
        *_TAIL,
    ],
}
UPSTREAM_STATUS = {
    "PENDING": "pending",
    "COMPLETED": "completed",
    "TRUNCATED": "truncated",
    "ABORTED": "aborted",
    "FAILED": "failed",
}

# Any: two frameworks' classes, each with its nested Status, SpecInfo and PrefixCacheInfo.
ROLLOUTS: dict[str, Callable[..., list[Any]]] = {
    "slime": make_slime_rollout,
    "vime": make_vime_rollout,
}
CLASSES: dict[str, Any] = {"slime": SlimeSample, "vime": VimeSample}


@pytest.mark.parametrize("framework", ["slime", "vime"])
def test_the_stand_ins_declare_what_upstream_declares(framework: str) -> None:
    cls: Any = CLASSES[framework]
    assert f"{cls.__module__}.{cls.__qualname__}" == f"{framework}.utils.types.Sample"
    assert [f.name for f in dataclasses.fields(cls)] == UPSTREAM_FIELDS[framework]
    assert {m.name: m.value for m in cls.Status} == UPSTREAM_STATUS
    assert cls.SpecInfo.__qualname__ == "Sample.SpecInfo"
    assert cls.PrefixCacheInfo.__qualname__ == "Sample.PrefixCacheInfo"
    rows = ROLLOUTS[framework](8, seed=1)
    for name in UPSTREAM_FIELDS[framework]:
        default = next(f for f in dataclasses.fields(cls) if f.name == name)
        values = [getattr(s, name) for s in rows]
        # every field is set to something other than its default in some sample
        assert any(not _is_default(v, default) for v in values), name


def _is_default(value: Any, field: dataclasses.Field[Any]) -> bool:
    if field.default is not dataclasses.MISSING:
        return value is field.default or (
            type(value) is type(field.default) and value == field.default
        )
    assert callable(field.default_factory)  # every field has a default or a factory
    made = field.default_factory()
    return type(value) is type(made) and bool(value == made)


@pytest.mark.parametrize("framework", ["slime", "vime"])
def test_a_framework_rollout_saves_and_loads_as_its_own_classes(
    tmp_path: Path, framework: str
) -> None:
    rows = ROLLOUTS[framework](12, seed=3)
    with ArchiveManager.open(tmp_path / "pool") as pool:
        arc = pool.save("r", rows, rollout_id=7)
        back = arc.load_samples()
        assert_same_samples(back, rows)
        cls = CLASSES[framework]
        assert all(type(s) is cls for s in back)
        assert all(type(s.spec_info) is cls.SpecInfo for s in back)
        assert all(type(s.prefix_cache_info) is cls.PrefixCacheInfo for s in back)
        assert [s.status for s in back] == [s.status for s in rows]
        # what the catalog knows of them
        meta = arc.sample_metadata()
        assert [m["status"] for m in meta] == [s.status.value for s in rows]
        # one sample by key reads back alone, equal
        assert_same_samples(arc.load_samples(sample_key="sample:5"), [rows[5]])


@pytest.mark.parametrize("framework", ["slime", "vime"])
def test_the_streaming_writer_and_the_facade_take_them_too(tmp_path: Path, framework: str) -> None:
    rows = ROLLOUTS[framework](6, seed=4)
    with ArchiveManager.open(tmp_path / "pool") as pool:
        with pool.writer("w", rollout_id=1) as writer:
            for sample in rows:
                writer.add(sample)
        assert_same_samples(pool.open_archive("w").load_samples(), rows)
    pointer = tmp_path / "debug" / "rollout_1.json"
    RolloutArchive.save(pointer, rows, rollout_id=1)
    with RolloutArchive(pointer) as archive:
        back = archive.load_samples()
    assert [type(s) for s in back] == [CLASSES[framework]] * len(rows)
    assert [s.spec_info for s in back] == [s.spec_info for s in rows]


@dataclasses.dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    ok: bool = True


class Verdict(enum.Enum):
    PASS = "pass"
    FAIL = "fail"


@dataclasses.dataclass
class AgentStep:
    observation: str
    calls: list[ToolCall] = dataclasses.field(default_factory=list)
    verdict: Verdict | None = None


def test_registering_a_class_covers_what_its_fields_declare(tmp_path: Path) -> None:
    register_sample_class(AgentStep)  # ToolCall and Verdict come with it
    steps = [
        AgentStep("o1", [ToolCall("calc", {"x": 1}), ToolCall("search", {"q": "a"}, ok=False)]),
        AgentStep("o2", verdict=Verdict.FAIL),
    ]
    sample = {
        "steps": steps,
        "by_status": {Verdict.PASS: 1, Verdict.FAIL: 2},  # members as keys
        "history": (Verdict.PASS, ToolCall("x", {})),
        "status": SlimeSample.Status.ABORTED,  # a framework's enum inside metadata
        "blob": b"\x00\xff raw",
        "buffer": bytearray(b"abc"),
    }
    with ArchiveManager.open(tmp_path / "pool") as pool:
        back = pool.save("a", [sample], rollout_id=1).load_samples()[0]
    assert back == sample
    assert type(back["steps"][0].calls[1]) is ToolCall and back["steps"][1].verdict is Verdict.FAIL
    assert back["status"] is SlimeSample.Status.ABORTED
    assert type(back["blob"]) is bytes and type(back["buffer"]) is bytearray


def test_an_unregistered_class_inside_a_field_is_refused_naming_the_call(tmp_path: Path) -> None:
    @dataclasses.dataclass
    class Unknown:
        x: int = 1

    class Color(enum.Enum):
        RED = 1

    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("kept", [{"a": 1}], rollout_id=1)
        before = snapshot_pool(pool)
        for value, name in ((Unknown(), "Unknown"), (Color.RED, "Color")):
            with pytest.raises(UnencodableError) as info:
                pool.save("b", [{"metadata": {"x": [value]}}], rollout_id=2)
            message = str(info.value)
            assert "'metadata'" in message and "register_sample_class(" in message
            assert name in message
        assert snapshot_pool(pool) == before


def test_an_unregistered_sample_class_is_refused_naming_the_call() -> None:
    @dataclasses.dataclass
    class Mine:
        x: int = 1

    with pytest.raises(UnencodableError, match=r"register_sample_class\(.*Mine\)"):
        from archive_manager.codec import encode_sample

        encode_sample(Mine())


def test_images_keep_mode_size_palette_and_pixels(tmp_path: Path) -> None:
    from PIL import Image

    rgb = Image.frombytes("RGB", (3, 2), bytes(range(18)))
    palette = Image.new("P", (2, 2))
    palette.putpalette([i % 256 for i in range(768)])
    gray = Image.new("L", (4, 1), 7)
    gray.info["dpi"] = (72, 72)
    with ArchiveManager.open(tmp_path / "pool") as pool:
        back = pool.save("i", [{"images": [rgb, palette, gray]}], rollout_id=1).load_samples()
    assert back[0]["images"] == [rgb, palette, gray]
    assert [type(i) for i in back[0]["images"]] == [Image.Image] * 3


def test_an_image_read_from_a_file_is_refused_with_the_fix(tmp_path: Path) -> None:
    from PIL import Image

    path = tmp_path / "x.png"
    Image.new("RGB", (2, 2)).save(path)
    with Image.open(path) as opened, ArchiveManager.open(tmp_path / "pool") as pool:
        with pytest.raises(UnencodableError, match=r"image\.copy\(\)"):
            pool.save("i", [{"image": opened}], rollout_id=1)
        pool.save("i", [{"image": opened.copy()}], rollout_id=1)


_LOAD_ELSEWHERE = """
import json, sys, warnings
sys.path.insert(0, {frameworks!r})
if {import_slime}:
    import slime.utils.types
from archive_manager import ArchiveManager
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    with ArchiveManager.open({root!r}) as pool:
        sample = pool.open_archive("r").load_samples()[0]
print(json.dumps({{
    "type": type(sample).__module__ + "." + type(sample).__qualname__,
    "spec_info": type(sample.spec_info if hasattr(sample, "spec_info") else sample["spec_info"]).__name__,
    "status": str(sample.status if hasattr(sample, "status") else sample["status"]),
    "warnings": [str(w.message) for w in said if w.category.__name__ == "UnregisteredClassWarning"],
    "imported": "slime" in sys.modules,
}}))
"""


@pytest.mark.parametrize("import_slime", [False, True])
def test_a_load_rebuilds_a_framework_class_only_where_its_module_is_loaded(
    tmp_path: Path, import_slime: bool
) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("r", make_slime_rollout(2, seed=1), rollout_id=1)
    script = _LOAD_ELSEWHERE.format(
        frameworks=str(FRAMEWORKS), root=str(root), import_slime=import_slime
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    if import_slime:
        assert seen["type"] == "slime.utils.types.Sample" and seen["spec_info"] == "SpecInfo"
        assert seen["warnings"] == []
    else:
        # a load never imports the module a payload names: the fields come back as dicts,
        # and the process is told which class is missing and how to get it back
        assert seen == {
            "type": "builtins.dict",
            "spec_info": "dict",
            "status": "completed",
            "warnings": seen["warnings"],
            "imported": False,
        }
        assert any("slime.utils.types.Sample" in w for w in seen["warnings"])
        assert all("register_sample_class" in w for w in seen["warnings"])


def test_an_unregistered_class_warns_once_and_loads_as_a_dict(tmp_path: Path) -> None:
    from archive_manager.samples import records as samples

    @dataclasses.dataclass
    class Gone:
        x: int = 1

    register_sample_class(Gone, "tests.Gone-once")
    with ArchiveManager.open(tmp_path / "pool") as pool:
        arc = pool.save("g", [{"v": Gone(3)}, {"v": Gone(4)}], rollout_id=1)
        # another process (or a later run) that never registered it
        del samples._CLASSES["tests.Gone-once"], samples._NAMES[Gone]
        samples._MISSING_SAID.discard("tests.Gone-once")
        with pytest.warns(UnregisteredClassWarning, match="tests.Gone-once") as said:
            back = arc.load_samples()
    assert back == [{"v": {"x": 3}}, {"v": {"x": 4}}]
    assert len([w for w in said if w.category is UnregisteredClassWarning]) == 1


def test_numpy_scalar_index_and_chunked_routed_experts(tmp_path: Path) -> None:
    rows: list[Any] = make_vime_rollout(6, seed=2)  # numpy scalar indices among them
    assert any(isinstance(s.index, np.integer) for s in rows)
    assert any(isinstance(s.rollout_routed_experts, list) for s in rows)
    with ArchiveManager.open(tmp_path / "pool") as pool:
        arc = pool.save("v", rows, rollout_id=1)
        back = arc.load_samples()
        keys = [k for k, _ in arc.keys()]
    chunks = [s.rollout_routed_experts for s in back if isinstance(s.rollout_routed_experts, list)]
    assert chunks and all(isinstance(c, torch.Tensor) for chunk in chunks for c in chunk)
    assert keys == [f"sample:{int(s.index)}" for s in rows]
