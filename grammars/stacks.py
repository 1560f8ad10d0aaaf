"""Parser stacks, hash-consed, and the one way to take a call edge.

A stack id names (parent id, return state, tag); id 0 is the empty stack.  A return state that only returns
(`Automaton.tail`) is not pushed: a chain of calls in tail position keeps the stack flat.  The call into an
object members rule always pushes a frame, since the frame's tag is where the object records the members
it wrote (`object_members`); the guarded call edges of that rule read and update the tag of the top frame.
The call into a captured terminal (`ir.Capture`) pushes a frame too, whose tag is the text written inside
it so far (bytes): where the terminal ends, the text joins the texts of the object frame below, unless it
is one of them already.
"""

from __future__ import annotations

import bisect
from array import array
from typing import Iterable

import numpy as np

from .automaton import CAPTURE_FRAME, Automaton
from .object_members import CLAIM, EMPTY_TAG, Tag

FrameTag = Tag | bytes | None   # an object's members, a captured text, nothing
Edge = tuple[int, int, FrameTag, bool, FrameTag]    # see `StackArena.edge`


class StackArena:
    """Stack ids of one automaton, and the call edges between configurations (state, stack id)."""

    def __init__(self, automaton: Automaton):
        # arrays, not lists: the garbage collector never walks them (a list of ints lengthens every full
        # collection by its length, and a server keeps thousands of stacks per grammar)
        self.parent = array("q", [0])
        self.ret = array("q", [-1])
        self.tag: list[FrameTag] = [None]
        self._ids: dict[tuple[int, int, FrameTag], int] = {}
        # tuples, not lists: as fast to index, and once they survive a collection the garbage collector
        # stops walking their items (a server holds many grammars; lists would lengthen every full collection); a
        # dict of ints only is never tracked.  Return states are structural, the first of a grammar's states, and
        # the framed ones are few: the terminals' states, most of them, are not copied (0.2 ms of a Kubernetes
        # schema's first mask)
        self._tail = tuple(automaton.tail[:automaton.first_terminal].tolist())
        framed = np.flatnonzero(automaton.framed)
        self._framed = dict(zip(framed.tolist(), automaton.framed[framed].tolist()))
        self._callee = tuple(automaton.call_callee.tolist())
        self._ret = tuple(automaton.call_ret.tolist())
        self._guard = tuple(automaton.call_guard.tolist())
        self._guards = automaton.guards
        self._frames = automaton.frames
        self.captures = bool((automaton.framed == CAPTURE_FRAME).any())

    def _id(self, parent: int, ret: int, tag: FrameTag) -> int:
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
        taken = self.calls(stack, (c,))
        return taken[0] if taken else None

    def calls(self, stack: int, edges: Iterable[int]) -> list[tuple[int, int]]:
        """`call` of each of `edges` from a configuration on `stack`, those whose guard is open.  A closure
        takes every call edge of each state it meets, and a byte that opens a large object's claims takes a hundred
        members' (`CompiledGrammar._opened`): one pass that builds no edge tuple, and skips a closed claim by its
        object's claimable members, asked once, before any tag is built."""
        out = []
        guard_of, callees, rets, guards, frames = self._guard, self._callee, self._ret, self._guards, self._frames
        tag = self.tag[stack]
        claimable: tuple[int, int] = (-1, 0)    # (frame, its claimable members), asked once for all its claims
        for c in edges:
            below = stack
            guard = guard_of[c]
            if guard >= 0:
                frame, kind, member = guards[guard]
                members = frames[frame].members
                if kind == CLAIM:
                    if claimable[0] != frame:
                        claimable = (frame, members.claimable(tag))
                    if not claimable[1] >> member & 1:
                        continue
                retagged = members.guard(kind, member, tag)
                if retagged is None:
                    continue
                if retagged != tag:
                    below = self._id(self.parent[stack], self.ret[stack], retagged)
            callee, ret = callees[c], rets[c]
            push, pushed = self._frame_of(callee, ret)
            out.append((callee, self._id(below, ret, pushed) if push else below))
        return out

    def _frame_of(self, callee: int, ret: int) -> tuple[bool, FrameTag]:
        """Whether a call into `callee` returning to `ret` pushes a frame, and the pushed frame's tag: the call into
        an object's members or a captured text always pushes one (its tag records what it writes), any other
        unless it returns where only returning is left (`Automaton.tail`)."""
        framed = self._framed.get(callee)
        if framed:
            return True, b"" if framed == CAPTURE_FRAME else EMPTY_TAG
        return not self._tail[ret], None

    def edge(self, stack: int, c: int) -> Edge | None:
        """Call edge `c` from a configuration on `stack`, making no stack: (callee state, return state, the tag of
        the top frame after the edge's guard, whether the call pushes a frame, the pushed frame's tag); None where
        the guard is closed.  A search that knows what a pushed frame allows by its tag needs no stack for it
        (after each member of an object, the search met a hundred members' frames, all known, and made and
        released two stacks for each)."""
        tag = self.tag[stack]
        guard = self._guard[c]
        if guard >= 0:
            frame, kind, member = self._guards[guard]
            tag = self._frames[frame].members.guard(kind, member, tag)
            if tag is None:
                return None
        callee, ret = self._callee[c], self._ret[c]
        return callee, ret, tag, *self._frame_of(callee, ret)

    def below(self, stack: int, edge: Edge) -> int:
        """The stack under what `edge` pushes from `stack` (`stack` itself, or in its place the frame its guard
        retagged), made."""
        tag = edge[2]
        return stack if tag == self.tag[stack] else self._id(self.parent[stack], self.ret[stack], tag)

    def made(self, stack: int, edge: Edge) -> int:
        """The stack `edge` leads to from `stack`, made."""
        stack = self.below(stack, edge)
        return self._id(stack, edge[1], edge[4]) if edge[3] else stack

    def release(self, mark: int) -> None:
        """Forget the stacks made since there were `mark` of them: a mask walk makes stacks for what tokens would
        write (a captured text ended inside a token), which no parser state holds afterwards."""
        for sid in range(mark, len(self.parent)):
            del self._ids[(self.parent[sid], self.ret[sid], self.tag[sid])]
        del self.parent[mark:], self.ret[mark:], self.tag[mark:]

    def extend(self, stack: int, data: bytes) -> int:
        """The stack once `data` is written: the same, unless its top frame records a captured text."""
        text = self.tag[stack]
        if type(text) is not bytes:
            return stack
        return self._id(self.parent[stack], self.ret[stack], text + data)

    def written(self, stack: int) -> tuple[bytes, ...]:
        """The captured texts of the object frame nearest the top of `stack`."""
        frame = self._object_below(stack)[1]
        return self.tag[frame][2] if frame else ()

    def texts_held(self, stack: int) -> int:
        """How many captured texts the object frames of `stack` hold together."""
        held = 0
        while stack:
            tag = self.tag[stack]
            if type(tag) is tuple:
                held += len(tag[2])
            stack = self.parent[stack]
        return held

    def _object_below(self, frame: int) -> tuple[list[int], int]:
        """(the frames from `frame` down to the nearest object frame, that frame or 0 where there is none)."""
        chain = []
        while frame and type(self.tag[frame]) is not tuple:
            chain.append(frame)
            frame = self.parent[frame]
        return chain, frame

    def pop(self, stack: int, text: bytes | None = None) -> tuple[int, int] | None:
        """The configuration (return state, stack) after returning from the top frame; from a captured terminal,
        with its `text` (by default the one recorded) added to the texts of the object frame below, and None
        where that object has written it already."""
        if text is None:
            text = self.tag[stack]
        if type(text) is not bytes:
            return self.ret[stack], self.parent[stack]
        chain, frame = self._object_below(self.parent[stack])   # and the frames between the capture and it
        if not frame:   # no object around it (a completion of the terminal on its own)
            return self.ret[stack], self.parent[stack]
        seen, extras, written = self.tag[frame]
        at = bisect.bisect_left(written, text)
        if at < len(written) and written[at] == text:
            return None
        below = self._id(self.parent[frame], self.ret[frame], (seen, extras, written[:at] + (text,) + written[at:]))
        for frame in reversed(chain):
            below = self._id(below, self.ret[frame], self.tag[frame])
        return self.ret[stack], below
