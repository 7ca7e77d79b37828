#!/usr/bin/env bash
# The README's first command (`make demo`): run the CLI and the server on the
# embedded demo model. The demo model has the real DeepSeek V4 vocabulary and
# chat format but RANDOM weights: its text is meaningless by construction; the
# point is that every layer of the engine runs end to end with no download.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/demo.gguf}
echo "== ds4 one-shot prompt on $MODEL (random weights: expect gibberish)"
./ds4 -m "$MODEL" --nothink -n 24 --temp 0 -p "Explain Redis streams in one paragraph."

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
    -d '{"model":"deepseek-v4-flash","messages":[{"role":"user","content":"List three Redis design principles."}],"max_tokens":16,"temperature":0,"thinking":{"type":"disabled"}}'
echo
echo "== demo done (server log: /tmp/ds4-demo-server.log)"
