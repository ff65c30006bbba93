"""Sample objects to stored records and back: the registry of storable classes (`Sample`,
registered dataclasses, the frameworks' own sample classes, their enums) and the adapters
that turn an object into fields and rebuild it on load.

One job, kept in one module because its parts call each other (registering a class plans its
rebuild; rebuilding a value consults the registry): the boundary at which a load decides what
it may construct.  Loading never imports or instantiates a class by name: only classes in this
registry are rebuilt, anything else comes back as a plain dict
(docs/architecture/safety-rules.md, "Safety rules").
"""

from __future__ import annotations

import abc
import ast
import builtins
import dataclasses
import enum
import functools
import itertools
import struct
import sys
import types
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from ..errors import (
    InvalidNameError,
    UnencodableError,
    UnregisteredClassWarning,
    UnsupportedFormatError,
)
from .sample import (
    QUEUE_PREFIX,
    SAMPLE_CLASS_NAME,
    Sample,
    _dataclass_fields,
    _sample_owned,
    _sample_values,
)

_T = TypeVar("_T")


# --------------------------------------------------------------------------- registry


_CLASSES: dict[str, type] = {}
_NAMES: dict[type, str] = {}
# Per-class cache: field name -> Enum type, for fields whose declared type is one Enum.
_ENUM_FIELDS: dict[type, dict[str, type[enum.Enum]]] = {}


# Metaclasses whose attribute lookup is the standard library's.
_PLAIN_METACLASSES = (type, abc.ABCMeta)


def register_sample_class(cls: type[_T], name: str | None = None) -> type[_T]:
    """Allow instances of the dataclass ``cls`` to be stored and rebuilt on load.

    Usable as a decorator.  ``name`` (default ``"<module>.<qualname>"``) is what archives
    record; keep it stable across refactors.  Registering the same class again under the
    same name is a no-op; a class redefined under the same module and qualname (a reload,
    a notebook cell run twice) replaces its predecessor.

    Registering a class registers the dataclasses and enums its fields declare (``status:
    Status``, ``spec_info: SpecInfo``, ``calls: list[ToolCall]``), and theirs, each under its
    module and qualified name, so that their instances and members are stored anywhere inside
    a sample and load back as themselves.  ``cls`` may be an `enum.Enum` too, to store its
    members inside fields that do not declare it (``metadata["status"]``).

    Raises:
        UnencodableError: ``cls`` is neither a dataclass type nor an enum of the standard
            metaclass.
        InvalidNameError: ``name`` is empty, or taken by another class, or ``cls`` is
            already registered under another name.
    """
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        return _register_enum(cls, name)  # type: ignore[return-value]
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise UnencodableError(f"only dataclass types can be registered as samples, got {cls!r}")
    if type(cls) not in _PLAIN_METACLASSES:
        # NOTE: a load reads the class's attributes (its fields, MRO, namespace), and a custom
        # metaclass's __getattribute__/__getattr__ would run then (as enums: see
        # docs/architecture/samples-and-values.md, "Samples and values")
        raise UnencodableError(
            f"{_qualified(cls)} has the custom metaclass {type(cls).__qualname__}, whose code "
            "loading would run; it cannot be registered as a sample class"
        )
    try:
        object.__new__(cls)
    except TypeError as exc:
        # e.g. a dataclass that subclasses a builtin: loading rebuilds instances this way
        raise UnencodableError(
            f"{_qualified(cls)} cannot be rebuilt without calling its constructor ({exc}); "
            "it cannot be registered as a sample class"
        ) from None
    # NOTE: a class redefined in place (a reload) is a new object with its own plan, but one
    # given a property after a save would keep a stale one: registering reads it afresh.
    _rebuild_plan.cache_clear()
    try:
        _rebuild_plan(cls)
    except TypeError as exc:
        raise UnencodableError(f"{exc}: it cannot be registered as a sample class") from None
    if name is None:
        name = f"{cls.__module__}.{cls.__qualname__}"
    if not isinstance(name, str) or not name:
        raise InvalidNameError(f"sample class name must be a non-empty string, got {name!r}")
    taken_by = _CLASSES.get(name)
    if taken_by is cls:
        return cls
    if taken_by is not None and not _same_definition(taken_by, cls):
        raise InvalidNameError(
            f"sample class name {name!r} is already registered for {_qualified(taken_by)}"
        )
    old_name = _NAMES.get(cls)
    if old_name is not None and old_name != name:
        raise InvalidNameError(
            f"{_qualified(cls)} is already registered as {old_name!r}, cannot add {name!r}"
        )
    if name in _ENUMS:
        raise InvalidNameError(
            f"name {name!r} is already registered for {_qualified(_ENUMS[name])}"
        )
    if taken_by is not None:
        del _NAMES[taken_by]
    _CLASSES[name] = cls
    _NAMES[cls] = name
    _ENUM_FIELDS.pop(cls, None)
    _register_declared(cls)
    return cls


def registered_class(name: str) -> type | None:
    """The class registered under ``name``, or None."""
    return _CLASSES.get(name)


def registered_name(cls: type) -> str | None:
    """The name ``cls`` (exactly this class, not a parent) is registered under, or None."""
    return _NAMES.get(cls)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _same_definition(a: type, b: type) -> bool:
    return a.__module__ == b.__module__ and a.__qualname__ == b.__qualname__


# --------------------------------------------------------------------------- adapters


def is_queue_key(key: object) -> bool:
    """Whether ``key`` names live queue state (``_queue_*``), which is never stored."""
    return isinstance(key, str) and key.startswith(QUEUE_PREFIX)


def _strip_queue(fields: dict[Any, Any], declared: frozenset[str] = frozenset()) -> dict[Any, Any]:
    """``fields`` without its ``_queue_*`` keys, except the ``declared`` field names.

    NOTE: mutates and returns ``fields``; callers pass a dict they own.  The joined-keys test
    is a fast path: this runs for every sample on every save and load.  A field the class
    declares is its data, whatever its name: only attributes a queue attached at run time are
    live queue state (docs/architecture/samples-and-values.md, "Samples and values").
    """
    try:
        # str subclasses joined too: a false hit only takes the exact test below
        joined = "\0".join(fields)
    except TypeError:  # a key that is not a str
        joined = "\0".join(k for k in fields if isinstance(k, str))
    if QUEUE_PREFIX in joined:
        for key in [k for k in fields if is_queue_key(k) and k not in declared]:
            del fields[key]
    return fields


def sample_to_fields(obj: Any) -> tuple[str | None, dict[str, Any]]:
    """Split a sample into (registered class name or None, its stored fields).

    `sample_to_record` without the list of converted fields (see there).

    Raises:
        UnencodableError: as `sample_to_record`.
    """
    name, fields, _ = sample_to_record(obj)
    return name, fields


def sample_to_record(obj: Any) -> tuple[str | None, dict[str, Any], list[str] | None]:
    """Split a sample into (registered class name or None, its stored fields, the fields
    stored converted).

    * `Sample` or a registered subclass: its declared fields and extra attributes; a
      `Sample.Status` is stored as its value, a ``SpecInfo``/``PrefixCacheInfo`` as a dict
      of its fields and extra attributes, and the third item names the fields so converted
      (anything else, a None status or a dict in ``spec_info`` included, is stored as it is
      and loads as it is).
    * another registered dataclass: its fields, then the extra attributes in its
      ``__dict__``.  A member of the one Enum type a field's annotation (or default)
      names is stored as its ``.value``, which `fields_to_sample` turns back.  Enums
      elsewhere are left for the codec to reject (they would load as their values).
      The third item is None.
    * a mapping: ``(None, a shallow copy, None)``.

    Keys and attributes starting with ``_queue_`` are dropped, unless the class declares
    them as fields.  Values are not copied.

    Raises:
        UnencodableError: ``obj`` is neither a mapping nor an instance of a registered class;
            or it would not load as saved: a dataclass field without a value, a field that
            is a property or another data descriptor (setting it back would run its code),
            an enum-typed field holding a non-member that would load as a member, or a
            member that would not load as itself (docs/architecture/samples-and-values.md, "Samples
            and values").
    """
    if isinstance(obj, Mapping):
        if isinstance(obj, dict) and type(obj) is not dict:
            # NOTE: it would load as a plain dict (a defaultdict's factory, a Counter's
            # missing-key 0 gone), as such values inside a sample are refused for.
            raise UnencodableError(
                f"cannot store a {_qualified(type(obj))} sample: it would load as a plain dict; "
                "pass dict(sample) to store it as one"
            )
        return None, _strip_queue(dict(obj)), None
    cls = type(obj)
    name = _NAMES.get(cls)
    if name is None and dataclasses.is_dataclass(cls):
        name = _adopt_framework_class(cls)
    if name is None:
        hint = (
            f"call archive_manager.register_sample_class({cls.__qualname__}) first (it also "
            "registers the dataclasses and enums its fields declare)"
            if dataclasses.is_dataclass(cls)
            else "use archive_manager.Sample, a dict, or a dataclass registered with "
            "archive_manager.register_sample_class()"
        )
        raise UnencodableError(f"cannot store a sample of type {_qualified(cls)}: {hint}")
    fields = _dataclass_state(obj)
    for key, enum_type in _enum_fields(cls).items():
        if key in fields:
            fields[key] = _enum_field_value(cls, key, enum_type, fields[key])
    if not isinstance(obj, Sample):
        return name, fields, None
    converted = []
    owned = _sample_owned(cls)  # type: ignore[arg-type]  # a class is hashable
    status = fields.get("status")
    if status is not None and "status" in owned:
        _check_status(status)
        # a member, or its value as a str (which loads as the member, as it always did)
        fields["status"] = status.value if type(status) is Sample.Status else status
        converted.append("status")
    for key, helper in (
        ("spec_info", Sample.SpecInfo),
        ("prefix_cache_info", Sample.PrefixCacheInfo),
    ):
        if key in owned and type(fields.get(key)) is helper:
            fields[key] = _dataclass_state(fields[key])
            converted.append(key)
    return name, fields, converted


def _shadowed(cls: type, key: str) -> UnencodableError:
    # put into __dict__ behind the class's back: the load would refuse it
    return UnencodableError(
        f"attribute {key!r:.80} of {_qualified(cls)} is in its __dict__ but "
        "the class makes that name a property or another data descriptor"
    )


def _dataclass_state(obj: Any) -> dict[str, Any]:
    """A registered dataclass instance's declared fields, then its other attributes
    (undeclared ``_queue_*`` ones dropped): what `_rebuild` sets back."""
    cls: type = type(obj)
    plan = _rebuild_plan(cls)
    names = plan.plain_names
    if names is not None and plan.instance_dict is not None:
        # NOTE: the common case in one copy (a save reads 3 dataclasses a sample): every
        # field in ``__dict__``, in declaration order, as ``__init__`` puts them; getattr of
        # a plain attribute is then exactly that entry, and the copy keeps what the loop
        # below would write, in the same order.
        # NOTE: only an exact dict with exact str field keys (tests/codec/test_codec_fast.py): ``obj.__dict__``
        # may be replaced by a dict subclass, whose overridden ``__iter__`` and
        # ``__getitem__`` dict() reads while getattr reads the entries (fields saved as the
        # subclass made them up), and a str-subclass key equal to a field's name is found by
        # getattr but written as a key the encoder refuses (or its ``__eq__`` run here).
        state = plan.instance_dict(obj)
        first = tuple(itertools.islice(state, len(names))) if type(state) is dict else None
        if first is not None and all(type(k) is str for k in first) and first == names:
            fields = dict(state)
            if len(fields) > len(names):
                for key in itertools.islice(state, len(names), None):
                    if key in plan.descriptors:
                        raise _shadowed(cls, key)
            return _strip_queue(fields, plan.declared)
    fields = {}
    for step in plan.fields:
        if step.setter is None:
            raise UnencodableError(
                f"sample field {step.name!r} of {_qualified(cls)} is a "
                f"{type(_class_attr(cls, step.name)).__name__} (a data descriptor): its "
                "value could only be set back by running the descriptor's code, and loading "
                "never runs a class's code; make it a plain field (keep the state the "
                "descriptor reads in a field of its own)"
            )
        try:
            # NOTE: not getattr: a class's own ``__getattribute__`` would be saved as what it
            # makes of the field, which `_rebuild` puts back raw and the class then reads
            # through it again (a field read as 40 loaded as 400: tests/codec/test_no_code_on_load.py).  Reading
            # as `_rebuild` writes, the class's code is left out; ``__getattr__`` still
            # answers for a field that has no value, as before.
            value = object.__getattribute__(obj, step.name)
        except AttributeError:
            try:
                value = getattr(obj, step.name)
            except AttributeError:
                # a field(init=False) without a default that __post_init__ never set
                raise UnencodableError(
                    f"sample field {step.name!r} of {_qualified(cls)} has no value"
                ) from None
        fields[step.name] = value
    # slots dataclasses have no __dict__: their fields are all there is
    if plan.instance_dict is not None:
        for key, value in plan.instance_dict(obj).items():
            if key in plan.descriptors and key not in plan.declared:
                raise _shadowed(cls, key)
            fields.setdefault(key, value)
    return _strip_queue(fields, plan.declared)


def _enum_field_value(cls: type, name: str, enum_type: type[enum.Enum], value: Any) -> Any:
    """What an enum-typed field stores: a member's value; anything else as it is, unless the
    load would turn it into a member (which would not be what was saved)."""
    if isinstance(value, enum_type):
        refusal = _enum_refusal(enum_type, value._value_)
        if refusal is not None:
            raise UnencodableError(
                f"sample field {name!r} of {_qualified(cls)} holds {value!r:.80}, which a "
                f"load could not rebuild without running the enum's code: {refusal}; store "
                "its value in a plain field, or use an enum of the standard metaclass"
            )
        if _enum_member(enum_type, value._value_) is not value:
            # e.g. a member whose value is NaN, which no lookup by equality finds
            raise UnencodableError(
                f"sample field {name!r} of {_qualified(cls)} holds {value!r:.80}, whose value "
                f"{value._value_!r:.80} would not load as that member"
            )
        return value._value_
    member = _enum_member(enum_type, value)
    if member is None:
        return value  # stays as it is on load too
    raise UnencodableError(
        f"sample field {name!r} of {_qualified(cls)} holds {value!r:.80}, not a "
        f"{enum_type.__qualname__}, but it would load as {member}; store the member itself"
    )


_FLOAT_BITS = struct.Struct("<d")


def _same_stored(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same stored value: same type, same bits.

    NOTE: no ``==`` on anything but builtins and numpy scalars, so comparing a loaded value
    with an enum member's value never runs a class's ``__eq__``; floats by their bits, so a
    NaN finds the member whose value is that NaN (equality never does).
    """
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is float:
        return _FLOAT_BITS.pack(a) == _FLOAT_BITS.pack(b)
    if a is None or kind in (bool, int, str, bytes):
        return bool(a == b)
    if kind is tuple:
        return len(a) == len(b) and all(map(_same_stored, a, b))
    # A numpy scalar; numpy is not imported for the test: a value cannot be one unless some
    # module imported numpy (docs/architecture/start-up.md, "Start-up").
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(a, numpy.generic):
        return bool(a.dtype == b.dtype and a.tobytes() == b.tobytes())
    return False


# The classes whose enum hooks are the standard library's: a lookup that reaches only these
# runs none of the user's code.
_STDLIB_ENUM_BASES = frozenset(
    {enum.Enum, enum.Flag, enum.IntEnum, enum.IntFlag, enum.ReprEnum, int, object}
)
# What `enum.Flag`'s lookup of a combination calls on the class and its members.
_FLAG_HOOKS = (
    "__new__", "_missing_", "_iter_member_", "_numeric_repr_", "__eq__", "__init__",
    "__getattribute__", "__getattr__", "__setattr__",
)  # fmt: skip


def _enum_refusal(enum_type: type[enum.Enum], value: Any) -> str | None:
    """Why a field storing ``value`` cannot be turned back into a member of ``enum_type``
    without running the enum's code, or None when it can (see `_enum_member`)."""
    if type(enum_type) is not enum.EnumType:
        # EnumType.__call__, __getattr__, __instancecheck__...: a metaclass's code
        return f"its enum class {enum_type.__qualname__} has a custom metaclass"
    get_value = object.__getattribute__
    if (
        type(value) is int
        and issubclass(enum_type, enum.Flag)
        and not _plain_flag(enum_type)
        and not any(
            _same_stored(get_value(m, "_value_"), value) for m in enum_type._member_map_.values()
        )
    ):
        return (
            f"a combination of {enum_type.__qualname__} flags is made by the class's own "
            "code (a mixin type or an overridden enum hook)"
        )
    return None


@functools.cache
def _plain_flag(enum_type: type[enum.Enum]) -> bool:
    """Whether the standard `enum.Flag` lookup of a combination runs only stdlib code here."""
    if getattr(enum_type, "_member_type_", None) not in (
        object,
        int,
    ):  # a mixin's __new__ makes pseudo-members
        return False
    return all(_stdlib_hook(enum_type, hook) for hook in _FLAG_HOOKS)


def _stdlib_hook(cls: type, name: str) -> bool:
    """Whether ``cls`` resolves ``name`` to the standard library's (or to nothing).

    NOTE: EnumType puts ``Enum.__new__`` into every enum class's own namespace, so the
    attribute found is compared with the stdlib bases' attributes, not only its class.
    """
    for klass in cls.__mro__:
        namespace = vars(klass)
        if name in namespace:
            found = namespace[name]
            return klass in _STDLIB_ENUM_BASES or any(
                vars(base).get(name) is found for base in _STDLIB_ENUM_BASES
            )
    return True


def _enum_member(enum_type: type[enum.Enum], value: Any) -> enum.Enum | None:
    """The member of ``enum_type`` a field storing ``value`` loads as, or None.

    One rule for save and load (the save checks a member comes back as itself), and no code
    of the enum runs: its ``_missing_`` hook, its values' ``__eq__``, its metaclass are never
    called; members are read from the class's ``_member_map_``.  An enum class with a custom
    metaclass gets no member (saves refuse it).  For an int no member of an `enum.Flag` has,
    the standard Flag lookup (stdlib code) runs when every hook it calls is the stdlib's and
    its members are plain or ints (`_plain_flag`), so a combination loads as that combination.
    """
    if type(enum_type) is not enum.EnumType:
        return None
    get_value = object.__getattribute__  # not the enum's own __getattribute__
    for member in enum_type._member_map_.values():
        if _same_stored(get_value(member, "_value_"), value):
            return member
    if type(value) is int and issubclass(enum_type, enum.Flag) and _plain_flag(enum_type):
        try:
            return enum_type(value)
        except ValueError:
            return None
    return None


def _check_status(status: object) -> None:
    # NOTE: a record marks a non-None status as converted, and the load turns it back into a
    # `Sample.Status`; a status it cannot turn back (``status="weird"``) would save and
    # never load, so it is refused when saving.
    if type(status) is Sample.Status:
        return
    try:
        Sample.Status(status)
    except (ValueError, TypeError):
        valid = ", ".join(repr(s.value) for s in Sample.Status)
        raise UnencodableError(
            f"Sample.status {status!r:.80} is not a Sample.Status (nor one of {valid})"
        ) from None


def fields_to_sample(
    name: str | None, fields: Mapping[str, Any], converted: Sequence[str] | None = None
) -> Any:
    """Rebuild a sample from `sample_to_record` output.

    A registered name rebuilds its class; other dataclasses get their enum-typed fields
    converted back from their values.  ``None`` or an unknown name returns a plain dict: a
    name never causes an import.  Undeclared ``_queue_*`` keys are dropped.

    For `Sample` and its subclasses, ``converted`` (what `sample_to_record` returned) names
    the fields to turn back into a `Sample.Status` or a helper; the others are set as they
    are.  Records written before it was kept (``None``) are read as older releases read
    them, through slime's ``from_dict`` rules: a None or missing status is pending, a dict or
    None helper becomes a helper of its known counters.

    Instances are rebuilt without calling the class's ``__init__``, ``__post_init__``,
    ``__setattr__`` or any descriptor's ``__set__``: the stored values are put into the
    instance's ``__dict__`` and slots as they are (docs/architecture/samples-and-values.md, "Samples
    and values"), so a ``__post_init__`` that normalises fields does not run twice, a property
    setter does not run, and ``init=False`` fields and frozen classes load as saved.  A field
    the stored fields lack (saved by an older version of the class) gets its default.

    Raises:
        UnsupportedFormatError: a registered class no longer accepts the stored fields.
    """
    cls = _registered_or_adopted(name)[0] if name is not None else None
    if cls is None:
        if name is not None:
            _say_missing(name)
        return _strip_queue(dict(fields))
    try:
        data = _strip_queue(dict(fields), _rebuild_plan(cls).declared)
        if issubclass(cls, Sample):
            if converted is None:
                data = _sample_values(data, _sample_owned(cls))  # type: ignore[arg-type]
            else:
                data = _converted_sample_values(data, converted)
        elif converted:
            data = _declared_values(cls, data, converted)
        return _build_dataclass(cls, data)
    except (TypeError, ValueError, AttributeError) as exc:
        raise UnsupportedFormatError(
            f"cannot rebuild a {name!r} sample from its stored fields: {exc}"
        ) from exc


def _converted_sample_values(data: dict[str, Any], converted: Sequence[str]) -> dict[str, Any]:
    """``data`` with the ``converted`` fields turned back into what `sample_to_record` saw."""
    for key in converted:
        if key not in data:
            continue
        if key == "status":
            data[key] = Sample.Status(data[key])
        elif key == "spec_info":
            data[key] = _rebuild(Sample.SpecInfo, _helper_state(data[key]))
        elif key == "prefix_cache_info":
            data[key] = _rebuild(Sample.PrefixCacheInfo, _helper_state(data[key]))
        else:
            raise ValueError(f"field {key!r:.80} is not one a Sample record converts")
    return data


def _declared_values(cls: type, data: dict[str, Any], converted: Sequence[str]) -> dict[str, Any]:
    """``data`` with each ``converted`` field that holds a dict rebuilt as the one registered
    dataclass its annotation (or default factory) declares: what `Archive.export_pt` wrote as
    plain values for a registered class other than `Sample` (enum fields are turned back by
    `_build_dataclass`)."""
    declared = _declared_dataclasses(cls)
    for key in converted:
        target = declared.get(key)
        if target is not None and type(data.get(key)) is dict and target in _NAMES:
            data[key] = _rebuild(
                target, _strip_queue(dict(data[key]), _rebuild_plan(target).declared)
            )
    return data


def _declared_dataclasses(cls: type) -> dict[str, type]:
    """Each field of ``cls`` whose annotation names exactly one dataclass (or whose default
    factory is one), and that class; annotations are parsed, never evaluated."""
    found: dict[str, type] = {}
    for f in dataclasses.fields(cls):
        hint: Any = f.type
        names = _annotation_names(cls, f.name, hint) if isinstance(hint, str) else [hint]
        classes = [c for c in names if isinstance(c, type) and dataclasses.is_dataclass(c)]
        if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
            classes.append(f.default_factory)
        unique = set(classes)
        if len(unique) == 1:
            found[f.name] = unique.pop()
    return found


def _helper_state(value: Any) -> dict[str, Any]:
    if type(value) is not dict:
        raise TypeError(f"a converted helper is stored as a {type(value).__name__}, not a dict")
    return dict(value)


def _build_dataclass(cls: type, data: dict[str, Any]) -> Any:
    for key, enum_type in _enum_fields(cls).items():
        # NOTE: no isinstance(data[key], enum_type): decoded values are never members, and
        # a custom metaclass's __instancecheck__ is the class's code
        if key in data:
            # not one of its values: keep what was stored rather than fail the load
            member = _enum_member(enum_type, data[key])
            if member is not None:
                data[key] = member
    return _rebuild(cls, data)


@dataclass(frozen=True)
class _FieldStep:
    """How `_rebuild` sets one declared field (and `_dataclass_state` reads it)."""

    name: str
    default: Any
    factory: Any
    # the slot's member descriptor's ``__set__`` (C code), a write into the instance's
    # ``__dict__``, or None: the name is a property or another data descriptor, whose
    # ``__set__`` is the class's code
    setter: Callable[[Any, Any], None] | None


@dataclass(frozen=True)
class _RebuildPlan:
    fields: tuple[_FieldStep, ...]
    declared: frozenset[str]
    # the instance's own ``__dict__`` (the getset descriptor types give every class with
    # one), or None for a slots-only class
    instance_dict: Callable[[Any], dict[str, Any]] | None
    # names the class resolves to a data descriptor (``__class__``, properties...): an
    # attribute of that name in ``__dict__`` is shadowed, and setting it runs their code
    descriptors: frozenset[str]
    # the declared field names in order, when reading them is reading ``__dict__`` (every
    # field a plain instance attribute, attribute access not overridden): `_dataclass_state`
    # then copies ``__dict__`` whole; else None
    plain_names: tuple[str, ...] | None = None


def _class_attr(cls: type, name: str) -> Any:
    """``name`` as the class's MRO holds it, found without running any code (no
    ``__getattr__``, no descriptor's ``__get__``); `dataclasses.MISSING` if absent."""
    for klass in cls.__mro__:
        namespace = vars(klass)
        if name in namespace:
            return namespace[name]
    return dataclasses.MISSING


def _is_data_descriptor(attr: Any) -> bool:
    kind = type(attr)
    return hasattr(kind, "__set__") or hasattr(kind, "__delete__")


@functools.cache
def _rebuild_plan(cls: type) -> _RebuildPlan:
    dict_attr = _class_attr(cls, "__dict__")
    if dict_attr is dataclasses.MISSING:
        instance_dict = None
    elif type(dict_attr) is types.GetSetDescriptorType:
        instance_dict = dict_attr.__get__
    else:
        # a class that defines ``__dict__`` itself: reaching the instance's would run its code
        raise TypeError(f"{_qualified(cls)} defines __dict__; it cannot be rebuilt safely")

    def into_dict(name: str) -> Callable[[Any, Any], None]:
        def put(obj: Any, value: Any) -> None:
            if instance_dict is None:
                raise TypeError(f"{_qualified(cls)} has no slot for {name!r}")
            instance_dict(obj)[name] = value

        return put

    steps = []
    into: set[str] = set()
    for f in dataclasses.fields(cls):
        attr = _class_attr(cls, f.name)
        if type(attr) is types.MemberDescriptorType:
            setter: Callable[[Any, Any], None] | None = attr.__set__
        elif _is_data_descriptor(attr):
            setter = None
        else:
            setter = into_dict(f.name)
            into.add(f.name)
        steps.append(_FieldStep(f.name, f.default, f.default_factory, setter))
    resolved: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        resolved.update(vars(klass))
    descriptors = frozenset(k for k, v in resolved.items() if _is_data_descriptor(v))
    plain = (
        instance_dict is not None
        and resolved.get("__getattribute__") is object.__getattribute__
        and all(s.name not in descriptors and s.name in into for s in steps)
    )
    return _RebuildPlan(
        tuple(steps),
        frozenset(f.name for f in steps),
        instance_dict,
        descriptors,
        tuple(s.name for s in steps) if plain else None,
    )


def _rebuild(cls: type, data: dict[str, Any]) -> Any:
    """An instance of the dataclass ``cls`` holding ``data`` (which this consumes): the
    declared fields first, then the extra attributes; no code of the class runs, except a
    default factory for a field the data lacks.

    NOTE: ``object.__setattr__`` passes a class's ``__setattr__`` but still calls a data
    descriptor's ``__set__`` (a property setter ran on load and changed the value); values
    go straight into the instance's ``__dict__``, or through a slot's member descriptor.
    A field that is a property (saves refuse those; an archive of an older release may hold
    one) is put into ``__dict__`` too, where the property shadows it: the state it reads
    comes back through the fields and attributes that hold it.
    """
    plan = _rebuild_plan(cls)
    obj: Any = object.__new__(cls)
    missing = dataclasses.MISSING
    for step in plan.fields:
        if step.name in data:
            value = data.pop(step.name)
        elif step.default is not missing:
            value = step.default
        elif step.factory is not missing:
            value = step.factory()
        else:
            raise TypeError(f"the stored fields lack {step.name!r}, which has no default")
        if step.setter is not None:
            step.setter(obj, value)
        elif plan.instance_dict is not None:
            plan.instance_dict(obj)[step.name] = value
        else:
            raise TypeError(f"{_qualified(cls)} has no slot for {step.name!r}")
    if data:
        if plan.instance_dict is None:
            raise TypeError(f"{_qualified(cls)} has no __dict__ for {next(iter(data))!r:.80}")
        shadowed = plan.descriptors.intersection(data)
        if shadowed:
            # what no save writes (it refuses such attributes): ``__class__``, a property
            raise TypeError(
                f"stored attribute {min(shadowed)!r:.80} is a data descriptor of the class"
            )
        plan.instance_dict(obj).update(data)
    return obj


def _enum_fields(cls: type) -> dict[str, type[enum.Enum]]:
    """The fields of ``cls`` whose annotation (or default) names one Enum type.

    Annotations are read, never evaluated: ``typing.get_type_hints`` runs ``eval`` on string
    annotations (every annotation under ``from __future__ import annotations``), which is
    arbitrary code; a string annotation is parsed and its names looked up in the namespaces of
    the class that declares it and of its module (see `_resolve_annotation`).  The fields a
    `Sample` subclass keeps from `Sample` follow `Sample`'s own rules, not this one.
    """
    cached = _ENUM_FIELDS.get(cls)
    if cached is not None:
        return cached
    sample_fields = _dataclass_fields(Sample)
    found: dict[str, type[enum.Enum]] = {}
    for f in dataclasses.fields(cls):
        if sample_fields.get(f.name) is f:
            continue
        hint = f.type
        if isinstance(hint, str):
            hint = _resolve_annotation(cls, f.name, hint)
        enum_type = _single_enum(hint)
        if enum_type is None and issubclass(type(f.default), enum.Enum):
            enum_type = type(f.default)
        if enum_type is not None:
            found[f.name] = enum_type
    _ENUM_FIELDS[cls] = found
    return found


# What ``Optional[X]``, ``Union[X, Y]`` and ``X | Y`` are (typing's alias is no UnionType).
_UNION_TYPES = (types.UnionType, type(Union[int, str]))  # noqa: UP007


def _single_enum(hint: Any) -> type[enum.Enum] | None:
    # NOTE: by the hint's exact type only: ``isinstance`` reads an object's ``__class__``,
    # which an annotation naming a user's object may make a property (code run on load)
    kind = type(hint)
    if kind is list:  # the members of a union `_resolve_annotation` parsed
        enums = [a for a in hint if issubclass(type(a), type) and issubclass(a, enum.Enum)]
        return enums[0] if len(enums) == 1 else None
    if issubclass(kind, type):
        return hint if issubclass(hint, enum.Enum) else None
    if issubclass(kind, _UNION_TYPES) and typing.get_origin(hint) in (Union, types.UnionType):
        return _single_enum(list(typing.get_args(hint)))
    return None


_UNRESOLVED = object()


def _annotation_scopes(cls: type, name: str) -> list[dict[str, Any]]:
    """Where a string annotation of field ``name`` of ``cls`` finds its names: the namespace
    of the class that declares the field, its module's, the builtins (plain dictionaries:
    looking a name up runs no code)."""
    owner: type = cls
    for klass in cls.__mro__:
        if name in vars(klass).get("__annotations__", {}):
            owner = klass
            break
    module = sys.modules.get(owner.__module__)
    scopes = [dict(vars(owner))]
    if type(module) is types.ModuleType:
        scopes.append(module.__dict__)
    scopes.append(vars(builtins))
    return scopes


def _resolve_annotation(cls: type, name: str, text: str) -> Any:
    """What the string annotation ``text`` of field ``name`` names, found without running code.

    Names, dotted names, ``X | Y``, ``Optional[X]`` and ``Union[X, ...]`` are resolved by plain
    dictionary lookups in the declaring class's namespace, its module's and the builtins (a
    union as the list of its members); anything else resolves to nothing, so the field is no
    enum field unless its default is a member.
    """
    scopes = _annotation_scopes(cls, name)
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    found = _resolve_node(node, scopes)
    return None if found is _UNRESOLVED else found


def _resolve_node(node: ast.expr, scopes: list[dict[str, Any]]) -> Any:
    if isinstance(node, ast.Name):
        for scope in scopes:
            if node.id in scope:
                return scope[node.id]
        return _UNRESOLVED
    if isinstance(node, ast.Constant) and node.value is None:
        return type(None)
    if isinstance(node, ast.Attribute):
        base = _resolve_node(node.value, scopes)
        if type(base) is types.ModuleType:
            return base.__dict__.get(node.attr, _UNRESOLVED)
        if isinstance(base, type):
            found = _class_attr(base, node.attr)
            return _UNRESOLVED if found is dataclasses.MISSING else found
        return _UNRESOLVED
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        parts = [_resolve_node(node.left, scopes), _resolve_node(node.right, scopes)]
        return [m for p in parts for m in (p if isinstance(p, list) else [p])]
    if isinstance(node, ast.Subscript):
        origin = _resolve_node(node.value, scopes)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if origin is typing.Optional and len(args) == 1:
            return [_resolve_node(args[0], scopes), type(None)]
        if origin is typing.Union:
            return [_resolve_node(a, scopes) for a in args]
    return _UNRESOLVED


# --------------------------------------------------------------------------- values inside fields

#: The frameworks' own sample classes (module and qualified name): saved without a call to
#: `register_sample_class`, and rebuilt on load when the loading process has imported their
#: module; a load never imports one (docs/architecture/samples-and-values.md, "Samples and values").
FRAMEWORK_SAMPLE_CLASSES = frozenset({"slime.utils.types.Sample", "vime.utils.types.Sample"})

_ENUMS: dict[str, type[enum.Enum]] = {}
_ENUM_NAMES: dict[type, str] = {}


def _register_enum(enum_type: type[enum.Enum], name: str | None) -> type[enum.Enum]:
    if type(enum_type) is not enum.EnumType:
        # EnumType.__call__, __getattr__, __instancecheck__...: a metaclass's code
        raise UnencodableError(
            f"{_qualified(enum_type)} has the custom metaclass {type(enum_type).__qualname__}, "
            "whose code loading would run; it cannot be registered"
        )
    if name is None:
        name = _qualified(enum_type)
    if not isinstance(name, str) or not name:
        raise InvalidNameError(f"enum name must be a non-empty string, got {name!r}")
    taken_by = _ENUMS.get(name)
    if taken_by is enum_type:
        return enum_type
    if (taken_by is not None and not _same_definition(taken_by, enum_type)) or name in _CLASSES:
        raise InvalidNameError(
            f"name {name!r} is already registered for {_qualified(taken_by or _CLASSES[name])}"
        )
    old_name = _ENUM_NAMES.get(enum_type)
    if old_name is not None and old_name != name:
        raise InvalidNameError(
            f"{_qualified(enum_type)} is already registered as {old_name!r}, cannot add {name!r}"
        )
    if taken_by is not None:
        del _ENUM_NAMES[taken_by]
    _ENUMS[name] = enum_type
    _ENUM_NAMES[enum_type] = name
    return enum_type


def _declared_types(cls: type) -> list[type]:
    """The dataclass and enum types the fields of ``cls`` declare (in their annotations, at
    any depth: ``list[X]``, ``X | None``, ``dict[str, X]``) or default to, without running
    code: string annotations are parsed, their names looked up (see `_resolve_annotation`)."""
    found: list[type] = []

    def add(candidate: Any) -> None:
        if (
            isinstance(candidate, type)
            and candidate is not cls
            and candidate not in found
            and (dataclasses.is_dataclass(candidate) or issubclass(candidate, enum.Enum))
        ):
            found.append(candidate)

    def walk_hint(hint: Any, depth: int = 0) -> None:
        if depth > 8:
            return
        if isinstance(hint, type):
            add(hint)
        for arg in typing.get_args(hint):
            walk_hint(arg, depth + 1)

    for f in dataclasses.fields(cls):
        hint = f.type
        if isinstance(hint, str):
            for candidate in _annotation_names(cls, f.name, hint):
                add(candidate)
        else:
            walk_hint(hint)
        if isinstance(f.default, enum.Enum) or (
            dataclasses.is_dataclass(f.default) and not isinstance(f.default, type)
        ):
            add(type(f.default))
        if isinstance(f.default_factory, type):
            add(f.default_factory)
    return found


def _annotation_names(cls: type, name: str, text: str) -> list[Any]:
    """Every name and dotted name in the string annotation ``text``, resolved as
    `_resolve_annotation` resolves them (names that resolve to nothing are left out)."""
    scopes = _annotation_scopes(cls, name)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Name, ast.Attribute)):
            found = _resolve_node(node, scopes)
            if found is not _UNRESOLVED:
                out.append(found)
    return out


def _register_declared(cls: type) -> None:
    """Register what the fields of the just-registered ``cls`` declare (and their own
    fields', recursively), each under its module and qualified name; a type that cannot be
    registered is left out (a save meeting one of its values refuses it, naming it)."""
    for declared in _declared_types(cls):
        if declared in _NAMES or declared in _ENUM_NAMES:
            continue
        try:
            if issubclass(declared, enum.Enum):
                _register_enum(declared, None)
            else:
                register_sample_class(declared)  # registers what it declares in turn
        except (UnencodableError, InvalidNameError):
            continue


def _framework_class(qualified: str) -> type | None:
    """The framework sample class ``qualified`` names (or the one whose nested class it
    names), when its module is already imported: found by dictionary lookups in the module's
    namespace, never an import or a module's ``__getattr__``."""
    for known in FRAMEWORK_SAMPLE_CLASSES:
        if qualified != known and not qualified.startswith(known + "."):
            continue
        module_name, _, class_name = known.rpartition(".")
        module = sys.modules.get(module_name)
        if type(module) is not types.ModuleType:
            return None
        found = module.__dict__.get(class_name)
        if (
            isinstance(found, type)
            and dataclasses.is_dataclass(found)
            and _qualified(found) == known
        ):
            return found
    return None


def _adopt_framework_class(cls: type) -> str | None:
    """Register ``cls`` if it is a framework's sample class or declared by one (see
    `FRAMEWORK_SAMPLE_CLASSES`); its registered name, or None."""
    outer = _framework_class(_qualified(cls))
    if outer is None:
        return None
    if outer not in _NAMES:
        register_sample_class(outer)
    return _NAMES.get(cls) or _ENUM_NAMES.get(cls)


def _registered_or_adopted(name: str) -> tuple[type | None, type[enum.Enum] | None]:
    cls = _CLASSES.get(name)
    enum_type = _ENUMS.get(name)
    if cls is None and enum_type is None:
        outer = _framework_class(name)
        if outer is not None:
            if outer not in _NAMES:
                register_sample_class(outer)
            cls, enum_type = _CLASSES.get(name), _ENUMS.get(name)
    return cls, enum_type


def _refuse_unregistered(cls: type, what: str) -> UnencodableError:
    return UnencodableError(
        f"cannot store a {_qualified(cls)} {what}: call "
        f"archive_manager.register_sample_class({cls.__qualname__}) first (registering a "
        "sample class also registers the dataclasses and enums its fields declare)"
    )


def value_to_record(value: Any) -> tuple[str, dict[str, Any]]:
    """A registered dataclass instance found inside a sample's field: ``(registered name,
    its fields and extra attributes)`` for the codec to store (undeclared ``_queue_*``
    attributes dropped, enum members left to the codec).

    Raises:
        UnencodableError: its class is not registered (nor a framework's; the message names
            the call that fixes it), or it would not load as saved (see `sample_to_record`).
    """
    cls = type(value)
    name = _NAMES.get(cls) or _adopt_framework_class(cls)
    if name is None or name not in _CLASSES:
        raise _refuse_unregistered(cls, "inside a sample")
    return name, _dataclass_state(value)


def enum_to_record(member: enum.Enum) -> tuple[str, Any]:
    """An enum member found inside a sample's field: ``(registered name of its enum, its
    value)``; the value loads back as this very member.

    Raises:
        UnencodableError: its enum is not registered (the message names the call that fixes
            it), or the value would not load as this member without running the enum's code.
    """
    enum_type = type(member)
    name = _ENUM_NAMES.get(enum_type) or _adopt_framework_class(enum_type)
    if name is None or name not in _ENUMS:
        raise _refuse_unregistered(enum_type, "member inside a sample")
    value = object.__getattribute__(member, "_value_")
    refusal = _enum_refusal(enum_type, value)
    if refusal is not None or _enum_member(enum_type, value) is not member:
        raise UnencodableError(
            f"{member!r:.80} would not load as itself"
            + (f": {refusal}" if refusal else f" (its value {value!r:.80} finds another member)")
        )
    return name, value


#: Class names met on load that the loading process has not registered: each is said once.
_MISSING_SAID: set[str] = set()


def _say_missing(name: str) -> None:
    if name in _MISSING_SAID:
        return
    _MISSING_SAID.add(name)
    warnings.warn(
        f"the archive holds {name!r} values, a class this process has not registered: they "
        f"load as plain dicts (or enum values); register the class with "
        "archive_manager.register_sample_class() before loading to get it back",
        UnregisteredClassWarning,
        stacklevel=2,
    )


def record_to_value(name: str, fields: dict[str, Any]) -> Any:
    """What `value_to_record` stored: an instance of the class registered as ``name`` (a
    framework class found among the loaded modules counts), else the fields as a dict (and
    an `UnregisteredClassWarning`, once per name).

    Raises:
        UnsupportedFormatError: the registered class no longer accepts the stored fields.
    """
    cls, _ = _registered_or_adopted(name)
    if cls is None:
        _say_missing(name)
        return _strip_queue(fields)
    try:
        return _rebuild(cls, _strip_queue(fields, _rebuild_plan(cls).declared))
    except (TypeError, ValueError, AttributeError) as exc:
        raise UnsupportedFormatError(
            f"cannot rebuild a {name!r} value from its stored fields: {exc}"
        ) from exc


def record_to_enum(name: str, value: Any) -> Any:
    """What `enum_to_record` stored: the member of the enum registered as ``name`` (a
    framework's found among the loaded modules counts), else the stored value (and an
    `UnregisteredClassWarning`, once per name).

    Raises:
        UnsupportedFormatError: the registered enum has no member of that value any more.
    """
    _, enum_type = _registered_or_adopted(name)
    if enum_type is None:
        _say_missing(name)
        return value
    member = _enum_member(enum_type, value)
    if member is None:
        raise UnsupportedFormatError(f"enum {name!r} has no member of value {value!r:.80}")
    return member


# after the functions registering uses
register_sample_class(Sample, SAMPLE_CLASS_NAME)
