"""A hostile review of issue 24's fix ("what you save is what you load"): each test is a case
the first fix got wrong, named by the claim it broke (docs/architecture.md, "Samples and
values"); each failed on the code it was written against, for the reason its docstring gives,
and now holds the decision that closed it, with its siblings (the same class of bug elsewhere).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import snapshot_pool

from archive_manager import ArchiveManager, Sample
from archive_manager.codec import encode_chunk
from archive_manager.errors import ArchiveError, UnencodableError
from archive_manager.samples import fields_to_sample, register_sample_class, registered_name

pytestmark = [pytest.mark.timeout(300)]

_names = itertools.count()


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[ArchiveManager]:
    manager = ArchiveManager.open(tmp_path / "pool", inline_limit=64)
    try:
        yield manager
    finally:
        manager.close()


def _name() -> str:
    return f"brk{next(_names)}"


def _save_or_refuse(pool: ArchiveManager, samples: list) -> list | None:
    """The loaded samples, or None when save refused them with a library error (and left the
    pool as it was).  A raw exception from save propagates: that is a failure by itself."""
    before = snapshot_pool(pool)
    name = _name()
    try:
        pool.save(name, samples, rollout_id=1)
    except ArchiveError:
        assert snapshot_pool(pool) == before
        return None
    return pool.open_archive(name).load_samples()


# --------------------------------------------------------------------------- claim 2


@dataclasses.dataclass
class Doubler:
    """A field behind a property (the common "validated attribute" dataclass pattern): the
    property's setter normalises what the constructor is given."""

    _x: int = dataclasses.field(default=0, repr=False)
    x: int = 0


def _get_x(self: Doubler) -> int:
    return self._x


SETTER_CALLS: list[object] = []


def _set_x(self: Doubler, value: object) -> None:
    SETTER_CALLS.append(value)
    if isinstance(value, property):  # the class default, at __init__
        value = 0
    self._x = value * 2  # type: ignore[operator]


Doubler.x = property(_get_x, _set_x)  # type: ignore[assignment]
register_sample_class(Doubler)


def test_claim2_property_setter_runs_on_load_and_changes_the_value(pool: ArchiveManager) -> None:
    """Claim 2: dataclasses load with exactly the saved field values, without running user
    code (properties named).  `_rebuild` sets fields with ``object.__setattr__``, which still
    calls a data descriptor's ``__set__``: a property setter runs on load, and here doubles
    the value again (``_x`` saved as 10 loads as 20).  Silent wrong data; fix: set fields
    straight into ``__dict__`` (or slots via the member descriptor) when the class attribute
    is a data descriptor, or refuse such classes at registration/save naming the field.

    Decided: refused at save, naming the field (its value could only be set back by running
    the setter); and loading never calls a descriptor's ``__set__``, so an archive an older
    release saved of such a class loads the state as it was stored (below)."""
    sample = Doubler()
    sample._x = 10
    assert sample.x == 10
    before = snapshot_pool(pool)
    with pytest.raises(UnencodableError, match=r"field 'x' of .*Doubler is a property"):
        pool.save(_name(), [sample], rollout_id=1)
    assert snapshot_pool(pool) == before
    with (
        pytest.raises(UnencodableError, match=r"field 'x'"),
        pool.writer(_name(), rollout_id=1) as w,
    ):
        w.add(sample)
    assert snapshot_pool(pool) == before
    # what an older release stored of it: both fields; loading runs no setter
    SETTER_CALLS.clear()
    loaded = fields_to_sample(registered_name(Doubler), {"_x": 10, "x": 10})
    assert SETTER_CALLS == []
    assert type(loaded) is Doubler and loaded._x == 10 and loaded.x == 10


class Counted:
    """A data descriptor of the user's own (not a property): ``__set__`` is its code."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = "_" + name

    def __get__(self, obj: object, owner: type | None = None) -> object:
        return 0 if obj is None else getattr(obj, self.name, 0)

    def __set__(self, obj: object, value: object) -> None:
        SETTER_CALLS.append(value)
        object.__setattr__(obj, self.name, value)


HOOK_CALLS: list[str] = []


@dataclasses.dataclass
class WithDescriptorField:
    n: Counted = Counted()  # a descriptor-typed field (a dataclasses pattern)


@dataclasses.dataclass
class Hooked:
    """``__setattr__``, ``__getattribute__`` and ``__init__`` hooks: none may run on load."""

    a: int = 0
    b: list = dataclasses.field(default_factory=list)

    def __setattr__(self, name: str, value: object) -> None:
        HOOK_CALLS.append(f"setattr {name}")
        object.__setattr__(self, name, value)

    def __post_init__(self) -> None:
        HOOK_CALLS.append("post_init")


@dataclasses.dataclass(slots=True)
class SlotsBase:
    a: int = 0


@dataclasses.dataclass
class PropertyOverSlot(SlotsBase):
    """A subclass that puts a property over its base's slot field."""


def _get_a(self: PropertyOverSlot) -> int:
    return SlotsBase.a.__get__(self) + 1  # type: ignore[attr-defined]


def _set_a(self: PropertyOverSlot, value: int) -> None:
    SETTER_CALLS.append(value)
    SlotsBase.a.__set__(self, value)  # type: ignore[attr-defined]


PropertyOverSlot.a = property(_get_a, _set_a)  # type: ignore[assignment]
for _cls in (WithDescriptorField, Hooked, SlotsBase, PropertyOverSlot):
    register_sample_class(_cls)


def test_claim2_siblings_descriptors_and_hooks_never_run_on_load(pool: ArchiveManager) -> None:
    """Siblings of the property setter: any data descriptor over a field (a user descriptor, a
    property over a base's slot) is refused at save the same way, and ``__setattr__`` /
    ``__post_init__`` hooks and slot fields load without the class's code."""
    for sample, field in ((WithDescriptorField(n=3), "n"), (PropertyOverSlot(a=1), "a")):
        before = snapshot_pool(pool)
        with pytest.raises(UnencodableError, match=rf"field '{field}' of .* data descriptor"):
            pool.save(_name(), [sample], rollout_id=1)
        assert snapshot_pool(pool) == before
    saved = [Hooked(a=5, b=[1, 2]), SlotsBase(a=7)]
    saved[0].extra = {"k": 1}  # type: ignore[attr-defined]
    name = _name()
    pool.save(name, saved, rollout_id=1)
    HOOK_CALLS.clear()
    SETTER_CALLS.clear()
    loaded = pool.open_archive(name).load_samples()
    assert HOOK_CALLS == [] and SETTER_CALLS == []
    assert loaded == saved and loaded[0].extra == {"k": 1}
    assert [type(x) for x in loaded] == [Hooked, SlotsBase]


@dataclasses.dataclass
class QueueFieldNoDefault:
    """A declared field whose name happens to start with ``_queue_``."""

    _queue_slot: int
    value: int = 0


@dataclasses.dataclass
class QueueFieldDefault:
    _queue_slot: int = -1
    value: int = 0


register_sample_class(QueueFieldNoDefault)
register_sample_class(QueueFieldDefault)


def test_claim2_queue_prefixed_dataclass_field_saves_but_never_loads(pool: ArchiveManager) -> None:
    """Claim 2 (and "an archive that saved must always load"): a registered dataclass with a
    declared field named ``_queue_*`` and no default is saved with that field silently
    dropped (``_strip_queue``), and every load then fails with UnsupportedFormatError ("the
    stored fields lack '_queue_slot'").  Fix: refuse at save (or registration) a class whose
    declared field the queue rule would drop, naming the field; or only strip undeclared
    attributes."""
    loaded = _save_or_refuse(pool, [QueueFieldNoDefault(_queue_slot=5, value=1)])
    # decided: a declared field is the class's data, whatever its name; only attributes a
    # queue attaches at run time (undeclared) are live queue state
    assert loaded is not None
    assert loaded[0] == QueueFieldNoDefault(_queue_slot=5, value=1)


def test_claim2_queue_prefixed_dataclass_field_loads_its_default(pool: ArchiveManager) -> None:
    """Claim 2: the same with a default: ``_queue_slot=5`` loads as its default ``-1``; the
    sample loads, but not with the saved field values.  Fix as above."""
    loaded = _save_or_refuse(pool, [QueueFieldDefault(_queue_slot=5, value=1)])
    assert loaded is not None
    assert loaded[0]._queue_slot == 5


@dataclasses.dataclass
class QueueSample(Sample):
    _queue_slot: int = -1


register_sample_class(QueueSample)


def test_claim2_queue_siblings_sample_subclass_kept_undeclared_dropped(
    pool: ArchiveManager,
) -> None:
    """Siblings: a `Sample` subclass declaring a ``_queue_*`` field keeps it too, while the
    undeclared ``_queue_*`` attributes a queue attaches (to that subclass, to a dataclass, to
    `Sample`) are still dropped, and are no part of the stored record."""
    sub = QueueSample(index=1, _queue_slot=4)
    sub._queue_receipt = object()  # type: ignore[attr-defined]  (live, unencodable)
    plain = QueueFieldDefault(_queue_slot=2)
    plain._queue_lease = object()  # type: ignore[attr-defined]
    sample = Sample(index=2)
    sample._queue_receipt = object()  # type: ignore[attr-defined]
    loaded = _save_or_refuse(pool, [sub, plain, sample])
    assert loaded is not None
    assert type(loaded[0]) is QueueSample and loaded[0]._queue_slot == 4
    assert loaded[1]._queue_slot == 2
    assert not any(hasattr(x, a) for x in loaded for a in ("_queue_receipt", "_queue_lease"))


def test_claim2_sample_helpers_and_status_do_not_load_as_saved(pool: ArchiveManager) -> None:
    """Claim 2 for `Sample` itself (registered, rebuilt through `_sample_values`): an extra
    attribute on ``spec_info`` is dropped (``SpecInfo.from_dict`` ignores unknown keys), a
    ``spec_info`` set to a dict loses its unknown keys and comes back a ``SpecInfo``, a
    ``spec_info`` of None loads as ``SpecInfo()``, and ``status=None`` loads as
    ``Status.PENDING``.  Other dataclasses get "an enum field holding a non-member that would
    load as a member is refused at save"; `Sample` does not.  Fix: store helpers as their
    fields plus extra attributes and rebuild them with `_rebuild`; refuse (or keep) a None or
    a dict where a helper/Status is expected, naming the field."""
    extra = Sample()
    extra.spec_info.custom_counter = 7  # type: ignore[attr-defined]
    as_dict = Sample()
    as_dict.spec_info = {"spec_accept_token_num": 3, "engine": "sglang"}  # type: ignore[assignment]
    none_status = Sample(status=None)  # type: ignore[arg-type]
    loaded = []
    for s in (extra, as_dict, none_status):
        got = _save_or_refuse(pool, [s])
        loaded.append(None if got is None else got[0])
    # decided: kept as saved (the record lists the fields it stored converted)
    assert all(x is not None for x in loaded)
    assert type(loaded[0].spec_info) is Sample.SpecInfo
    assert loaded[0].spec_info.custom_counter == 7
    assert vars(loaded[0].spec_info) == vars(extra.spec_info)
    assert type(loaded[1].spec_info) is dict and loaded[1].spec_info == as_dict.spec_info
    assert loaded[2].status is None
    assert [vars(x) for x in loaded] == [vars(x) for x in (extra, as_dict, none_status)]


def test_claim2_sample_helper_siblings(pool: ArchiveManager, tmp_path: Path) -> None:
    """Siblings: ``prefix_cache_info`` and None helpers load as saved too, a helper keeps its
    counters' types, the status given as its value still loads as the member, and an export
    slime's ``from_dict`` would not read back as saved is refused naming the field."""
    none_helpers = Sample(index=0, status=Sample.Status.COMPLETED)
    none_helpers.spec_info = None  # type: ignore[assignment]
    none_helpers.prefix_cache_info = {"cached_tokens": 2, "other": "x"}  # type: ignore[assignment]
    counters = Sample(index=1, status="truncated")  # type: ignore[arg-type]
    counters.prefix_cache_info.cached_tokens = 2.5  # type: ignore[assignment]
    counters.prefix_cache_info.source = "radix"  # type: ignore[attr-defined]
    loaded = _save_or_refuse(pool, [none_helpers, counters])
    assert loaded is not None
    assert loaded[0].spec_info is None
    assert loaded[0].prefix_cache_info == {"cached_tokens": 2, "other": "x"}
    assert loaded[0].status is Sample.Status.COMPLETED
    assert loaded[1].status is Sample.Status.TRUNCATED
    assert type(loaded[1].prefix_cache_info) is Sample.PrefixCacheInfo
    assert vars(loaded[1].prefix_cache_info) == {
        "cached_tokens": 2.5,
        "total_prompt_tokens": 0,
        "source": "radix",
    }
    for bad, field in (
        (Sample(status=None), "status"),  # type: ignore[arg-type]
        (none_helpers, "spec_info"),
        (counters, "prefix_cache_info"),
    ):
        name = _name()
        pool.save(name, [bad], rollout_id=1)
        with pytest.raises(UnencodableError, match=rf"sample 0 .* field '{field}'"):
            pool.open_archive(name).export_pt(tmp_path / "refused.pt")
        assert not list(tmp_path.glob("*refused*"))


class Score(enum.Enum):
    MISSING = math.nan
    ZERO = 0.0


@dataclasses.dataclass
class Scored:
    score: Score = Score.ZERO


register_sample_class(Scored)


def test_claim2_enum_member_with_nan_value_loads_as_a_float(pool: ArchiveManager) -> None:
    """Claim 2: an enum-typed field is stored as the member's ``.value`` and turned back with
    ``Score(value)`` on load.  For a member whose value is NaN (a "missing score" sentinel),
    the loaded NaN is a new object, so neither the value map (identity) nor the linear scan
    (``==``) finds the member; ``_build_dataclass`` suppresses the ValueError and the field
    loads as the float ``nan`` instead of ``Score.MISSING``.  Fix: check at save that
    ``enum_type(stored value) is member`` and refuse otherwise (naming the field), or store
    members by name."""
    loaded = _save_or_refuse(pool, [Scored(Score.MISSING)])
    # decided: members are found by the bits of their stored value, so a NaN finds its member
    assert loaded is not None
    assert loaded[0].score is Score.MISSING


MISSING_CALLS: list[object] = []


class Picky(enum.Enum):
    A = "a"
    LIST = [1, 2]  # noqa: RUF012  (an unhashable value: no lookup by value finds it)

    @classmethod
    def _missing_(cls, value: object) -> Picky:
        MISSING_CALLS.append(value)
        return cls.A  # a hook that turns anything into A


class Perm(enum.Flag):
    R = 1
    W = 2


@dataclasses.dataclass
class Enumerated:
    picky: Picky = Picky.A
    perm: Perm = Perm.R
    level: float = 0.0


register_sample_class(Enumerated)


def test_claim2_enum_siblings_no_enum_code_on_load(pool: ArchiveManager) -> None:
    """Siblings: the enum's ``_missing_`` hook never runs on load or decides a save (the lookup
    is the same on both sides); a member whose value no lookup finds is refused at save;
    a combination of `enum.Flag` members round-trips."""
    name = _name()
    pool.save(name, [Enumerated(Picky.A, Perm.R | Perm.W)], rollout_id=1)
    MISSING_CALLS.clear()
    (loaded,) = pool.open_archive(name).load_samples()
    assert MISSING_CALLS == []
    assert loaded.picky is Picky.A and loaded.perm == Perm.R | Perm.W
    # "b" is no member's value: it is stored and loads as "b", whatever _missing_ says
    name = _name()
    pool.save(name, [Enumerated(picky="b")], rollout_id=1)  # type: ignore[arg-type]
    assert pool.open_archive(name).load_samples()[0].picky == "b"
    assert MISSING_CALLS == []
    before = snapshot_pool(pool)
    with pytest.raises(UnencodableError, match=r"field 'picky' .* would not load as that member"):
        pool.save(_name(), [Enumerated(Picky.LIST)], rollout_id=1)
    assert snapshot_pool(pool) == before


# --------------------------------------------------------------------------- claims 4 and 5


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(lambda: torch.zeros(1).expand(2**40), id="torch-expand"),
        pytest.param(lambda: np.broadcast_to(np.zeros(1), (2**40,)), id="numpy-broadcast_to"),
    ],
)
def test_claim5_broadcast_views_raise_raw_errors_from_save(pool: ArchiveManager, value) -> None:
    """Claims 4 and 5: a zero-stride view (``t.expand``, ``np.broadcast_to``: the "same
    memory many times" case of shared sub-objects) holds 8 bytes and expands to 4-8 TiB.
    Save calls ``.contiguous()`` / ``.tobytes()`` and raises a raw ``RuntimeError``
    ("DefaultCPUAllocator: can't allocate memory") or ``MemoryError`` instead of an
    `UnencodableError` naming the field; smaller expansions (say 2**31 of a 1-element view)
    silently allocate gigabytes.  Fix: bound the expanded byte size (numel * itemsize) of
    tensors and arrays against a documented limit before materialising, and refuse past it
    with the field named."""
    before = snapshot_pool(pool)
    # decided: refused before anything is expanded, past a bound on the bytes a record would
    # hold beyond the sample's own memory (codec.values._MAX_EXTRA_BYTES)
    with pytest.raises(UnencodableError, match=r"field 'metadata'\['view'\]: .*broadcast"):
        pool.save(_name(), [Sample(metadata={"view": value()})], rollout_id=1)
    assert snapshot_pool(pool) == before
    with (
        pytest.raises(UnencodableError, match="metadata"),
        pool.writer(_name(), rollout_id=1) as w,
    ):
        w.add(Sample(metadata={"view": value()}))
    assert snapshot_pool(pool) == before


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(lambda: torch.zeros(1).expand(2**31), id="torch-expand-8GiB"),
        pytest.param(lambda: torch.zeros(4, 1).expand(4, 2**28).t(), id="torch-expand-t"),
        pytest.param(
            lambda: torch.zeros(2**17).as_strided((2**16, 2**16), (1, 1)), id="torch-overlap"
        ),
        pytest.param(lambda: np.broadcast_to(np.zeros(1), (2**31,)), id="numpy-8GiB"),
        pytest.param(
            lambda: np.lib.stride_tricks.as_strided(np.zeros(2**17), (2**16, 2**16), (8, 8)),
            id="numpy-overlap",
        ),
        pytest.param(lambda: np.broadcast_to(np.float64(1.0), (2**31,)), id="numpy-scalar-base"),
    ],
)
def test_claim5_sibling_views_are_refused_before_they_expand(pool: ArchiveManager, value) -> None:
    """Siblings: expansions of gigabytes (not only terabytes), transposed expansions, and
    overlapping strides without a zero stride; above and below the inline limit alike."""
    for limit in (64, 1 << 40):
        with pytest.raises(UnencodableError, match="broadcast"):
            encode_chunk([{"view": value()}], inline_limit=limit)
    before = snapshot_pool(pool)
    with pytest.raises(UnencodableError, match="metadata"):
        pool.save(_name(), [Sample(metadata={"view": value()})], rollout_id=1)
    assert snapshot_pool(pool) == before


def test_claim5_small_views_and_repeated_tensors_still_round_trip(pool: ArchiveManager) -> None:
    """A small broadcast view is stored expanded and loads equal; a tensor above the inline
    limit held in many places is hashed once and loads as equal copies."""
    big = torch.arange(1000)
    views = {
        "t": torch.arange(3).expand(4, 3),
        "n": np.broadcast_to(np.arange(3), (4, 3)),
        "refs": [big] * 5000,
    }
    name = _name()
    pool.save(name, [views], rollout_id=1)
    (loaded,) = pool.open_archive(name).load_samples()
    assert torch.equal(loaded["t"], views["t"].contiguous())
    assert np.array_equal(loaded["n"], views["n"]) and loaded["n"].flags.writeable
    assert len(loaded["refs"]) == 5000
    assert all(torch.equal(r.materialize(), big) for r in loaded["refs"][:3])


_DAG_SCRIPT = textwrap.dedent(
    """
    import resource, sys, tempfile, warnings
    warnings.filterwarnings("ignore")
    from archive_manager import ArchiveManager, Sample
    from archive_manager.errors import ArchiveError
    pool = ArchiveManager.open(tempfile.mkdtemp() + "/pool")
    # the address space in use now, plus 1.5 GiB
    vm = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1]) * 1024
    limit = vm + (3 << 29)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    v = "x" * (1 << 20)        # one 1 MiB string
    for _ in range(14):         # held in 2**14 places through 28 distinct small lists
        v = [v, v]
    try:
        pool.save("dag", [Sample(metadata={"dag": v})], rollout_id=1)
        print("RESULT saved")
    except ArchiveError as exc:
        print("RESULT refused", type(exc).__name__, str(exc)[:200])
    except BaseException as exc:
        print("RESULT raw", type(exc).__name__, str(exc)[:200])
    """
)


def test_claim4_shared_leaves_are_not_bounded() -> None:
    """Claim 4: shared sub-objects are bounded.  The bound counts *items* of repeated
    containers (2**20), not the bytes written: 14 levels of ``v = [v, v]`` over one 1 MiB
    string (or a tensor below the inline limit, or a numpy array) repeats only ~32,000 items,
    so it is not refused, and it expands to 16 GiB of record.  Run with a 1.5 GiB address
    space budget, save dies with a raw MemoryError instead of a clear UnencodableError; with
    no limit it stalls and swaps.  Fix: count the bytes of leaves written again (strings
    >= _MIN_RAW_STR, inline tensors, arrays) against a byte bound too, or store a repeated
    leaf once and reference it."""
    out = subprocess.run(
        [sys.executable, "-c", _DAG_SCRIPT],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=Path(__file__).resolve().parents[2],
    )
    result = [line for line in out.stdout.splitlines() if line.startswith("RESULT")]
    assert result, out.stderr[-2000:]
    assert result[0].startswith("RESULT refused UnencodableError"), result[0]
    assert "sample field 'metadata'['dag']" in result[0] and "bytes beyond" in result[0]


@pytest.mark.parametrize(
    "leaf",
    [
        pytest.param(lambda: np.zeros(1 << 17), id="numpy-array"),
        pytest.param(lambda: torch.zeros(1 << 18), id="inline-tensor"),
        pytest.param(lambda: "y" * (1 << 20), id="long-string"),
    ],
)
def test_claim4_sibling_leaves_repeated_in_one_list_are_bounded(leaf) -> None:
    """Siblings: no DAG needed, one list holding the same 1 MiB leaf 300 times (items far
    below the item bound) is refused by the byte bound, at the place that passes it (a
    tensor's or array's node counts too, so it passes one place earlier); 200 times is
    stored."""
    value = leaf()
    encode_chunk([{"many": [value] * 200}], inline_limit=1 << 30)
    with pytest.raises(UnencodableError, match=r"field 'many'\[25[67]\]: .*bytes beyond"):
        encode_chunk([{"many": [value] * 300}], inline_limit=1 << 30)


# --------------------------------------------------------------------------- claim 5: exports


@pytest.mark.parametrize("where", ["value", "key"])
def test_claim5_export_of_numpy_complex_scalar_is_not_importable(
    pool: ArchiveManager, tmp_path: Path, where: str
) -> None:
    """Claim 5: export_pt writes only files that import_pt reads back equal, or refuses at
    export naming the field.  A numpy complex scalar (which save stores and loads exactly)
    is exported as a Python ``complex`` (``np.generic.item()``); torch.load reads it, but
    import_pt then refuses the library's own export with "cannot store a value of type
    builtins.complex".  Fix: refuse complex numpy scalars at export naming the field (or
    export them as 0-d complex tensors, or teach the codec Python complex)."""
    meta = {"z": np.complex64(1 + 2j)} if where == "value" else {np.complex128(1 + 2j): 1}
    name = _name()
    pool.save(name, [Sample(metadata=meta)], rollout_id=1)
    assert pool.open_archive(name).load_samples()[0].metadata == meta
    path = tmp_path / "dump.pt"
    # decided: refused at export naming the field (the codec stores no Python complex)
    field = r"'metadata'\['z'\]" if where == "value" else r"'metadata'\[np.complex128"
    with pytest.raises(UnencodableError, match=rf"sample 0 .* field {field}.*complex"):
        pool.open_archive(name).export_pt(path)
    assert not list(tmp_path.glob("*dump*"))
    # a complex 0-d array (and any complex array) exports as a tensor and imports back
    name = _name()
    pool.save(name, [Sample(metadata={"z": np.array(1 + 2j, np.complex64)})], rollout_id=1)
    pool.open_archive(name).export_pt(path)
    imported = pool.import_pt(path, _name()).load_samples()[0].metadata["z"]
    assert torch.equal(imported, torch.tensor(1 + 2j, dtype=torch.complex64))
