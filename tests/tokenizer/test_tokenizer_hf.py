#!/usr/bin/env python3
"""The tokenizer against live independent implementations (run from the repo
root after `make`; needs ./ds4-vocab, tokenizers, gguf):

1. HF `tokenizers` on the V3 base tokenizer.json with the V4 added tokens
   (tests/fixtures/tokenizer/v4-added-tokens.json) encodes a few hundred
   seeded random texts; ./ds4-vocab must produce the same ids. The texts go
   through one ds4-vocab call, joined by EOS with every added token
   recognised, so the ids split back per text at id 1.
2. ./ds4-vocab --write-gguf output read back with gguf-py: tokens in id order
   equal HF's vocabulary strings, token types, merges, bos/eos ids. This uses
   a cut-down tokenizer.json (the first 2000 ids of the real one, the merges
   that stay inside them, the chat specials after them): gguf-py needs about
   a minute for the full 129k-token vocabulary.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

from gguf import GGUFReader
from tokenizers import Tokenizer

V3 = "data/deepseek-v3-tokenizer.json"
ADDED = "tests/fixtures/tokenizer/v4-added-tokens.json"
TOOL = "./ds4-vocab"
EOS = "<｜end▁of▁sentence｜>"

# Blocks assigned since Unicode 6 or earlier: their classes do not depend on
# the Unicode version of whichever tokenizers release CI installs.
POOLS = [
    (30, "etaoinshrdlucmfwypvbgkjqxz ETAOINSHRDLU"),
    (12, "    \n\t\r"),
    (8, "0123456789"),
    (10, ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`"),
    (4, "éèàùçñöüßøåæœ"),
    (4, "приветмирПРИВЕТ"),
    (4, "你好世界中文汉字测试"),
    (3, "ひらがなカタカナ・ー"),
    (2, "αβγδΩΣ"),
    (2, "—–…“”‘’«»€£¥"),
    (2, "½²³¼①٣१"),
    (1, "\u00a0\u2003\u3000\u0085\u2028"),
    (1, "\u0301\u0308\u093f"),
    (1, "😀🎉👍🏽"),
]


def random_text(rng):
    weights = [w for w, _ in POOLS]
    n = rng.choice([1, 3, 8, 20, 60, 200])
    return "".join(rng.choice(rng.choices(POOLS, weights)[0][1]) for _ in range(n))


def hf_tokenizer():
    with open(V3, encoding="utf-8") as f:
        j = json.load(f)
    with open(ADDED, encoding="utf-8") as f:
        j["added_tokens"] = json.load(f)["added_tokens"]
    return j, Tokenizer.from_str(json.dumps(j))


def small_json(j):
    """The first 2000 ids and their merges (merge r makes id r + 259 in this
    vocabulary), plus BOS/EOS and the chat specials as added tokens."""
    keep = 2000
    vocab = {t: i for t, i in j["model"]["vocab"].items() if i < keep}
    merges = j["model"]["merges"][:keep - 259]
    added = [a for a in j["added_tokens"] if a["id"] < 3]
    for k, s in enumerate(["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"]):
        added.append({"id": keep + k, "content": s, "special": k % 2 == 0, "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": True})
    small = dict(j)
    small["model"] = dict(j["model"], vocab=vocab, merges=merges)
    small["added_tokens"] = added
    return small


def main():
    failures = 0
    j, hf = hf_tokenizer()

    rng = random.Random(4242)
    texts = [random_text(rng) for _ in range(300)]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "texts.txt")
        with open(src, "w", encoding="utf-8") as f:
            f.write(EOS.join(texts))
        out = subprocess.run([TOOL, V3, "--added", ADDED, "--specials", "all", "--encode-file", src],
                             check=True, capture_output=True, text=True).stdout.split()
        ids, segs = [int(x) for x in out], [[]]
        for i in ids:
            if i == 1:
                segs.append([])
            else:
                segs[-1].append(i)
        if len(segs) != len(texts):
            print("FAIL: %d segments for %d texts" % (len(segs), len(texts)))
            failures += 1
        for t, got in zip(texts, segs):
            want = hf.encode(t, add_special_tokens=False).ids
            if got != want:
                failures += 1
                if failures <= 5:
                    print("FAIL: %r\n  want %s\n  got  %s" % (t[:80], want[:30], got[:30]))

        small = small_json(j)
        hf = Tokenizer.from_str(json.dumps(small))
        jpath, path = os.path.join(tmp, "small.json"), os.path.join(tmp, "vocab.gguf")
        with open(jpath, "w", encoding="utf-8") as fj:
            json.dump(small, fj, ensure_ascii=False)
        subprocess.run([TOOL, jpath, "--write-gguf", path], check=True, capture_output=True)
        r = GGUFReader(path)
        f = r.fields

        def strings(key):
            fl = f[key]
            return [bytes(fl.parts[i]).decode("utf-8") for i in fl.data]

        toks = strings("tokenizer.ggml.tokens")
        types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
        merges = strings("tokenizer.ggml.merges")
        n = hf.get_vocab_size(with_added_tokens=True)
        special = {a["id"]: a["special"] for a in small["added_tokens"]}
        checks = [
            ("vocabulary size", len(toks) == n == 2005),
            ("tokens in id order", all(toks[i] == hf.id_to_token(i) for i in range(n))),
            ("token types", all(types[i] == (1 if i not in special else 3 if special[i] else 4)
                                for i in range(n))),
            ("merges", merges == [m if isinstance(m, str) else " ".join(m) for m in small["model"]["merges"]]),
            ("bos/eos", int(f["tokenizer.ggml.bos_token_id"].parts[-1][0]) == 0 and
             int(f["tokenizer.ggml.eos_token_id"].parts[-1][0]) == 1),
            ("model gpt2", bytes(f["tokenizer.ggml.model"].parts[-1]).decode() == "gpt2"),
        ]
        for name, ok in checks:
            if not ok:
                failures += 1
                print("FAIL: GGUF export: " + name)

    print("test_tokenizer_hf: %d texts, %d failures" % (len(texts), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
