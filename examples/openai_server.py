"""Talk to `leapgen serve` with the official `openai` client: chat, streaming, and structured output.

Starts the server on the embedded default model (as `leapgen serve --port 8000` would in another terminal),
asks it three things, and stops it.  Run: python examples/openai_server.py
"""

import json
import re
import subprocess
import sys
import time

import httpx
import openai

server = subprocess.Popen([sys.executable, "-m", "leapgen.cli", "serve", "--port", "0"], stderr=subprocess.PIPE,
                          text=True)
url = next(m.group(1) for line in server.stderr if (m := re.search(r"at (http://\S+/v1)", line)))
while httpx.get(url.removesuffix("/v1") + "/health").status_code != 200:
    time.sleep(0.2)

try:
    client = openai.OpenAI(base_url=url, api_key="unused")   # start the server with --api-key KEY to require one
    model = client.models.list().data[0].id

    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name a planet."}],
                                            max_tokens=30, temperature=0)
    print("chat:", answer.choices[0].message.content)

    print("stream: ", end="")
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count to 5."}],
                                                max_tokens=30, temperature=0, stream=True):
        print(chunk.choices[0].delta.content or "", end="", flush=True)
    print()

    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    extracted = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Paris is the capital of France. Give city and country."}],
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}},
        max_tokens=40, temperature=0)
    print("json_schema:", json.loads(extracted.choices[0].message.content))

    # leapgen's extras (top_k, min_p, repetition_penalty, regex, grammar, num_beams) go in extra_body
    date = client.completions.create(model=model, prompt="The first moon landing was on", max_tokens=12,
                                     temperature=0, extra_body={"regex": r" \d{4}-\d{2}-\d{2}"})
    print("regex:", date.choices[0].text)
finally:
    server.terminate()
    server.wait()
