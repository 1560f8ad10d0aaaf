"""Response bodies and stream chunks in the shapes of OpenAI's completions and chat completions APIs."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from leapgen.engine.outputs import RequestOutput, TokenLogprob
from leapgen.server.engine_loop import Piece
from leapgen.server.protocol import LogprobsRequest, ParsedRequest

TokenBytes = Callable[[int], bytes]          # a token id's bytes as they appear in text


@dataclass
class ResponseShape:
    """What every body and chunk of one response shares, and how its choices are numbered: prompt `i`'s
    completion `j` is choice `i * n + j`, as vLLM numbers them."""

    request: ParsedRequest
    model: str
    token_bytes: TokenBytes
    chat: bool
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    # per choice of a stream, the length of its tokens' texts so far: its next chunk's text offsets go on from there
    _streamed: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    def choice_index(self, job: int, index: int) -> int:
        return job * self.request.params.n + index

    # --- whole responses ----------------------------------------------------------------------------

    def body(self, outputs: list[RequestOutput]) -> dict:
        choices = []
        for job, output in enumerate(outputs):
            for completion in output.outputs:
                choice = {"index": self.choice_index(job, completion.index),
                          "logprobs": self._logprobs(completion.logprobs or []),
                          "finish_reason": completion.finish_reason}
                if self.chat:
                    choice["message"] = {"role": "assistant", "content": completion.text, "refusal": None}
                else:
                    choice["text"] = completion.text
                choices.append(choice)
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": usage(outputs)}

    # --- stream chunks ------------------------------------------------------------------------------

    def chunk(self, job: int, piece: Piece, first: bool) -> dict:
        """The chunk for one piece; `first` (chat): the completion's first chunk, which names the role."""
        index = self.choice_index(job, piece.index)
        at = self._streamed.get(index, 0)
        logprobs = self._logprobs(piece.logprobs, at) if piece.logprobs else None
        if logprobs is not None and "tokens" in logprobs:     # as in a whole body, offsets count the tokens' texts
            self._streamed[index] = at + sum(map(len, logprobs["tokens"]))
        choice: dict = {"index": index, "logprobs": logprobs, "finish_reason": piece.finish_reason}
        if self.chat:
            delta: dict = {"role": "assistant"} if first else {}
            if piece.text or first:
                delta["content"] = piece.text
            choice["delta"] = delta
        else:
            choice["text"] = piece.text
        return self._chunk([choice])

    def usage_chunk(self, outputs: list[RequestOutput]) -> dict:
        """The last chunk of a stream with `include_usage`: no choices, the usage of the whole request."""
        return {**self._chunk([]), "usage": usage(outputs)}

    def _chunk(self, choices: list[dict]) -> dict:
        chunk = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                 "created": self.created, "model": self.model, "choices": choices}
        if self.request.include_usage:
            chunk["usage"] = None
        return chunk

    # --- logprobs ------------------------------------------------------------------------------------

    def _logprobs(self, logprobs: list[TokenLogprob], at: int = 0) -> dict | None:
        """The logprobs of a choice's tokens (in a stream: of one chunk's, the first at offset `at` of the text)."""
        wanted: LogprobsRequest | None = self.request.logprobs
        if wanted is None:
            return None
        if wanted.chat:
            return {"content": [self._chat_token(lp, wanted.top) for lp in logprobs], "refusal": None}
        tokens = [self._text(lp.token_id) for lp in logprobs]
        offsets = []
        for token in tokens:
            offsets.append(at)
            at += len(token)
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
                "top_logprobs": [{self._text(t): v for t, v in list(lp.top.items())[:wanted.top]}
                                 for lp in logprobs] if wanted.top else None,
                "text_offset": offsets}

    def _chat_token(self, logprob: TokenLogprob, top: int) -> dict:
        entry = self._token_entry(logprob.token_id, logprob.logprob)
        entry["top_logprobs"] = [self._token_entry(t, v) for t, v in list(logprob.top.items())[:top]]
        return entry

    def _token_entry(self, token_id: int, logprob: float) -> dict:
        data = self.token_bytes(token_id)
        return {"token": data.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(data)}

    def _text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", "replace")


def usage(outputs: list[RequestOutput]) -> dict:
    prompt = sum(len(output.prompt_token_ids) for output in outputs)
    completion = sum(len(c.token_ids) for output in outputs for c in output.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
