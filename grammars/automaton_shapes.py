"""Automata memoised by the shape of their grammar, each grammar's own terminals laid out in them.

Most schemas a service meets are built alike (a function's arguments: an object of a few typed members) and their
grammars differ only in their terminals: the keys, an enum's values, a pattern.  A grammar's shape is its rules in
order, each terminal written as its slot: the number of its DFA among the grammar's distinct terminal DFAs, in the
order a walk over the rules meets them, with what the compile asks of a terminal besides which DFA it is (whether it
matches nothing, whether it matches the empty text).  Two grammars of one shape compile to the same structural
states and calls, and call the DFAs in their slots where the other calls its own: so from the second grammar of a
shape on, the automaton of the first is taken and the grammar's terminals are laid out after its structural states
(`_Shape.automaton`), instead of compiling rule automata, finding the productive rules, trimming and laying out again.
The walk that finds a shape costs nearly a tenth of a small grammar's time to its first mask, so it is taken only
where the grammar's outline (`outline`: its rules' kinds and lengths) came lately: most new shapes come once.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

from . import ir
from .automaton import (MAX_TERMINAL_STATES, MAX_TERMINAL_WORK, Automaton, ObjectFrame,
                        Walked, bad_bounds, compile_automaton, is_terminal, separated_tail, terminal_for)
from .errors import GrammarError
from .fsm import DFA, BudgetExceeded
from .walk_cache import make_room

# Grammars of more rules than this are compiled whole: their shapes seldom repeat (a large schema is its own), and
# walking them for a shape would add to every compile
MAX_SHAPED_RULES = 16
MAX_SHAPE_LENGTH = 1000  # nor a grammar whose shape is longer than this (about three numbers an expression)
_EMPTY, _SEQ, _CHOICE, _REPEAT, _MEMBERS, _UNUSUAL, _REF = range(-1, -8, -1)
_SHAPES: dict[bytes, "_Shape"] = {}
_SHAPES_KEPT = 128
# the outlines of the grammars compiled lately (bytes: the garbage collector does not track them)
_OUTLINES: dict[bytes, None] = {}
_OUTLINES_KEPT = 4096
_KINDS = {ir.Lit: 1, ir.Terminal: 2, ir.Ref: 3, ir.Seq: 4, ir.Choice: 5, ir.Repeat: 6, ir.Members: 7, ir.Capture: 8}


@dataclass(frozen=True, slots=True)
class GrammarShape:
    """A grammar's shape (`key`), the DFAs in its slots, and what the walk found for a compile of the grammar to
    take (`walked`): each terminal expression's DFA, taken for every equal expression as the compile takes them, so
    that the compile calls the very DFAs of the slots at the places the walk met them (the terminal memo may make a
    DFA again between two equal expressions, and a rule automaton kept from an earlier grammar may hold an older
    one), and the rules each rule refers to."""

    key: bytes
    slots: tuple[DFA, ...]
    walked: Walked


def grammar_shape(grammar: ir.Grammar) -> GrammarShape | None:
    """The shape of `grammar`; None where it is not memoised: too large, with captured terminals (their frames
    record texts) or an empty text among an object's parts, or where the compile is to refuse or judge it (bad
    repetition bounds, a terminal past its budget: the compile says why, where it meets the terminal at all)."""
    if not _shapeable(grammar):
        return None
    rules = grammar.rules
    index = {name: k for k, name in enumerate(rules)}
    slot_by_id: dict[int, int] = {}
    dfas: dict[ir.Expr, DFA] = {}
    slot_of: dict[DFA, int] = {}
    refs: dict[str, set[str]] = {}
    # what the compile asks of a terminal's language besides its DFA (productive rules, left recursion through
    # empty texts), per slot where it is not the usual (asked of each new slot: a few per grammar)
    unusual: list[int] = []
    # the key, flat: a slot's number, or a negative mark, some followed by their fields: a sequence's length and
    # where it loops (`separated_tail`), a choice's length, a repetition's bounds, an object's fields; a reference
    # is one number of its own, from _REF down
    key: list[int] = [index[grammar.start]]
    add, extend = key.append, key.extend
    try:
        for name, body in rules.items():
            own = refs[name] = set()
            todo = [body]
            while todo:
                expr = todo.pop()
                kind = type(expr)
                if kind is ir.Repeat and bad_bounds(expr):
                    return None     # (the compile refuses them, a terminal's too)
                # (inline, by exact type: every node of the grammar comes here on every compile)
                if kind is ir.Terminal or (kind is ir.Lit and expr.text) or (
                        (kind is ir.Choice or kind is ir.Repeat) and is_terminal(expr)):
                    number = slot_by_id.get(id(expr))
                    if number is None:
                        dfa = dfas.get(expr)
                        if dfa is None:
                            dfa = dfas[expr] = terminal_for(expr)
                        number = slot_of.get(dfa)
                        if number is None:
                            number = slot_of[dfa] = len(slot_of)
                            if dfa.matches_nothing or dfa.accept[0]:
                                unusual += (number, dfa.matches_nothing, bool(dfa.accept[0]))
                        slot_by_id[id(expr)] = number     # (the grammar holds the expression: ids stay its own)
                    add(number)
                elif kind is ir.Lit:
                    add(_EMPTY)     # (the empty text calls nothing in a sequence)
                elif kind is ir.Ref:
                    number = index.get(expr.name)
                    if number is None:
                        return None
                    add(_REF - 2 * number - expr.call)
                    own.add(expr.name)
                elif kind is ir.Seq:
                    items = expr.items
                    looped = 0      # where `item (separator item)*` is written as one loop
                    for k in range(len(items) - 1):
                        if type(items[k + 1]) is ir.Repeat and separated_tail(items[k + 1], items[k]):
                            looped |= 1 << k
                    extend((_SEQ, len(items), looped))
                    todo += reversed(items)
                elif kind is ir.Choice:
                    extend((_CHOICE, len(expr.items)))
                    todo += reversed(expr.items)
                elif kind is ir.Repeat:
                    extend((_REPEAT, expr.min, -1 if expr.max is None else expr.max))
                    todo.append(expr.item)
                elif kind is ir.Members:
                    if any(type(part) is ir.Lit and not part.text for part in expr.parts()):
                        return None     # (an empty text is a terminal the compile labels there, not nothing)
                    extend((_MEMBERS, len(expr.members), expr.extra is not None, _bits(expr.required), expr.min,
                            -1 if expr.max is None else expr.max, expr.ordered,
                            -1 if expr.max_extras is None else expr.max_extras, expr.loose, len(expr.dependents)))
                    for trigger, needed in expr.dependents:
                        extend((trigger, _bits(needed)))
                    todo += reversed(expr.parts())
                else:
                    return None
                if len(key) > MAX_SHAPE_LENGTH:
                    return None
    except (GrammarError, BudgetExceeded):     # (the compile says why, where it meets the terminal at all)
        return None
    add(_UNUSUAL)
    extend(unusual)
    try:
        # bytes: hashed once for the lookup and the store, and never tracked by the garbage collector
        packed = array("q", key).tobytes()
    except OverflowError:   # (a sequence of over 62 items looping, an object of over 62 members)
        return None
    return GrammarShape(packed, tuple(slot_of), Walked(dfas, refs))


def _shapeable(grammar: ir.Grammar) -> bool:
    return len(grammar.rules) <= MAX_SHAPED_RULES and grammar.start in grammar.rules


def outline(grammar: ir.Grammar) -> bytes:
    """What grammars of one shape have alike and most of other shapes do not, found at a glance: the start rule's
    place and each rule's kind, with a sequence's or choice's length and the kinds of its first items, an object's
    counts of members and required members and whether it takes extras."""
    kinds = _KINDS
    out = [list(grammar.rules).index(grammar.start)]
    for body in grammar.rules.values():
        kind = type(body)
        out.append(kinds.get(kind, 0))
        if kind is ir.Seq or kind is ir.Choice:
            out.append(len(body.items))
            out += [kinds.get(type(item), 0) for item in body.items[:8]]     # (not a long enum's every value)
        elif kind is ir.Members:
            out += (len(body.members), len(body.required), body.extra is not None)
    return array("q", out).tobytes()


def _bits(indices: frozenset[int]) -> int:
    out = 0
    for k in indices:
        out |= 1 << k
    return out


def shaped_automaton(grammar: ir.Grammar) -> Automaton:
    """`compile_automaton(grammar)`, taken from the automaton of an earlier grammar of its shape where one was
    compiled (the grammar's terminals laid out in it).  A grammar whose outline no grammar had lately is compiled
    whole without a walk for its shape: its shape is new too."""
    if not _shapeable(grammar):
        return compile_automaton(grammar)
    seen = outline(grammar)
    if seen not in _OUTLINES:
        make_room(_OUTLINES, _OUTLINES_KEPT)
        _OUTLINES[seen] = None
        return compile_automaton(grammar)
    shape = grammar_shape(grammar)
    if shape is None:
        return compile_automaton(grammar)
    known = _SHAPES.get(shape.key)
    if known is not None:
        automaton = known.automaton(shape.slots)
        if automaton is not None:
            return automaton
    automaton = compile_automaton(grammar, shape.walked)
    make_room(_SHAPES, _SHAPES_KEPT)
    _SHAPES[shape.key] = _Shape(automaton, shape.slots)
    return automaton


class _Shape:
    """What an automaton of one shape holds besides its terminals: its structural states' tables (views of the
    automaton's: states before `first_terminal`), all its call edges, its frames, guards and portable rules; and
    the terminal DFAs it lays out (`kept`, from `starts` on) with the slot DFAs of its grammar (`slots`).  Not the
    automaton itself: that is some 30 objects a shape for every full garbage collection to visit (each terminal's
    (start, DFA) pair among them), this about 9.  Which slot each terminal is, and what moves
    where another grammar's terminals are laid out, is found when a second grammar of the shape comes (most shapes
    come once): `_Layout`."""

    __slots__ = ("first_terminal", "accept", "call_ptr", "call_callee", "call_ret", "call_guard", "framed", "tail",
                 "start", "guards", "frames", "portable", "starts", "kept", "slots", "_layout")

    def __init__(self, compiled: Automaton, slots: tuple[DFA, ...]):
        first_terminal = self.first_terminal = compiled.first_terminal
        self.accept, self.tail = compiled.accept[:first_terminal], compiled.tail[:first_terminal]
        self.framed, self.call_ptr = compiled.framed[:first_terminal], compiled.call_ptr[:first_terminal + 1]
        self.call_callee, self.call_ret, self.call_guard = compiled.call_callee, compiled.call_ret, compiled.call_guard
        self.start, self.guards, self.frames, self.portable = (compiled.start, compiled.guards, compiled.frames,
                                                               compiled.portable)
        self.starts = tuple([first for first, _ in compiled.terminals])
        self.kept = tuple([dfa for _, dfa in compiled.terminals])
        self.slots = slots
        self._layout: _Layout | None = None

    def automaton(self, slots: tuple[DFA, ...]) -> Automaton | None:
        """The automaton with the DFAs of `slots` laid out in place of its own; None where they take more than the
        terminal budget (the compile then says so), where its portable rules would call other DFAs than its own (the
        terminal memo made them again since: a compile gives their rules keys of their own), or where the compile
        laid out a DFA in none of its grammar's slots."""
        layout = self._layout
        if layout is None:
            layout = self._layout = _Layout.of(self, self.slots)
        if layout.blocks is None:
            return None
        first_terminal = self.first_terminal
        dfas = [slots[k] for k in layout.blocks]
        kept = self.kept
        if not all(dfas[k] is kept[k] for k in layout.portable_blocks):
            return None
        starts, work, total = [], 0, first_terminal
        for dfa in dfas:
            starts.append(total)
            size = len(dfa.accept)
            total += size
            work += max(dfa.built_states, size)
        if total - first_terminal > MAX_TERMINAL_STATES or work > MAX_TERMINAL_WORK:
            return None
        callee, frames = self.call_callee, self.frames
        if starts != list(self.starts):
            callee = callee.copy()
            callee[layout.calls] = np.array(starts, np.int32)[layout.called]
            moved = dict(zip(self.starts, starts))
            frames = tuple(ObjectFrame(frame.members, frame.start, frame.first, frame.after, frame.next,
                                       moved.get(frame.open, frame.open),
                                       tuple([moved.get(item, item) for item in frame.items]),
                                       moved.get(frame.extra, frame.extra), moved.get(frame.separator, frame.separator),
                                       moved.get(frame.close, frame.close))
                           for frame in frames)
        call_ptr = np.empty(total + 1, np.int32)
        call_ptr[:first_terminal + 1] = self.call_ptr
        call_ptr[first_terminal + 1:] = len(callee)
        structural = np.zeros(total, bool)
        framed = np.zeros(total, np.int8)
        framed[:first_terminal] = self.framed
        tail = structural.copy()
        tail[:first_terminal] = self.tail
        return Automaton(
            accept=np.concatenate([self.accept, *[dfa.accept for dfa in dfas]]),
            call_ptr=call_ptr,
            call_callee=callee,
            call_ret=self.call_ret,
            has_out=np.concatenate([structural[:first_terminal], *[dfa.has_out for dfa in dfas]]),
            start=self.start,
            tail=tail,
            terminals=tuple(zip(starts, dfas)),
            framed=framed,
            call_guard=self.call_guard,
            guards=self.guards,
            frames=frames,
            portable=self.portable,
        )


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where a shape's automaton lays out its terminals: the slot of each (`blocks`, in its order; None where one is
    in none of the slots); `calls`: the call edges into terminals, `called`: the block each calls;
    `portable_blocks`: the blocks its portable rules call (`Automaton.portable`): their keys name the DFAs called,
    so another grammar shares them only where it holds the same DFAs there."""

    blocks: tuple[int, ...] | None
    calls: np.ndarray
    called: np.ndarray
    portable_blocks: tuple[int, ...]

    @classmethod
    def of(cls, shape: _Shape, slots: tuple[DFA, ...]) -> "_Layout":
        slot_of = {dfa: k for k, dfa in enumerate(slots)}
        blocks = tuple([slot_of.get(dfa, -1) for dfa in shape.kept])
        calls = np.flatnonzero(shape.call_callee >= shape.first_terminal)
        called = np.searchsorted(np.array(shape.starts, np.int32), shape.call_callee[calls])
        portable: set[int] = set()
        ptr = shape.call_ptr
        for first, end, _ in shape.portable:
            portable.update(called[(calls >= ptr[first]) & (calls < ptr[end])].tolist())
        return cls(None if -1 in blocks else blocks, calls, called, tuple(sorted(portable)))
