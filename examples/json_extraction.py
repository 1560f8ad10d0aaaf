"""Extract one JSON record per document under a JSON schema; every output validates.

    python examples/json_extraction.py

The schema is compiled once for the tokenizer and reused for every document; where the schema admits
one continuation only (keys, quotes, punctuation), the engine appends it without sampling.
"""

import json

import leapgen

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 40},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
DOCUMENTS = [
    "Maria Lopez, 34, works as a nurse in Valencia.",
    "Tom Becker is a 52-year-old carpenter from Hamburg.",
    "Aiko Tanaka (29) teaches mathematics in Osaka.",
]

llm = leapgen.LLM()
prompts = [llm.chat_prompt(f"Extract name, age and city as JSON: {doc}") for doc in DOCUMENTS]
constraint = leapgen.JsonSchema(SCHEMA, {"whitespace": "dumps"})      # json.dumps-style spacing
for doc, out in zip(DOCUMENTS, llm.generate(prompts, leapgen.SamplingParams(max_tokens=80), constraint=constraint)):
    print(doc, "->", json.loads(out.text))
print(f"{llm.engine.num_forced_tokens} tokens were forced by the schema instead of sampled")
