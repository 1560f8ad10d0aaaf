"""Processors that reshape logits from each row's history: constraint mask, logit bias, min_tokens, n-gram ban, penalties."""

from __future__ import annotations

import torch

from leapgen.decoding import penalty_kernels
from leapgen.decoding.batch import SamplingBatch
from leapgen.decoding.bitmask import apply_token_bitmask_


class ConstraintMask:
    """Disallowed tokens (by the batch's packed `token_bitmask`, e.g. from grammar matchers) get -inf."""

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when the engine supplied a bitmask this step."""
        return batch.token_bitmask is not None

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Mask in place."""
        return apply_token_bitmask_(logits, batch.token_bitmask)


class LogitBias:
    """Adds each row's `logit_bias` {token id: bias} (OpenAI semantics: added to the raw logit)."""

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when some row has a bias."""
        return bool(batch.bias_rows)

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """One index_put over all rows' biases."""
        rows = torch.tensor(batch.bias_rows, dtype=torch.long, device=logits.device)
        cols = torch.tensor(batch.bias_cols, dtype=torch.long, device=logits.device)
        values = torch.tensor(batch.bias_values, dtype=logits.dtype, device=logits.device)
        return logits.index_put_((rows, cols), values, accumulate=True)


class MinTokens:
    """Rows with fewer than `min_tokens` outputs cannot pick eos (unless ignore_eos) or a stop token id."""

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when some row is still below its min_tokens."""
        return bool(batch.suppressed)

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Set the banned ids to -inf."""
        rows = [r for r, ids in batch.suppressed for _ in ids]
        cols = [t for _, ids in batch.suppressed for t in ids]
        logits[rows, cols] = -float("inf")
        return logits


class NoRepeatNGram:
    """Bans any token that would repeat an n-gram already in the row's prompt + output (transformers semantics)."""

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when some row sets no_repeat_ngram_size."""
        return bool(batch.ngram_rows)

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Per row: the windows whose first n-1 ids equal the current suffix ban their last id."""
        for row, n in batch.ngram_rows:
            ids = batch.row_token_ids(row)
            if ids.numel() < n:
                continue
            windows = ids.unfold(0, n, 1)
            suffix = ids[ids.numel() - n + 1:]
            # The window ending at the last token is never complete, so it cannot match its own suffix.
            hits = (windows[:, :-1] == suffix).all(dim=1)
            banned = windows[hits, -1]
            logits[row, banned[banned < logits.shape[1]]] = -float("inf")
        return logits


class RepetitionPenalty:
    """Seen tokens (prompt or output): positive logits divided, negative multiplied by the penalty (CTRL / HF)."""

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when some row's penalty differs from 1."""
        return batch.uses_repetition_penalty

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """In place: compiled on float32 CPU logits, else through torch."""
        if penalty_kernels.applies(logits, batch.device):
            penalty_kernels.repetition_penalty_(logits, *batch.flat_ids, batch.repetition_penalty, batch.vocab_size)
            return logits
        return self.with_torch(logits, batch)

    def with_torch(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Gather the seen tokens' logits, penalise, scatter back (repeated ids write the same value)."""
        ids, valid = batch.history_ids
        if ids.shape[1] == 0:
            return logits
        seen = logits.gather(1, ids)
        penalty = batch.repetition_penalty[:, None]
        penalised = torch.where(seen > 0, seen / penalty, seen * penalty)
        # Padding repeats a seen id of the row, so it must write the penalised value too.
        return logits.scatter_(1, ids, torch.where(valid.any(dim=1, keepdim=True), penalised, seen))


class FrequencyPresencePenalty:
    """OpenAI-style: subtract frequency * count + presence * (count > 0), counting generated tokens only."""

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when some row has a non-zero frequency or presence penalty."""
        return batch.uses_output_penalties

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """In place: compiled on float32 CPU logits, else through torch."""
        if penalty_kernels.applies(logits, batch.device):
            penalty_kernels.frequency_presence_penalty_(logits, *batch.flat_output_ids, batch.frequency_penalty,
                                                        batch.presence_penalty, batch.vocab_size)
            return logits
        return self.with_torch(logits, batch)

    def with_torch(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Every occurrence subtracts the frequency penalty, the first occurrence of each id also the presence one."""
        ids, valid = batch.output_ids
        if ids.shape[1] == 0:
            return logits
        ids, order = ids.masked_fill(~valid, -1).sort(dim=1)
        valid = valid.gather(1, order)
        first = torch.ones_like(valid)
        first[:, 1:] = ids[:, 1:] != ids[:, :-1]
        delta = batch.frequency_penalty[:, None] + batch.presence_penalty[:, None] * first
        return logits.scatter_add_(1, ids.clamp(min=0), -delta * valid)
