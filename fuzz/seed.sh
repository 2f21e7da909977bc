#!/usr/bin/env bash
# Seeds the fuzz corpora (corpus/<target>/) from ../shared/golden: the family models and the
# llama.cpp vocabulary files (GGUF, whole and shrunk by shrink_gguf.py), the golden prompts and
# the tokenizer suite's inputs (text for each tokenizer), the 70 real chat templates with a
# conversation, and request bodies of every shape the server reads. Files already there
# (what earlier runs added; the corpora are git-ignored) stay.
set -euo pipefail
cd "$(dirname "$0")"
golden=../../shared/golden
mkdir -p corpus/gguf corpus/tokenizer corpus/chat_template corpus/openai_request
# GGUF: every file's metadata with its vocabulary cut to a few hundred tokens (a few KB, so
# the metadata and tokenizer paths run fast), and the family models whole (tensor infos,
# configs).
for f in "$golden"/families/*/model.gguf; do
  family=$(basename "$(dirname "$f")")
  cp "$f" "corpus/gguf/family-$family.gguf"
  python3 shrink_gguf.py "$f" "corpus/gguf/small-family-$family.gguf"
done
for f in "$golden"/llama-cpp-vocab/*.gguf; do
  python3 shrink_gguf.py "$f" "corpus/gguf/small-$(basename "$f")"
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
# Server requests: a byte picking the endpoint (even: chat, odd: completions), then a body.
request() { printf '%s%s' "$1" "$2" > "corpus/openai_request/$3"; }
request 0 "{\"messages\": $(tr -d '\n' < "$messages"), \"max_tokens\": 8}" chat-golden
request 0 '{"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "a"}]}], "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3, "n": 2, "stop": ["x", "y"], "logprobs": true, "top_logprobs": 2, "presence_penalty": 0.5, "frequency_penalty": 0.1, "repetition_penalty": 1.1, "logit_bias": {"15": -100}, "max_completion_tokens": 16, "stream": true, "stream_options": {"include_usage": true}, "user": "u"}' chat-every-field
request 0 '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "2"}], "ignore_eos": true}' chat-tool-calls
request 0 '{"messages": [{"role": "assistant", "content": "a", "reasoning_content": "r"}, {"role": "user", "content": "b"}], "tools": [{"type": "function", "function": {"name": "f"}}], "response_format": {"type": "json_object"}}' chat-unsupported
request 1 '{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "echo": true}' completion-text
request 1 '{"prompt": ["a", "b", [1, 2, 3]], "logprobs": 3, "n": 3, "stop": "\n", "seed": 18446744073709551615}' completion-list
request 1 '{"prompt": [15496, 11, 995], "max_tokens": 1, "stream": true}' completion-tokens
echo "corpora: $(ls corpus/gguf | wc -l) gguf, $(ls corpus/tokenizer | wc -l) tokenizer, $(ls corpus/chat_template | wc -l) chat_template, $(ls corpus/openai_request | wc -l) openai_request"
