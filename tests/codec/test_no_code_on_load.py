"""Loading runs none of the user's code (README, "What you save is what you load";
docs/architecture/samples-and-values.md, "Samples and values"): no constructor, property setter,
descriptor, ``__setattr__`` hook, evaluated annotation, enum hook or metaclass; enum classes a plain
lookup cannot rebuild are refused at save; ``_queue_``-prefixed dataclass fields and
`Sample`'s helpers load as documented.  Each test failed on the code it was written against,
for the reason its docstring gives ("Claim N" names the claim of the fix it broke).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import refused, round_trip, snapshot_pool

from archive_manager import ArchiveManager, Sample
from archive_manager.errors import ArchiveError, UnencodableError
from archive_manager.samples import (
    fields_to_sample,
    register_sample_class,
    registered_name,
)
from archive_manager.samples.records import _ENUM_FIELDS

_names = itertools.count()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArchiveManager]:
    manager = ArchiveManager.open(tmp_path_factory.mktemp("fidelity") / "pool", inline_limit=64)
    try:
        yield manager
    finally:
        manager.close()


CALLS: list[str] = []


class Level(enum.Enum):
    LOW = 1
    HIGH = 2


def annotation_side_effect() -> type:
    CALLS.append("annotation evaluated")
    return Level


@dataclasses.dataclass
class StringAnnotated:
    # this module's ``from __future__ import annotations`` makes every annotation a string,
    # which typing.get_type_hints evals
    level: annotation_side_effect() = Level.LOW  # type: ignore[valid-type]
    other: Level | None = None
    text: str = ""


register_sample_class(StringAnnotated)


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_claim2_string_annotations_are_not_evaluated_on_load(pool: ArchiveManager) -> None:
    """Claim 2: `_enum_fields` called ``typing.get_type_hints``, which evals the string
    annotations of a registered dataclass (arbitrary code) on the first load of a process.
    Annotations are now parsed and resolved by name lookups only: a resolvable one
    (``"Level | None"``) still finds its enum, a call is never made (the field's enum comes
    from its default instead)."""
    name = f"a{next(_names)}"
    pool.save(name, [StringAnnotated(Level.HIGH, Level.LOW)], rollout_id=1)
    _ENUM_FIELDS.pop(StringAnnotated, None)  # as in a process that only loads
    CALLS.clear()
    (loaded,) = pool.open_archive(name).load_samples()
    assert CALLS == []
    assert loaded.level is Level.HIGH and loaded.other is Level.LOW


class RecordingInt(int):
    """A user's int mixin whose ``__new__`` has a side effect."""

    def __new__(cls, value: int) -> RecordingInt:
        CALLS.append("mixin __new__")
        return int.__new__(cls, value)


# int's operators and Flag's disagree (typeshed): the pairing is the user code under test.
class MixinFlag(RecordingInt, enum.Flag):  # type: ignore[misc]
    A = 1
    B = 2


class RecordingMeta(enum.EnumType):
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        CALLS.append("metaclass __call__")
        return super().__call__(*args, **kwargs)


class MetaFlag(enum.Flag, metaclass=RecordingMeta):
    A = 1
    B = 2


class MetaEnum(enum.Enum, metaclass=RecordingMeta):
    X = "x"


class PlainFlag(enum.IntFlag):
    A = 1
    B = 2


@dataclasses.dataclass
class Flagged:
    mixin: MixinFlag | int | None = None  # `A | B` of an int mixin is typed as int's

    meta: MetaFlag | None = None
    meta_enum: MetaEnum | None = None
    plain: PlainFlag = PlainFlag.A


register_sample_class(Flagged)


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize(
    ("sample", "field", "why"),
    [
        (Flagged(mixin=MixinFlag.A | MixinFlag.B), "mixin", "mixin type"),
        (Flagged(meta=MetaFlag.A), "meta", "custom metaclass"),
        (Flagged(meta=MetaFlag.A | MetaFlag.B), "meta", "custom metaclass"),
        (Flagged(meta_enum=MetaEnum.X), "meta_enum", "custom metaclass"),
    ],
    ids=["mixin-flag-combination", "metaclass-flag", "metaclass-flag-combination", "metaclass"],
)
def test_claim2_enums_a_lookup_cannot_rebuild_are_refused_at_save(
    pool: ArchiveManager, sample: Flagged, field: str, why: str
) -> None:
    """Claim 2: the Flag-combination lookup (``enum_type(value)``) ran a user int mixin's
    ``__new__`` (to make the pseudo-member) and a custom metaclass's ``__call__`` on load.
    Loads now find members in ``_member_map_`` only, and run the stdlib Flag lookup only for
    classes whose every hook is the stdlib's; the others are refused at save, naming the
    field."""
    CALLS.clear()
    refused(pool, sample, rf"field '{field}' of .*Flagged .*without running the enum's "
            rf"code: .*{why}")  # fmt: skip
    # what an older release stored of them loads as the stored value, running nothing
    CALLS.clear()
    MixinFlag._value2member_map_.pop(3, None)  # as in a fresh process: no pseudo-member yet
    back = fields_to_sample(registered_name(Flagged), {"mixin": 3, "meta": 3, "meta_enum": "x"})
    assert CALLS == []
    assert (back.mixin, back.meta, back.meta_enum) == (3, 3, "x")


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_claim2_stdlib_flags_still_round_trip(pool: ArchiveManager) -> None:
    """Siblings: plain and int flags (combinations included) round-trip, running nothing."""
    PlainFlag._value2member_map_.pop(3, None)
    CALLS.clear()
    loaded = round_trip(pool, Flagged(plain=PlainFlag.A | PlainFlag.B))
    assert loaded.plain is PlainFlag.A | PlainFlag.B and CALLS == []


class RecordingDataclassMeta(type):
    """A metaclass whose attribute lookup is the user's code."""

    def __getattribute__(cls, name: str) -> Any:
        CALLS.append(f"metaclass __getattribute__ {name}")
        return super().__getattribute__(name)


@dataclasses.dataclass
class MetaDataclass(metaclass=RecordingDataclassMeta):
    x: int = 0


class ClassProperty:
    """An object whose ``__class__`` is a property: ``isinstance`` on it runs user code."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        CALLS.append("annotation __class__")
        return ClassProperty


LEVEL = ClassProperty()


@dataclasses.dataclass
class PropertyAnnotated:
    level: LEVEL = 0  # type: ignore[valid-type]


register_sample_class(PropertyAnnotated, "no_code_on_load.PropertyAnnotated")


def registered(cls: type) -> type | None:
    """``cls`` registered, or None when registering refuses it (as refused as at save)."""
    try:
        return register_sample_class(cls, f"no_code_on_load.{cls.__qualname__}")
    except UnencodableError:
        return None


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "sample",
    [
        pytest.param(
            lambda: registered(MetaDataclass) and MetaDataclass(3),
            id="dataclass-metaclass-getattribute",
        ),
        pytest.param(lambda: PropertyAnnotated(4), id="annotation-class-property"),
    ],
)
def test_loading_runs_no_code_of_a_registered_dataclass(
    pool: ArchiveManager, sample: Callable[[], Any]
) -> None:
    """Claim 3 (loading runs none of the user's code; classes a plain lookup cannot rebuild
    are refused at save): enums with a custom metaclass are refused, but a registered
    dataclass with one is saved, and the first load of a process (`_enum_fields` reads
    ``dataclasses.fields(cls)``, ``cls.__mro__``) runs its metaclass's ``__getattribute__``;
    an annotation naming an object is checked with ``isinstance``, which reads its
    ``__class__``, a property of the user's.  Either is fine: refused at save, or no call."""
    value = sample()
    if value is None:
        return  # refused at registration
    name = f"c{next(_names)}"
    try:
        pool.save(name, [value], rollout_id=1)
    except UnencodableError:
        return
    _ENUM_FIELDS.pop(type(value), None)  # as in a process that only loads
    CALLS.clear()
    (loaded,) = pool.open_archive(name).load_samples()
    assert CALLS == []
    assert loaded == value


@pytest.fixture
def fresh_pool(tmp_path: Path) -> Iterator[ArchiveManager]:
    manager = ArchiveManager.open(tmp_path / "fresh_pool", inline_limit=64)
    try:
        yield manager
    finally:
        manager.close()


def _name() -> str:
    return f"brk{next(_names)}"


def _save_or_refuse(fresh_pool: ArchiveManager, samples: list) -> list | None:
    """The loaded samples, or None when save refused them with a library error (and left the
    fresh_pool as it was).  A raw exception from save propagates: that is a failure by itself."""
    before = snapshot_pool(fresh_pool)
    name = _name()
    try:
        fresh_pool.save(name, samples, rollout_id=1)
    except ArchiveError:
        assert snapshot_pool(fresh_pool) == before
        return None
    return fresh_pool.open_archive(name).load_samples()


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


@pytest.mark.timeout(300)
def test_claim2_property_setter_runs_on_load_and_changes_the_value(
    fresh_pool: ArchiveManager,
) -> None:
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
    before = snapshot_pool(fresh_pool)
    with pytest.raises(UnencodableError, match=r"field 'x' of .*Doubler is a property"):
        fresh_pool.save(_name(), [sample], rollout_id=1)
    assert snapshot_pool(fresh_pool) == before
    with (
        pytest.raises(UnencodableError, match=r"field 'x'"),
        fresh_pool.writer(_name(), rollout_id=1) as w,
    ):
        w.add(sample)
    assert snapshot_pool(fresh_pool) == before
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
    return vars(SlotsBase)["a"].__get__(self) + 1  # the slot's own descriptor


def _set_a(self: PropertyOverSlot, value: int) -> None:
    SETTER_CALLS.append(value)
    vars(SlotsBase)["a"].__set__(self, value)


PropertyOverSlot.a = property(_get_a, _set_a)  # type: ignore[assignment]


for _cls in (WithDescriptorField, Hooked, SlotsBase, PropertyOverSlot):
    register_sample_class(_cls)


@pytest.mark.timeout(300)
def test_claim2_siblings_descriptors_and_hooks_never_run_on_load(
    fresh_pool: ArchiveManager,
) -> None:
    """Siblings of the property setter: any data descriptor over a field (a user descriptor, a
    property over a base's slot) is refused at save the same way, and ``__setattr__`` /
    ``__post_init__`` hooks and slot fields load without the class's code."""
    for sample, field in ((WithDescriptorField(n=3), "n"), (PropertyOverSlot(a=1), "a")):
        before = snapshot_pool(fresh_pool)
        with pytest.raises(UnencodableError, match=rf"field '{field}' of .* data descriptor"):
            fresh_pool.save(_name(), [sample], rollout_id=1)
        assert snapshot_pool(fresh_pool) == before
    saved = [Hooked(a=5, b=[1, 2]), SlotsBase(a=7)]
    saved[0].extra = {"k": 1}  # type: ignore[attr-defined]
    name = _name()
    fresh_pool.save(name, saved, rollout_id=1)
    HOOK_CALLS.clear()
    SETTER_CALLS.clear()
    loaded = fresh_pool.open_archive(name).load_samples()
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


@pytest.mark.timeout(300)
def test_claim2_queue_prefixed_dataclass_field_saves_but_never_loads(
    fresh_pool: ArchiveManager,
) -> None:
    """Claim 2 (and "an archive that saved must always load"): a registered dataclass with a
    declared field named ``_queue_*`` and no default is saved with that field silently
    dropped (``_strip_queue``), and every load then fails with UnsupportedFormatError ("the
    stored fields lack '_queue_slot'").  Fix: refuse at save (or registration) a class whose
    declared field the queue rule would drop, naming the field; or only strip undeclared
    attributes."""
    loaded = _save_or_refuse(fresh_pool, [QueueFieldNoDefault(_queue_slot=5, value=1)])
    # decided: a declared field is the class's data, whatever its name; only attributes a
    # queue attaches at run time (undeclared) are live queue state
    assert loaded is not None
    assert loaded[0] == QueueFieldNoDefault(_queue_slot=5, value=1)


@pytest.mark.timeout(300)
def test_claim2_queue_prefixed_dataclass_field_loads_its_default(
    fresh_pool: ArchiveManager,
) -> None:
    """Claim 2: the same with a default: ``_queue_slot=5`` loads as its default ``-1``; the
    sample loads, but not with the saved field values.  Fix as above."""
    loaded = _save_or_refuse(fresh_pool, [QueueFieldDefault(_queue_slot=5, value=1)])
    assert loaded is not None
    assert loaded[0]._queue_slot == 5


@dataclasses.dataclass
class QueueSample(Sample):
    _queue_slot: int = -1


register_sample_class(QueueSample)


@pytest.mark.timeout(300)
def test_claim2_queue_siblings_sample_subclass_kept_undeclared_dropped(
    fresh_pool: ArchiveManager,
) -> None:
    """Siblings: a `Sample` subclass declaring a ``_queue_*`` field keeps it too, while the
    undeclared ``_queue_*`` attributes a queue attaches (to that subclass, to a dataclass, to
    `Sample`) are still dropped, and are no part of the stored record."""
    sub = QueueSample(index=1, _queue_slot=4)
    sub._queue_receipt = object()  # type: ignore[attr-defined]  # live, unencodable
    plain = QueueFieldDefault(_queue_slot=2)
    plain._queue_lease = object()  # type: ignore[attr-defined]
    sample = Sample(index=2)
    sample._queue_receipt = object()  # type: ignore[attr-defined]
    loaded = _save_or_refuse(fresh_pool, [sub, plain, sample])
    assert loaded is not None
    assert type(loaded[0]) is QueueSample and loaded[0]._queue_slot == 4
    assert loaded[1]._queue_slot == 2
    assert not any(hasattr(x, a) for x in loaded for a in ("_queue_receipt", "_queue_lease"))


@pytest.mark.timeout(300)
def test_claim2_sample_helpers_and_status_do_not_load_as_saved(fresh_pool: ArchiveManager) -> None:
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
    loaded: Any = []
    for s in (extra, as_dict, none_status):
        got = _save_or_refuse(fresh_pool, [s])
        loaded.append(None if got is None else got[0])
    # decided: kept as saved (the record lists the fields it stored converted)
    assert all(x is not None for x in loaded)
    assert type(loaded[0].spec_info) is Sample.SpecInfo
    assert vars(loaded[0].spec_info)["custom_counter"] == 7
    assert vars(loaded[0].spec_info) == vars(extra.spec_info)
    assert type(loaded[1].spec_info) is dict and loaded[1].spec_info == as_dict.spec_info
    assert loaded[2].status is None
    assert [vars(x) for x in loaded] == [vars(x) for x in (extra, as_dict, none_status)]


@pytest.mark.timeout(300)
def test_claim2_sample_helper_siblings(fresh_pool: ArchiveManager, tmp_path: Path) -> None:
    """Siblings: ``prefix_cache_info`` and None helpers load as saved too, a helper keeps its
    counters' types, the status given as its value still loads as the member, and an export
    slime's ``from_dict`` would not read back as saved is refused naming the field."""
    none_helpers = Sample(index=0, status=Sample.Status.COMPLETED)
    none_helpers.spec_info = None  # type: ignore[assignment]
    none_helpers.prefix_cache_info = {"cached_tokens": 2, "other": "x"}  # type: ignore[assignment]
    counters = Sample(index=1, status="truncated")  # type: ignore[arg-type]
    counters.prefix_cache_info.cached_tokens = 2.5  # type: ignore[assignment]
    counters.prefix_cache_info.source = "radix"  # type: ignore[attr-defined]
    loaded = _save_or_refuse(fresh_pool, [none_helpers, counters])
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
        fresh_pool.save(name, [bad], rollout_id=1)
        with pytest.raises(UnencodableError, match=rf"sample 0 .* field '{field}'"):
            fresh_pool.open_archive(name).export_pt(tmp_path / "refused.pt")
        assert not list(tmp_path.glob("*refused*"))


class Score(enum.Enum):
    MISSING = math.nan
    ZERO = 0.0


@dataclasses.dataclass
class Scored:
    score: Score = Score.ZERO


register_sample_class(Scored)


@pytest.mark.timeout(300)
def test_claim2_enum_member_with_nan_value_loads_as_a_float(fresh_pool: ArchiveManager) -> None:
    """Claim 2: an enum-typed field is stored as the member's ``.value`` and turned back with
    ``Score(value)`` on load.  For a member whose value is NaN (a "missing score" sentinel),
    the loaded NaN is a new object, so neither the value map (identity) nor the linear scan
    (``==``) finds the member; ``_build_dataclass`` suppresses the ValueError and the field
    loads as the float ``nan`` instead of ``Score.MISSING``.  Fix: check at save that
    ``enum_type(stored value) is member`` and refuse otherwise (naming the field), or store
    members by name."""
    loaded = _save_or_refuse(fresh_pool, [Scored(Score.MISSING)])
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


@pytest.mark.timeout(300)
def test_claim2_enum_siblings_no_enum_code_on_load(fresh_pool: ArchiveManager) -> None:
    """Siblings: the enum's ``_missing_`` hook never runs on load or decides a save (the lookup
    is the same on both sides); a member whose value no lookup finds is refused at save;
    a combination of `enum.Flag` members round-trips."""
    name = _name()
    fresh_pool.save(name, [Enumerated(Picky.A, Perm.R | Perm.W)], rollout_id=1)
    MISSING_CALLS.clear()
    (loaded,) = fresh_pool.open_archive(name).load_samples()
    assert MISSING_CALLS == []
    assert loaded.picky is Picky.A and loaded.perm == Perm.R | Perm.W
    # "b" is no member's value: it is stored and loads as "b", whatever _missing_ says
    name = _name()
    fresh_pool.save(name, [Enumerated(picky="b")], rollout_id=1)  # type: ignore[arg-type]
    assert fresh_pool.open_archive(name).load_samples()[0].picky == "b"
    assert MISSING_CALLS == []
    before = snapshot_pool(fresh_pool)
    with pytest.raises(UnencodableError, match=r"field 'picky' .* would not load as that member"):
        fresh_pool.save(_name(), [Enumerated(Picky.LIST)], rollout_id=1)
    assert snapshot_pool(fresh_pool) == before
