"""Naming every dim of a captured FX graph, so that the builder's broadcast-by-name does what
torch's broadcast-by-position does.

Every tensor axis (and every reduced or contracted axis) is a key; an op's rule says which
operand axis lines up with which of its iteration axes. Aligned axes of equal size (not 1) are
unified into one class, and a class is one name. Two constraints can refuse a union:

- the two classes already meet in one op or tensor (``x @ x.T``: rows and columns both come
  from ``x``'s first axis but must be different dims of the product), or
- both carry different user names (``a[A, B] + b[C, B]``: the first name wins, as in the anchor).

A refused union is not an error: the lowering renames that operand's axis (a view) to the
name of the iteration axis it lines up with. Size-1 axes unify only with the axis an
``expand`` stretches them to (the builder's expand keeps a dim's name); elsewhere they are
renamed where they broadcast. A class takes its user name, else a generated one from its first axis in
graph order: ``<input>_<axis>`` for an input's axis, ``<node>_<axis>`` for a result's axis,
``<node>_r<k>`` for a reduced axis. Same program, same names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch.fx as fx

from fspyre.errors import FrontendError
from fspyre.frontend.annotations import declared_dims
from fspyre.frontend.ops import RULES, Alignment, Key, describe_node, shape, supported_ops


@dataclass(frozen=True, slots=True, kw_only=True)
class Placeholder:
    """A graph input: its FX node name, the fspyre input name, and user dim names if any."""

    node: str
    name: str
    dims: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DimNames:
    names: Mapping[Key, str]
    sizes: Mapping[str, int]  # every name of a dim longer than 1, with its size
    outputs: Mapping[str, tuple[tuple[Key, ...], ...]]  # node -> the keys of each of its results
    alignments: Mapping[str, Alignment]

    def of(self, node: str, index: int = 0) -> tuple[str, ...]:
        return tuple(self.names[k] for k in self.outputs[node][index])


class _Classes:
    """Union-find over axis keys; a root holds its class's size, user name and the nodes
    (ops and tensors) its axes appear in."""

    def __init__(self) -> None:
        self.parent: dict[Key, Key] = {}
        self.order: dict[Key, int] = {}
        self.size: dict[Key, int] = {}  # key -> the size of that axis
        self.csize: dict[Key, int] = {}  # root -> the class's size (1 only if every axis has size 1)
        self.groups: dict[Key, set[str]] = {}
        self.user: dict[Key, tuple[str, str]] = {}  # root -> (name, where it was given)

    def add(self, key: Key, size: int, group: str) -> None:
        if key in self.parent:
            return
        self.parent[key] = key
        self.order[key] = len(self.order)
        self.size[key] = self.csize[key] = size
        self.groups[key] = {group}

    def find(self, key: Key) -> Key:
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: Key, b: Key) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return True
        if self.groups[ra] & self.groups[rb] or 1 != self.csize[ra] != self.csize[rb] != 1:
            return False
        ua, ub = self.user.get(ra), self.user.get(rb)
        if ua and ub and ua[0] != ub[0]:
            return False
        if self.order[rb] < self.order[ra]:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.csize[ra] = max(self.csize[ra], self.csize.pop(rb))
        self.groups[ra] |= self.groups.pop(rb)
        self.user.pop(rb, None)
        if user := ua or ub:
            self.user[ra] = user
        return True


def name_dims(graph: fx.Graph, placeholders: Mapping[str, Placeholder]) -> DimNames:
    """Align every op, unify axes, and name each class. Raises FrontendError listing every
    unsupported op at once, or naming the two tensors whose same-named dims differ in size."""
    unsupported = [n for n in graph.nodes if n.op == "call_function" and n.target not in RULES]
    if unsupported:
        lines = "\n".join(f"  - {describe_node(n)}" for n in unsupported)
        raise FrontendError(
            f"fspyre cannot capture {len(unsupported)} op(s):\n{lines}\n"
            f"Rewrite them with supported ops, or ask for a lowering. Supported: {', '.join(supported_ops())}"
        )
    declared = declared_dims()
    uf = _Classes()
    owner: dict[str, Key] = {}  # user name -> a key of its class
    unit_names: dict[Key, str] = {}  # user names of size-1 axes, which never unify
    outputs: dict[str, tuple[tuple[Key, ...], ...]] = {}
    alignments: dict[str, Alignment] = {}

    def give(key: Key, name: str, where: str) -> None:
        size = uf.size[key]
        if size == 1:
            unit_names[key] = name
            return
        if name in declared and declared[name] != size:
            raise FrontendError(
                f"{where} is named {name!r} with size {size}, but {name!r} was declared with size "
                f"{declared[name]} (declare_tensor_dim({name!r}, {declared[name]})); make them agree"
            )
        if name in owner:
            other = uf.find(owner[name])
            if uf.csize[other] != size:
                raise FrontendError(
                    f"dim name {name!r}: {uf.user[other][1]} has size {uf.csize[other]} but {where} has size {size}; "
                    f"two dims with one name must have one size"
                )
            if not uf.union(key, other):
                raise FrontendError(
                    f"dim name {name!r} is given to {uf.user[other][1]} and to {where}, which are different "
                    f"dims of one op or tensor; give them different names"
                )
            return
        owner[name] = key
        uf.user[uf.find(key)] = (name, where)

    for node in graph.nodes:
        if node.op == "placeholder":
            if node.name not in placeholders:
                continue
            ph = placeholders[node.name]
            keys = tuple(("out", node.name, 0, j) for j in range(len(shape(node))))
            outputs[node.name] = (keys,)
            for key, size in zip(keys, shape(node)):
                uf.add(key, size, node.name)
            for j, (key, n) in enumerate(zip(keys, ph.dims or ())):
                give(key, n, f"dim {j} of input {ph.name}")
        elif node.op == "call_function":
            al = RULES[node.target].align(node)
            alignments[node.name] = al
            outputs[node.name] = al.outputs
            for i, keys in enumerate(al.outputs):
                for key, size in zip(keys, shape(node, i)):
                    uf.add(key, size, node.name)
            for key, size in al.reduced:
                uf.add(key, size, node.name)
            for key, n in al.user_names.items():
                give(key, n, f"dim {key[3]} of {node.name} (name_tensor_dims)")
            for use in al.uses:
                for src, dst in zip(outputs[use.arg.name][use.index], use.dst):
                    if dst is None:
                        continue
                    stretched = use.stretch and uf.size[src] == 1 and src not in unit_names
                    if uf.size[src] == uf.size[dst] != 1 or stretched:
                        uf.union(src, dst)

    input_names = {p.node: p.name for p in placeholders.values()}
    taken = {u[0] for u in uf.user.values()} | set(unit_names.values())
    names: dict[Key, str] = {}
    root_name: dict[Key, str] = {}
    for key in sorted(uf.parent, key=uf.order.__getitem__):
        root = uf.find(key)
        if root not in root_name:
            if key in unit_names:
                root_name[root] = unit_names[key]
            elif root in uf.user:
                root_name[root] = uf.user[root][0]
            else:
                root_name[root] = _fresh(_base(root, input_names), taken)
        names[key] = root_name[root]
    # (a size-0 axis is of a result fspyre does not compute: batch norm's empty saved statistics)
    sizes = {names[k]: uf.size[k] for k in names if uf.size[k] not in (0, 1)}
    return DimNames(names=names, sizes=sizes, outputs=outputs, alignments=alignments)


def _base(key: Key, input_names: Mapping[str, str]) -> str:
    if key[0] == "red":
        return f"{key[1]}_r{key[2]}"
    _, node, index, axis = key
    stem = input_names.get(node, node)
    return f"{stem}_{axis}" if index == 0 else f"{stem}_{index}_{axis}"


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 2
    while name in taken:
        name = f"{base}_{k}"
        k += 1
    taken.add(name)
    return name
