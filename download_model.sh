#!/usr/bin/env bash
# download_model.sh -- fetch a DeepSeek V4 GGUF into ./gguf/ and point
# ./ds4flash.gguf (the default -m of every binary) at the main model.
#
#   ./download_model.sh [--dry-run] [--token TOKEN] TARGET
#
# Downloads resume (curl -C -). Authentication is optional; a token is taken
# from --token, then $HF_TOKEN, then the local Hugging Face token cache.
set -euo pipefail

REPO_URL=${DS4_MODEL_URL:-https://huggingface.co/antirez/deepseek-v4-gguf/resolve/main}
DEST=${DS4_GGUF_DIR:-gguf}

FLASH_Q2=DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2
FLASH_Q4=DeepSeek-V4-Flash-Q4KExperts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2

# target -> "file [file...]"; the first file of a main-model target becomes ./ds4flash.gguf
files_for() {
    case $1 in
        q2)                    echo "$FLASH_Q2.gguf" ;;
        q2-imatrix)            echo "$FLASH_Q2-imatrix.gguf" ;;
        q2-q4-imatrix)         echo "DeepSeek-V4-Flash-IQ2XXS-w2Q2K-L37-42Q4K-AProjQ8-SExpQ8-OutQ8-chat-v2-imatrix.gguf" ;;
        q4)                    echo "$FLASH_Q4.gguf" ;;
        q4-imatrix)            echo "$FLASH_Q4-imatrix.gguf" ;;
        pro-q2-imatrix)        echo "DeepSeek-V4-Pro-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-Instruct-imatrix.gguf" ;;
        pro-q4-layers00-30)    echo "DeepSeek-V4-Pro-Q4K-Layers00-30.gguf" ;;
        pro-q4-layers31-output) echo "DeepSeek-V4-Pro-Q4K-Layers-31-output.gguf" ;;
        pro-q4-split)          echo "DeepSeek-V4-Pro-Q4K-Layers00-30.gguf DeepSeek-V4-Pro-Q4K-Layers-31-output.gguf" ;;
        mtp)                   echo "DeepSeek-V4-Flash-MTP-Q4K-Q8_0-F32.gguf" ;;
        dspark-support)        echo "DeepSeek-V4-Flash-DSpark-support.gguf" ;;
        *) return 1 ;;
    esac
}
# Support files and distributed halves never replace the main model link.
updates_link() {
    case $1 in mtp|dspark-support|pro-q4-*) return 1 ;; *) return 0 ;; esac
}

usage() {
    cat <<USAGE
usage: $0 [--dry-run] [--token TOKEN] TARGET

main models (update ./ds4flash.gguf):
  q2-imatrix       96/128 GB RAM machines, imatrix-tuned q2 (~81 GB)
  q2-q4-imatrix    q2 with the last 6 layers' experts at q4 (~91 GB)
  q4-imatrix       >= 256 GB RAM machines, imatrix-tuned q4 (~153 GB)
  q2, q4           the same mixes without imatrix
  pro-q2-imatrix   512 GB RAM machines, PRO q2 imatrix quant
distributed PRO Q4 halves (do not update ./ds4flash.gguf):
  pro-q4-layers00-30, pro-q4-layers31-output, pro-q4-split (both)
support files (do not update ./ds4flash.gguf):
  mtp              the one-stage MTP block for Flash (--mtp FILE)
  dspark-support   the DSpark block drafter for Flash (--mtp FILE --dspark), ~5.6 GiB
USAGE
}

dry_run=0; token=${HF_TOKEN:-}; target=
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) dry_run=1 ;;
        --token) shift; token=${1:?--token needs a value} ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
        *) [ -z "$target" ] || { echo "only one target" >&2; exit 2; }; target=$1 ;;
    esac
    shift
done
[ -n "$target" ] || { usage >&2; exit 2; }
files=$(files_for "$target") || { echo "unknown target: $target" >&2; usage >&2; exit 2; }

if [ -z "$token" ]; then
    for f in "${HF_HOME:-$HOME/.cache/huggingface}/token" "$HOME/.huggingface/token"; do
        [ -r "$f" ] && { token=$(tr -d '[:space:]' < "$f"); break; }
    done
fi

mkdir -p "$DEST"
for f in $files; do
    url="$REPO_URL/$f"
    if [ "$dry_run" = 1 ]; then
        echo "would fetch $url -> $DEST/$f${token:+ (with token)}"
        continue
    fi
    echo "fetching $f"
    curl -fL -C - --retry 5 ${token:+-H "Authorization: Bearer $token"} -o "$DEST/$f" "$url"
done

if updates_link "$target"; then
    main=${files%% *}
    if [ "$dry_run" = 1 ]; then
        echo "would link ./ds4flash.gguf -> $DEST/$main"
    else
        ln -sfn "$DEST/$main" ds4flash.gguf
        echo "./ds4flash.gguf -> $DEST/$main"
    fi
fi
