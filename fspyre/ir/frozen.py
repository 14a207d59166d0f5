"""FrozenMap: a small immutable, ordered, hashable mapping for IR fields.

IR nodes need mappings whose order is meaningful (an iteration space lists its symbols in
the order cores are enumerated), so pyrsistent's unordered ``pmap`` does not fit there.
Equality is order-sensitive for the same reason.
"""

from __future__ import annotations

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
