"""Token masks: a parser state's allowed tokens, from cached walks of the vocabulary trie (`trie_walks`).

A walk runs inside one terminal DFA and stops at its *pop points*, the trie nodes where the terminal may end.
What follows a pop point depends on the rule around the terminal and on the parser stack, so `TokenMasks.add_mask`
continues the walk from there in the caller's return state, which dispatches to the next terminals through its
call edges.  Terminal DFAs are shared objects, so a walk depends on (terminal DFA, state, trie nodes) only and is
cached per vocabulary across grammars: the big walks (inside a JSON string, the first token of a value) are paid
once per process, not once per grammar, and a whole-vocabulary walk from a state that moves like another on all
but a few first bytes is patched from that state's walk instead of walking the trie again.

Above the walks, a mask is searched one stack frame at a time (`TokenMasks._in_frame`): what a configuration
allows before its top frame returns, and the trie nodes where it returns, depend on its state, the tag of that
frame and the nodes only (guards read their own frame), so the answer is kept per grammar and shared by every
parser state holding that frame, whatever lies below it; a frame pushed on it is answered the same way.

Inside a captured terminal (`ir.Capture`) the walk is the terminal's own, less the tokens that would write a
text its object wrote already, or would reach a prefix whose every completion it did (`captured_texts`); where
the text ends inside a token, the walk goes on with the text added to the object's (`StackArena.pop`), so a token
holding two keys is checked for both.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left

import numba
import numpy as np

from . import captured_texts, trie_walks
from .automaton import CAPTURE_FRAME, Automaton, ObjectFrame
from .captured_texts import (NO_DEAD_END, clear_below, dead_depth, dead_depths, dead_ends, descend_texts,
                             followed_nodes, goes_on, reading_nodes, writes_again)
from .fsm import DFA, packed_bytes
from .object_members import CLAIM, MemberSet
from .stacks import Edge, FrameTag, StackArena
from .trie_tables import first_byte_nodes, root_children, subtree_heights, subtree_tables
from .trie_walks import (NO_KEY, NO_POPS, ROOT, ROOT_KEY, SCRATCH, add_walk, narrow_walk, new_walk, patch_walk,
                         row_reach, run_walk, run_walks_together, skipping_args, spell_from_root, spelled_apart)
from .vocab import Vocabulary
from .walk_cache import SharedWalks, Walk

_SHARED_WALKS_LIMIT = 1 << 15  # per vocabulary, walks of narrow states; most are sparse (a few words of bitmask)
_SHARED_FRAMES_LIMIT = 1 << 11  # per vocabulary, answers of frames inside rules every grammar reads alike (one
# of more than _MAX_FRAME_WALKS walks holds a whole bitmask: 12 KB on cl100k)
# per vocabulary, wide states' walks (a dense bitmask, often tens of thousands of pop points: 12-250 KB on cl100k)
_SHARED_WIDE_BYTES = 64 << 20
# a whole-vocabulary walk over fewer trie nodes is kept per DFA state only, not shared between DFAs by its state's
# signature: the signature costs 20-50 us, as much as walking ~20k nodes (walks of keys and enum values enter a few
# hundred)
_SIGNED_WALK_NODES = 20_000
# a whole-vocabulary walk is patched from a neighbour's when it differs on this few bytes: up to a class of hex
# digits (a key pattern of 32 hex digits beside any key: each position of it walked the trie afresh, 6 ms a mask)
_MAX_PATCHED_BYTES = 32
_MAX_PATCH_DEPTH = 4  # ...through at most this many neighbours (prefixes of an excluded key)
_PATCHED_MIN_BYTES = 128  # ...from a state taking at least this many first bytes (a string's inside)
# a whole-vocabulary walk is narrowed from another automaton's when the two read alike for this many bytes (a
# length-bounded string's short of its bound): closer to the bound, most of the trie lies deeper, and a walk of
# its own skips more of it (cl100k: at 7 bytes, 4.7 ms narrowed against 3.3 walked; at 15, 0.5 against 1.3)
_NARROWED_DEPTH = 12
_FRAME_CACHE_LIMIT = 1 << 12  # per grammar; an entry holds up to a whole bitmask (12 KB on cl100k)
# a wide walk skips main paths (`DFA.byte_runs`: a pass over its table, 0.1-0.6 us per DFA state as minimisation kept
# its byte classes or not) from the first for a DFA of this many states, and from the k-th for one k times larger:
# skipping saves about 1 ms a walk on cl100k, and a pattern under a length bound unrolled over the count took 6 ms
# for its first walk where 1.5 walked plainly
_SKIPPING_STATES = 2048
_MAX_FRAME_WALKS = 8  # a frame's answer keeps this many walks as they are, more merged into one bitmask
_MAX_FRAME_NESTING = 48  # frames searched one inside another (two Python calls each), well inside the recursion limit
# objects with this many members or more have their members' answers taken together where a member comes next (see
# `_Claims`); below it, the edges one by one cost about as much as the index (Kubernetes' instances: 8 members took
# 1% longer, 16 and 32 the same)
_CLAIMS_TOGETHER = 16
# a parser state of this many configurations or more has those in states of chains (object keys) spelled in one
# compiled pass (`spell_from_root`) instead of walked one by one (after `{"` in an object of a thousand optional
# members, a thousand key states: 1-2 ms a mask)
_KEYS_TOGETHER = 16
# a trie subtree of more nodes than this is not searched for a captured text written again (`writes_again`): a token
# below it is taken to write it, which is exact (the text is added to its object's and the search goes on), and below
# the root, where a number may end before the token, the search took 250-400 us a mask on cl100k and nearly always
# found one (an array of 30 unique integers: mask time -50%, in process)
_SEARCHED_FOR_TEXTS = 20_000


@numba.njit(cache=True, nogil=True)
def _or_chosen(words, values, owners, chosen, bits, touched):  # pragma: no cover - compiled
    """The sparse entries (`words`, `values`) whose owner is `chosen` (a flag per owner) ORed together, as sorted
    words and their values; `bits` (all zero, left so) and `touched` are scratch rows.  A sparse walk's values are
    never zero, so a word is listed in `touched` once."""
    n = 0
    for i in range(len(words)):
        if chosen[owners[i]]:
            w = words[i]
            if bits[w] == 0:
                touched[n] = w
                n += 1
            bits[w] |= values[i]
    out = np.sort(touched[:n])
    merged = bits[out]
    bits[out] = 0
    return out, merged


def load_kernels(vocabulary: Vocabulary) -> None:
    """Load the kernels that only some masks reach (see `trie_walks.load_kernels`, `captured_texts.load_kernels`)
    and `_or_chosen`, which only a large object calls: they would otherwise load, from numba's disk cache, inside
    the first mask that needs one."""
    trie_walks.load_kernels(vocabulary)
    captured_texts.load_kernels(vocabulary)
    _or_chosen(np.zeros(1, np.int64), np.zeros(1, np.uint32), np.zeros(1, np.int32), np.zeros(1, np.uint8),
               *SCRATCH.of(vocabulary)[:2])


# What a configuration allows before its top frame returns: its walks, and the trie nodes where the frame returns
# (an array and its bytes, per distinct set)
FrameAnswer = tuple[tuple[Walk, ...], tuple[tuple[np.ndarray, bytes], ...]]


# per vocabulary: (terminal DFA, state, trie nodes) or (state signature, root) -> Walk, shared by every grammar
_SHARED_WALKS: "weakref.WeakKeyDictionary[Vocabulary, SharedWalks]" = weakref.WeakKeyDictionary()
# per vocabulary: ((rule key, state in the rule), frame tag, trie nodes) -> FrameAnswer, shared by every grammar
# holding the rule (`Automaton.portable`), in a cache of walks' kind (its narrow tier: bounded by count)
_SHARED_FRAMES: "weakref.WeakKeyDictionary[Vocabulary, SharedWalks]" = weakref.WeakKeyDictionary()


def _narrowable(dfa: DFA, state: int) -> bool:
    """Whether the whole-vocabulary walk of wide `state` is narrowed from another automaton's
    (`_narrowed_root_walk`)."""
    return dfa.like is not None and dfa.like_depths[state] >= _NARROWED_DEPTH


def _patch_reference(dfa: DFA, state: int, depth: int) -> int | None:
    """The state whose whole-vocabulary walk that of `state` is patched from (`_patched_root_walk`): its main
    successor, where the two part on at most `_MAX_PATCHED_BYTES` bytes; None where no walk is patched."""
    row = dfa.trans[state]
    targets = row[row >= 0]
    if depth >= _MAX_PATCH_DEPTH or len(targets) < _PATCHED_MIN_BYTES:
        return None
    ref = int(np.bincount(targets).argmax())
    if ref == state or np.count_nonzero(row != dfa.trans[ref]) > _MAX_PATCHED_BYTES:
        return None
    return ref


ClaimEdges = tuple[MemberSet, tuple[int, ...], int, tuple[int, ...]]


def _claim_edges(automaton: Automaton, g: int, frame: ObjectFrame) -> ClaimEdges:
    """At `g`, a state of `frame` where a member comes next: its members, per member the claim edge that pushes the
    member's frame (-1: none), the bits of those members, and the other edges."""
    lo, hi = int(automaton.call_ptr[g]), int(automaton.call_ptr[g + 1])
    claims, others, edged = [-1] * frame.members.size, [], 0
    for c, guard in enumerate(automaton.call_guard[lo:hi].tolist(), lo):
        kind, member = automaton.guards[guard][1:] if guard >= 0 else (-1, -1)
        if kind == CLAIM and (automaton.framed[automaton.call_callee[c]] or not automaton.tail[automaton.call_ret[c]]):
            claims[member] = c
            edged |= 1 << member
        else:
            others.append(c)
    return frame.members, tuple(claims), edged, tuple(others)


def _key_starts(automaton: Automaton, call_edges: tuple[range, ...], edges: tuple[int, ...], chained: bytes
                ) -> tuple[int, ...]:
    """Per member of a large object (by its claim edge in `edges`, -1: none), the state of a chain terminal (its key)
    that its frame begins in, where its rule starts with one unguarded call into such a state and nothing else; -1
    elsewhere.  Below some trie nodes, such a frame allows what the key's walk does, and returns nowhere where the
    walk stops at no pop point."""
    a = automaton
    out = []
    for c in edges:
        start = -1
        if c >= 0:
            callee = int(a.call_callee[c])
            inner = call_edges[callee] if callee < a.first_terminal and not a.accept[callee] else ()
            if len(inner) == 1 and a.call_guard[inner[0]] < 0 and chained[a.call_callee[inner[0]]]:
                start = int(a.call_callee[inner[0]])
        out.append(start)
    return tuple(out)


class _Claims:
    """Where a member of a large object comes next (after `{` or a separator), below some trie nodes: what each
    member's frame allows, the same whatever the object wrote before it, and the sparse walks of all of them in one
    index, so that a new tag takes its claimable members' tokens in one compiled pass instead of a hundred guarded
    edges one by one (after each member of a Snowplow event, 0.3-0.9 ms).  Members join as they are first claimable.
    Slots and few containers: a grammar keeps a table per such state and trie nodes (up to ~100 replaying a
    subset's instances), and the garbage collector walks each container it holds."""

    __slots__ = ("known", "returns", "dense", "_sparse", "_index")

    def __init__(self) -> None:
        self.known = 0          # bits of the members whose answers are in
        self.returns: dict[int, tuple[tuple[np.ndarray, bytes], ...]] = {}   # of members whose frame can return
        self.dense: list[tuple[int, Walk]] = []     # (member, walk) of the walks kept whole
        # (words, values, owners): sparse walks, each entry's member in `owners` (one member's walk, or the keys of
        # many spelled at once)
        self._sparse: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._index: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None   # of the first n sparse

    def add(self, member: int, answer: FrameAnswer) -> None:
        if answer[1]:
            self.returns[member] = answer[1]
        for walk in answer[0]:
            if walk[0] is None:
                self.dense.append((member, walk))
            elif len(walk[0]):
                self._sparse.append((walk[0], walk[1], np.full(len(walk[0]), member, np.int32)))
        self.known |= 1 << member    # last: a member counts as known once all of it is in

    def add_spelled(self, members: int, words: np.ndarray, values: np.ndarray, owners: np.ndarray) -> None:
        """Members (bits) whose answers are their keys' walks alone, as sparse entries of theirs (`owners`: member
        indices)."""
        if len(words):
            self._sparse.append((words, values, owners))
        self.known |= members

    def index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The sparse walks' words, values and owners (member indices), concatenated."""
        n, kept = len(self._sparse), self._index
        if kept is None or kept[0] != n:
            parts = self._sparse[:n] or [(np.zeros(0, np.int64), np.zeros(0, np.uint32), np.zeros(0, np.int32))]
            kept = self._index = (n, tuple(np.concatenate(column) for column in zip(*parts)))
        return kept[1]


class TokenMasks:
    """Token masks of one automaton over one vocabulary, from cached terminal walks."""

    def __init__(self, automaton: Automaton, vocabulary: Vocabulary):
        self.a = automaton
        self.vocabulary = vocabulary
        self._walks: dict[tuple[int, bytes], Walk] = {}
        # per terminal state met by `prefetch`: whether its whole-vocabulary walk is wide and its own (not narrowed
        # from another automaton's), which its DFA alone decides: asked of every configuration of every new parser
        # state (a key's start, after each member of an object), and found by a compiled pass over its row
        self._wide_own: dict[int, bool] = {}
        # a frame's answer, its walks and its returns kept apart: cached as one nested pair it would stay tracked by
        # the garbage collector into its old generation (see CompiledGrammar's closures)
        self._frame_walks: dict[tuple[int, FrameTag, bytes], tuple[Walk, ...]] = {}
        self._frame_returns: dict[tuple[int, FrameTag, bytes], tuple[tuple[np.ndarray, bytes], ...]] = {}
        self._first_byte_nodes = first_byte_nodes(vocabulary)
        self._root_children = root_children(vocabulary)
        self._shared = _SHARED_WALKS.get(vocabulary)
        if self._shared is None:
            self._shared = _SHARED_WALKS.setdefault(vocabulary, SharedWalks(_SHARED_WALKS_LIMIT, _SHARED_WIDE_BYTES))
        # read per configuration by the searches here and by the parser's closures, and indexing numpy from Python
        # costs ~0.1 us a time: the structural states' call edges as ranges (made once: a closure took two lookups
        # and a range per state), whether each state accepts and reads bytes as bytes (0 or 1)
        ptr = automaton.call_ptr[:automaton.first_terminal + 1].tolist()
        self.call_edges = tuple(map(range, ptr[:-1], ptr[1:]))
        self.accepting, self.reading = automaton.accept.tobytes(), automaton.has_out.tobytes()
        # a token that ends a captured text goes on with the text added to its object's only where enough of it is
        # left to write a separator and that text again, or the start of another that it may make a dead end (see
        # `_dead_reach`)
        captured = [automaton.terminal_of(int(first))[1] for first in np.flatnonzero(automaton.framed == CAPTURE_FRAME)]
        # captured terminals whose strings can run out from some state on (then a prefix may be a dead end)
        self._runs_out = {dfa.uid for dfa in captured if (dfa.finite & dfa.has_out).any()}
        self._dead_depths = [dead_depths(dfa) for dfa in captured if dfa.uid in self._runs_out]
        self._dead_reaches: dict[int, int] = {}   # by the number of texts the stack's objects hold
        # what follows a captured text ending where the texts do not matter, by (return state, stack below, trie
        # nodes), for stacks below `_kept`, which outlive the mask being searched (see `_after_text`)
        self._after_texts: dict[tuple[int, int, bytes], Walk] = {}
        self._kept = 0
        # see `_bytes_after`: by return state, and by (return state, stack below)
        self._bytes_after_states: dict[int, np.ndarray] = {}
        self._bytes_after_texts: dict[tuple[int, int], np.ndarray] = {}
        # the states of objects with `_CLAIMS_TOGETHER` members or more where a member comes next, and their edges
        # once searched or read by the parser (see `claim_edges`)
        self.large_objects = {g: frame for frame in automaton.frames if frame.members.size >= _CLAIMS_TOGETHER
                              for g in (frame.first, frame.next)}
        self._claim_edges: dict[int, ClaimEdges] = {}
        self._key_starts: dict[int, tuple[int, ...]] = {}    # see `_key_starts`, by object state
        self._claims: dict[tuple[int, bytes], _Claims] = {}
        # the structural states of rules that read the same in every grammar holding them, as (rule key, state in
        # the rule): answers inside them are shared between grammars (`_in_frame`)
        self._portable = {g: (key, g - first) for first, end, key in automaton.portable for g in range(first, end)}
        # the texts the chain terminals (keys) read, packed, and per state where the rest of its text lies, for
        # `spell_from_root`; with a byte per state, 1 where it reads a chain: made where a state first holds many
        # configurations (`_chain_tables`)
        self._chains: tuple[np.ndarray, np.ndarray, np.ndarray, bytes] | None = None
        self._shared_frames = _SHARED_FRAMES.get(vocabulary)
        if self._shared_frames is None:
            self._shared_frames = _SHARED_FRAMES.setdefault(vocabulary, SharedWalks(_SHARED_FRAMES_LIMIT, 0))

    def walk(self, state: int, nodes: np.ndarray, nodes_key: bytes) -> Walk:
        """Tokens below the trie `nodes` consumable from terminal state `state`, and pop points (cached)."""
        key = (state, nodes_key)
        hit = self._walks.get(key)
        if hit is None:
            first, dfa = self.a.terminal_of(state)
            hit = self._walks[key] = self._shared_walk(dfa, state - first, nodes, nodes_key)
        return hit

    def claim_edges(self, g: int) -> ClaimEdges | None:
        """Where `g` is a state of a large object where a member comes next, its claim edges (see `_claim_edges`);
        None for any other state."""
        frame = self.large_objects.get(g)
        if frame is None:
            return None
        claims = self._claim_edges.get(g)
        if claims is None:
            claims = self._claim_edges[g] = _claim_edges(self.a, g, frame)
        return claims

    def _shared_walk(self, dfa: DFA, state: int, nodes: np.ndarray, nodes_key: bytes, depth: int = 0) -> Walk:
        # kept per DFA state, and walks of the whole vocabulary from a wide state also by the state's signature:
        # they are the expensive ones, shared between all states with the same future (the inside of every JSON
        # string, whatever its declared keys)
        key = (dfa.uid, state, nodes_key)
        hit = self._shared.get(key)
        if hit is not None:
            return hit
        root = nodes_key == ROOT_KEY
        out_bytes, wide = self._first_bytes(dfa, state) if root else (0, False)
        if wide and _narrowable(dfa, state):
            hit = self._narrowed_root_walk(dfa, state)
            self._shared.put(key, hit, wide)
            return hit
        signature = dfa.signature(state) if wide else None
        signed = (signature, nodes_key) if signature is not None else None
        hit = self._shared.get(signed) if signed is not None else None
        if hit is None:
            # counted already: the patch's own check would index the row again (2 us on every key's first walk)
            hit = self._patched_root_walk(dfa, state, depth) if out_bytes >= _PATCHED_MIN_BYTES else None
            if hit is None:
                hit = run_walk(dfa, self.vocabulary, state, nodes, wide=wide,
                               skipping=wide and self._skips(dfa))
            if signed is not None:
                self._shared.put(signed, hit, wide)
        # a dense walk below other nodes (a long string's first chunk after every token opening it) costs as much as
        # a wide state's: among the narrow walks, a few hundred schemas pushed it out and each walked it again (2-3
        # ms a mask on Github_hard)
        self._shared.put(key, hit, wide or hit[0] is None)
        return hit

    def _skips(self, dfa: DFA) -> bool:
        """Whether a wide walk of `dfa` skips main paths: it pays for the byte runs once the walks without them
        have cost about as much (see `_SKIPPING_STATES`)."""
        if dfa.has_byte_runs or dfa.num_states <= _SKIPPING_STATES:
            return True
        dfa.plain_walks += 1    # (on the DFA: grammars share it)
        return dfa.num_states <= dfa.plain_walks * _SKIPPING_STATES

    def prefetch(self, configurations: tuple[tuple[int, int], ...]) -> None:
        """Take together the whole-vocabulary walks from wide states that `configurations` (a parser state's, ready to
        read) need and no cache holds or derives (for a patched walk, its reference's), where there are two or more:
        one pass over the trie serves them all.  Each branch of a `oneOf` of patterns walked the trie by itself, 1-2
        ms each (five of them, 9 ms in one mask)."""
        if len(configurations) < 2:     # the common case, and nothing to take together
            return
        if len(configurations) >= _KEYS_TOGETHER:   # keys are spelled together (`add_mask`), not walked
            chained = self._chain_tables()[3]
            configurations = tuple([c for c in configurations if not chained[c[0]]])
        batch: dict[tuple, tuple[DFA, int, tuple | None]] = {}
        wide_own = self._wide_own
        for g, _ in configurations:
            if wide_own.get(g) is False or (g, ROOT_KEY) in self._walks:
                continue
            if g < self.a.first_terminal:    # a large object's state: its members' keys are not wide
                wide_own[g] = False
                continue
            first, dfa = self.a.terminal_of(g)
            if g not in wide_own:
                wide_own[g] = self._first_bytes(dfa, g - first)[1] and not _narrowable(dfa, g - first)
                if not wide_own[g]:
                    continue
            found = self._walk_to_run(dfa, g - first)
            if found is not None and found[0] not in batch:
                batch[found[0]] = (dfa, *found[1:])
        if len(batch) < 2:
            return
        walks = run_walks_together([(dfa, state) for dfa, state, _ in batch.values()], self.vocabulary)
        for (key, (_, _, signed)), walk in zip(batch.items(), walks):
            if signed is not None:
                self._shared.put(signed, walk, True)
            self._shared.put(key, walk, True)

    def _walk_to_run(self, dfa: DFA, state: int, depth: int = 0) -> tuple[tuple, int, tuple | None] | None:
        """The wide walk on the trie that the whole-vocabulary walk from `state` would take where no cache holds it
        (its own, or its patch reference's), as (key, state, signature key); None where it is known, narrowed, or
        not wide (see `_shared_walk`)."""
        key = (dfa.uid, state, ROOT_KEY)
        if self._shared.get(key) is not None:
            return None
        out_bytes, wide = self._first_bytes(dfa, state)
        if not wide or _narrowable(dfa, state):
            return None
        signature = dfa.signature(state)
        signed = (signature, ROOT_KEY) if signature is not None else None
        if signed is not None and self._shared.get(signed) is not None:
            return None
        ref = _patch_reference(dfa, state, depth) if out_bytes >= _PATCHED_MIN_BYTES else None
        return (key, state, signed) if ref is None else self._walk_to_run(dfa, ref, depth + 1)

    def _first_bytes(self, dfa: DFA, state: int) -> tuple[int, bool]:
        """How many first bytes `state` takes, and whether they lead into at least `_SIGNED_WALK_NODES` trie nodes (a
        bound on what its whole-vocabulary walk visits; it is wide): only such a walk is worth a signature, which
        costs as much as walking ~20k nodes."""
        out_bytes, nodes = row_reach(dfa.trans[state], self._first_byte_nodes)
        return out_bytes, nodes >= _SIGNED_WALK_NODES

    def _patched_root_walk(self, dfa: DFA, state: int, depth: int) -> Walk | None:
        """The whole-vocabulary walk of a wide state that moves like its main successor on all
        but a few bytes (inside a string, a prefix of an excluded key): the successor's walk, patched
        under those bytes (`patch_walk`).  None where that does not apply."""
        ref = _patch_reference(dfa, state, depth)
        if ref is None:
            return None
        base = self._shared_walk(dfa, ref, ROOT, ROOT_KEY, depth + 1)
        bits = np.zeros(self.vocabulary.mask_words, np.uint32)
        add_walk(base, bits)
        pops = patch_walk(*skipping_args(dfa, self.vocabulary), state, ref, _MAX_PATCHED_BYTES, bits, base[2])
        return new_walk(bits, pops)

    def _narrowed_root_walk(self, dfa: DFA, state: int) -> Walk:
        """The whole-vocabulary walk of a state that reads like a state of another automaton for a few bytes (a
        length-bounded string, any string's): that state's walk, narrowed where the two part (`narrow_walk`).
        Each position of a string with maxLength 128 walked the trie afresh, 2-5 ms a mask."""
        base = self._shared_walk(dfa.like, int(dfa.like_states[state]), ROOT, ROOT_KEY)
        bits = np.zeros(self.vocabulary.mask_words, np.uint32)
        add_walk(base, bits)
        t = self.vocabulary.trie
        pops = narrow_walk(dfa.trans, dfa.accept, dfa.like_depths, t.byte, t.end, t.tok_ptr, t.tok_ids,
                            subtree_heights(self.vocabulary), state, bits, base[2])
        return new_walk(bits, pops)

    def add_mask(self, bits: np.ndarray, configurations: tuple[tuple[int, int], ...], stacks: StackArena) -> None:
        """OR into `bits` the tokens allowed from the configurations (state, stack) of a parser state."""
        if stacks.captures:     # a captured text reads the frames below its own: no frame stands alone
            self._kept = len(stacks.parent)     # (the mask's caller releases the stacks made from here on)
            self._search(bits, [(g, s, ROOT, ROOT_KEY) for g, s in configurations], stacks)
            return
        # configurations of one state often share the frames below their own (parallel parses of overlapping
        # branches): each is searched once
        if len(configurations) < _KEYS_TOGETHER:
            todo = [(g, s, ROOT, ROOT_KEY) for g, s in configurations]
            seen = {(g, s, ROOT_KEY) for g, s in configurations}
        else:
            found = self._keys_spelled(bits, configurations, stacks)
            todo, seen = list(found.values()), set(found)
        while todo:
            g, s, nodes, nodes_key = todo.pop()
            walks, returns = self._in_frame(g, s, nodes, nodes_key, stacks)
            for walk in walks:
                add_walk(walk, bits)
            if s:
                up, below = stacks.ret[s], stacks.parent[s]
                for pops, pops_key in returns:
                    if (up, below, pops_key) not in seen:
                        seen.add((up, below, pops_key))
                        todo.append((up, below, pops, pops_key))

    def _keys_spelled(self, bits: np.ndarray, configurations: tuple[tuple[int, int], ...], stacks: StackArena
                      ) -> dict[tuple[int, int, bytes], tuple[int, int, np.ndarray, bytes]]:
        """`add_mask`'s start for a state of many configurations: those in states of chains (object keys) spelled
        from the root in one pass, their tokens ORed into `bits`, as their walks would (`run_walk`); returns what is
        left to search, by its key: the other configurations, and where the frame of each key spelled to its end
        returns, below the node of its end."""
        texts, text_from, text_to, _ = self._chain_tables()
        t = self.vocabulary.trie
        states = np.fromiter([g for g, _ in configurations], np.int64, len(configurations))
        ends = spell_from_root(t.byte, t.end, t.tok_ptr, t.tok_ids, self._root_children, texts, text_from, text_to,
                               states, bits)
        todo = {}
        parent, ret = stacks.parent, stacks.ret
        left = np.flatnonzero(ends != -1)     # (-1: a key spelled to no node below which tokens go on)
        for k, end in zip(left.tolist(), ends[left].tolist()):
            g, s = configurations[k]
            if end == -2:
                todo[(g, s, ROOT_KEY)] = (g, s, ROOT, ROOT_KEY)
            elif s:
                nodes = np.array([end], np.int32)
                key = nodes.tobytes()
                todo.setdefault((ret[s], parent[s], key), (ret[s], parent[s], nodes, key))
        return todo

    def keys_stepped(self, configurations: tuple[tuple[int, int], ...], byte: int
                     ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]] | None:
        """For a parser step over `byte` (`CompiledGrammar.step`) from many configurations (as many as `add_mask`
        spells together): those in states of chains (object keys) moved over it at once, each to the next state of
        its chain where the byte is its text's next one; and the others, left to step one by one.  None where the
        configurations are few.  A key's first bytes stepped a thousand candidate keys one by one, each token's
        bytes a millisecond."""
        if len(configurations) < _KEYS_TOGETHER:
            return None
        texts, text_from, text_to, _ = self._chain_tables()
        states = np.fromiter([g for g, _ in configurations], np.int64, len(configurations))
        at, stop = text_from[states], text_to[states]
        reads = np.flatnonzero((at >= 0) & (at < stop))
        moving = reads[texts[at[reads]] == byte].tolist()
        others = np.flatnonzero(at < 0).tolist()
        return ([(configurations[k][0] + 1, configurations[k][1]) for k in moving],
                [configurations[k] for k in others])

    def _chain_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, bytes]:
        """(texts, text_from, text_to, chained): the texts of the automaton's chain terminals packed, per state where
        the rest of its chain's text lies in them (-1: not a state of a chain), and a byte per state, 1 in a chain
        (made once)."""
        tables = self._chains
        if tables is None:
            text_from, text_to = np.full(self.a.num_states, -1, np.int64), np.full(self.a.num_states, -1, np.int64)
            parts, size = [], 0
            for first, dfa in self.a.terminals:
                if dfa.chain is not None:
                    n = len(dfa.chain)
                    text_from[first:first + n + 1] = np.arange(size, size + n + 1)
                    text_to[first:first + n + 1] = size + n
                    parts.append(dfa.chain)
                    size += n
            texts = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
            tables = self._chains = (texts, text_from, text_to, (text_from >= 0).astype(np.uint8).tobytes())
        return tables

    def _in_frame(self, g: int, s: int, nodes: np.ndarray, nodes_key: bytes, stacks: StackArena,
                  depth: int = 0) -> FrameAnswer:
        """From configuration (g, s) below trie `nodes`: the tokens allowed before the top frame of `s` returns,
        and the trie nodes where it does (cached).  Guards read only the tag of their own frame, so this
        depends on g, that tag and the nodes, not on the frames below: a new parser state deep in a document
        shares the answers of the frames it has in common with earlier ones."""
        if g >= self.a.first_terminal:
            return self._terminal_answer(g, nodes, nodes_key)
        key = (g, stacks.tag[s], nodes_key)
        walks = self._frame_walks.get(key)
        if walks is not None:
            return walks, self._frame_returns[key]
        if len(self._frame_walks) >= _FRAME_CACHE_LIMIT:
            self._frame_walks.clear()
            self._frame_returns.clear()
        # inside a rule every grammar reads alike (any JSON value), the answer is another grammar's: the first mask
        # inside each schema's `{}` searched a dozen frames and walked some forty terminals (240 us on BFCL_java).
        # The top frame may be a caller's that called the rule last (not pushed): it returns where the rule does.
        place = self._portable.get(g)
        shared = None if place is None else (place, key[1], nodes_key)
        answer = None if shared is None else self._shared_frames.get(shared)
        if answer is None:
            answer = self._frame_search(g, s, nodes, nodes_key, stacks, depth)
            if shared is not None:
                self._shared_frames.put(shared, answer, False)
        walks, returns = answer
        self._frame_walks[key], self._frame_returns[key] = walks, returns
        return walks, returns

    def _in_pushed(self, s: int, edge: Edge, nodes: np.ndarray, nodes_key: bytes, stacks: StackArena,
                   depth: int) -> FrameAnswer:
        """`_in_frame` for the frame that call `edge` pushes from stack `s`, made only where its answer is not known
        yet: a terminal's reads no stack, and a rule's is kept by the pushed frame's tag."""
        callee = edge[0]
        if callee >= self.a.first_terminal:
            return self._terminal_answer(callee, nodes, nodes_key)
        key = (callee, edge[4], nodes_key)
        walks = self._frame_walks.get(key)
        if walks is not None:
            return walks, self._frame_returns[key]
        return self._in_frame(callee, stacks.made(s, edge), nodes, nodes_key, stacks, depth)

    def _terminal_answer(self, g: int, nodes: np.ndarray, nodes_key: bytes) -> FrameAnswer:
        """What terminal state `g` allows below trie `nodes`, and where it returns: its walk."""
        found = self.walk(g, nodes, nodes_key)
        return (found,), (((found[2], found[3]),) if len(found[2]) else ())

    def _frame_search(self, g: int, s: int, nodes: np.ndarray, nodes_key: bytes, stacks: StackArena,
                      depth: int) -> FrameAnswer:
        """`_in_frame`, searched.  The frames of the base level are those sharing the parent and return state of
        `s` (a guard that changes the tag makes another frame in its place; hash-consing makes no other); a frame
        pushed on them is answered by `_in_frame` in turn, so a rule called from many places (a value, a
        definition) is searched once per tag and trie nodes.  That never comes back to the frame being searched
        (left recursion is refused), but each level of it is a Python call: past `_MAX_FRAME_NESTING` the
        search goes on inside the pushed frames instead."""
        a, call_edges, parent, ret = self.a, self.call_edges, stacks.parent, stacks.ret
        first_terminal = a.first_terminal
        base = (parent[s], ret[s])
        nested = depth < _MAX_FRAME_NESTING
        walks: dict[int, Walk] = {}
        returns: dict[bytes, np.ndarray] = {}
        todo = [(g, s, nodes, nodes_key)]
        seen = {(g, s, nodes_key)}
        while todo:
            g, s, nodes, nodes_key = todo.pop()
            nexts = []
            if g >= first_terminal:
                found = self.walk(g, nodes, nodes_key)
                walks[id(found)] = found
                ends, ends_key = found[2], found[3]
                returning = len(ends) > 0
            else:
                edges = call_edges[g]
                claims = self.claim_edges(g) if nested else None
                if claims is not None:
                    self._claimed(g, claims, s, nodes, nodes_key, stacks, depth, walks, nexts)
                    edges = claims[3]
                for c in edges:
                    edge = stacks.edge(s, c)
                    if edge is None:
                        continue
                    if nested and edge[3]:
                        inner, rets = self._in_pushed(s, edge, nodes, nodes_key, stacks, depth + 1)
                        for walk in inner:
                            walks[id(walk)] = walk
                        if rets:
                            below = stacks.below(s, edge)
                            for ends, ends_key in rets:
                                nexts.append((edge[1], below, ends, ends_key))
                    else:
                        nexts.append((edge[0], stacks.made(s, edge), nodes, nodes_key))
                ends, ends_key = nodes, nodes_key
                returning = bool(self.accepting[g])
            if returning:
                if (parent[s], ret[s]) == base:
                    returns[ends_key] = ends
                else:
                    nexts.append((ret[s], parent[s], ends, ends_key))
            for item in nexts:
                key = (item[0], item[1], item[3])
                if key not in seen:
                    seen.add(key)
                    todo.append(item)
        found = tuple(walks.values())
        if len(found) > _MAX_FRAME_WALKS:
            found = (self._union(found),)
        return found, tuple((pops, key) for key, pops in returns.items())

    def _claimed(self, g: int, claims: ClaimEdges, s: int, nodes: np.ndarray, nodes_key: bytes, stacks: StackArena,
                 depth: int, walks: dict[int, Walk], nexts: list) -> None:
        """`_frame_search`'s claim edges from object state `g` (see `_claim_edges`), taken together (`_Claims`):
        into `walks` what the claimable members allow, into `nexts` where their frames return."""
        members, edges, edged, _ = claims
        chosen = members.claimable(stacks.tag[s]) & edged
        if not chosen:
            return
        table = self._claims.get((g, nodes_key))
        if table is None:
            if len(self._claims) >= _FRAME_CACHE_LIMIT:
                self._claims.clear()
            table = self._claims[(g, nodes_key)] = _Claims()
        missing = chosen & ~table.known
        if missing:
            missing = self._keys_apart(g, edges, table, missing, nodes)
        while missing:
            member = missing.bit_length() - 1
            missing ^= 1 << member
            table.add(member, self._in_pushed(s, stacks.edge(s, edges[member]), nodes, nodes_key, stacks, depth + 1))
        words, values, owners = table.index()
        if len(words):
            flags = np.unpackbits(np.frombuffer(chosen.to_bytes((members.size + 7) // 8, "little"), np.uint8),
                                  bitorder="little")
            merged = (*_or_chosen(words, values, owners, flags, *SCRATCH.of(self.vocabulary)[:2]), NO_POPS, NO_KEY)
            walks[id(merged)] = merged
        for member, walk in table.dense:
            if chosen >> member & 1:
                walks[id(walk)] = walk
        for member, rets in table.returns.items():
            if chosen >> member & 1:
                edge = stacks.edge(s, edges[member])
                below = stacks.below(s, edge)
                for ends, ends_key in rets:
                    nexts.append((edge[1], below, ends, ends_key))

    def _keys_apart(self, g: int, edges: tuple[int, ...], table: _Claims, missing: int, nodes: np.ndarray) -> int:
        """Of the `missing` members of the large object at `g` (bits), those whose frames begin with their keys
        (`_key_starts`) have their keys spelled below `nodes` in one compiled pass (`spelled_apart`), and join `table`
        where the key's walk stops at no pop point: their answer is that walk.  Returns the members left to search
        (a key spelled to its end below a node where tokens go on, or a frame of another start).  One frame search
        per member took 16-30 ms a mask at the first few places a member of a thousand may come next."""
        starts = self._key_starts.get(g)
        if starts is None:
            starts = self._key_starts[g] = _key_starts(self.a, self.call_edges, edges, self._chain_tables()[3])
        members = []
        bits = missing
        while bits:
            member = bits.bit_length() - 1
            bits ^= 1 << member
            if starts[member] >= 0:
                members.append(member)
        if not members:
            return missing
        texts, text_from, text_to, _ = self._chain_tables()
        t = self.vocabulary.trie
        words, values, owners, popping = spelled_apart(
            t.byte, t.end, t.tok_ptr, t.tok_ids, self._root_children, nodes, texts, text_from, text_to,
            np.array([starts[member] for member in members], np.int64))
        joined = 0
        for member, pops in zip(members, popping.tolist()):
            if not pops:
                joined |= 1 << member
        if popping.any():      # (their entries go with their frame searches)
            kept = ~popping[owners]
            words, values, owners = words[kept], values[kept], owners[kept]
        table.add_spelled(joined, words, values, np.array(members, np.int32)[owners])
        return missing & ~joined

    def _union(self, walks: tuple[Walk, ...]) -> Walk:
        """The tokens of all `walks` as one walk (no pop points)."""
        bits = np.zeros(self.vocabulary.mask_words, np.uint32)
        sparse = []
        for w in walks:
            if w[0] is None:
                np.bitwise_or(bits, w[1], out=bits)
            elif len(w[0]):
                sparse.append(w)
        if sparse:  # at once: the walks of a hundred keys, one fancy-indexed OR each, took half an object's mask
            np.bitwise_or.at(bits, np.concatenate([w[0] for w in sparse]), np.concatenate([w[1] for w in sparse]))
        return new_walk(bits, NO_POPS)

    def _search(self, bits: np.ndarray, todo: list[tuple[int, int, np.ndarray, bytes]], stacks: StackArena) -> None:
        """OR into `bits` the tokens allowed from configurations (state, stack) below trie nodes."""
        a = self.a
        call_edges = self.call_edges
        seen = {(g, s, key) for g, s, _, key in todo}
        while todo:
            g, s, nodes, nodes_key = todo.pop()
            nexts = []
            if type(stacks.tag[s]) is bytes:
                self._add_captured(bits, g, s, nodes, stacks)
            elif g >= a.first_terminal:
                found = self.walk(g, nodes, nodes_key)
                add_walk(found, bits)
                pops, pops_key = found[2], found[3]
                if s and len(pops):
                    nexts.append((stacks.ret[s], stacks.parent[s], pops, pops_key))
            else:
                # a structural state consumes no bytes: go on into each callee from the same nodes
                nexts = [(*called, nodes, nodes_key) for called in stacks.calls(s, call_edges[g])]
                if self.accepting[g] and s:
                    # returning from the outermost rule ends the text: nothing may follow
                    nexts.append((stacks.ret[s], stacks.parent[s], nodes, nodes_key))
            for item in nexts:
                key = (item[0], item[1], item[3])
                if key not in seen:
                    seen.add(key)
                    todo.append(item)

    def _add_captured(self, bits: np.ndarray, g: int, s: int, nodes: np.ndarray, stacks: StackArena) -> None:
        """OR into `bits` the tokens allowed in a captured terminal, from each trie node on its own (the text
        written since differs per node).  The written texts go to the kernels packed: checked one Python call per
        text and byte, JsonSchemaStore's webhook (41 unique role ids, then a repeat) took up to 11 ms a mask."""
        t, text = self.vocabulary.trie, stacks.tag[s]
        # the written texts the text so far begins: a run of them, sorted as they are (UTF-8 never holds 0xff)
        written = stacks.written(s)
        written = [w[len(text):] for w in written[bisect_left(written, text):bisect_left(written, text + b"\xff")]]
        dead_reach = self._dead_reach(stacks, s)
        first, dfa = self.a.terminal_of(g)
        # the written texts, then the starts only such texts complete (where they can run out), packed together
        dead = dead_ends(dfa, g - first, written) if dfa.uid in self._runs_out else []
        data, ends = packed_bytes(written + dead)
        # a written text the terminal cannot go on from (a string, its quote closed) cuts every token that writes
        # it; one it can (a number: 10 after 1) only cuts the readings that end the text there; a dead start cuts
        going_on = goes_on(dfa.trans, dfa.has_out, g - first, data, ends)
        going_on[len(written):] = False
        cuts = ~going_on
        heights, below = subtree_tables(self.vocabulary)
        # where the text may not end here, a node with no child the terminal can read adds nothing (its own token came
        # with the walk that popped there): whitespace before an item pops at 180 nodes, few of which go on with a quote
        if not dfa.accept[g - first]:
            nodes = reading_nodes(t.byte, t.end, dfa.trans[g - first], nodes)
        for node in nodes.tolist():
            depth, height = int(t.depth[node]), int(heights[node])
            # every token this node adds lies below it, so where no cut does they go straight into `bits`
            cut = descend_texts(t.byte, t.end, node, height, data, ends, cuts)
            cut = cut[cut >= 0]
            own = np.zeros_like(bits) if len(cut) else bits
            one = np.array([node], np.int32)
            found = self.walk(g, one, one.tobytes())
            add_walk(found, own)
            pops = found[2]
            follow = []
            # a token ending the text at a pop goes on with the text added only where a token below writes the text
            # again (another text written already is cut all the same without it), or may reach a dead end that the
            # text added might make
            tall = []
            for pop in pops[heights[pops] > np.minimum(len(text) - depth + t.depth[pops], dead_reach)].tolist():
                whole = text + self._path(pop)[depth:]
                if (heights[pop] > dead_reach or t.end[pop] - pop > _SEARCHED_FOR_TEXTS
                        or writes_again(t.byte, t.depth, t.end, heights, pop, np.frombuffer(whole, np.uint8))):
                    tall.append((pop, whole))
            if tall:    # a pop point below which no byte may follow the text goes on with nothing
                followed = followed_nodes(below, np.array([pop for pop, _ in tall], np.int32),
                                          self._bytes_after(s, stacks)).tolist()
                tall = [item for item in tall if item[0] in followed]
            short = pops[heights[pops] > 0]
            if tall:
                short = short[~np.isin(short, [pop for pop, _ in tall])]
            if len(short) and going_on.any():
                short = short[~np.isin(short, descend_texts(t.byte, t.end, node, height, data, ends, going_on))]
            if len(short):      # the texts of the object do not matter to what follows
                if stacks.parent[s] < self._kept:
                    add_walk(self._after_text(s, short, stacks), own)
                else:
                    follow.append((stacks.ret[s], stacks.parent[s], short, short.tobytes()))
            for pop, whole in tall:
                popped = stacks.pop(s, whole)
                if popped is not None:
                    pop_nodes = np.array([pop], np.int32)
                    follow.append((*popped, pop_nodes, pop_nodes.tobytes()))
            if follow:
                self._search(own, follow, stacks)
            if len(cut):
                clear_below(own, t.end, t.tok_ptr, t.tok_ids, cut)
                np.bitwise_or(bits, own, out=bits)

    def _after_text(self, s: int, pops: np.ndarray, stacks: StackArena) -> Walk:
        """What may follow the captured text of stack `s` where it ends at trie nodes `pops` and its texts do not
        matter (it returns without the text added), for a stack below that outlives the mask: kept, since every mask
        while one item is written searches it again (in process: mask time -21% through an array of 30 unique
        strings, -26% through JsonSchemaStore's webhook)."""
        ret, below = stacks.ret[s], stacks.parent[s]
        key = (ret, below, pops.tobytes())
        hit = self._after_texts.get(key)
        if hit is None:
            bits = np.zeros(self.vocabulary.mask_words, np.uint32)
            self._search(bits, [(ret, below, pops, key[2])], stacks)
            if len(self._after_texts) >= _FRAME_CACHE_LIMIT:
                self._after_texts.clear()
            hit = self._after_texts[key] = new_walk(bits, NO_POPS)
        return hit

    def _bytes_after(self, s: int, stacks: StackArena) -> np.ndarray:
        """The bytes that may come first once the captured text of stack `s` ends (four 64-bit words, as the trie's
        bytes below each node).  A token ending the text at a pop point with none of them below goes on with nothing:
        a number's digits (30 unique integers: ten such points a mask, each searched with the text added, a third of
        its time).  Kept per return state where no guard or return was met on the way (an array's separator; every
        item's object frame below is another stack), else per stack below where it outlives the mask."""
        ret, below = stacks.ret[s], stacks.parent[s]
        hit = self._bytes_after_states.get(ret)
        if hit is None:
            hit = self._bytes_after_texts.get((ret, below))
        if hit is not None:
            return hit
        a, call_edges, guard_of = self.a, self.call_edges, self.a.call_guard
        reads = np.zeros(256, np.bool_)
        todo, seen, read_below = [(ret, below)], {(ret, below)}, False
        while todo:
            g, s = todo.pop()
            if g >= a.first_terminal:   # a terminal reads first, and one that may end at once returns too
                reads |= a.terminal_row(g)[1] >= 0
                nexts = []
            else:
                edges = call_edges[g]
                read_below = read_below or any(guard_of[c] >= 0 for c in edges)
                nexts = stacks.calls(s, edges)
            if self.accepting[g] and s:
                read_below = True
                nexts.append((stacks.ret[s], stacks.parent[s]))
            for cfg in nexts:
                if cfg not in seen:
                    seen.add(cfg)
                    todo.append(cfg)
        hit = np.packbits(reads, bitorder="little").view(np.uint64)
        if not read_below:
            self._bytes_after_states[ret] = hit
        elif below < self._kept:
            if len(self._bytes_after_texts) >= _FRAME_CACHE_LIMIT:
                self._bytes_after_texts.clear()
            self._bytes_after_texts[(ret, below)] = hit
        return hit

    def _dead_reach(self, stacks: StackArena, s: int) -> int:
        """The fewest bytes from the start of a captured text to a dead end that the text of stack `s`, once added
        to its object, might make: a state with no more strings than the texts the stack's objects hold and this
        one (a large number where no captured terminal runs out)."""
        if not self._dead_depths:
            return NO_DEAD_END
        texts = stacks.texts_held(s)
        reach = self._dead_reaches.get(texts)
        if reach is None:
            reach = self._dead_reaches[texts] = min(dead_depth(depths, texts + 1) for depths in self._dead_depths)
        return reach

    def _path(self, node: int) -> bytes:
        """The bytes from the trie's root to `node`: the start of any token below it."""
        t = self.vocabulary.trie
        return self.vocabulary.token_bytes[t.tok_ids[t.tok_ptr[node]]][:t.depth[node]]


