#!/usr/bin/env bash
# The README's first command (`make demo`): run the CLI and the server on the
# trained tiny DeepSeek V4 model (models/ds4-tiny.gguf, unpacked from
# data/ds4-tiny/; docs/tiny-model.md). It has the real DeepSeek V4 architecture,
# vocabulary and chat format at a few million parameters: it answers short
# questions about Python functions and a few programming topics and makes DSML
# tool calls for simple agent tasks, nothing more. MODEL=models/demo.gguf runs
# the random-weight model instead.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/ds4-tiny.gguf}
echo "== ds4 one-shot prompt on $MODEL"
./ds4 -m "$MODEL" --nothink -n 120 --temp 0 -p "Explain Redis streams in one paragraph."
echo
echo "== the same model, a thinking-mode prompt"
./ds4 -m "$MODEL" --think -n 120 --temp 0 -p "What is a hash table?"
echo

PORT=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
echo "== ds4-server on 127.0.0.1:$PORT, one chat completion"
./ds4-server -m "$MODEL" --port "$PORT" --ctx 4096 > /tmp/ds4-demo-server.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -sS "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"model":"deepseek-v4-flash","messages":[{"role":"user","content":"List three Redis design principles."}],"max_tokens":120,"temperature":0,"thinking":{"type":"disabled"}}'
echo
echo "== the same server, a request with tools: the model answers with a DSML tool call (its arguments are often wrong: docs/tiny-model.md)"
curl -sS "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"model":"deepseek-v4-flash","messages":[{"role":"user","content":"List the files in src."}],"tools":[{"type":"function","function":{"name":"list_files","description":"List the files in a directory.","parameters":{"type":"object","properties":{"path":{"type":"string","description":"Directory to list"}},"required":["path"]}}},{"type":"function","function":{"name":"read_file","description":"Read the contents of a file.","parameters":{"type":"object","properties":{"path":{"type":"string","description":"File to read"}},"required":["path"]}}},{"type":"function","function":{"name":"run_command","description":"Run a shell command and return its output.","parameters":{"type":"object","properties":{"command":{"type":"string","description":"The command line"}},"required":["command"]}}}],"max_tokens":80,"temperature":0,"thinking":{"type":"disabled"}}'
echo
echo "== demo done (server log: /tmp/ds4-demo-server.log)"
