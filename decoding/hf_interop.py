"""Interop with transformers: its LogitsProcessors inside leapgen, and leapgen grammars inside `model.generate`."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from transformers import LogitsProcessor

from leapgen.decoding.batch import SamplingBatch
from leapgen.decoding.bitmask import apply_token_bitmask_, bitmask_words
from leapgen.decoding.constraint import TokenConstraint, TokenMatcher


class RequestProcessors:
    """Applies each row's `SamplingParams.logits_processors` (transformers-style `(input_ids, scores) -> scores`).

    Each processor sees only its own row: `input_ids` is `[1, L]` (prompt + output so far), `scores` `[1, V]`.
    A processor that raises (or returns the wrong shape) fails its row alone: the error goes to
    `batch.row_errors` and the row's logits stay as they were, so the other rows go on.
    """

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when some row brings processors."""
        return bool(batch.extra_rows)

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Row by row."""
        for row, processors in batch.extra_rows:
            try:
                logits[row] = _run_processors(processors, batch.row_token_ids(row)[None, :], logits[row: row + 1])
            except Exception as exc:
                batch.row_errors[row] = exc
        return logits


def _token_ids(ids: Any) -> set[int]:
    """One token id or several (ints, numpy integers, tensors) as a set of ints; TypeError naming what came."""
    if isinstance(ids, (torch.Tensor, np.ndarray)):
        ids = ids.tolist()
    items = [ids] if isinstance(ids, (int, np.integer)) else ids
    try:
        out = {int(t) for t in items if isinstance(t, (int, np.integer)) and not isinstance(t, bool)}
        complete = len(out) == len(set(items))
    except TypeError:
        complete = False
    if not complete or not out:
        raise TypeError(f"eos_token_id must be a token id or a non-empty sequence of them, got {ids!r}")
    return out


def _run_processors(processors: Sequence[Any], input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    width = scores.shape[1]
    for processor in processors:
        scores = processor(input_ids, scores)
        if not isinstance(scores, torch.Tensor) or scores.shape != (1, width):
            shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
            raise ValueError(f"logits processor {processor!r} returned {shape}, expected (1, {width})")
    return scores[0]


class GrammarLogitsProcessor(LogitsProcessor):
    """A transformers LogitsProcessor that keeps every row of `model.generate` inside a leapgen grammar.

    One matcher per batch row.  Each call reads the row's output so far (the tokens after the length of the first
    call) and brings the row's matcher to it: forward by the new tokens, or, where beam search put another beam's
    tokens in the row, back to what the two share and forward from there.  A row that has produced an eos id is
    finished: transformers pads it from then on, so it is not masked.  Beam search keeps some candidates the mask
    gave -inf where too few tokens are allowed; such a row is dead: every token is masked, so it stays at -inf.
    `vocab_size` is the tokenizer's size (the bitmask width) when the model's logits are wider.  Works with greedy,
    sampling and beam search; put it before any processor that keeps a few tokens (a `TopKLogitsWarper` first may
    keep only tokens the grammar refuses, leaving the row none), and use a fresh processor per `generate` call (one
    that sees another call's rows raises).  `eos_token_id`: the id(s) generate stops on, among them the grammar's
    end-of-text token.  Where fewer hypotheses inside the grammar finish than `num_return_sequences` asks (a language
    of fewer texts, a `length_penalty` <= 0 that ranks an early eos of a dead beam high), transformers fills the rest
    with dead ones, scored -1e9 over their length to the `length_penalty` in `sequences_scores`
    (`return_dict_in_generate=True, output_scores=True`): drop those (a score below -1e6).  Pass generate's
    `max_new_tokens` as `max_new_tokens` too: each row's text then completes within it, as leapgen's own outputs
    complete within `max_tokens` (without it a row the length limit stops ends where it stands, mid-instance).  Under
    that budget each allowed token is checked (a step through the grammar: a few microseconds) and kept only where the
    text can still close in the tokens left after it; where more than `checked_at_most` are allowed (string
    contents), the ones with the highest scores are checked, with the shortest completion's next token, and the rest
    masked: the row samples among those.  transformers' `min_new_tokens` takes eos away from rows the grammar may
    have finished: leave it out.
    """

    checked_at_most = 1024

    def __init__(self, grammar: TokenConstraint, eos_token_id: int | Sequence[int], vocab_size: int | None = None,
                 max_new_tokens: int | None = None):
        if max_new_tokens is not None and (type(max_new_tokens) is not int or max_new_tokens < 1):
            raise ValueError(f"max_new_tokens must be an int >= 1 or None, got {max_new_tokens!r}")
        shortest = grammar.matcher().completion_tokens() if max_new_tokens is not None else None
        if shortest is not None and len(shortest) > max_new_tokens:
            raise ValueError(f"max_new_tokens={max_new_tokens} is too small for the constraint: its shortest output "
                             f"takes {len(shortest)} tokens")
        self.grammar = grammar
        self.max_new_tokens = max_new_tokens
        self.eos_token_ids = _token_ids(eos_token_id)
        vocabulary = getattr(grammar, "vocabulary", None)     # (a leapgen CompiledGrammar's)
        ends = set(getattr(vocabulary, "eos_ids", ()))
        if ends and not ends & self.eos_token_ids:
            raise ValueError(f"eos_token_id {sorted(self.eos_token_ids)} holds none of the grammar's end-of-text "
                             f"tokens {sorted(ends)}: give the id generate stops on (the tokenizer's eos)")
        # the grammar's other end-of-text tokens leave the masks: generate would not stop on one, and the row, its
        # text ended, would be dead
        self._other_ends = sorted(ends - self.eos_token_ids)
        self.vocab_size = vocab_size
        self._width = max(vocab_size or 0, getattr(vocabulary, "size", 0))   # the bitmask's, at least
        self._matchers: list[TokenMatcher] = []
        self._fed: list[list[int]] = []      # per row, the tokens its matcher has consumed
        self._prompts: torch.Tensor | None = None    # the rows' tokens before the first call's length
        self._length = 0                             # the rows' length at the last call

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        """Bring each row's matcher to the row's output so far, then mask the scores to the allowed tokens."""
        batch, length = input_ids.shape
        if self._prompts is None:
            self._matchers = [self.grammar.matcher(self.max_new_tokens) for _ in range(batch)]
            self._fed = [[] for _ in range(batch)]
            self._prompts = input_ids.clone()
        else:
            start = self._prompts.shape[1]
            # the calls of one generate() see the same prompts and the rows grow a token a call at most (assisted
            # decoding may shorten them); another call's rows may be as many, its prompt longer (the last output
            # fed back): its tokens would be read as output
            if batch != len(self._matchers) or length > self._length + 1 or not torch.equal(
                    input_ids[:, :start], self._prompts.to(input_ids.device)):
                raise ValueError(
                    f"GrammarLogitsProcessor was started on {len(self._matchers)} rows of a {start}-token prompt and "
                    f"last saw them {self._length} tokens long; these {batch} rows of length {length} are another "
                    "generate() call's: use a fresh processor per call")
        self._length = length
        vocab = max(self.vocab_size or scores.shape[-1], self._width)
        bitmask = np.zeros((batch, bitmask_words(vocab)), dtype=np.int32)
        for row, output in enumerate(input_ids[:, self._prompts.shape[1]:].tolist()):
            ended = next((i for i, token in enumerate(output) if token in self.eos_token_ids), None)
            if ended is not None:
                bitmask[row] = -1
                output = output[:ended]
            if self._follow(row, output) and ended is None:
                self._matchers[row].fill_bitmask(bitmask[row])
                words = bitmask[row].view(np.uint32)
                for token in self._other_ends:
                    words[token >> 5] &= ~np.uint32(1 << (token & 31))
                if self.max_new_tokens is not None:
                    self._keep_fitting(self._matchers[row], bitmask[row], scores[row])
        return apply_token_bitmask_(scores.clone(), torch.from_numpy(bitmask).to(scores.device))

    def _keep_fitting(self, matcher: TokenMatcher, words: np.ndarray, row_scores: torch.Tensor) -> None:
        """Clear from the row's bitmask `words` the tokens after which its text could not close within the budget
        (the grammar's mask offers them until closing begins: leapgen's engine replaces such a sampled token with
        the shortest completion's, which a transformers row cannot), and past `checked_at_most`, the unchecked."""
        allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
        allowed = allowed[allowed < row_scores.shape[-1]]
        checked = allowed
        if len(allowed) > self.checked_at_most:
            best = torch.topk(row_scores[torch.from_numpy(allowed)].float().cpu(), self.checked_at_most).indices
            closing = matcher.completion_tokens()
            # the shortest completion's next token always fits; where the text is complete, that is eos
            ends = closing[:1] if closing else ([] if closing is None else sorted(self.eos_token_ids))
            checked = np.union1d(allowed[best.numpy()], np.array(ends, allowed.dtype))
        keep = np.zeros(len(words), np.uint32)
        for token in checked.tolist():
            if matcher.is_token_allowed(token):
                keep[token >> 5] |= np.uint32(1 << (token & 31))
        words &= keep.view(np.int32)

    def _follow(self, row: int, output: list[int]) -> bool:
        """Bring row `row`'s matcher to `output`; False where a token of it is not allowed (a dead beam)."""
        matcher, fed = self._matchers[row], self._fed[row]
        shared = 0
        for a, b in zip(fed, output):
            if a != b:
                break
            shared += 1
        if shared < len(fed):
            matcher.rollback(len(fed) - shared)
            del fed[shared:]
        for token in output[shared:]:
            if not matcher.is_token_allowed(token):
                return False
            matcher.advance(token)
            fed.append(token)
        return True
