"""Decoding: logits processing, sampling, stop criteria, beam search — the engine-facing interface.

Per request (once, when it is admitted), the engine keeps on its Sequence:
    generator = request_generator(params.seed, sample_index, device) if params.seed is not None else None
    detok     = IncrementalDetokenizer(vocabulary, prompt_ids, params.skip_special_tokens)   # grammars.Vocabulary
    stopper   = StopChecker(params, eos_token_ids, detok)
    beams     = BeamSearch(params.num_beams, params.max_tokens, eos_ids, params.length_penalty,
                           params.early_stopping)                     # only when num_beams > 1

Per step, for the B rows whose logits were computed:
    rows  = [SamplingRow(seq.params, seq.prompt_ids, seq.output_ids, seq.generator) for seq in seqs]
    batch = SamplingBatch.build(rows, vocab_size, eos_token_ids, device, token_bitmask=None | [B, W] int32)
    out   = sampler(logits, batch)          # Sampler(): one per engine, owns the global generator
    for seq, token in zip(seqs, out.token_ids.tolist()):
        seq.append(token); delta_text = seq.stopper.append(token)   # stream delta_text
        if seq.stopper.finished: finish with seq.stopper.finish_reason / .text
    (out.logprobs / out.top_logprob_ids / out.top_logprobs: [B] / [B, n] when some row set params.logprobs)

Processing order (`pipeline.default_processors`): constraint bitmask, logit_bias, min_tokens,
no_repeat_ngram, repetition penalty, frequency/presence penalties, per-request transformers
processors (`params.logits_processors`), temperature, top-k + top-p, min-p, typical-p.  A stage no
row uses is skipped; rows with different settings share one pass.  Greedy rows (temperature 0)
take the argmax after the penalties.  Sampled rows with top-k / top-p are warped and drawn on their
best candidates (`candidates.py`: the same distribution without full-vocabulary passes); the others,
and nuclei wider than `TopKTopP.candidates`, over the whole vocabulary.  Logprobs are the raw
model's by default (`Sampler(logprobs_mode="processed")` for the sampled distribution);
`prompt_logprobs()` for prompts.

Beam search (num_beams > 1): run the request's live beams as rows; give `beams.step()` their
next-token log-probs (`[len(beams.running), V]`, the processors applied to the logits' log_softmax, as
transformers' beam search applies them); fork each new
beam's KV blocks from `step.parents[j]` and append `step.token_ids[j]`; when `beams.done`, the
result is `beams.best(params.n)`.  Constraints for `transformers.generate`: `GrammarLogitsProcessor`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leapgen.decoding.batch import SamplingBatch, SamplingRow
    from leapgen.decoding.beam_search import BeamSearch, BeamStep, Hypothesis
    from leapgen.decoding.bitmask import allocate_token_bitmask, apply_token_bitmask_
    from leapgen.decoding.detokenizer import IncrementalDetokenizer
    from leapgen.decoding.hf_interop import GrammarLogitsProcessor
    from leapgen.decoding.pipeline import BatchLogitsProcessor, LogitsPipeline, default_processors
    from leapgen.decoding.sampler import PromptLogprobs, Sampler, SamplerOutput, prompt_logprobs, request_generator
    from leapgen.decoding.sampling_params import SamplingParams
    from leapgen.decoding.stop import StopChecker

# Importing a submodule (`leapgen.decoding.sampling_params`) runs this file first: the torch-heavy
# modules are imported only when one of their names is looked up here, so SamplingParams stays light.
_LAZY = {
    "SamplingBatch": "batch", "SamplingRow": "batch",
    "BeamSearch": "beam_search", "BeamStep": "beam_search", "Hypothesis": "beam_search",
    "allocate_token_bitmask": "bitmask", "apply_token_bitmask_": "bitmask",
    "IncrementalDetokenizer": "detokenizer",
    "GrammarLogitsProcessor": "hf_interop",
    "BatchLogitsProcessor": "pipeline", "LogitsPipeline": "pipeline", "default_processors": "pipeline",
    "PromptLogprobs": "sampler", "Sampler": "sampler", "SamplerOutput": "sampler", "prompt_logprobs": "sampler",
    "request_generator": "sampler",
    "SamplingParams": "sampling_params",
    "StopChecker": "stop",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'leapgen.decoding' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"leapgen.decoding.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "BatchLogitsProcessor", "BeamSearch", "BeamStep", "GrammarLogitsProcessor", "Hypothesis",
    "IncrementalDetokenizer", "LogitsPipeline", "PromptLogprobs", "Sampler", "SamplerOutput", "SamplingBatch",
    "SamplingParams", "SamplingRow", "StopChecker", "allocate_token_bitmask", "apply_token_bitmask_",
    "default_processors", "prompt_logprobs", "request_generator",
]
