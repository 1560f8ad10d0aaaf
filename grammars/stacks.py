"""Parser stacks, hash-consed, and the one way to take a call edge.

A stack id names (parent id, return state, tag); id 0 is the empty stack.  A return state that only returns
(`Automaton.tail`) is not pushed: a chain of calls in tail position keeps the stack flat.  The call into an
object members rule always pushes a frame, since the frame's tag is where the object records the members
it wrote (`object_members`); the guarded call edges of that rule read and update the tag of the top frame.
"""

from __future__ import annotations

from array import array

from .automaton import Automaton
from .object_members import EMPTY_TAG, Tag


class StackArena:
    """Stack ids of one automaton, and the call edges between configurations (state, stack id)."""

    def __init__(self, automaton: Automaton):
        # arrays, not lists: the garbage collector never walks them (a list of ints lengthens every full
        # collection by its length, and a server keeps thousands of stacks per grammar)
        self.parent = array("q", [0])
        self.ret = array("q", [-1])
        self.tag: list[Tag | None] = [None]
        self._ids: dict[tuple[int, int, Tag | None], int] = {}
        # tuples, not lists: as fast to index, and once they survive a collection the garbage collector
        # stops walking their items (a server holds many grammars; lists would lengthen every full collection)
        self._tail = tuple(automaton.tail.tolist())
        self._framed = tuple(automaton.framed.tolist())
        self._callee = tuple(automaton.call_callee.tolist())
        self._ret = tuple(automaton.call_ret.tolist())
        self._guard = tuple(automaton.call_guard.tolist())
        self._guards = automaton.guards
        self._frames = automaton.frames

    def _id(self, parent: int, ret: int, tag: Tag | None) -> int:
        key = (parent, ret, tag)
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = len(self.parent)
            self.parent.append(parent)
            self.ret.append(ret)
            self.tag.append(tag)
        return sid

    def call(self, stack: int, c: int) -> tuple[int, int] | None:
        """The configuration (callee state, stack) after taking call edge `c` from a configuration on
        `stack`; None where the edge's guard is closed."""
        guard = self._guard[c]
        if guard >= 0:
            frame, kind, member = self._guards[guard]
            tag = self._frames[frame].members.guard(kind, member, self.tag[stack])
            if tag is None:
                return None
            if tag != self.tag[stack]:
                stack = self._id(self.parent[stack], self.ret[stack], tag)
        callee, ret = self._callee[c], self._ret[c]
        if self._framed[callee]:
            return callee, self._id(stack, ret, EMPTY_TAG)
        if self._tail[ret]:
            return callee, stack
        return callee, self._id(stack, ret, None)
