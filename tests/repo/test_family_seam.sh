#!/usr/bin/env bash
# The model family is a seam (docs/architecture.md "Two model families"):
# the engine, the generation loop, the server and the agent (its code; its
# headers describe both formats) reach a family only through
# model_family.h / chat_spec.h (engine.h, the public contract, lists the
# families a file may be). None of their lines names a family (GLM,
# DSV4, DeepSeek, the chat profile or family enums, GLM's token strings) and
# none includes a family's own header; each such line is printed.
set -u
cd "$(dirname "$0")/../.."
files=$( (find src -name engine.c -o -name generate.c -o -name generate.h -o -path '*/server/*.[ch]' \
    -o -path '*/agent/*.c'; echo app/ds4-agent.c) | sort)
[ -n "$files" ] || { echo "FAIL: engine and server sources not found"; exit 1; }
status=0
names=$(grep -nE '[Gg][Ll][Mm]|[Dd][Ss][Vv]4|[Dd]eep[Ss]eek|DEEPSEEK|DS4_CHAT_(DS4|GLM|GLM47|OFFICIAL)\b|DS4_FAMILY_|DS4_TOK_GLM' $files)
[ -z "$names" ] || { echo "FAIL: family named outside the family files:"; echo "$names"; status=1; }
incs=$(grep -nE '#include "(models/(dsv4|glm)/|backends/cuda/|text/glm_|([a-z/]*/)?(glm_[a-z_]*|model|kv|kv_payload|forward_cpu[a-z_]*|ds4_layout|dsv4_family|glm_family)\.h")' $files)
[ -z "$incs" ] || { echo "FAIL: family header included outside the family files:"; echo "$incs"; status=1; }
[ $status = 0 ] && echo "family seam: $(echo "$files" | wc -l) engine, generation, server and agent files name no family"
exit $status
