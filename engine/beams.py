"""Beam search in the step loop: a request's live beams are sequences forked through the block manager.

Each beam carries its own constraint state, forked with the beam's KV blocks, so grammar-
constrained beams only ever extend a beam with tokens its constraint allows.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from leapgen.decoding.beam_search import BeamSearch, Hypothesis
from leapgen.engine.outputs import CompletionOutput
from leapgen.engine.request_state import EngineRequest, SequenceState

Fork = Callable[[EngineRequest, SequenceState], SequenceState]
Retire = Callable[[SequenceState, str], None]


def advance_beams(request: EngineRequest, eos_token_ids: Sequence[int], fork: Fork, retire: Retire,
                  decode: Callable[[list[int]], str]) -> bool:
    """Step a request's beams once every live beam has its next-token log-probs in `request.beam_rows`;
    returns True when the search is done and `request.output` holds the best beams."""
    live = [s for s in request.samples if not s.seq.is_finished]
    if any(s.seq.seq_id not in request.beam_rows for s in live):
        return False                                 # a sibling was preempted; wait for its recomputation
    params = request.params
    if request.beams is None:
        request.beams = BeamSearch(params.num_beams, params.max_tokens,
                                   () if params.ignore_eos else eos_token_ids, params.length_penalty,
                                   params.early_stopping, complete_only=request.constraint is not None)
    rows = torch.stack([request.beam_rows.pop(s.seq.seq_id) for s in live])
    step = request.beams.step(_within_budget(rows, live, request.beams.candidates_per_step))
    # Fork before appending: several new beams may continue the same parent.
    children: list[SequenceState] = []
    taken: set[int] = set()
    for parent_index in step.parents:
        parent = live[parent_index]
        children.append(parent if parent_index not in taken else fork(request, parent))
        taken.add(parent_index)
    for index, state in enumerate(live):
        if index not in taken:
            retire(state, "pruned")
    for state, token in zip(children, step.token_ids):
        state.append(token)
    request.samples = children                       # the order of the search's running beams
    if not request.beams.done:
        return False
    for state in request.samples:
        retire(state, "pruned")
    eos = set(eos_token_ids)
    request.output.outputs = [_completion(i, h, eos, decode) for i, h in enumerate(request.beams.best(params.n))]
    return True


def _within_budget(log_probs: torch.Tensor, live: list[SequenceState], width: int) -> torch.Tensor:
    """Drop the candidates after which a constrained beam could no longer close within its token budget
    (the mask lets them through until closing begins).  The search picks among each row's best `width`,
    so only those are checked, again after each drop."""
    for row, state in zip(log_probs, live):
        if state.constraint is None:
            continue
        while True:
            best = row.topk(min(width, row.numel()))
            refused = [t for v, t in zip(best.values.tolist(), best.indices.tolist())
                       if v > float("-inf") and not state.constraint.matcher.is_token_allowed(t)]
            if not refused:
                break
            row[refused] = float("-inf")
    return log_probs


def _completion(index: int, hypothesis: Hypothesis, eos: set[int], decode: Callable[[list[int]], str]
                ) -> CompletionOutput:
    ids = list(hypothesis.token_ids)
    text = decode(ids)
    reason = "stop" if ids and ids[-1] in eos else "length"
    return CompletionOutput(index, text, ids, reason, score=hypothesis.score, delta=text)
