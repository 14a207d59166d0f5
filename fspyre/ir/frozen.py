"""FrozenMap: a small immutable, ordered, hashable mapping for IR fields.

IR nodes need mappings whose order is meaningful (an iteration space lists its symbols in
the order cores are enumerated), so pyrsistent's unordered ``pmap`` does not fit there.
Equality is order-sensitive for the same reason.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any, Generic, TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


class FrozenMap(Mapping[K, V], Generic[K, V]):
    __slots__ = ("_items", "_index", "_hash")

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        pairs = tuple(items.items()) if isinstance(items, Mapping) else tuple(items)
        index = dict(pairs)
        if len(index) != len(pairs):
            raise ValueError(f"duplicate keys in FrozenMap: {[k for k, _ in pairs]}")
        # The slots are written once, here; there is no other way to set them.
        self._items = pairs
        self._index = index
        self._hash: int | None = None

    def __getitem__(self, key: K) -> V:
        return self._index[key]

    def __iter__(self) -> Iterator[K]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    # Mapping's mixins answer these through __getitem__ and a caught KeyError per missing key
    # (and a lookup per item); the stages ask them in their per-op loops, so the index answers.
    def __contains__(self, key: object) -> bool:
        return key in self._index

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V | T, /) -> V | T: ...

    def get(self, key: K, default: object = None, /) -> object:
        return self._index.get(key, default)

    def keys(self) -> KeysView[K]:
        return self._index.keys()

    def values(self) -> ValuesView[V]:
        return self._index.values()

    def items(self) -> ItemsView[K, V]:
        return self._index.items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._items == other._items
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self._items)
        return self._hash

    def __repr__(self) -> str:
        return "FrozenMap({" + ", ".join(f"{k!r}: {v!r}" for k, v in self._items) + "})"

    def set(self, key: K, value: V) -> FrozenMap[K, V]:
        """A new map with ``key`` bound to ``value`` (kept in place if present, else appended)."""
        if key in self._index:
            return FrozenMap((k, value if k == key else v) for k, v in self._items)
        return FrozenMap(self._items + ((key, value),))

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMap, (self._items,))



# -- construction checks shared by the IR nodes --------------------------------------------------
# A list or dict in a field would make a frozen node mutable (and unhashable), so nodes check
# their container fields when built instead of trusting every caller.
def require_map(value: object, what: str, error: type[Exception]) -> None:
    if not isinstance(value, FrozenMap):
        raise error(f"{what} must be a FrozenMap, got a {type(value).__name__} {value!r:.60}; "
                    f"wrap it in FrozenMap(...)")


def require_tuple(value: object, what: str, error: type[Exception], item: type | tuple[type, ...] | None = None,
                  non_empty: bool = False) -> None:
    if not isinstance(value, tuple):
        raise error(f"{what} must be a tuple, got a {type(value).__name__} {value!r:.60}")
    if non_empty and not value:
        raise error(f"{what} must not be empty")
    if item is not None:
        for x in value:
            if not isinstance(x, item):
                names = item.__name__ if isinstance(item, type) else " or ".join(t.__name__ for t in item)
                raise error(f"{what} must hold {names}, got a {type(x).__name__} {x!r:.60}")


def require_int(value: object, what: str, error: type[Exception], least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise error(f"{what} {value!r:.60} must be an integer >= {least}")


_FIELD_TYPES: dict[type, dict[str, Any]] = {}


def require_fields(record: Any, error: type[Exception]) -> None:
    """Each field of an options record holds a value of its declared type: ``bool`` only
    True/False (never a truthy ``"no"``), ``int`` an integer (not a bool), a ``Literal`` one of
    its values, a record type an instance of it, ``X | None`` either. Records call it in
    ``__post_init__``, so a wrong option is refused where it is made, naming the field."""
    cls = type(record)
    if cls not in _FIELD_TYPES:
        _FIELD_TYPES[cls] = typing.get_type_hints(cls)
    for f in dataclasses.fields(record):
        value, tp = getattr(record, f.name), _FIELD_TYPES[cls][f.name]
        if not _fits(value, tp):
            shown = " ".join(repr(value).split())[:60]
            raise error(f"{cls.__name__}({f.name}={shown}): must be {_describe(tp)}")


def _fits(value: object, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return any(type(value) is type(v) and value == v for v in typing.get_args(tp))
    if origin is typing.Union or origin is types.UnionType:
        return any(_fits(value, t) for t in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return type(value) is bool
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is not None:  # a generic such as Callable[...] or tuple[...]: its container only
        return callable(value) if origin is collections.abc.Callable else isinstance(value, origin)
    return tp is Any or isinstance(value, tp)


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(tp)))
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(_describe(t) for t in typing.get_args(tp))
    if tp is type(None):
        return "None"
    if tp is bool:
        return "True or False"
    if tp is int:
        return "an integer"
    return f"a {getattr(tp, '__name__', str(tp))}"
