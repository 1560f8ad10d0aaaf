"""The grammar IR compiled to a byte-level recursive transition network.

Every rule that takes part in recursion (and the start rule) becomes a DFA over
bytes plus *call edges*: `call(rule, return_state)`.  Everything else is
inlined, and maximal call-free sub-expressions are first compiled to minimal
DFAs (terminal DFAs are memoised across compiles), so a non-recursive grammar is
a single DFA.  Rule DFAs are numbered into one global state space; a parser
configuration is (global state, stack of return states).  Recursion is never
unrolled; left recursion is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import ir
from .errors import GrammarError
from .fsm import DFA, NFA, BudgetExceeded, determinize, live_states, minimize
from .regex import literal_dfa, terminal_dfa

MAX_RULE_STATES = 200_000
_SHARED_LIMIT = 4096
_SHARED_DFAS: dict[ir.Expr, DFA] = {}


@dataclass(eq=False)
class Automaton:
    """Global tables of all rule DFAs: start state `start`, stack returns via call edges."""

    trans: np.ndarray  # int32 [G, 256]; -1: no transition
    accept: np.ndarray  # bool [G]: the rule may end (return) here
    call_ptr: np.ndarray  # int32 [G+1]: CSR into call_callee / call_ret
    call_callee: np.ndarray  # int32: global start state of the called rule
    call_ret: np.ndarray  # int32: global state to continue in after the callee returns
    has_out: np.ndarray  # bool [G]: some byte transition leaves this state
    start: int
    # (first global state, terminal DFA) of each shared terminal rule: their walks are memoised
    # across grammars, since a terminal rule has no calls
    terminals: tuple[tuple[int, DFA], ...] = ()

    @property
    def num_states(self) -> int:
        return len(self.accept)


def _is_loop_terminal(dfa: DFA) -> bool:
    """Terminals like JSON strings: a non-accepting state consuming most bytes.  They are called
    as rules of their own, so their large token walks are shared by every grammar using them."""
    wide = (dfa.trans >= 0).sum(axis=1) >= 128
    return bool((wide & ~dfa.accept).any())


def _refs(expr: ir.Expr, out: set[str]) -> set[str]:
    if isinstance(expr, ir.Ref):
        out.add(expr.name)
    elif isinstance(expr, (ir.Seq, ir.Choice)):
        for item in expr.items:
            _refs(item, out)
    elif isinstance(expr, ir.Repeat):
        _refs(expr.item, out)
    return out


def _recursive_rules(rules: dict[str, ir.Expr]) -> set[str]:
    """Rules lying on a reference cycle (Tarjan's strongly connected components)."""
    graph = {name: _refs(body, set()) for name, body in rules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: set[str] = set()
    counter = [0]

    def visit(root: str) -> None:
        # iterative Tarjan: deep JSON-schema $ref chains must not hit Python's recursion limit
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
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
                if len(component) > 1 or node in graph[node]:
                    result.update(component)

    for name in rules:
        if name not in index:
            visit(name)
    return result


class _Compiler:
    def __init__(self, grammar: ir.Grammar):
        self.rules = grammar.rules
        self.start = grammar.start
        self._check()
        self.recursive = _recursive_rules(self.rules)
        self._call_free: dict[int, bool] = {}
        self._rule_dfa: dict[str, DFA] = {}
        self.terminal_rules: dict[str, DFA] = {}
        self._terminal_labels: dict[ir.Terminal, str] = {}

    def _check(self) -> None:
        if not self.rules:
            raise GrammarError("the grammar has no rules")
        if self.start not in self.rules:
            raise GrammarError(f"the start rule {self.start!r} is not defined")
        for name, body in self.rules.items():
            for ref in _refs(body, set()):
                if ref not in self.rules:
                    raise GrammarError(f"rule {name!r} refers to undefined rule {ref!r}")

    def call_free(self, expr: ir.Expr) -> bool:
        key = id(expr)
        hit = self._call_free.get(key)
        if hit is None:
            if isinstance(expr, ir.Terminal):
                hit = not _is_loop_terminal(self.leaf_dfa(expr))
            elif isinstance(expr, ir.Ref):
                hit = expr.name not in self.recursive and self.call_free(self.rules[expr.name])
            elif isinstance(expr, (ir.Seq, ir.Choice)):
                hit = all(self.call_free(item) for item in expr.items)
            elif isinstance(expr, ir.Repeat):
                hit = self.call_free(expr.item)
            else:
                hit = True
            self._call_free[key] = hit
        return hit

    def leaf_dfa(self, expr: ir.Expr) -> DFA:
        """Minimal DFA of a call-free expression."""
        if isinstance(expr, ir.Terminal):
            return terminal_dfa(expr.pattern, tuple(expr.also), tuple(expr.excluding))
        if isinstance(expr, ir.Lit):
            return literal_dfa(expr.text)
        if isinstance(expr, ir.Ref):
            hit = self._rule_dfa.get(expr.name)
            if hit is None:
                hit = self._rule_dfa[expr.name] = self.leaf_dfa(self.rules[expr.name])
            return hit
        shared = not _refs(expr, set())
        if shared:
            hit = _SHARED_DFAS.get(expr)
            if hit is not None:
                return hit
        nfa = NFA()
        src, dst = nfa.node(), nfa.node()
        self.build(nfa, expr, src, dst, flat=True)
        dfa = minimize(determinize(nfa, src, dst, MAX_RULE_STATES))
        if shared:
            # self-contained expressions (JSON strings, numbers, separators...) recur across grammars
            if len(_SHARED_DFAS) >= _SHARED_LIMIT:
                _SHARED_DFAS.pop(next(iter(_SHARED_DFAS)))
            _SHARED_DFAS[expr] = dfa
        return dfa

    def build(self, nfa: NFA, expr: ir.Expr, src: int, dst: int, flat: bool = False) -> None:
        """NFA fragment for `expr` between src and dst; recursive references become calls."""
        if isinstance(expr, ir.Terminal) and not self.call_free(expr):
            nfa.call(src, self.terminal_label(expr), dst)
        elif isinstance(expr, (ir.Terminal, ir.Lit)):
            nfa.embed(self.leaf_dfa(expr), src, dst)
        elif isinstance(expr, ir.Ref):
            if expr.name in self.recursive:
                nfa.call(src, expr.name, dst)
            elif self.call_free(expr):
                nfa.embed(self.leaf_dfa(expr), src, dst)
            else:
                self.build(nfa, self.rules[expr.name], src, dst, flat)
        elif isinstance(expr, ir.Seq):
            cur = src
            for k, item in enumerate(expr.items):
                nxt = dst if k == len(expr.items) - 1 else nfa.node()
                self.part(nfa, item, cur, nxt, flat)
                cur = nxt
            if not expr.items:
                nfa.epsilon(src, dst)
        elif isinstance(expr, ir.Choice):
            for item in expr.items:
                self.part(nfa, item, src, dst, flat)
        elif isinstance(expr, ir.Repeat):
            self.repeat(nfa, expr, src, dst, flat)
        else:
            raise GrammarError(f"unknown grammar expression {expr!r}")

    def part(self, nfa: NFA, expr: ir.Expr, src: int, dst: int, flat: bool) -> None:
        """A sub-expression; inside a rule with calls, maximal call-free parts become minimal DFAs
        (`flat`: we are already building one such DFA, so keep its parts as plain NFA)."""
        composite = isinstance(expr, (ir.Seq, ir.Choice, ir.Repeat))
        if self.call_free(expr) and not (flat and composite):
            nfa.embed(self.leaf_dfa(expr), src, dst)
        else:
            self.build(nfa, expr, src, dst, flat)

    def repeat(self, nfa: NFA, expr: ir.Repeat, src: int, dst: int, flat: bool) -> None:
        if expr.min < 0 or (expr.max is not None and expr.max < expr.min):
            raise GrammarError(f"bad repetition bounds {expr.min}..{expr.max}")
        cur = src
        for _ in range(expr.min):
            nxt = nfa.node()
            self.part(nfa, expr.item, cur, nxt, flat)
            cur = nxt
        if expr.max is None:
            loop_end = nfa.node()
            self.part(nfa, expr.item, cur, loop_end, flat)
            nfa.epsilon(loop_end, cur)
            nfa.epsilon(cur, dst)
            return
        for _ in range(expr.max - expr.min):
            nfa.epsilon(cur, dst)
            nxt = nfa.node()
            self.part(nfa, expr.item, cur, nxt, flat)
            cur = nxt
        nfa.epsilon(cur, dst)

    def terminal_label(self, expr: ir.Terminal) -> str:
        """The pseudo-rule name under which a loop terminal is called."""
        label = self._terminal_labels.get(expr)
        if label is None:
            label = self._terminal_labels[expr] = f"<terminal {len(self._terminal_labels)}>"
            self.terminal_rules[label] = self.leaf_dfa(expr)
        return label

    def rule_dfa(self, name: str) -> DFA:
        body = self.rules[name]
        if self.call_free(body):
            return self.leaf_dfa(body)
        nfa = NFA()
        src, dst = nfa.node(), nfa.node()
        self.build(nfa, body, src, dst)
        return determinize(nfa, src, dst, MAX_RULE_STATES)


def _trim(dfas: dict[str, DFA], start: str) -> dict[str, DFA]:
    """Drop transitions and calls that cannot lead to the end of their rule."""
    productive: set[str] = set()
    while True:
        live = {name: _live(dfa, productive) for name, dfa in dfas.items()}
        now = {name for name, states in live.items() if states[0]}
        if now == productive:
            break
        productive = now
    if start not in productive:
        raise GrammarError("the grammar matches no string at all")
    out = {}
    for name, dfa in dfas.items():
        ok = live[name]
        trans = np.where((dfa.trans >= 0) & np.append(ok, False)[dfa.trans], dfa.trans, -1).astype(np.int32)
        calls = [
            tuple((lab, t) for lab, t in (dfa.calls[s] if dfa.calls else ()) if lab in productive and ok[t])
            for s in range(dfa.num_states)
        ]
        out[name] = DFA(trans, dfa.accept & ok, calls)
    return out


def _live(dfa: DFA, productive: set[str]) -> np.ndarray:
    """States that can reach the end of their rule through bytes and calls of productive rules."""
    extra = [(s, t) for s in range(dfa.num_states) for lab, t in (dfa.calls[s] if dfa.calls else ()) if lab in productive]
    if not extra:
        return live_states(dfa.trans, dfa.accept)
    trans = dfa.trans
    # a call edge behaves like a transition to its return state: append it as an extra column
    column = np.full((dfa.num_states, 1), -1, np.int32)
    columns = []
    for s, t in extra:
        for col in columns:
            if col[s, 0] < 0:
                col[s, 0] = t
                break
        else:
            col = column.copy()
            col[s, 0] = t
            columns.append(col)
    return live_states(np.concatenate([trans] + columns, axis=1), dfa.accept)


def _check_left_recursion(dfas: dict[str, DFA]) -> None:
    """Refuse rules that can call themselves before consuming a byte."""
    nullable: set[str] = set()
    while True:
        now = {name for name, dfa in dfas.items() if _reaches_accept_without_bytes(dfa, nullable)}
        if now == nullable:
            break
        nullable = now
    first_calls = {}
    for name, dfa in dfas.items():
        seen, todo, callees = {0}, [0], set()
        while todo:
            s = todo.pop()
            for lab, t in dfa.calls[s] if dfa.calls else ():
                callees.add(lab)
                if lab in nullable and t not in seen:
                    seen.add(t)
                    todo.append(t)
        first_calls[name] = callees
    for name in dfas:
        seen, todo = set(), [name]
        while todo:
            for callee in first_calls[todo.pop()]:
                if callee == name:
                    raise GrammarError(f"rule {name!r} is left-recursive (it can call itself before any text)")
                if callee not in seen:
                    seen.add(callee)
                    todo.append(callee)


def _reaches_accept_without_bytes(dfa: DFA, nullable: set[str]) -> bool:
    seen, todo = {0}, [0]
    while todo:
        s = todo.pop()
        if dfa.accept[s]:
            return True
        for lab, t in dfa.calls[s] if dfa.calls else ():
            if lab in nullable and t not in seen:
                seen.add(t)
                todo.append(t)
    return False


def compile_automaton(grammar: ir.Grammar) -> Automaton:
    """The recursive transition network of `grammar` (raises GrammarError / RegexError)."""
    compiler = _Compiler(grammar)
    names = [grammar.start] + sorted(compiler.recursive - {grammar.start})
    try:
        dfas = {name: compiler.rule_dfa(name) for name in names}
        names += list(compiler.terminal_rules)
        dfas.update(compiler.terminal_rules)
    except BudgetExceeded as e:
        raise GrammarError(f"grammar too large to compile ({e})") from None
    except RecursionError:
        raise GrammarError("grammar nested too deeply to compile") from None
    dfas = _trim(dfas, grammar.start)
    _check_left_recursion(dfas)
    offsets, total = {}, 0
    for name in names:
        offsets[name] = total
        total += dfas[name].num_states
    trans = np.concatenate([np.where(d.trans >= 0, d.trans + offsets[n], -1) for n, d in dfas.items()]).astype(np.int32)
    accept = np.concatenate([d.accept for d in dfas.values()])
    call_ptr, callee, ret = [0], [], []
    for name, dfa in dfas.items():
        for s in range(dfa.num_states):
            for lab, t in dfa.calls[s] if dfa.calls else ():
                callee.append(offsets[lab])
                ret.append(t + offsets[name])
            call_ptr.append(len(callee))
    return Automaton(
        trans=trans,
        accept=accept,
        call_ptr=np.array(call_ptr, np.int32),
        call_callee=np.array(callee, np.int32),
        call_ret=np.array(ret, np.int32),
        has_out=(trans >= 0).any(axis=1),
        start=offsets[grammar.start],
        terminals=tuple((offsets[label], dfa) for label, dfa in compiler.terminal_rules.items()),
    )

