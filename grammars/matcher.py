"""Compiled constraints and the per-sequence Matcher.

A parser state is the sorted tuple of distinct configurations (automaton
state, stack id) reached right after a byte (not yet closed under calls and
returns), so equal texts-so-far in equal contexts give equal, hashable states:
the whole-mask cache is keyed by them.  Tuples of ints, unlike frozensets,
leave the garbage collector's view once they survive a collection, so the
caches keyed by states stay out of the full collections' walks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import ir
from .automaton import Automaton
from .automaton_shapes import shaped_automaton
from .collector import collector_paused
from .completion import UNREACHABLE, Completions
from .errors import GrammarError
from .stacks import StackArena
from .token_masks import TokenMasks
from .vocab import Vocabulary, as_vocabulary

State = tuple  # of sorted, distinct (automaton state, stack id)
_MASK_CACHE_LIMIT = 1 << 14
_IDS_CACHE_LIMIT = 1 << 8  # id lists take up to 8 bytes a token (800 KB on cl100k), masks 1 bit


class CompiledGrammar:
    """A grammar compiled for one vocabulary; `.matcher()` starts a sequence.

    One thread at a time: its matchers share its parser's stack arena and caches, which take no lock (a mask
    releases the stacks it made, another thread's among them).  Grammars of their own may run on threads of
    their own; the engine uses a grammar it keeps under its lock only."""

    def __init__(self, automaton: Automaton, vocabulary: Vocabulary):
        self.automaton = automaton
        self.vocabulary = vocabulary
        self.masks = TokenMasks(automaton, vocabulary)
        self.stacks = StackArena(automaton)
        self.initial: State = ((automaton.start, 0),)
        # A state's ready configurations, and apart from them the states that are complete: an answer cached as a
        # (configurations, complete) pair would stay tracked by the garbage collector into its old generation
        # (a collection untracks a tuple only after the tuples inside it, and it meets the pair first).
        self._closures: dict[State, tuple[tuple[int, int], ...]] = {}
        self._complete: set[State] = set()
        self._member_reads: dict[int, tuple[dict[int, int], int]] = {}    # see `_claim_reads`
        self._opened_cache: dict[tuple[State, int | None], tuple[tuple[int, int], ...]] = {}
        self._mask_cache: dict[State, np.ndarray] = {}
        self._ids_cache: dict[State, np.ndarray] = {}
        self._out_bytes: dict[int, np.ndarray] = {}
        # terminal states met: their terminal's first state and their byte row there (local targets)
        self._rows: dict[int, tuple[int, np.ndarray]] = {}
        self._token_steps: dict[tuple[State, int], State | None] = {}
        self._completions: Completions | None = None
        self._completion_cache: dict[State, bytes | None] = {}
        self._completion_ids: dict[State, list[int] | None] = {}
        self._completion_lengths: dict[State, int] = {}

    @classmethod
    def from_ir(cls, grammar: ir.Grammar, tokenizer: Any) -> "CompiledGrammar":
        """Compile an IR grammar for an HF tokenizer or a Vocabulary."""
        with collector_paused():
            return cls(shaped_automaton(grammar), as_vocabulary(tokenizer))

    def matcher(self, max_tokens: int | None = None) -> "Matcher":
        """A fresh per-sequence matcher at the start of the text; with `max_tokens`, its output always
        completes within that many tokens (see `Matcher`)."""
        return Matcher(self, max_tokens)

    # --- parser steps (bytes) ---------------------------------------------------------------

    def closure(self, state: State) -> tuple[tuple[tuple[int, int], ...], bool]:
        """Configurations of `state` that can consume a byte, after calls and returns; and
        whether the text so far is complete (the outermost rule can return).  Where a member of a large object
        comes next, its members' claims stay closed: the configuration of the object's state stands for them (a
        structural state among the ready ones, see `_opened`)."""
        hit = self._closures.get(state)
        if hit is not None:
            return hit, state in self._complete
        ready, complete = self._expand(list(state), set(state))
        if len(self._closures) >= _MASK_CACHE_LIMIT:
            self._closures.clear()
            self._complete.clear()
        hit = self._closures[state] = tuple(sorted(ready))
        if complete:
            self._complete.add(state)
        return hit, complete

    def _expand(self, todo: list[tuple[int, int]], seen: set[tuple[int, int]]) -> tuple[list[tuple[int, int]], bool]:
        """`closure` from the configurations `todo` (all in `seen`)."""
        stacks, masks, first_terminal = self.stacks, self.masks, self.automaton.first_terminal
        call_edges, accept, has_out = masks.call_edges, masks.accepting, masks.reading     # (see TokenMasks.call_edges)
        large = masks.large_objects
        ready, complete = [], False
        while todo:
            g, s = todo.pop()
            if g >= first_terminal:     # a terminal state reads bytes and calls nothing
                if has_out[g]:
                    ready.append((g, s))
                nexts = []
            elif g in large:
                # After each member of a large object its claims made a hundred members' configurations, three
                # stacks each (after the separator, and again after a space), which no mask reads (masks take
                # claims together, `TokenMasks._claimed`): they are opened once a byte picks among them.  A
                # member's key reads a byte first, so the text is not complete through one.
                members, _, edged, others = masks.claim_edges(g)
                if members.claimable(stacks.tag[s]) & edged:
                    ready.append((g, s))
                nexts = stacks.calls(s, others)
            else:
                nexts = stacks.calls(s, call_edges[g])
            if accept[g]:
                if s == 0:
                    complete = True
                else:
                    popped = stacks.pop(s)     # None: a captured text its object wrote already
                    if popped is not None:
                        nexts.append(popped)
            for cfg in nexts:
                if cfg not in seen:
                    seen.add(cfg)
                    todo.append(cfg)
        return ready, complete

    def _opened(self, state: State, byte: int | None) -> tuple[tuple[int, int], ...]:
        """The closure of `state` with the claims a large object's configuration stands for opened: the
        configurations of its claimable members that may read `byte` first (where `byte` is None, of all of them).
        Cached: a state met again is stepped again."""
        key = (state, byte)
        hit = self._opened_cache.get(key)
        if hit is not None:
            return hit
        first_terminal, stacks, masks = self.automaton.first_terminal, self.stacks, self.masks
        ready, _ = self.closure(state)
        out = [cfg for cfg in ready if cfg[0] >= first_terminal]
        objects = [cfg for cfg in ready if cfg[0] < first_terminal]
        seen = set(ready)
        while objects:
            g, s = objects.pop()
            members, edges, edged, _ = masks.claim_edges(g)
            chosen = members.claimable(stacks.tag[s]) & edged
            if byte is not None:
                by_byte, unread = self._claim_reads(g)
                chosen &= by_byte.get(byte, 0) | unread
            picked = []
            while chosen:
                member = chosen.bit_length() - 1
                chosen ^= 1 << member
                picked.append(edges[member])
            todo = [cfg for cfg in stacks.calls(s, picked) if cfg not in seen]
            seen.update(todo)
            for cfg in self._expand(todo, seen)[0]:
                (out if cfg[0] >= first_terminal else objects).append(cfg)
        if len(self._opened_cache) >= _MASK_CACHE_LIMIT:
            self._opened_cache.clear()
        hit = self._opened_cache[key] = tuple(out)
        return hit

    def _claim_reads(self, g: int) -> tuple[dict[int, int], int]:
        """Of the members claimed at large object state `g`: per byte, the members that may read it first (bits);
        and the members whose first bytes are not known (their rule may return before reading any)."""
        hit = self._member_reads.get(g)
        if hit is None:
            by_byte: dict[int, int] = {}
            unread = 0
            for member, c in enumerate(self.masks.claim_edges(g)[1]):
                if c < 0:
                    continue
                first = self._first_bytes(int(self.automaton.call_callee[c]))
                if first is None:
                    unread |= 1 << member
                for byte in first or ():
                    by_byte[byte] = by_byte.get(byte, 0) | 1 << member
            hit = self._member_reads[g] = (by_byte, unread)
        return hit

    def _first_bytes(self, start: int) -> set[int] | None:
        """The bytes a call into `start` may read first, whatever its guards; None where it may return before."""
        a, call_edges = self.automaton, self.masks.call_edges
        seen, todo, out = {start}, [start], set()
        while todo:
            g = todo.pop()
            if a.accept[g]:
                return None
            if g >= a.first_terminal:
                out.update(self._state_bytes(g).tolist())
                continue
            for c in call_edges[g]:
                callee = int(a.call_callee[c])
                if callee not in seen:
                    seen.add(callee)
                    todo.append(callee)
        return out

    def step(self, state: State, data: bytes) -> State | None:
        """The state after `data`, or None if the grammar cannot continue with it."""
        if not state:
            return None
        first_terminal, accepting = self.automaton.first_terminal, self.masks.accepting
        plain = not self.stacks.captures
        for b in data:
            g = state[0][0]
            if plain and len(state) == 1 and g >= first_terminal and not accepting[g]:
                # inside one terminal that cannot end here (a string's inside, a key): its closure is itself, so the
                # byte moves it along its row, without `_step_byte`'s closure, set and sort
                first, row = self._row(g)
                target = int(row[b])
                if target < 0:
                    return None
                state = ((target + first, state[0][1]),)
            else:
                state = self._step_byte(state, b)
                if state is None:
                    return None
        return state

    def _step_byte(self, state: State, b: int) -> State | None:
        """The state after byte `b` from any state (`step` moves some without it)."""
        ready, _ = self.closure(state)   # terminal states (they alone consume bytes), and large objects' states
        if ready and ready[0][0] < self.automaton.first_terminal:     # (which sort first)
            ready = self._opened(state, b)
        moved = set()
        keys = self.masks.keys_stepped(ready, b)
        if keys is not None:
            moved.update(keys[0])
            ready = keys[1]
        for g, s in ready:
            first, row = self._row(g)
            target = int(row[b])
            if target >= 0:
                moved.add((target + first, s))
        stacks = self.stacks
        if stacks.captures:     # a captured text records the byte
            moved = {(g, stacks.extend(s, bytes((b,)))) for g, s in moved}
        return tuple(sorted(moved)) or None

    def _row(self, g: int) -> tuple[int, np.ndarray]:
        """Terminal state `g`'s first state of its terminal and its byte row there (cached): targets left local,
        shifted per byte read, where a copy of the row shifted to global states cost 3 us on each state's first
        byte (BFCL: half the time of a token's step)."""
        row = self._rows.get(g)
        if row is None:
            row = self._rows[g] = self.automaton.terminal_row(g)
        return row

    def step_token(self, state: State, token_id: int) -> State | None:
        """`step` over a token's bytes, cached per state and token (but where texts are captured, which their stacks
        record): a budgeted transformers row checks a thousand tokens a step, in states that come again (inside a
        string)."""
        key = (state, token_id)
        if key in self._token_steps:
            return self._token_steps[key]
        nxt = self.step(state, self.vocabulary.token_bytes[token_id])
        if not self.stacks.captures:
            if len(self._token_steps) >= _MASK_CACHE_LIMIT:
                self._token_steps.clear()
            self._token_steps[key] = nxt
        return nxt

    def next_bytes(self, state: State) -> np.ndarray:
        """Sorted distinct bytes that may follow."""
        ready, _ = self.closure(state)
        if ready and ready[0][0] < self.automaton.first_terminal:
            ready = self._opened(state, None)
        if len(ready) == 1:
            return self._state_bytes(ready[0][0])
        return np.unique(np.concatenate([self._state_bytes(g) for g, _ in ready])) if ready else np.zeros(0, np.int64)

    def _state_bytes(self, g: int) -> np.ndarray:
        hit = self._out_bytes.get(g)
        if hit is None:
            hit = self._out_bytes[g] = np.flatnonzero(self.automaton.terminal_row(g)[1] >= 0)
        return hit

    # --- shortest completions (token budgets) ------------------------------------------------

    @property
    def completions(self) -> Completions:
        """Shortest-completion tables, built on first use (the first matcher with a token budget)."""
        if self._completions is None:
            self._completions = Completions(self.automaton, self.stacks)
        return self._completions

    def completion(self, state: State) -> bytes | None:
        """The bytes of a shortest completion of `state` (b"" when complete; cached per state)."""
        if state not in self._completion_cache:
            if len(self._completion_cache) >= _MASK_CACHE_LIMIT:
                self._completion_cache.clear()
                self._completion_ids.clear()
            self._completion_cache[state] = self.completions.shortest(state)
        return self._completion_cache[state]

    def completion_ids(self, state: State) -> list[int] | None:
        """A shortest completion of `state` canonically tokenized; None when the vocabulary cannot spell it."""
        if state not in self._completion_ids:
            data = self.completion(state)
            self._completion_ids[state] = None if data is None else self.vocabulary.spell(data)
        return self._completion_ids[state]

    def completion_length(self, state: State) -> int | None:
        """The length in bytes of a shortest completion of `state`, None if there is none (cached)."""
        hit = self._completion_lengths.get(state)
        if hit is None:
            if len(self._completion_lengths) >= _MASK_CACHE_LIMIT:
                self._completion_lengths.clear()
            cost = min((self.completions.cost(config) for config in state), default=UNREACHABLE)
            hit = self._completion_lengths[state] = cost if cost < UNREACHABLE else -1
        return hit if hit >= 0 else None

    def fits(self, state: State, budget: int) -> bool:
        """Whether some completion of `state` takes at most `budget` tokens (a token holds at least one
        byte, so a short enough completion in bytes needs no tokenizing)."""
        length = self.completion_length(state)
        if length is None:
            return False
        if length <= budget:
            return True
        ids = self.completion_ids(state)
        return ids is None or len(ids) <= budget    # unspellable: no bound can be promised, so none is kept

    # --- token masks ---------------------------------------------------------------------------

    def mask(self, state: State) -> np.ndarray:
        """Packed uint32 bitmask of allowed tokens (EOS included when complete), cached per state."""
        bits = self._mask_cache.get(state)
        if bits is None:
            bits = np.zeros(self.vocabulary.mask_words, np.uint32)
            ready, complete = self.closure(state)
            self.masks.prefetch(ready)
            mark = len(self.stacks.parent)      # after closure(), whose cached answer keeps the stacks it makes
            self.masks.add_mask(bits, state, self.stacks)
            self.stacks.release(mark)
            if complete:
                for eos in self.vocabulary.eos_ids:
                    bits[eos >> 5] |= np.uint32(1 << (eos & 31))
            if len(self._mask_cache) >= _MASK_CACHE_LIMIT:
                self._mask_cache.clear()
            self._mask_cache[state] = bits
        return bits

    def allowed_ids(self, state: State) -> np.ndarray:
        """Sorted allowed token ids (read-only view of a cached array)."""
        ids = self._ids_cache.get(state)
        if ids is None:
            bits = np.unpackbits(self.mask(state).view(np.uint8), bitorder="little")
            if len(self._ids_cache) >= _IDS_CACHE_LIMIT:
                self._ids_cache.clear()
            ids = self._ids_cache[state] = np.flatnonzero(bits[: self.vocabulary.size])
            ids.flags.writeable = False
        return ids


class Matcher:
    """Per-sequence constraint state: masks, forced tokens, advance and rollback.

    With a token budget (`max_tokens`) the output always completes within it: a token is allowed only
    if a shortest completion still fits after it, and once the budget left comes down to the tokens of
    a shortest completion, that completion is the only way on (forced, one token at a time).  The
    masks stay the grammar's until then, so `is_token_allowed` is the exact test for a sampled token;
    the mask equals it from the moment closing begins.
    """

    def __init__(self, grammar: CompiledGrammar, max_tokens: int | None = None):
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 0):
            raise ValueError(f"max_tokens must be a non-negative int or None, got {max_tokens!r}")
        self.grammar = grammar
        self.max_tokens = max_tokens
        self._states: list[State] = [grammar.initial]
        self._ended = False
        self._plan: tuple[int, list[int]] | None = None     # (position it starts at, closing token ids)
        # Per position: the fewest tokens known to complete the text, as (ids, offset) into an earlier state's
        # completion, or None for the state's own canonical one (see _next_known)
        self._known: list[tuple[list[int], int] | None] = [None]
        self._peek: tuple[tuple, State | None] | None = None

    @property
    def _state(self) -> State:
        return self._states[-1]

    @property
    def _position(self) -> int:
        """Tokens consumed so far."""
        return len(self._states) - 1

    def _closing(self) -> list[int] | None:
        """The rest of the closing plan when the budget left only fits a shortest completion, else None."""
        if self.max_tokens is None or self._ended:
            return None
        if self._plan is not None and self._plan[0] <= self._position:
            return self._plan[1][self._position - self._plan[0]:]
        left = self.max_tokens - self._position
        length = self.grammar.completion_length(self._state)
        if length is None or left > length:
            return None
        ids = self._known_completion()
        if ids is None or left > len(ids):
            return None
        self._plan = (self._position, ids)
        return ids

    def _known_completion(self) -> list[int] | None:
        """The fewest tokens known to complete the text from here."""
        known = self._known[-1]
        if known is None:
            return self.grammar.completion_ids(self._state)
        ids, offset = known
        return ids[offset:]

    def _next_known(self, token_id: int, state: State) -> tuple[list[int], int] | None:
        """The known completion once `token_id` takes the text to `state`: the rest of the current one when the
        token followed it and it is shorter than the state's canonically tokenized shortest completion (a
        shortest completion in bytes from a later state may take more tokens, and the budget must keep to the
        route it promised), else None, the state's own.  Where that one fits the budget left by its length in
        bytes alone, it is None without tokenizing anything, so far from the budget this costs nothing.  Kept
        per position, so it depends on the tokens only."""
        if self.max_tokens is None:
            return None
        length = self.grammar.completion_length(state)
        if length is None or length <= self.max_tokens - self._position - 1:
            return None
        route = self._known_completion()
        if not route or route[0] != token_id:
            return None
        ids = self.grammar.completion_ids(state)
        if ids is not None and len(route) - 1 >= len(ids):
            return None
        known = self._known[-1]
        return (route, 1) if known is None else (known[0], known[1] + 1)

    def completion_tokens(self) -> list[int] | None:
        """The fewest tokens that complete the text from here (the closing plan once closing began);
        [] when complete, None when the vocabulary cannot spell a completion."""
        if self._ended:
            return []
        plan = self._closing()
        return plan if plan is not None else self._known_completion()

    def allowed_token_ids(self) -> np.ndarray:
        """Sorted ids of the tokens allowed next (EOS exactly when the text so far is complete).  Under a budget,
        until closing begins, a token here may still be refused by `is_token_allowed`: one after which the text
        could not close in the tokens left (the engine then takes the shortest completion's first token)."""
        if self._ended:
            return np.zeros(0, np.int64)
        plan = self._closing()
        if plan is not None:
            return np.flatnonzero(np.unpackbits(self._plan_mask(plan).view(np.uint8), bitorder="little"))
        return self.grammar.allowed_ids(self._state)

    def fill_bitmask(self, buffer: np.ndarray) -> None:
        """Write the allowed set into an int32 buffer of ceil(vocabulary.size / 32) words (bit i%32 of word i//32)."""
        words = self.grammar.vocabulary.mask_words
        if buffer.dtype != np.int32 or buffer.ndim != 1 or len(buffer) < words:
            raise ValueError(f"fill_bitmask needs a 1-D int32 buffer of at least {words} words")
        plan = None if self._ended else self._closing()
        if self._ended:
            buffer[:words] = 0
        elif plan is not None:
            buffer[:words] = self._plan_mask(plan).view(np.int32)
        else:
            buffer[:words] = self.grammar.mask(self._state).view(np.int32)

    def _plan_mask(self, plan: list[int]) -> np.ndarray:
        """Closing: the plan's next token; with nothing left to close, eos where the grammar allows it."""
        if not plan:
            bits = self.grammar.mask(self._state).copy()
            eos = np.zeros_like(bits)
            for token in self.grammar.vocabulary.eos_ids:
                eos[token >> 5] |= np.uint32(1 << (token & 31))
            return bits & eos
        bits = np.zeros(self.grammar.vocabulary.mask_words, np.uint32)
        bits[plan[0] >> 5] = np.uint32(1 << (plan[0] & 31))
        return bits

    def is_token_allowed(self, token_id: int) -> bool:
        """Whether `token_id` may come next (under a budget: and the text can still complete after it)."""
        return self._next(int(token_id)) is not None

    def _next(self, token_id: int) -> State | None:
        """The state after `token_id` (the current one for eos), None when it is not allowed; the last
        answer is kept, since a token is usually checked just before it is consumed."""
        key = (len(self._states), self._state, token_id, self._known[-1])
        if self._peek is None or self._peek[0] != key:
            self._peek = (key, self._successor(token_id))
        return self._peek[1]

    def _successor(self, token_id: int) -> State | None:
        if self._ended or not 0 <= token_id < self.grammar.vocabulary.size:
            return None
        g = self.grammar
        if not int(g.mask(self._state)[token_id >> 5]) >> (token_id & 31) & 1:     # (numpy's scalar ops: 0.4 us)
            return None
        if token_id in g.vocabulary.eos_ids:
            return self._state
        plan = self._closing()
        if plan is not None and (not plan or token_id != plan[0]):
            return None
        nxt = g.step_token(self._state, token_id)
        if nxt is None:  # the mask allowed it, so this is an internal inconsistency
            raise GrammarError(f"token {token_id} was allowed but cannot be consumed")
        if self.max_tokens is not None and plan is None:
            room = self.max_tokens - self._position - 1
            if not g.fits(nxt, room):
                known = self._known_completion()          # its first token keeps its promise
                if not known or known[0] != token_id or len(known) - 1 > room:
                    return None
        return nxt

    def advance(self, token_id: int) -> None:
        """Consume one token; raises ValueError if it is not allowed."""
        token_id = int(token_id)
        nxt = self._next(token_id)
        if nxt is None:
            raise ValueError(f"token {token_id} is not allowed by the constraint here")
        self._ended = token_id in self.grammar.vocabulary.eos_ids
        self._known.append(self._next_known(token_id, nxt))
        self._states.append(nxt)

    def rollback(self, n: int) -> None:
        """Undo the last `n` advances."""
        if not 0 <= n < len(self._states):
            raise ValueError(f"cannot roll back {n} tokens: only {len(self._states) - 1} were advanced")
        if n:
            del self._states[-n:]
            self._ended = False
            if self._plan is not None and self._plan[0] > self._position:
                self._plan = None
            del self._known[len(self._states):]

    def is_finished(self) -> bool:
        """True when EOS was consumed, or the text is complete and nothing but EOS can follow."""
        if self._ended:
            return True
        ready, complete = self.grammar.closure(self._state)
        return complete and not ready

    def forced_bytes(self) -> bytes:
        """The bytes every continuation starts with (stops at a choice or where the text may end)."""
        g = self.grammar
        if self._ended:
            return b""
        out, state = bytearray(), self._state
        while True:
            ready, complete = g.closure(state)
            options = g.next_bytes(state)
            if complete or len(options) != 1:
                return bytes(out)
            out.append(int(options[0]))
            state = g.step(state, out[-1:])

    def forced_tokens(self) -> list[int]:
        """Token ids of the only possible continuation, canonically tokenized; the last token is
        held back unless the text ends there, since it could merge with what follows.  Closing under
        a budget, the whole rest of the closing plan."""
        plan = self._closing()
        if plan is not None:
            return list(plan)
        data = self.forced_bytes()
        if not data:
            return []
        end_state = self.grammar.step(self._state, data)
        ready, complete = self.grammar.closure(end_state)
        finished = complete and not ready
        if not finished:
            # never split a UTF-8 character: keep the forced text to whole characters
            cut = len(data)
            while cut > 0 and not _utf8_whole(data[:cut]):
                cut -= 1
            data = data[:cut]
        if not data:
            return []
        ids = self.grammar.vocabulary.spell(data)
        if ids is None:      # the forced text only starts tokens (a word-level vocabulary): let the mask choose
            return []
        return self._within_budget(ids if finished else ids[:-1])

    def _within_budget(self, ids: list[int]) -> list[int]:
        """The leading forced tokens after which the text can still complete within the budget."""
        if self.max_tokens is None:
            return ids
        state, left = self._state, self.max_tokens - self._position
        for i, token in enumerate(ids):
            state = self.grammar.step(state, self.grammar.vocabulary.token_bytes[token])
            left -= 1
            if state is None or not self.grammar.fits(state, left):
                return ids[:i]
        return ids


def _utf8_whole(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
