#!/usr/bin/env bash
# download_model.sh --dry-run: every documented target resolves to files under
# gguf/, only main-model targets move ./ds4flash.gguf, tokens are honoured,
# unknown targets fail with usage. Nothing is downloaded.
set -u
cd "$(dirname "$0")/../.."
fail=0; n=0
expect() { n=$((n+1)); if ! eval "$2"; then echo "FAIL: $1"; fail=$((fail+1)); fi; }
for t in q2 q2-imatrix q2-q4-imatrix q4 q4-imatrix pro-q2-imatrix; do
    out=$(HF_TOKEN= HOME=/nonexistent ./download_model.sh --dry-run "$t")
    expect "$t fetches a gguf" '[[ $out == *"would fetch https://huggingface.co/antirez/deepseek-v4-gguf/resolve/main/"*".gguf -> gguf/"* ]]'
    expect "$t links ds4flash.gguf" '[[ $out == *"would link ./ds4flash.gguf -> gguf/"* ]]'
    expect "$t no token" '[[ $out != *"with token"* ]]'
done
for t in mtp dspark-support pro-q4-layers00-30 pro-q4-layers31-output pro-q4-split; do
    out=$(HOME=/nonexistent ./download_model.sh --dry-run "$t")
    expect "$t does not link" '[[ $out != *"would link"* ]]'
done
out=$(HOME=/nonexistent ./download_model.sh --dry-run pro-q4-split)
expect "split fetches two files" '[ "$(grep -c "would fetch" <<<"$out")" = 2 ]'
out=$(HOME=/nonexistent ./download_model.sh --dry-run --token abc q4-imatrix)
expect "--token is used" '[[ $out == *"with token"* ]]'
out=$(HF_TOKEN=xyz HOME=/nonexistent ./download_model.sh --dry-run q4-imatrix)
expect "HF_TOKEN is used" '[[ $out == *"with token"* ]]'
out=$(HOME=/nonexistent ./download_model.sh --dry-run dspark-support)
expect "dspark-support fetches the sidecar" '[[ $out == *"would fetch "*"/DeepSeek-V4-Flash-DSpark-support.gguf -> gguf/"* ]]'
./download_model.sh --dry-run nope >/dev/null 2>&1; rc=$?
expect "unknown target exits 2" '[ $rc = 2 ]'
[ -e ds4flash.gguf.testprobe ] && rm -f ds4flash.gguf.testprobe
echo "download_model: $((n-fail)) passed, $fail failed"
[ $fail = 0 ]
