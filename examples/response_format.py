"""Structured answers the OpenAI way: `response_format` and pydantic models, with `LLM.chat`.

    python examples/response_format.py

A pydantic model comes back validated in `completion.parsed`; an OpenAI-style dict works unchanged,
and `"strict": true` means no key the schema does not declare is ever generated.
"""

import json

from pydantic import BaseModel, Field

import leapgen


class City(BaseModel):
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)
    population_millions: float = Field(ge=0, le=50)


llm = leapgen.LLM()                      # SmolLM2-135M-Instruct, on CPU
params = leapgen.SamplingParams(max_tokens=60)

# A pydantic model: the output is JSON of its schema, and `parsed` the model instance.
messages = [{"role": "system", "content": "Answer in JSON."},
            {"role": "user", "content": "Describe the capital of France."}]
out = llm.chat(messages, params, response_format=City)[0]
print(repr(out.outputs[0].parsed))

# The dict an OpenAI client sends, unchanged; two conversations in one batch.
response_format = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 40}, "confident": {"type": "boolean"}},
    "required": ["answer", "confident"],
}}}
questions = ["What colour is the sky?", "Which is larger, a cat or a mouse?"]
for question, out in zip(questions, llm.chat([[{"role": "user", "content": q}] for q in questions], params,
                                             response_format=response_format)):
    print(question, "->", json.loads(out.text))
