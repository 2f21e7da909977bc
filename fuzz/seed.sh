#!/usr/bin/env bash
# Seeds the fuzz corpora (corpus/<target>/) from ../shared/golden: the family models and the
# llama.cpp vocabulary files (GGUF), the golden prompts and the tokenizer suite's inputs (text
# for each tokenizer), and the 70 real chat templates with a conversation. Files already there
# (the minimized corpora kept in git) stay.
set -euo pipefail
cd "$(dirname "$0")"
golden=../../shared/golden
mkdir -p corpus/gguf corpus/tokenizer corpus/chat_template
for f in "$golden"/families/*/model.gguf; do
  cp "$f" "corpus/gguf/family-$(basename "$(dirname "$f")").gguf"
done
for f in "$golden"/llama-cpp-vocab/*.gguf; do
  cp "$f" "corpus/gguf/$(basename "$f")"
done
i=0
for f in "$golden"/prompts/*.txt "$golden"/llama-cpp-vocab/*.inp; do
  for pick in 0 1 6 7 12; do
    { printf "\\x$(printf %02x $pick)"; head -c 4096 "$f"; } > "corpus/tokenizer/seed-$i-$pick"
  done
  i=$((i + 1))
done
messages="$golden/prompts/chat_messages_qwen6.json"
for f in "$golden"/chat-templates/*.jinja; do
  { cat "$f"; printf '\0'; cat "$messages"; } > "corpus/chat_template/$(basename "$f" .jinja)"
done
echo "corpora: $(ls corpus/gguf | wc -l) gguf, $(ls corpus/tokenizer | wc -l) tokenizer, $(ls corpus/chat_template | wc -l) chat_template"
