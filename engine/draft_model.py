"""A draft model for speculative decoding: a smaller model with its own paged KV cache that guesses the
next k tokens of every speculating sequence, greedily, as one batch per drafted position.

It mirrors each target sequence with a sequence of its own.  Before drafting, the mirror is cut back to
the longest prefix it shares with the target's tokens (its rejected guesses leave its cache, as the
target's do) and extended with the tokens the target accepted since; one forward pass computes those,
and k - 1 more passes of one token each produce the rest of the draft.  Under a constraint the draft
model's choice is masked by the request's matcher, walked along the draft and rolled back, so its
guesses stay inside the constraint and are worth verifying.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Sequence as Seq

import numpy as np
import torch

from leapgen.decoding.bitmask import apply_token_bitmask_, bitmask_words
from leapgen.decoding.constraint import TokenMatcher
from leapgen.decoding.speculative import DraftRequest
from leapgen.engine.block_manager import BlockManager
from leapgen.engine.loader import LoadedModel, load_model
from leapgen.engine.model_runner import PagedModelRunner
from leapgen.engine.scheduler import SchedulerOutput
from leapgen.engine.sequence import Sequence


class DraftModelError(ValueError):
    """The draft model cannot serve: it does not load, or it cannot draft for the target."""


def load_draft(path: str | Path, target: LoadedModel) -> LoadedModel:
    """The draft model at `path`, loaded like the target (dtype, device); DraftModelError when it does not load,
    does not share the target's tokenizer or cannot roll back its cache."""
    try:
        draft = load_model(path, target.dtype, target.device)
    except (OSError, ValueError) as exc:
        raise DraftModelError(f"speculative.model {path}: {exc}") from exc
    if draft.is_fallback:
        raise DraftModelError(f"speculative.model {path}: its architecture runs through the transformers "
                              "fallback, which cannot roll back its cache; use a Llama/Mistral/Qwen-family draft")
    if draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        sizes = (f"{len(draft.tokenizer)} tokens against {len(target.tokenizer)}"
                 if len(draft.tokenizer) != len(target.tokenizer) else f"as many tokens, {len(draft.tokenizer)}, "
                 f"not the same ones")
        raise DraftModelError(f"speculative.model {path}: its tokenizer differs from the target's ({sizes}); a draft "
                              "must share the vocabulary")
    size, target_size = (sum(p.numel() for p in model.model.parameters()) for model in (draft, target))
    if size > target_size:
        warnings.warn(f"speculative.model {path}: the draft has {size:,} parameters, the target {target_size:,}; a "
                      f"draft larger than its target can only slow generation down", stacklevel=3)
    return draft


class DraftModelProposer:
    """Proposes with a draft model that shares the target's tokenizer (see the module docstring)."""

    def __init__(self, draft: LoadedModel, target: LoadedModel, num_blocks: int, block_size: int,
                 pack_weights: bool = False) -> None:
        """`draft` (see `load_draft`) with a cache of `num_blocks`, as many as the target's."""
        self.draft = draft
        self.runner = PagedModelRunner(draft, num_blocks, block_size, pack_weights)
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching=True)
        # ids at or past it (padding) are never proposed
        self.vocab_limit = min(len(target.tokenizer), draft.vocab_size, target.vocab_size)
        self.mask_vocab = target.vocab_size      # the width of the constraint's bitmask (the target's logits)
        self.mirrors: dict[int, Sequence] = {}

    def propose(self, requests: Seq[DraftRequest]) -> list[list[int]]:
        """See `decoding.speculative.Proposer.propose`."""
        drafts: dict[int, list[int]] = {r.seq_id: [] for r in requests}
        matchers = {r.seq_id: r.matcher for r in requests if r.matcher is not None}
        try:
            self._draft(requests, drafts, matchers)
        finally:                                 # leave every matcher where the engine had it
            for seq_id, matcher in matchers.items():
                matcher.rollback(len(drafts[seq_id]))
        return [drafts[r.seq_id] for r in requests]

    def _draft(self, requests: Seq[DraftRequest], drafts: dict[int, list[int]],
               matchers: dict[int, TokenMatcher]) -> None:
        active = [(self._sync(r), r.k) for r in requests if len(r.token_ids) + r.k <= self.draft.max_model_len]
        active = [(mirror, k) for mirror, k in active if mirror is not None]
        while active:
            active = [(mirror, k) for mirror, k in active if self._reserve(mirror)]
            if not active:
                break
            step = SchedulerOutput([(mirror, mirror.num_uncomputed) for mirror, _ in active])
            step.is_decode = all(n == 1 and mirror.num_computed_tokens > 0 for mirror, n in step.scheduled)
            logits = self.runner.execute(step)
            for mirror, n in step.scheduled:
                mirror.num_computed_tokens += n
                self.block_manager.commit(mirror)
            still = []
            for mirror, k in active:
                token = self._choose(logits.logits[logits.rows[mirror.seq_id]][-1], matchers.get(mirror.seq_id))
                if token is None:                  # a padding id, or the constraint allows nothing: stop here
                    continue
                mirror.append_token(token)
                drafts[mirror.seq_id].append(token)
                matcher = matchers.get(mirror.seq_id)
                if matcher is not None:
                    matcher.advance(token)
                if len(drafts[mirror.seq_id]) < k and not (matcher is not None and matcher.is_finished()):
                    still.append((mirror, k))
            active = still

    def _choose(self, logits: torch.Tensor, matcher: TokenMatcher | None) -> int | None:
        """The draft's greedy token, inside the constraint when there is one."""
        logits = logits[:self.vocab_limit]
        if matcher is not None:
            mask = np.zeros((1, bitmask_words(self.mask_vocab)), dtype=np.int32)
            matcher.fill_bitmask(mask[0])
            logits = apply_token_bitmask_(logits[None].clone(), mask)[0]
        token = int(logits.argmax())
        if logits[token] == -float("inf") or (matcher is not None and not matcher.is_token_allowed(token)):
            return None                          # nothing allowed, or the token would leave too little budget
        return token

    def release(self, seq_id: int) -> None:
        """Free the mirror of a finished sequence."""
        mirror = self.mirrors.pop(seq_id, None)
        if mirror is not None:
            self.block_manager.free(mirror)

    def _sync(self, request: DraftRequest) -> Sequence | None:
        """The mirror of `request`'s sequence holding exactly its tokens (the shared prefix kept in cache)."""
        tokens = list(request.token_ids)
        mirror = self.mirrors.get(request.seq_id)
        if mirror is None:
            # a one-token "prompt", so the mirror can be cut back anywhere past the first token
            mirror = self.mirrors[request.seq_id] = Sequence(request.seq_id, tokens[:1])
            mirror.append_tokens(tokens[1:])
            return mirror
        # its last token is computed again where the mirror holds it computed already, for the logits of the first
        # guess: a target that took part of the last draft and no token of its own (a forced-token jump comes
        # next) is a prefix of its mirror
        shared = min(_shared_prefix(mirror.token_ids, tokens), len(tokens) - 1)
        self.block_manager.truncate(mirror, max(shared, 1))
        mirror.append_tokens(tokens[mirror.num_tokens:])
        return mirror

    def _reserve(self, mirror: Sequence) -> bool:
        """Cache slots for the mirror's uncomputed tokens; False (no more drafting for it) when the draft's
        cache is full."""
        manager = self.block_manager
        if not mirror.block_table:
            if not manager.can_allocate(mirror):
                return False
            manager.allocate(mirror)
            return True
        if not manager.can_append(mirror, mirror.num_uncomputed):
            return False
        self.runner.copy_blocks(manager.append_slots(mirror, mirror.num_uncomputed))
        return True


def _shared_prefix(a: Seq[int], b: Seq[int]) -> int:
    same = torch.tensor(a[:len(b)]) == torch.tensor(b[:len(a)])
    mismatches = (~same).nonzero()
    return int(mismatches[0]) if len(mismatches) else int(same.numel())

