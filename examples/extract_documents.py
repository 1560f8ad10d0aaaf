"""Extract contact details from short documents into a .jsonl file, one line per document, resumably.

    python examples/extract_documents.py [OUT.jsonl]

The same job from the command line:

    leapgen extract examples/data/contacts.jsonl --schema examples/data/contact.schema.json --output /tmp/contacts.jsonl

Every record gets one output line ({"id", "status", "data", "error", "finish_reason", "usage", "latency_s",
"time_to_first_token_s"}) as it finishes; run it again and the records already in the output are skipped.
"""

import json
import sys
import tempfile
from pathlib import Path

import leapgen

DATA = Path(__file__).parent / "data"
output = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.gettempdir()) / "contacts.jsonl"

summary = leapgen.extract(DATA / "contacts.jsonl", DATA / "contact.schema.json", output, max_tokens=128)
print(summary)
for line in output.read_text(encoding="utf-8").splitlines():
    result = json.loads(line)
    print(result["id"], result["status"], json.dumps(result["data"] if result["status"] == "ok" else result["error"]))
