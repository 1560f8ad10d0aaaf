#!/usr/bin/env bash
# Compare sampling settings on the embedded default model (SmolLM2-135M-Instruct): every combination of
# three temperatures and two top-p values, 4 samples per prompt for each, all in one batch.  Prints one row
# per setting (distinct-1/2: how varied the samples are; logprob: how likely the model finds them; length;
# tok/s) and writes every sample, with its settings, to a .jsonl file.
#
#     bash examples/sampling_sweep.sh [OUT.jsonl]
#
# --prompts-file takes one prompt a line (or JSONL with a "prompt" field; '-' reads stdin) and may follow
# --prompt flags.  The same --seed prints the same table and samples again.  Add --plot sweep.png for a
# chart (pip install 'leapgen[plot]'), --json for the table as JSON lines, or a constraint (--regex,
# --schema, --grammar) for a "valid%" column.
set -euo pipefail
cd "$(dirname "$0")"
OUT="${1:-/tmp/sweep.jsonl}"

leapgen sweep --chat \
    --prompt "Say hello in five words." \
    --prompts-file data/prompts.txt \
    --grid temperature=0.3,0.7,1.0 --grid top_p=0.9,1.0 \
    --n 4 --max-tokens 32 --seed 0 \
    --output "$OUT"

echo "samples in $OUT; the last cell's for the first prompt:"
python3 - "$OUT" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
last = max(r["cell"] for r in records)
for r in [r for r in records if r["cell"] == last and r["prompt_index"] == 0][:3]:
    print(f"  {r['settings']}: {r['text']!r}")
PY
