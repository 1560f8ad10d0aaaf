"""The grammar IR compiled to a recursive transition network over shared terminal DFAs.

Every terminal (a regex Terminal, a literal, or a choice of literals) becomes
a rule of its own: a minimal byte DFA, memoised per process, so the same
terminal is the same object in every grammar.  The start rule, every rule
taking part in recursion, every rule too large to write out in place and every
rule referenced with `Ref.call` become DFAs over *call edges* only:
`call(rule, return_state)`; other references are inlined.  So compiling a
grammar determinizes its structure (a few states per IR node), never its bytes,
and only terminal states consume bytes.  Rule DFAs are numbered into one
global state space; a parser configuration is (global state, stack of return
states), where a call returning to a state that only returns pushes nothing.
Recursion is never unrolled; left recursion is refused.  An object (`ir.Members`)
is a rule of five hand-built states whose member calls are guarded at run time
by the members its stack frame records (`object_members`, `stacks`).  A captured
terminal (`ir.Capture`) is a copy of its DFA of its own: the call into it pushes
a frame where the text it writes is recorded.  A rule that calls only itself and
its terminals, whose body a front end keeps as one object across grammars (any
JSON value), is taken whole from the second grammar holding it on (`_ClosedRule`).
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import ir
from .errors import AutomatonTooLargeError, EmptyLanguageError, GrammarError, RegexError, UnsupportedSchemaError
from .fsm import DFA, MEMO_SIZE, NFA, BudgetExceeded, CallDFA, determinize, determinize_calls, minimize
from .object_members import CLAIM, CLOSE, EMPTY_TAG, EXTRA, FIRST, SEPARATOR, MemberSet
from .regex import literal_dfa, literals_dfa, terminal_dfa
from .walk_cache import make_room

MAX_RULE_STATES = 200_000
MEMOISED_RULE_NODES = 200  # rule automata built from NFAs of at most this many nodes are kept (_RULE_DFAS)
CALLED_RULE_SIZE = 400  # a rule written out in more automaton nodes than this is called, not inlined
# All terminal DFAs of one grammar together: the global table takes 1 KiB a state, and building them is most
# of a compile's time, so past this a schema that multiplies its strings (negations distributed into many
# variants, each intersecting patterns and lengths) is refused early instead of taking seconds
MAX_TERMINAL_STATES = 150_000
MAX_TERMINAL_WORK = 400_000  # states of every product built for them, the emptied ones too
MEMBERS_FRAME, CAPTURE_FRAME = 1, 2
# Rule automata built by subset construction, by body, across grammars (the bodies every schema shares: any JSON
# value, an array of strings): a body whose references are all calls reads the same in any grammar, and so do its
# terminal calls while the terminal memo keeps their DFAs, whose labels name them (`_Compiler._label`).  Only small
# rules, and few: the bodies kept are objects every full garbage collection visits.  256 of them were 4,400 of a long
# run's 7,300 tracked objects (a full collection 3-5.5 ms) for no more hits than 64 (time to first mask within 1% and
# mask time within 1.5% of 256 in interleaved A/Bs over five and six MaskBench subsets)
_RULE_DFAS: dict[ir.Expr, "_BuiltRule"] = {}
_RULE_DFAS_KEPT = 64
# the numbers of portable rules' groups (see `_portable_rules`) by what names them, a tuple of names and numbers:
# such tuples drop out of the garbage collector's scans, where keys of frozensets holding the rule automata kept
# two thirds of the process's tracked objects (25,000 after three MaskBench subsets) for every full collection
# to visit, a pause of 10-20 ms in some token mask
_PORTABLE_KEYS: dict[tuple, int] = {}
_PORTABLE_KEYS_KEPT = 4096
_PORTABLE_IDS = itertools.count()
# Closed rules (see `_ClosedRule`) by the identity of their body: a front end that keeps a rule's body as one object
# across its grammars (the JSON-schema compiler's any JSON value, in most of its grammars) gets the rule's automaton
# and what the passes over it found without building or checking it again
_CLOSED_RULES: dict[int, "_ClosedRule"] = {}
_CLOSED_RULES_KEPT = 16


@dataclass(frozen=True)
class ObjectFrame:
    """An object members rule (`ir.Members`) in the global state space: its states after `{`
    (`first`), after a member (`after`) and after a separator (`next`), and the start states of what it
    calls: per member, for extras (-1: none), the separator and the closing brace; the start of the captured
    terminal the extras begin with, whose texts must differ (-1: none)."""

    members: MemberSet
    start: int
    first: int
    after: int
    next: int
    open: int
    items: tuple[int, ...]
    extra: int
    separator: int
    close: int
    capture: int = -1


# the hand-built call DFA of a members rule: its states, in this order
_START, _FIRST, _AFTER, _NEXT, _END = range(5)


@dataclass(frozen=True)
class _MemberLabels:
    """What a members rule calls (rule names or terminal labels), part by part."""

    open: str
    members: tuple[str, ...]
    separator: str
    close: str
    extras: tuple[str, ...]  # the extra-key rule, if any

    @classmethod
    def of(cls, body: ir.Members, labels: list[str]) -> "_MemberLabels":
        """Split labels listed in the order of `body.parts()`."""
        n = len(body.members)
        return cls(labels[0], tuple(labels[1:n + 1]), labels[n + 1], labels[n + 2], tuple(labels[n + 3:]))


@dataclass(frozen=True)
class _BuiltRule:
    """A rule automaton as `_RULE_DFAS` keeps it: its terminals in the order its build labelled them, each as
    (flagged where captured, its expression, its label, its DFA); `refs`, the rules its body refers to, all of them
    called when it was built."""

    dfa: CallDFA
    terminals: tuple[tuple[bool, ir.Expr, str, DFA], ...]
    refs: frozenset[str]
    body: ir.Expr   # the body it was built from, this very object (a later grammar holding it may close the rule)


@dataclass(frozen=True, slots=True)
class _ClosedRule:
    """A rule whose automaton calls nothing but its terminals and itself, taken whole by every grammar holding its
    body (this very object) under its name.  Its automaton, trimmed, calls the terminals under the labels of their
    DFAs, which the grammar gives them before any other (`terminals`: (expression, DFA), in that order); `portable`:
    its key among the portable rules.  It matches some text, is not left-recursive and lies on no cycle with other
    rules, so the grammar's passes take it as it is."""

    name: str
    body: ir.Expr
    dfa: CallDFA
    terminals: tuple[tuple[ir.Expr, DFA], ...]
    portable: tuple[str, int]


@dataclass(frozen=True, slots=True)
class Walked:
    """What a walk over a grammar found (`automaton_shapes.grammar_shape`), for its compile to take: the terminal
    expressions' DFAs (the compile takes them for equal expressions too, and adds to the dict), and the rules each
    rule refers to, every one defined."""

    dfas: dict[ir.Expr, DFA]
    refs: dict[str, set[str]]


@dataclass(eq=False)
class Automaton:
    """Global tables of all rule DFAs: start state `start`, stack returns via call edges."""

    accept: np.ndarray  # bool [G]: the rule may end (return) here
    call_ptr: np.ndarray  # int32 [G+1]: CSR into call_callee / call_ret
    call_callee: np.ndarray  # int32: global start state of the called rule
    call_ret: np.ndarray  # int32: global state to continue in after the callee returns
    has_out: np.ndarray  # bool [G]: some byte transition leaves this state
    start: int
    # bool [G]: a structural state that only returns (accepting, no calls): a call returning there needs
    # no stack frame, so chains of calls in tail position (a value ending a member, a closing brace) keep
    # the stack flat
    tail: np.ndarray
    # (first global state, terminal DFA) of each terminal rule, by increasing first state; only
    # terminal rules consume bytes, and their DFAs are shared objects, so their token walks are
    # memoised across grammars
    terminals: tuple[tuple[int, DFA], ...] = ()
    # int8 [G]: the start state of an object members rule (MEMBERS_FRAME) or of a captured terminal
    # (CAPTURE_FRAME), whose calls always push a frame: the first records the members written, the other the text
    framed: np.ndarray | None = None
    call_guard: np.ndarray | None = None  # int32, per call edge: index into `guards`, -1 for none
    guards: tuple[tuple[int, int, int], ...] = ()  # (frame, object_members kind, member)
    frames: tuple[ObjectFrame, ...] = ()
    # (first global state, end, key) of each rule that reads the same in every grammar holding it (see
    # `_portable_rules`): equal keys, equal rules
    portable: tuple[tuple[int, int, tuple[str, int]], ...] = ()
    # the first states of `terminals`, a tuple: once it survives a collection the collector stops walking it
    _terminal_starts: tuple[int, ...] = field(init=False, repr=False)
    # every state from here on is a terminal's (structural states come first, then the terminals end to end)
    first_terminal: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._terminal_starts = tuple(first for first, _ in self.terminals)
        self.first_terminal = self._terminal_starts[0] if self.terminals else len(self.accept)

    @property
    def num_states(self) -> int:
        return len(self.accept)

    def terminal_of(self, state: int) -> tuple[int, DFA] | None:
        """(first global state, DFA) of the terminal rule holding `state`, None for a structural state."""
        k = bisect.bisect_right(self._terminal_starts, state) - 1
        if k < 0:
            return None
        first, dfa = self.terminals[k]
        return (first, dfa) if state - first < dfa.num_states else None

    def terminal_row(self, state: int) -> tuple[int, np.ndarray]:
        """A terminal state's byte transitions where they are: the first state of its terminal, and its row in the
        terminal's DFA (int32 [256], targets local to that DFA, -1: none).  Only terminal states consume bytes, and
        each terminal's rows stay in its shared DFA: a global table would copy them all on every compile."""
        first, dfa = self.terminal_of(state)
        return first, dfa.trans[state - first]

    def byte_row(self, state: int) -> np.ndarray:
        """The byte transitions of a terminal state (int32 [256], global targets, -1: none)."""
        first, row = self.terminal_row(state)
        return np.where(row >= 0, row + first, -1)


def rule_refs(expr: ir.Expr, out: set[str]) -> set[str]:
    """`out` with the names of the rules `expr` refers to (not those they refer to in turn)."""
    # by exact type, leaves skipped first: every compile walks every rule body here
    todo = [expr]
    while todo:
        expr = todo.pop()
        kind = type(expr)
        if kind is ir.Lit or kind is ir.Terminal:
            continue
        if kind is ir.Ref:
            out.add(expr.name)
        elif kind is ir.Seq or kind is ir.Choice:
            todo.extend(expr.items)
        elif kind is ir.Repeat:
            todo.append(expr.item)
        elif kind is ir.Members:
            todo.extend(expr.parts())
    return out


def _in_order(graph: dict[str, set[str]]) -> bool:
    """Whether every node's successors come before it in `graph`'s order (so that it has no cycle)."""
    before: set[str] = set()
    for node, successors in graph.items():
        if not successors <= before:
            return False
        before.add(node)
    return True


def _cyclic(graph: dict[str, set[str]]) -> set[str]:
    """Nodes lying on a cycle of `graph`."""
    result: set[str] = set()
    for component in _components(graph):
        if len(component) > 1 or component[0] in graph[component[0]]:
            result.update(component)
    return result


def _components(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` (every node's successors among its keys), each after those it
    reaches (Tarjan's algorithm, iterative: deep JSON-schema $ref chains must not hit Python's recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components


def _unwrap(expr: ir.Expr) -> ir.Expr:
    while isinstance(expr, (ir.Seq, ir.Choice)) and len(expr.items) == 1:
        expr = expr.items[0]
    return expr


def separated_tail(tail: ir.Expr, item: ir.Expr) -> bool:
    """Whether `tail` is `(separator item)*`, so that `item tail` is a separated list."""
    return (isinstance(tail, ir.Repeat) and tail.min == 0 and tail.max is None and isinstance(tail.item, ir.Seq)
            and len(tail.item.items) > 1 and tail.item.items[-1] == item)


def bad_bounds(expr: ir.Repeat) -> bool:
    """Whether a repetition's bounds are out of order or negative (the compile refuses them)."""
    return expr.min < 0 or (expr.max is not None and expr.max < expr.min)


def is_terminal(expr: ir.Expr) -> bool:
    """Expressions compiled to one shared terminal DFA: terminals, literals, choices of literals,
    and short repetitions of those (a repeated terminal as a call loop could end after any of its
    repetitions, and token walks would follow every split of the text)."""
    kind = type(expr)   # exact types (the IR has no subclasses): asked of every node by each walk
    if kind is ir.Terminal or kind is ir.Lit:
        return True
    if kind is ir.Choice:
        return len(expr.items) > 1 and all(type(i) is ir.Lit for i in expr.items)
    if kind is ir.Repeat:
        item = _unwrap(expr.item)
        return is_terminal(item) and type(item) is not ir.Repeat and (expr.max or expr.min) <= 16
    return False


def _origin(expr: ir.Expr) -> tuple[str, str] | None:
    """What the front end called the terminal inside a terminal expression (see `is_terminal`), if it said."""
    while isinstance(expr, ir.Repeat):
        expr = _unwrap(expr.item)
    return expr.origin if isinstance(expr, ir.Terminal) else None


def terminal_for(expr: ir.Expr) -> DFA:
    """The shared, memoised DFA of a terminal expression (see `is_terminal`): equal expressions
    get the same DFA object in every grammar, so token walks inside it are reused."""
    # All but repetitions go to memos keyed by their texts, which the garbage collector stops scanning; a memo
    # keyed by the expressions would keep every literal object and its key tracked.
    if isinstance(expr, ir.Terminal):
        return terminal_dfa(expr.pattern, tuple(expr.also), tuple(expr.excluding))
    if isinstance(expr, ir.Lit):
        return literal_dfa(expr.text)
    if isinstance(expr, ir.Choice):
        return literals_dfa(tuple(sorted({item.text for item in expr.items})))
    return _repeated_terminal(expr)


@functools.lru_cache(maxsize=MEMO_SIZE)
def _repeated_terminal(expr: ir.Repeat) -> DFA:
    item = terminal_for(_unwrap(expr.item))
    nfa = NFA(MAX_RULE_STATES)
    src, dst = nfa.node(), nfa.node()
    cur = src
    for _ in range(expr.min):
        nxt = nfa.node()
        nfa.embed(item, cur, nxt)
        cur = nxt
    if expr.max is None:
        loop = nfa.node()
        nfa.embed(item, cur, loop)
        nfa.epsilon(loop, cur)
    else:
        for _ in range(expr.max - expr.min):
            nfa.epsilon(cur, dst)
            nxt = nfa.node()
            nfa.embed(item, cur, nxt)
            cur = nxt
    nfa.epsilon(cur, dst)
    return minimize(determinize(nfa, src, dst, MAX_RULE_STATES))


class _Compiler:
    """Rule DFAs over call labels: every terminal is a call into its shared terminal DFA, so
    subset construction here only sees the grammar's structure, never bytes."""

    def __init__(self, grammar: ir.Grammar, walked: Walked | None = None):
        self.rules = dict(grammar.rules)
        self.start = grammar.start
        self.terminal_rules: dict[str, DFA] = {}
        self._labels: dict[DFA, str] = {}
        self._dfas: dict[ir.Expr, DFA] = {} if walked is None else walked.dfas
        self._label_of: dict[int, tuple[ir.Expr, str]] = {}    # terminal_label by id (see there)
        self._member_sets: dict[tuple[str, int, bool], MemberSet] = {}
        self.capture_labels: dict[DFA, str] = {}
        self._terminal_states = self._terminal_work = 0
        # kept rule automata this grammar reuses whose rules call only themselves: closed once the grammar compiles
        self.reused: dict[str, _BuiltRule] = {}
        # while a rule is built for _RULE_DFAS: the terminals it labels, in order, and whether it inlined a rule
        self._labelled: list[tuple[bool, ir.Expr, str]] | None = None
        self._inlined = False
        self.closed: dict[str, _ClosedRule] = {}
        for name, body in self.rules.items():
            closed = _CLOSED_RULES.get(id(body))
            if closed is not None and closed.body is body and closed.name == name and self._labels_closed(closed):
                self.closed[name] = closed
        refs = self._check(None if walked is None else walked.refs)
        # where every rule refers only to rules defined before it (front ends mostly define a rule's parts first),
        # no rule is on a cycle, and the productive rules are found in one pass in that order (`_productive`)
        self.in_order = _in_order(refs)
        # rules lying on a reference cycle: every cycle of calls passes through one (a members part, `owner<k>`,
        # refers to what its owner refers to), so only what they call can be left-recursive
        self.cyclic = frozenset() if self.in_order else frozenset(_cyclic(refs))
        self.called = set(self.cyclic)
        self.called.update(self.closed)
        self._sizes: dict[str, int] = dict.fromkeys(self.closed, 1)
        # members rules: always called, each part called through a label of its own
        self.members_rules: dict[str, _MemberLabels] = {}
        for name, body in list(self.rules.items()):
            if isinstance(body, ir.Members):
                if name == self.start:
                    raise GrammarError("a members rule cannot be the start rule (it needs a caller's frame)")
                self.called.add(name)
                labels = [self._part_label(name, i, part) for i, part in enumerate(body.parts())]
                self.members_rules[name] = _MemberLabels.of(body, labels)
        for name in self.rules:
            self._rule_size(name)

    def _labels_closed(self, closed: _ClosedRule) -> bool:
        """Label a closed rule's terminals, before any other of the grammar's, so that they get the labels its
        automaton calls; False where one already has another DFA's label (a closed rule before it in this grammar was
        closed while the terminal memo held another DFA for that terminal): then the rule is built as the others."""
        return all(self.terminal_label(expr, dfa) == self._labels.get(dfa) for expr, dfa in closed.terminals)

    def _part_label(self, owner: str, index: int, part: ir.Expr) -> str:
        if is_terminal(part):
            return self.terminal_label(part)
        if isinstance(part, ir.Ref):
            self.called.add(part.name)
            return part.name
        name = f"{owner}<{index}>"
        self.rules[name] = part
        self.called.add(name)
        return name

    def _size(self, expr: ir.Expr) -> int:
        """About how many NFA nodes `expr` takes written out, where called rules count one; a rule over
        CALLED_RULE_SIZE joins the called ones, so a subschema used in many places is built once and a
        large schema is not inlined into one automaton."""
        kind = type(expr)
        if kind is ir.Lit or kind is ir.Terminal or kind is ir.Capture:
            return 1
        if kind is ir.Ref:
            if expr.call:
                self.called.add(expr.name)
            return self._rule_size(expr.name)
        if kind is ir.Seq or kind is ir.Choice:
            if kind is ir.Choice and is_terminal(expr):
                return 1
            size = 0
            for item in expr.items:
                size += self._size(item)
            return max(size, 1)
        if kind is ir.Repeat:
            if is_terminal(expr):
                return 1
            count = max(expr.max if expr.max is not None else expr.min + 1, 1)
            size = self._size(expr.item)
            if count > 1 and count * size > CALLED_RULE_SIZE:
                # every repetition writes the item out again: the rules it refers to are called instead (an array
                # of a hundred arrays of a hundred strings is not ten thousand strings written out)
                self._call_refs(expr.item)
                size = self._size(expr.item)
            return count * size
        if kind is ir.Members:
            for item in expr.parts():
                self._size(item)
        return 1

    def _rule_size(self, name: str) -> int:
        """`_size` of a reference to rule `name`."""
        if name not in self._sizes:  # every body is visited once: the call-only refs inside join `called`
            self._sizes[name] = 1  # a cycle ends here (its rules are called anyway)
            size = self._sizes[name] = self._size(self.rules[name])
            if size > CALLED_RULE_SIZE:
                self.called.add(name)
        return 1 if name in self.called else self._sizes[name]

    def _call_refs(self, expr: ir.Expr) -> None:
        """Call the rules `expr` refers to outside repetitions (those count on their own)."""
        if isinstance(expr, ir.Ref):
            self.called.add(expr.name)
        elif isinstance(expr, (ir.Seq, ir.Choice)):
            for item in expr.items:
                self._call_refs(item)

    def _check(self, known: Mapping[str, set[str]] | None) -> dict[str, set[str]]:
        """The rules each rule refers to, all of them defined (GrammarError otherwise); `known`: as a walk over the
        grammar found them, every one defined."""
        if not self.rules:
            raise GrammarError("the grammar has no rules")
        if self.start not in self.rules:
            raise GrammarError(f"the start rule {self.start!r} is not defined")
        if known is not None:
            return {name: set() if name in self.closed else known[name] for name in self.rules}
        refs = {name: set() if name in self.closed else rule_refs(body, set()) for name, body in self.rules.items()}
        for name, names in refs.items():
            for ref in names:
                if ref not in self.rules:
                    raise GrammarError(f"rule {name!r} refers to undefined rule {ref!r}")
        return refs

    def build(self, nfa: NFA, expr: ir.Expr, src: int, dst: int) -> None:
        """NFA fragment for `expr` between src and dst: terminals and recursive references become
        calls, other references are inlined."""
        kind = type(expr)
        if kind is ir.Terminal or (kind is ir.Lit and expr.text) or (kind is ir.Choice and is_terminal(expr)):
            nfa.call(src, self.terminal_label(expr), dst)
        elif kind is ir.Lit:
            nfa.epsilon(src, dst)
        elif kind is ir.Ref:
            if expr.name in self.called or expr.call:
                nfa.call(src, expr.name, dst)
            else:
                self._inlined = True
                self.build(nfa, self.rules[expr.name], src, dst)
        elif kind is ir.Seq:
            items, cur, k = expr.items, src, 0
            while k < len(items):
                looped = k + 1 < len(items) and separated_tail(items[k + 1], items[k])
                span = 2 if looped else 1
                nxt = dst if k + span == len(items) else nfa.node()
                if looped:
                    self.separated(nfa, items[k], items[k + 1].item.items[:-1], cur, nxt)
                else:
                    self.build(nfa, items[k], cur, nxt)
                cur, k = nxt, k + span
            if not items:
                nfa.epsilon(src, dst)
        elif kind is ir.Choice:
            for item in expr.items:
                self.build(nfa, item, src, dst)
        elif kind is ir.Repeat:
            if bad_bounds(expr):
                raise GrammarError(f"bad repetition bounds {expr.min}..{expr.max}")
            if is_terminal(expr):
                nfa.call(src, self.terminal_label(expr), dst)
            else:
                self.repeat(nfa, expr, src, dst)
        elif kind is ir.Capture:
            nfa.call(src, self.capture_label(expr), dst)
        elif kind is ir.Members:
            raise GrammarError("an object members rule must be the whole body of a rule")
        else:
            raise GrammarError(f"unknown grammar expression {expr!r}")

    def separated(self, nfa: NFA, item: ir.Expr, separator: tuple[ir.Expr, ...], src: int, dst: int) -> None:
        """`item (separator item)*` with one copy of `item`, looped through the separator: written
        out, every JSON array and object holds its item twice, doubling the automaton per nesting level."""
        start, end = nfa.node(), nfa.node()
        nfa.epsilon(src, start)
        self.build(nfa, item, start, end)
        self.build(nfa, ir.Seq(separator), end, start)
        nfa.epsilon(end, dst)

    def repeat(self, nfa: NFA, expr: ir.Repeat, src: int, dst: int) -> None:
        cur = src
        for _ in range(expr.min):
            nxt = nfa.node()
            self.build(nfa, expr.item, cur, nxt)
            cur = nxt
        if expr.max is None:
            # The loop gets a node of its own: looping back to `src` would let a path that took one
            # repetition re-enter whatever else leaves src (the other branches of a choice).
            loop, loop_end = nfa.node(), nfa.node()
            nfa.epsilon(cur, loop)
            self.build(nfa, expr.item, loop, loop_end)
            nfa.epsilon(loop_end, loop)
            nfa.epsilon(loop, dst)
            return
        for _ in range(expr.max - expr.min):
            nfa.epsilon(cur, dst)
            nxt = nfa.node()
            self.build(nfa, expr.item, cur, nxt)
            cur = nxt
        nfa.epsilon(cur, dst)

    def terminal_label(self, expr: ir.Expr, dfa: DFA | None = None) -> str:
        """The pseudo-rule name under which a terminal is called (one per distinct DFA).  `dfa`: its DFA where known
        (a kept rule automaton keeps its terminals'), so that the terminal memo is not asked; the grammar's own memo
        learns it, so that equal terminals elsewhere in the grammar get the same label."""
        # by the expression's identity first: rules share their punctuation and strings as objects, and hashing an
        # expression hashes all of it (the entry holds the expression, so that its id is not reused meanwhile)
        known = self._label_of.get(id(expr))
        if known is not None:
            label = known[1]
        else:
            dfa = self._terminal_dfa(expr) if dfa is None else self._dfas.setdefault(expr, dfa)
            label = self._label(dfa, expr, self._labels, "terminal")
            self._label_of[id(expr)] = (expr, label)
        if self._labelled is not None:
            self._labelled.append((False, expr, label))
        return label

    def capture_label(self, expr: ir.Capture) -> str:
        """The pseudo-rule name of a captured terminal: a copy of the terminal's DFA, under a label of its own, so
        that only the calls into the copy record their text."""
        if not is_terminal(expr.item):
            raise GrammarError(f"only a terminal can be captured, not {expr.item!r}")
        label = self._label(self._terminal_dfa(expr.item), expr.item, self.capture_labels, "capture")
        if self._labelled is not None:
            self._labelled.append((True, expr, label))
        return label

    def _terminal_dfa(self, expr: ir.Expr) -> DFA:
        # the grammar's own memo first: past MEMO_SIZE terminals the shared one would hand an expression back
        # as a new DFA object, and so a second label, counted twice against the budget
        dfa = self._dfas.get(expr)
        try:
            if dfa is None:
                dfa = self._dfas[expr] = terminal_for(expr)
        except RegexError as exc:   # a regex the front end wrote (a pattern of the user's is checked there)
            origin = _origin(expr)
            if origin is None:
                raise
            what, pointer = origin
            why = f"within {exc.budget}" if isinstance(exc, AutomatonTooLargeError) else \
                f"(a regex it needs: {exc.reason})"
            raise UnsupportedSchemaError(f"{what} cannot be enforced exactly {why}", pointer) from None
        return dfa

    def _label(self, dfa: DFA, expr: ir.Expr, labels: dict[DFA, str], kind: str) -> str:
        """The label of `dfa` in `labels` (the plain terminals, or the captured copies), made on first use: its
        states join the global table and count against the grammar's terminal budget."""
        label = labels.get(dfa)
        if label is None:
            self._terminal_states += dfa.num_states
            if dfa not in self._labels and dfa not in self.capture_labels:   # built once, whatever its copies
                self._terminal_work += max(dfa.built_states, dfa.num_states)
            if self._terminal_states > MAX_TERMINAL_STATES or self._terminal_work > MAX_TERMINAL_WORK:
                origin = _origin(expr)
                message = (f"the grammar's terminals need more than {MAX_TERMINAL_STATES} automaton states together"
                           if self._terminal_states > MAX_TERMINAL_STATES else
                           f"building the grammar's terminals takes more than {MAX_TERMINAL_WORK} automaton states")
                if origin is None:
                    raise GrammarError(message)
                raise UnsupportedSchemaError(f"{message} (the last: {origin[0]})", origin[1])
            # named by the DFA, not numbered: a rule automaton kept across grammars (`_RULE_DFAS`) reads the same
            label = labels[dfa] = f"<{kind} {dfa.uid}>"
            self.terminal_rules[label] = dfa
        return label

    def leading_captures(self, expr: ir.Expr, seen: set[str] | None = None) -> set[str]:
        """The labels of the captured terminals `expr` can begin with."""
        seen = set() if seen is None else seen
        if isinstance(expr, ir.Capture):
            return {self.capture_label(expr)}
        if isinstance(expr, ir.Seq):
            return self.leading_captures(expr.items[0], seen) if expr.items else set()
        if isinstance(expr, ir.Choice):
            return set().union(*(self.leading_captures(item, seen) for item in expr.items))
        if isinstance(expr, ir.Ref) and expr.name not in seen and not isinstance(self.rules[expr.name], ir.Members):
            seen.add(expr.name)
            return self.leading_captures(self.rules[expr.name], seen)
        return set()

    def rule_dfa(self, name: str) -> CallDFA:
        closed = self.closed.get(name)
        if closed is not None:
            return closed.dfa
        if name in self.members_rules:
            return self.members_dfa(name)
        labels = self._chain(self.rules[name], [])
        if labels is not None:      # most rules (an object member: key, colon, value): no subsets to construct
            if len(labels) >= MAX_RULE_STATES:
                raise BudgetExceeded(MAX_RULE_STATES, "automaton states")
            return CallDFA([False] * len(labels) + [True], [((label, k + 1),) for k, label in enumerate(labels)] + [()],
                           trimmed=True)
        body = self.rules[name]
        built = _RULE_DFAS.get(body)
        if built is not None and all(ref in self.called for ref in built.refs):
            if built.body is body and built.refs <= {name} and not any(t[0] for t in built.terminals):
                self.reused[name] = built
            return self._relabelled(body, built)
        nfa = NFA()
        src, dst = nfa.node(), nfa.node()
        self._labelled, self._inlined = [], False
        try:
            self.build(nfa, body, src, dst)
            labelled = self._labelled
        finally:
            self._labelled = None
        dfa = determinize_calls(nfa, src, dst, MAX_RULE_STATES)
        # nearly always so (only an empty choice leaves a dead end): known here, a kept automaton skips `_live`
        dfa.trimmed = all(_live(dfa)[0])
        if not self._inlined and nfa.count <= MEMOISED_RULE_NODES:
            self._memoise(body, dfa, labelled)
        return dfa

    def _memoise(self, body: ir.Expr, dfa: CallDFA, labelled: list[tuple[bool, ir.Expr, str]]) -> None:
        """Keep `dfa`, the automaton of `body`, in _RULE_DFAS with the terminals it labelled."""
        terminals: dict[str, tuple[bool, ir.Expr, str, DFA]] = {}
        for captured, expr, label in labelled:
            terminals.setdefault(label, (captured, expr, label, self.terminal_rules[label]))
        refs = frozenset(label for row in dfa.calls for label, _ in row if label not in terminals)
        make_room(_RULE_DFAS, _RULE_DFAS_KEPT)
        dfa.shared = True
        _RULE_DFAS[body] = _BuiltRule(dfa, tuple(terminals.values()), refs, body)

    def _relabelled(self, body: ir.Expr, built: _BuiltRule) -> CallDFA:
        """A kept rule automaton in this grammar: its terminals labelled in the order its build would label them.
        Labels name DFAs, so it is the kept automaton itself unless this grammar already labelled one of its
        terminals with another DFA (the terminal memo built it again since); then the relabelled one is kept in its
        place, so that the grammars after this one share it again (`CallDFA.shared`)."""
        renamed = {}
        for captured, expr, kept, dfa in built.terminals:
            label = self.capture_label(expr) if captured else self.terminal_label(expr, dfa)
            if label != kept:
                renamed[kept] = label
        if not renamed:
            return built.dfa
        calls = [tuple((renamed.get(label, label), t) for label, t in row) for row in built.dfa.calls]
        dfa = CallDFA(built.dfa.accept, calls, built.dfa.trimmed, shared=True)
        if _RULE_DFAS.get(body) is built:     # (not where another thread's compile dropped it meanwhile)
            _RULE_DFAS[body] = _BuiltRule(dfa, tuple(
                (captured, expr, renamed.get(label, label), self.terminal_rules[renamed.get(label, label)])
                for captured, expr, label, _ in built.terminals), built.refs, built.body)
        return dfa

    def _chain(self, expr: ir.Expr, labels: list[str]) -> list[str] | None:
        """`labels` and then the labels `expr` calls one after the other, where it is a plain sequence of calls
        (no choice or repetition, inlined references followed); None otherwise.  Labels are made in the order
        `build` makes them, so a rule that turns out not to be a chain lays out its terminals as before."""
        todo = [expr]   # what is left to read, the next item last (most rules of every grammar come here)
        while todo:
            expr = todo.pop()
            kind = type(expr)
            if kind is ir.Seq:
                todo += reversed(expr.items)
            elif kind is ir.Terminal or kind is ir.Lit:
                if kind is ir.Terminal or expr.text:
                    labels.append(self.terminal_label(expr))
            elif kind is ir.Ref:
                if expr.name in self.called or expr.call:
                    labels.append(expr.name)
                else:
                    todo.append(self.rules[expr.name])   # inlined refs are never cyclic: those are called
            elif kind is ir.Capture:
                labels.append(self.capture_label(expr))
            elif (kind is ir.Choice or kind is ir.Repeat and not bad_bounds(expr)) and is_terminal(expr):
                labels.append(self.terminal_label(expr))    # one call, as `build` writes it
            else:
                return None
        return labels

    def members_dfa(self, name: str) -> CallDFA:
        """`open`, then members and extras, each guarded at run time, between separators, then `close`."""
        labels = self.members_rules[name]
        items = tuple((label, _AFTER) for label in labels.members + labels.extras)
        if len({label for label, _ in items}) < len(items) or labels.separator == labels.close:
            raise GrammarError(f"members rule {name!r} calls one rule for two of its parts")
        calls = [((labels.open, _FIRST),), items, ((labels.separator, _NEXT), (labels.close, _END)), items, ()]
        return CallDFA([False, False, False, False, True], calls, trimmed=True)

    def member_set(self, name: str, live: int, productive: set[str]) -> MemberSet:
        """The object rules of members rule `name`, where only the members in `live` (bits) and the extras
        if their rule is in `productive` can be written."""
        extras_live = all(label in productive for label in self.members_rules[name].extras)
        key = (name, live, extras_live)     # asked again as rules join the productive ones, and for the frame
        members = self._member_sets.get(key)
        if members is None:
            members = self._member_sets[key] = MemberSet(self.rules[name], live, extras_live)
        return members

    def guards(self, name: str) -> dict[tuple[int, str], tuple[int, int]]:
        """(state, label) -> (object_members kind, member) for the guarded calls of a members rule."""
        labels = self.members_rules[name]
        out = {}
        for state in (_FIRST, _NEXT):
            out.update({(state, label): (CLAIM, k) for k, label in enumerate(labels.members)})
            out.update({(state, label): (EXTRA, -1) for label in labels.extras})
        out[(_AFTER, labels.separator)] = (SEPARATOR, -1)
        out[(_AFTER, labels.close)] = (CLOSE, -1)
        return out


def _least_set(rules: dict[str, CallDFA], seed: set[str], holds: Callable[[str, set[str]], bool],
               joined: Callable[[str], None] = lambda name: None) -> set[str]:
    """The least set holding `seed` and every rule for which `holds(rule, set)`, where `holds` only grows
    with the set: a rule is checked again only when one of the rules it calls joins (a chain of a thousand
    rules is one pass, not a thousand); `joined` hears of each rule that joins."""
    callers: dict[object, set[str]] = {}
    for name, rule in rules.items():
        for calls in rule.calls:
            for label, _ in calls:
                if label not in rules:      # only rules join: a terminal is in the seed or never
                    continue
                known = callers.get(label)   # (setdefault would make a set for every call)
                if known is None:
                    callers[label] = {name}
                else:
                    known.add(name)
    found = set(seed)
    todo = list(rules)
    while todo:
        name = todo.pop()
        if name not in found and holds(name, found):
            found.add(name)
            joined(name)
            todo.extend(callers.get(name, ()))
    return found


def _productive(rules: dict[str, CallDFA], known: set[str],
                compiler: _Compiler) -> tuple[set[str], dict[str, int]]:
    """The rules and terminals that match some text, and per members rule the bits of its members that do;
    `known`: those known to match something (the terminals whose DFAs do, trimmed already, and the closed rules).
    A members rule matches where its object can be completed with the parts that do (its call DFA alone would let
    a member whose value admits no text count towards `required` or `min`)."""
    live = dict.fromkeys(compiler.members_rules, 0)  # per members rule: bits of its members found to match
    owners: dict[str, list[tuple[str, int]]] = {}
    for name, labels in compiler.members_rules.items():
        for k, label in enumerate(labels.members):
            owners.setdefault(label, []).append((name, 1 << k))

    def joined(label: str) -> None:
        for name, bit in owners.get(label, ()):
            live[name] |= bit

    def ends(name: str, found: set[str]) -> bool:
        if name not in live:
            return _ends(rules[name], found)
        # the required members first: cheap, and an object of a thousand is asked a thousand times
        if any(not live[name] >> k & 1 for k in compiler.rules[name].required):
            return False
        return compiler.member_set(name, live[name], found).feasible(EMPTY_TAG, FIRST) and _ends(rules[name], found)

    for label in owners.keys() & known:     # members written as one terminal or a closed rule
        joined(label)
    if not compiler.in_order:
        return _least_set(rules, known, ends, joined), live
    # each rule asked once, after every rule it calls (an object's part rules, `owner<k>`, come after it in the
    # compiler's rules: they are asked first)
    found = set(known)

    def ask(name: str) -> None:
        if name in rules and name not in found and ends(name, found):
            found.add(name)
            joined(name)

    for name in compiler.rules:
        labels = compiler.members_rules.get(name)
        if labels is not None:
            for part in labels.members + labels.extras:
                ask(part)
        ask(name)
    return found, live


def _trim(rules: dict[str, CallDFA], productive: set[str], start: str) -> dict[str, CallDFA]:
    """Drop the calls that cannot lead to the end of their rule (`productive`: see `_productive`)."""
    if start not in productive:
        raise EmptyLanguageError("the grammar matches no string at all")
    out = {}
    for name, rule in rules.items():
        if rule.trimmed and all(lab in productive for calls in rule.calls for lab, _ in calls):
            out[name] = rule
            continue
        ok, whole = _live(rule, productive)
        if whole and all(ok):   # most rules: nothing to drop
            out[name] = rule
            continue
        calls = [tuple((lab, t) for lab, t in rule.calls[s] if lab in productive and ok[t])
                 for s in range(rule.num_states)]
        out[name] = CallDFA([acc and ok[s] for s, acc in enumerate(rule.accept)], calls)
    return out


def _live(rule: CallDFA, productive: set[str] | None = None) -> tuple[list[bool], bool]:
    """States that can reach the end of their rule through calls of productive rules (None: through any call);
    and whether every call is of a productive rule."""
    preds: list[list[int]] = [[] for _ in range(rule.num_states)]
    whole = True
    for s, calls in enumerate(rule.calls):
        for lab, t in calls:
            if productive is None or lab in productive:
                preds[t].append(s)
            else:
                whole = False
    live = list(rule.accept)
    todo = [s for s, acc in enumerate(live) if acc]
    while todo:
        for p in preds[todo.pop()]:
            if not live[p]:
                live[p] = True
                todo.append(p)
    return live, whole


def _called_from(rules: dict[str, CallDFA], roots: frozenset[str]) -> dict[str, CallDFA]:
    """The rules `roots` call, directly or not, themselves included."""
    seen, todo = set(roots), list(roots)
    while todo:
        for calls in rules[todo.pop()].calls:
            for label, _ in calls:
                if label in rules and label not in seen:
                    seen.add(label)
                    todo.append(label)
    return {name: rule for name, rule in rules.items() if name in seen}


def _check_left_recursion(rules: dict[str, CallDFA], nullable_terminals: set[str]) -> None:
    """Refuse rules that can call themselves before consuming a byte."""
    if not any(lab in rules or lab in nullable_terminals for rule in rules.values() for lab, _ in rule.calls[0]):
        return  # no start state calls a rule or a nullable terminal (JSON's any value, recursive objects)
    nullable = _least_set(rules, nullable_terminals, lambda name, found: _ends(rules[name], found))
    first_calls = {}
    for name, rule in rules.items():
        seen, todo, callees = {0}, [0], set()
        while todo:
            s = todo.pop()
            for lab, t in rule.calls[s]:
                if lab in rules:
                    callees.add(lab)
                if lab in nullable and t not in seen:
                    seen.add(t)
                    todo.append(t)
        first_calls[name] = callees
    cyclic = _cyclic(first_calls)
    if cyclic:
        raise GrammarError(f"rule {min(cyclic)!r} is left-recursive (it can call itself before any text)")


def _ends(rule: CallDFA, callable_rules: set[str]) -> bool:
    """Whether the rule can get from its start to its end calling only `callable_rules` (a forward search
    that stops at the first end)."""
    seen, todo = {0}, [0]
    while todo:
        s = todo.pop()
        if rule.accept[s]:
            return True
        for lab, t in rule.calls[s]:
            if lab in callable_rules and t not in seen:
                seen.add(t)
                todo.append(t)
    return False


def compile_automaton(grammar: ir.Grammar, walked: Walked | None = None) -> Automaton:
    """The recursive transition network of `grammar` (raises GrammarError / RegexError); `walked`: what a walk over
    it found already."""
    compiler = _Compiler(grammar, walked)
    names = [grammar.start] + sorted(compiler.called - {grammar.start})
    try:
        rules = {name: compiler.rule_dfa(name) for name in names}
    except BudgetExceeded as e:
        raise GrammarError(f"grammar too large to compile ({e})") from None
    except RecursionError:
        raise GrammarError("grammar nested too deeply to compile") from None
    terminals = compiler.terminal_rules
    productive, live = _productive(
        rules, {lab for lab, dfa in terminals.items() if not dfa.matches_nothing}.union(compiler.closed), compiler)
    rules = _trim(rules, productive, grammar.start)
    if compiler.cyclic:
        nullable_terminals = {lab for lab, dfa in terminals.items() if dfa.accept[0]}
        _check_left_recursion(_called_from(rules, compiler.cyclic), nullable_terminals)
    # structural states first (they consume no bytes), then each terminal DFA
    offsets, total = {}, 0
    for name, rule in rules.items():
        offsets[name] = total
        total += len(rule.accept)
    first_terminal = total
    for label, dfa in terminals.items():
        offsets[label] = total
        total += len(dfa.accept)
    structural_accept: list[bool] = []
    for rule in rules.values():
        structural_accept += rule.accept
    accept = np.concatenate([np.array(structural_accept, bool), *(dfa.accept for dfa in terminals.values())])
    # per structural state: where its call edges start, whether it only returns (`Automaton.tail`); per call edge:
    # the global state called, the one returned to, the index of its guard (-1: none)
    call_ptr, tail, callee, ret, call_guard, guards, frames = [0], [], [], [], [], [], []
    framed = np.zeros(total, np.int8)
    for label in compiler.capture_labels.values():
        framed[offsets[label]] = CAPTURE_FRAME
    for name, rule in rules.items():
        guarded = {}
        if name in compiler.members_rules:
            guarded = compiler.guards(name)
            frames.append(_object_frame(compiler, name, offsets, compiler.member_set(name, live[name], productive)))
            framed[offsets[name]] = MEMBERS_FRAME
        base = offsets[name]
        for state, calls in enumerate(rule.calls):
            for lab, t in calls:
                callee.append(offsets[lab])
                ret.append(t + base)
                kind = guarded.get((state, lab)) if guarded else None   # guards: members rules only
                if kind is None:
                    call_guard.append(-1)
                else:
                    call_guard.append(len(guards))
                    guards.append((len(frames) - 1, *kind))
            call_ptr.append(len(callee))
            tail.append(not calls and rule.accept[state])
    call_ptr_all = np.full(total + 1, len(callee), np.int32)     # terminal states call nothing
    call_ptr_all[:len(call_ptr)] = call_ptr
    has_out = np.concatenate([np.zeros(first_terminal, bool), *(dfa.has_out for dfa in terminals.values())])
    # (a grammar with captured terminals searches its masks whole, sharing no frame)
    keys = {} if compiler.capture_labels else _portable_rules(
        rules, {name: closed.portable for name, closed in compiler.closed.items()})
    portable = tuple((offsets[name], offsets[name] + rules[name].num_states, key) for name, key in keys.items())
    for name, built in compiler.reused.items():
        if rules[name] is built.dfa and name in keys:
            make_room(_CLOSED_RULES, _CLOSED_RULES_KEPT)
            _CLOSED_RULES[id(built.body)] = _ClosedRule(
                name, built.body, built.dfa, tuple((expr, dfa) for _, expr, _, dfa in built.terminals), keys[name])
    return Automaton(
        accept=accept,
        call_ptr=call_ptr_all,
        call_callee=np.array(callee, np.int32),
        call_ret=np.array(ret, np.int32),
        has_out=has_out,
        start=offsets[grammar.start],
        tail=np.concatenate([np.array(tail, bool), np.zeros(total - first_terminal, bool)]),
        terminals=tuple((offsets[label], dfa) for label, dfa in terminals.items()),
        framed=framed,
        call_guard=np.array(call_guard, np.int32),
        guards=tuple(guards),
        frames=tuple(frames),
        portable=portable,
    )


def _portable_rules(rules: dict[str, CallDFA], closed: Mapping[str, tuple[str, int]] | None = None
                    ) -> dict[str, tuple[str, int]]:
    """Per rule kept across grammars that calls only such rules, in turn (`CallDFA.shared`; the value of an object's
    extras, any JSON value, is one), a key naming it with every rule it reaches: two grammars with equal keys hold
    the same automata under the same names, and call the same terminal DFAs (labels name them), so what a token can
    do inside the rule is the same in both.  A key is the rule's name and the number of its group of rules that
    reach each other, which its members (names and automata) and the numbers of the groups it calls name (one set
    per rule's reach took quadratic time and memory on long recursions): another grammar's equal group gets the same
    number.  `closed`: the keys of closed rules, known already (`_ClosedRule`)."""
    closed = closed or {}
    # a kept rule that reaches one not kept is not portable (asked of the kept rules only: most rules are not)
    kept = {name: rule for name, rule in rules.items() if rule.shared}
    if len(kept) == len(closed):    # (closed rules are kept)
        return dict(closed)
    callees = {name: [label for calls in rule.calls for label, _ in calls if label in rules]
               for name, rule in kept.items()}
    excluded = _least_set(kept, {name for name, called in callees.items() if any(c not in kept for c in called)},
                          lambda name, found: any(c in found for c in callees[name]))
    keys = {name: number for name, (_, number) in closed.items()}
    portable = {name: called for name, called in callees.items() if name not in excluded}
    for group in _components(portable):
        if group[0] in closed:  # (a group of its own)
            continue
        named = (tuple(sorted((name, rules[name].uid) for name in group)),
                 tuple(sorted({keys[label] for name in group for label in portable[name] if label in keys})))
        group_key = _PORTABLE_KEYS.get(named)
        if group_key is None:
            if len(_PORTABLE_KEYS) >= _PORTABLE_KEYS_KEPT:
                _PORTABLE_KEYS.clear()
            group_key = _PORTABLE_KEYS[named] = next(_PORTABLE_IDS)
        for name in group:
            keys[name] = group_key
    return {name: (name, key) for name, key in keys.items()}


def _object_frame(compiler: _Compiler, name: str, offsets: dict[str, int], members: MemberSet) -> ObjectFrame:
    labels = compiler.members_rules[name]
    body = compiler.rules[name]
    # (every captured terminal has its label by now: without any, the extras' expression need not be walked)
    captures = compiler.leading_captures(body.extra) if body.extra is not None and compiler.capture_labels else set()
    if len(captures) > 1:
        raise GrammarError(f"the extras of members rule {name!r} begin with {len(captures)} captured terminals, "
                           "not one")
    first = offsets[name]
    return ObjectFrame(members, first + _START, first + _FIRST, first + _AFTER,
                       first + _NEXT, open=offsets[labels.open], items=tuple(offsets[m] for m in labels.members),
                       separator=offsets[labels.separator], close=offsets[labels.close],
                       extra=offsets[labels.extras[0]] if labels.extras else -1,
                       capture=offsets[captures.pop()] if captures else -1)
