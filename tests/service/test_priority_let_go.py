"""service/priority.py's let_go_later / let_go_gradually: what a read built is freed a
piece at a time when its block ends, and nothing anyone else holds is touched."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from mla_switchboard.service.priority import let_go_gradually, let_go_later, releasing_gradually


class Node:
    def __init__(self, children: Any = None) -> None:
        self.children = children


def tree(width: int, depth: int) -> Node:
    if depth == 0:
        return Node()
    return Node({i: [tree(width, depth - 1)] for i in range(width)})


def leaves(node: Node) -> list[Node]:
    if node.children is None:
        return [node]
    return [leaf for kids in node.children.values() for k in kids for leaf in leaves(k)]


def test_everything_only_the_walk_held_is_freed() -> None:
    root = tree(30, 3)
    watched = [weakref.ref(x) for x in [root, *leaves(root)]]
    big = {i: Node() for i in range(2000)}  # a large container below the walked levels
    root.children[0].append(Node({"big": big}))
    watched += [weakref.ref(x) for x in big.values()]
    del big
    gc.disable()
    try:
        let_go_gradually(root)
        del root
        assert all(w() is None for w in watched)
    finally:
        gc.enable()


def test_what_others_hold_is_left_whole() -> None:
    shared = {i: Node([i]) for i in range(1000)}
    root = Node({"shared": shared, "own": [Node(), Node()]})
    let_go_gradually(root)
    del root
    assert len(shared) == 1000 and all(n.children == [i] for i, n in shared.items())


def test_a_cycle_is_left_to_the_collector() -> None:
    a = Node()
    a.children = {"self": a, "data": list(range(100))}
    seen = weakref.ref(a)
    let_go_gradually(a)
    del a
    assert seen() is not None and seen().children["data"] == list(range(100))
    gc.collect()
    assert seen() is None


def test_kept_until_the_block_ends_then_freed() -> None:
    with releasing_gradually():
        memo = let_go_later(Node({i: Node() for i in range(100)}))
        seen = weakref.ref(memo)
        del memo
        assert seen() is not None  # the block holds it: no free mid-read
    assert seen() is None


def test_outside_a_block_it_is_an_ordinary_reference() -> None:
    memo = let_go_later(Node())
    seen = weakref.ref(memo)
    with releasing_gradually():
        pass
    assert seen() is memo
    del memo
    assert seen() is None
