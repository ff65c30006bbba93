"""vime's own `RolloutArchive` tests, the portable ones, run against the facade.

Each test re-expresses what one of vime's archive tests asserts (named in its docstring; the
suites are vime's archive metadata tests and its straw transport tests) without vime, Ray or
a GPU: the samples are vime's ``Sample`` (the stand-in under tests/frameworks), saved through
the facade (a pointer file) and, where the test is about reading, written by the seed itself
(`tests._seed.seed_save`, real straw-queue) and opened by the facade.  Where the facade
deliberately differs (docs/dropin.md), the test pins the facade's side of that row.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("straw")
torch = pytest.importorskip("torch")

import _seed  # noqa: E402  (puts tests/frameworks on sys.path)
import straw.store  # type: ignore[import-untyped]  # noqa: E402
import straw.tensor  # type: ignore[import-untyped]  # noqa: E402

from archive_manager import ArchiveManager, RolloutArchive  # noqa: E402
from archive_manager.blobs import BlobStore  # noqa: E402
from archive_manager.codec import TensorRef as PoolTensorRef  # noqa: E402
from archive_manager.compat import SeedTensor, validate_seed_metadata  # noqa: E402
from archive_manager.errors import MetadataError  # noqa: E402
from archive_manager.interop.straw import StrawArchive  # noqa: E402

Sample = _seed.Sample  # vime.utils.types.Sample

WRITERS = ("facade", "seed")


# --------------------------------------------------------------------------- builders


def checked_sample() -> Any:
    """One completed vime sample that fits `run_args`: 3 tokens, 2 of them the response,
    routed experts for the 2 routed positions, a top-p capture of 2 candidates."""
    return Sample(
        index=0,
        group_index=0,
        tokens=[9, 1, 2],
        response_length=2,
        loss_mask=[1, 1],
        rollout_log_probs=[0.0, 0.0],
        status=Sample.Status.COMPLETED,
        rollout_routed_experts=torch.zeros((2, 3, 2), dtype=torch.int32),
        rollout_top_p_token_ids=torch.tensor([1, 2], dtype=torch.int32),
        rollout_top_p_token_offsets=torch.tensor([0, 1, 2], dtype=torch.int32),
        rollout_top_p_log_probs=torch.zeros(2),
    )


def run_args() -> SimpleNamespace:
    """A run with routing replay on a 3-layer top-2 MoE and score centering under top-p."""
    return SimpleNamespace(
        use_rollout_routing_replay=True,
        use_score_centering=True,
        num_layers=3,
        moe_router_topk=2,
        rollout_top_p=0.95,
    )


def save_with(writer: str, path: Path, samples: list[Any], **kwargs: Any) -> None:
    """Save as the seed's caller does (``save`` returns None): through the facade, or with
    the seed's own writer into its straw pool beside ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if writer == "facade":
        assert RolloutArchive.save(path, samples, **kwargs) is None
    else:
        assert _seed.seed_save(path, samples, **kwargs) is None


def save_debug_rollout_data(template: str, samples: list[Any], *, rollout_id: int) -> None:
    """vime's debug dump helper, archive branch: the template names the file per rollout."""
    path = Path(template.format(rollout_id=str(rollout_id)))
    path.parent.mkdir(parents=True, exist_ok=True)
    RolloutArchive.save(path, samples, rollout_id=rollout_id)


def load_debug_rollout_data(template: str, *, rollout_id: int) -> list[Any]:
    """vime's loader: an archive through `RolloutArchive`, a ``.pt`` dump through
    ``torch.load`` and ``Sample.from_dict``."""
    path = template.format(rollout_id=str(rollout_id))
    if path.endswith(".json"):
        with RolloutArchive(path) as archive:
            return archive.load_samples()
    dump = torch.load(path, weights_only=False)
    return [Sample.from_dict(d) for d in dump["samples"]]


def forbid(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the metadata check touched {what}")

    return refuse


# --------------------------------------------------------------------------- metadata checks


@pytest.mark.parametrize("writer", WRITERS)
def test_metadata_check_reads_the_index_alone_never_a_store_or_tensor(
    tmp_path: Path, writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ports ``test_index_only_check_never_opens_straw_or_reads_tensors``: every way to a
    stored payload (straw's store and lazy tensors, the pool, its blobs, the facade's lazy
    tensors) raises, and the check still answers from the index file."""
    path = tmp_path / "rollout.straw.json"
    save_with(writer, path, [checked_sample()], rollout_id=0)
    monkeypatch.setattr(straw.store.SharedFilesystemStore, "__init__", forbid("a straw store"))
    monkeypatch.setattr(straw.tensor.TensorRef, "load", forbid("a straw tensor"))
    monkeypatch.setattr(StrawArchive, "__init__", forbid("the seed reader"))
    monkeypatch.setattr(ArchiveManager, "open", forbid("the pool"))
    monkeypatch.setattr(BlobStore, "get", forbid("a blob"))
    monkeypatch.setattr(BlobStore, "get_view", forbid("a blob"))
    monkeypatch.setattr(BlobStore, "open", forbid("a blob"))
    monkeypatch.setattr(PoolTensorRef, "materialize", forbid("a pool tensor"))
    monkeypatch.setattr(SeedTensor, "load", forbid("a facade tensor"))
    metadata = RolloutArchive.check_metadata(path, run_args())
    assert len(metadata) == 1
    assert metadata[0]["response_length"] == 2
    # exactly the seed's description of the sample, whoever wrote the archive
    assert metadata == [_seed.describe_sample(checked_sample())]


def _corrupt(description: dict[str, Any], corruption: str) -> None:
    tensors = description["tensors"]
    if corruption == "tokens":  # fewer tokens than the response
        description["tokens"] = 1
    elif corruption == "mask":  # a loss mask shorter than the response
        description["loss_mask"] = 1
    elif corruption == "routes":  # routes for 4 layers on a 3-layer model
        tensors["rollout_routed_experts"]["shape"][1] = 4
    elif corruption == "offsets":  # top-p offsets not one longer than the response
        tensors["rollout_top_p_token_offsets"]["shape"] = [2]
    elif corruption == "logps":  # log-probs of another count than the ids
        tensors["rollout_top_p_log_probs"]["shape"] = [3]
    elif corruption == "ids_dtype":  # candidate ids that are not integers
        tensors["rollout_top_p_token_ids"]["dtype"] = "float32"
    else:  # pragma: no cover
        raise AssertionError(corruption)


CORRUPTIONS = ("tokens", "mask", "routes", "offsets", "logps", "ids_dtype")


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_metadata_check_rejects_each_shape_and_dtype_mismatch(
    tmp_path: Path, corruption: str
) -> None:
    """Ports ``test_metadata_rejects_shape_and_dtype_mismatch``: one field of the seed's
    description made not to fit the run raises the seed's ValueError, with the seed's
    message: from the facade's validator, and from `check_metadata` of a seed index and of
    a facade pointer carrying that description.  (The facade raises `MetadataError`, a
    ValueError.)"""
    description = _seed.describe_sample(checked_sample())
    validate_seed_metadata([description], run_args())  # as made, it fits
    _corrupt(description, corruption)
    with pytest.raises(ValueError) as seed_error:
        _seed.validate_sample_metadata([description], run_args())
    message = str(seed_error.value)
    assert issubclass(MetadataError, ValueError)
    with pytest.raises(MetadataError) as facade_error:
        validate_seed_metadata([description], run_args())
    assert str(facade_error.value) == message

    index = tmp_path / "seed" / "rollout.straw.json"
    save_with("seed", index, [checked_sample()], rollout_id=0)
    document = json.loads(index.read_text())
    _corrupt(document["sample_metadata"]["samples"][0], corruption)
    index.write_text(json.dumps(document))
    pointer = tmp_path / "facade" / "rollout.json"
    save_with("facade", pointer, [checked_sample()], rollout_id=0)
    document = json.loads(pointer.read_text())
    _corrupt(document["metadata"][0], corruption)
    pointer.write_text(json.dumps(document))
    for path in (index, pointer):
        with pytest.raises(ValueError) as checked:
            RolloutArchive.check_metadata(path, run_args())
        assert type(checked.value) is MetadataError and str(checked.value) == message


def test_seed_index_without_metadata_needs_its_sidecar_bound_by_digest(tmp_path: Path) -> None:
    """Ports ``test_legacy_index_requires_explicit_sidecar_and_checks_identity`` on a seed
    index: without ``sample_metadata`` the check reads ``<index>.metadata.json`` and nothing
    else (no sidecar: FileNotFoundError naming it); a sidecar of another archive's manifest
    digest raises the seed's ValueError."""
    path = tmp_path / "rollout.straw.json"
    save_with("seed", path, [checked_sample()], rollout_id=0)
    index = json.loads(path.read_text())
    metadata = index.pop("sample_metadata")
    path.write_text(json.dumps(index))
    sidecar = path.with_suffix(path.suffix + ".metadata.json")
    assert sidecar.name == "rollout.straw.json.metadata.json"
    with pytest.raises(FileNotFoundError) as missing:
        RolloutArchive.check_metadata(path, run_args())
    assert Path(missing.value.filename) == sidecar
    document = {"manifest_digest": index["manifest"]["digest"], "sample_metadata": metadata}
    sidecar.write_text(json.dumps(document))
    assert len(RolloutArchive.check_metadata(path, run_args())) == 1
    document["manifest_digest"] = "wrong"
    sidecar.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"^Metadata sidecar belongs to a different archive$"):
        RolloutArchive.check_metadata(path, run_args())


def test_pointer_without_metadata_reads_a_sidecar_bound_by_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ports ``test_legacy_index_requires_explicit_sidecar_and_checks_identity`` on a facade
    pointer: a sidecar, when there is one, answers (the pool is never opened) and must carry
    the pointer's manifest digest.  Without one the pool's catalog answers instead of a
    FileNotFoundError (docs/dropin.md, "a pointer without metadata")."""
    path = tmp_path / "rollout.json"
    save_with("facade", path, [checked_sample()], rollout_id=0)
    pointer = json.loads(path.read_text())
    del pointer["metadata"]
    path.write_text(json.dumps(pointer))
    assert len(RolloutArchive.check_metadata(path, run_args())) == 1  # from the catalog

    sidecar = path.with_suffix(path.suffix + ".metadata.json")
    document = {
        "manifest_digest": pointer["manifest_digest"],
        "sample_metadata": {"version": 1, "samples": [_seed.describe_sample(checked_sample())]},
    }
    sidecar.write_text(json.dumps(document))
    with monkeypatch.context() as m:
        m.setattr(ArchiveManager, "open", forbid("the pool"))
        assert (
            RolloutArchive.check_metadata(path, run_args())
            == document["sample_metadata"]["samples"]
        )
        document["manifest_digest"] = "wrong"
        sidecar.write_text(json.dumps(document))
        with pytest.raises(ValueError, match=r"^Metadata sidecar belongs to a different archive$"):
            RolloutArchive.check_metadata(path, run_args())


@pytest.mark.parametrize("writer", WRITERS)
def test_routed_expert_chunks_are_described_by_their_total_length(
    tmp_path: Path, writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ports ``test_metadata_counts_routed_chunks_without_materializing``: routed experts
    held as a list of per-segment chunks (1 + 2 positions) are described as their
    concatenation, ``[3, 3, 2]`` int32, and the check reads that from the index without
    loading a tensor."""
    sample = checked_sample()
    sample.rollout_routed_experts = [
        torch.zeros((1, 3, 2), dtype=torch.int32),
        torch.zeros((2, 3, 2), dtype=torch.int32),
    ]
    expected = {"shape": [3, 3, 2], "dtype": "int32"}
    assert _seed.describe_sample(sample)["tensors"]["rollout_routed_experts"] == expected
    path = tmp_path / "rollout.straw.json"
    save_with(writer, path, [sample], rollout_id=0)
    monkeypatch.setattr(straw.tensor.TensorRef, "load", forbid("a straw tensor"))
    monkeypatch.setattr(BlobStore, "open", forbid("a blob"))
    monkeypatch.setattr(SeedTensor, "load", forbid("a facade tensor"))
    (metadata,) = RolloutArchive.check_metadata(path, None)
    assert metadata["tensors"]["rollout_routed_experts"] == expected
    assert metadata == _seed.describe_sample(sample)


# --------------------------------------------------------------------------- reading


def queued_sample() -> Any:
    """A vime sample handed out by the queue: its lease names the task, and it carries the
    queue's live bookkeeping, which an archive must not give back."""
    sample: Any = Sample(
        index=42,
        tokens=[1, 2, 3],
        response_length=2,
        reward=1.0,
        rollout_routed_experts=torch.arange(8, dtype=torch.int32).reshape(2, 2, 2),
    )
    sample._queue_lease = {"task_id": "prompt:21", "queue_id": "parent"}
    sample._queue_source_positions = [999]
    return sample


@pytest.mark.parametrize("writer", WRITERS)
def test_debug_archive_gives_keys_lazy_captures_and_a_tuple_key_error(
    tmp_path: Path, writer: str
) -> None:
    """Ports ``test_straw_debug_archive_keys_lazy_tensors_gc_and_legacy_export`` (keys and
    lazy tensors; the export, release and existing-path parts are the tests below): the key
    pair comes from the lease, the live queue fields are gone from the loaded sample, the
    routed experts are lazy until ``.load()``, and an unknown key raises
    ``KeyError((sample_key, task_key))``.  The seed's ``record_ref`` identity with the
    source record is straw's own (docs/dropin.md, "capture fields")."""
    routes = queued_sample().rollout_routed_experts
    path = tmp_path / "archive_7.straw.json"
    save_with(writer, path, [queued_sample()], rollout_id=7)
    with RolloutArchive(path) as archive:
        assert archive.keys() == [("sample:42", "prompt:21")]
        assert archive.index["rollout_id"] == 7
        (restored,) = archive.load_samples(sample_key="sample:42", task_key="prompt:21")
        assert type(restored) is Sample and restored.tokens == [1, 2, 3]
        assert not hasattr(restored, "_queue_lease")
        assert not hasattr(restored, "_queue_source_positions")
        lazy = restored.rollout_routed_experts
        assert not torch.is_tensor(lazy)
        assert isinstance(lazy, SeedTensor if writer == "facade" else straw.tensor.TensorRef)
        assert lazy.kind == "rollout_routed_experts"
        assert tuple(lazy.shape) == (2, 2, 2) and lazy.dtype == "int32" and len(lazy) == 2
        assert torch.equal(lazy.load(), routes)
        assert torch.equal(lazy[1:2], routes[1:2])
        with pytest.raises(KeyError) as missing:
            archive.load_samples(sample_key="sample:404")
        assert missing.value.args == (("sample:404", None),)
        with pytest.raises(KeyError) as missing:
            archive.load_samples(sample_key="sample:42", task_key="prompt:22")
        assert missing.value.args == (("sample:42", "prompt:22"),)
        with pytest.raises(TypeError):  # keyword-only, as the seed's
            archive.load_samples("sample:42")  # type: ignore[misc]


@pytest.mark.parametrize("writer", WRITERS)
def test_key_read_decodes_only_its_chunk_and_keeps_duplicate_keys(
    tmp_path: Path, writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ports ``test_archive_index_reads_only_selected_chunk_and_preserves_duplicate_keys``:
    130 samples make three chunks of 64; the last two share the key ``sample:128`` (a
    compacted trajectory reusing an id); both come back in order, and reading them reads
    the one chunk that holds them."""
    samples = [Sample(index=i, tokens=[i]) for i in range(130)]
    samples[129].index = 128
    path = tmp_path / "indexed.straw.json"
    save_with(writer, path, samples, rollout_id=0)
    with RolloutArchive(path) as archive:
        keys = archive.keys()
        assert [k for k, _ in keys] == [f"sample:{i}" for i in range(129)] + ["sample:128"]
        assert all(task is None for _, task in keys)
        read: list[Any] = []
        if writer == "facade":
            chunk_of_128 = archive.archive.chunks()[2]
            assert chunk_of_128["samples"] == 2
            with archive.archive.reads_reported(read.append):
                found = archive.load_samples(sample_key="sample:128")
            assert read == [chunk_of_128["digest"]]
        else:
            load_chunk = StrawArchive.load_chunk

            def counted(self: StrawArchive, ordinal: int, **kwargs: Any) -> list[Any]:
                read.append(ordinal)
                return load_chunk(self, ordinal, **kwargs)

            monkeypatch.setattr(StrawArchive, "load_chunk", counted)
            found = archive.load_samples(sample_key="sample:128")
            assert read == [2]
        assert [s.tokens for s in found] == [[128], [129]]
        assert [s.index for s in found] == [128, 128]


# --------------------------------------------------------------------------- writing, export, release


@pytest.mark.parametrize("writer", WRITERS)
def test_save_returns_none_and_refuses_an_existing_path(tmp_path: Path, writer: str) -> None:
    """Ports the last step of ``test_straw_debug_archive_keys_lazy_tensors_gc_and_legacy_export``
    (saving the same path again raises FileExistsError): archives are immutable, whether
    the file there is a facade pointer or a seed index, and the file is left as it was."""
    path = tmp_path / "archive_7.straw.json"
    save_with(writer, path, [queued_sample()], rollout_id=7)
    before = path.read_bytes()
    with pytest.raises(
        FileExistsError, match=r"^Rollout archives are immutable; choose a new path"
    ):
        RolloutArchive.save(path, [queued_sample()], rollout_id=7)
    assert path.read_bytes() == before
    template = str(tmp_path / "archive_{rollout_id}.straw.json")
    with pytest.raises(FileExistsError):
        save_debug_rollout_data(template, [queued_sample()], rollout_id=7)


def test_release_returns_none_twice_and_keeps_an_export_readable(tmp_path: Path) -> None:
    """Ports the release step of ``test_straw_debug_archive_keys_lazy_tensors_gc_and_legacy_export``
    (and the seed's idempotent ``release``): releasing returns None, again None the second
    time; once GC has reclaimed the archive, a dump exported before still loads, routes
    and all, and the pointer file stays."""
    template = str(tmp_path / "archive_{rollout_id}.straw.json")
    save_debug_rollout_data(template, [queued_sample()], rollout_id=7)
    legacy = tmp_path / "export.pt"
    with RolloutArchive(template.format(rollout_id=7)) as archive:
        archive.export_pt(legacy)
        archive.release()
        archive.release()  # a second release does nothing

        archive.pool.gc(grace=0)
    dump = torch.load(legacy, weights_only=False)
    assert torch.equal(
        dump["samples"][0]["rollout_routed_experts"], queued_sample().rollout_routed_experts
    )
    assert Path(template.format(rollout_id=7)).exists()


@pytest.mark.parametrize(
    "writer",
    [
        "facade",
        "seed",
    ],
)
def test_export_pt_dump_reads_back_through_the_seeds_loader(tmp_path: Path, writer: str) -> None:
    """Ports the export step of ``test_straw_debug_archive_keys_lazy_tensors_gc_and_legacy_export``
    (and vime's e2e, which exports every rollout): ``export_pt`` writes a dump that vime's
    ``load_debug_rollout_data`` reads back as the samples the archive gives, tensors loaded,
    live queue fields absent."""
    path = tmp_path / "archive_7.straw.json"
    save_with(writer, path, [queued_sample()], rollout_id=7)
    legacy = tmp_path / "dumps" / "export_7.pt"
    with RolloutArchive(path) as archive:
        archive.export_pt(legacy)
        (restored,) = archive.load_samples()
    assert torch.load(legacy, weights_only=False)["rollout_id"] == 7
    (loaded,) = load_debug_rollout_data(
        str(tmp_path / "archive_{rollout_id}.straw.json"), rollout_id=7
    )
    assert loaded.tokens == restored.tokens == [1, 2, 3]
    (exported,) = load_debug_rollout_data(str(legacy), rollout_id=7)
    assert type(exported) is Sample and exported.status is Sample.Status.PENDING
    assert exported.tokens == [1, 2, 3] and exported.reward == 1.0
    assert torch.equal(exported.rollout_routed_experts, queued_sample().rollout_routed_experts)
    assert exported.spec_info == Sample.SpecInfo()
    assert not hasattr(exported, "_queue_lease")
    assert not hasattr(exported, "_queue_source_positions")


@pytest.mark.parametrize("writer", WRITERS)
def test_an_export_of_a_seed_or_pointer_archive_needs_no_unpickling(
    tmp_path: Path, writer: str
) -> None:
    """The seed's own dump kept numpy arrays (top-k captures, metadata) and so needed
    ``weights_only=False``, a full unpickle; the facade's dump holds them as tensors, its
    status as a value and its helpers as dicts, so ``weights_only=True`` reads it
    (docs/dropin.md, ``export_pt``)."""
    import numpy as np

    sample = queued_sample()
    sample.rollout_topk_token_ids = np.arange(6, dtype=np.int32).reshape(2, 3)
    sample.metadata = {"scores": np.array([0.5, 0.25], dtype=np.float32), "n": np.int64(3)}
    path = tmp_path / "archive_7.straw.json"
    save_with(writer, path, [sample], rollout_id=7)
    dump_path = tmp_path / "export_7.pt"
    with RolloutArchive(path) as archive:
        archive.export_pt(dump_path)
    (dumped,) = torch.load(dump_path, weights_only=True)["samples"]
    assert torch.equal(
        dumped["rollout_topk_token_ids"], torch.arange(6, dtype=torch.int32).reshape(2, 3)
    )
    assert torch.equal(dumped["metadata"]["scores"], torch.tensor([0.5, 0.25]))
    assert dumped["metadata"]["n"] == 3 and dumped["status"] == "pending"
    assert dumped["spec_info"] == dataclasses.asdict(Sample.SpecInfo())
    assert Sample.from_dict(dumped).status is Sample.Status.PENDING
