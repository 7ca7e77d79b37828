#!/usr/bin/env python3
"""Builds the constructed GLM tokenizer and its Hugging Face oracle cases.

No package on the registries here ships GLM's tokenizer.json
(glm-5.2-model.md 8), so the machinery is tested on a tokenizer of the same
*form*, trained here with Hugging Face `tokenizers`:
  - pre-tokenizer: GLM's one Split regex (Isolated) then ByteLevel with
    use_regex=false, decoder ByteLevel, no post-processor, no BOS;
  - model: byte-level BPE trained on a seeded synthetic multilingual corpus
    to 4060 base tokens (256 bytes + merges), ignore_merges true as llama.cpp
    treats glm4;
  - the 36 GLM added tokens (sheet 7.5, in GLM's order) after the base
    vocabulary: 4096 ids, the vocabulary size of ds4-make-model's glm-demo.

Outputs
  data/glm-constructed-tokenizer.json      the tokenizer (ds4-make-model embeds
                                           it in GLM models)
  tests/fixtures/tokenizer/glm-cases.jsonl {"text", "mode", "ids"} encoded by
                                           HF: mode "all" = every added token
                                           matched, "none" = no added tokens

Usage: python3 tests/oracles/glm_tokenizer_make.py   (needs tokenizers).
Deterministic: a fixed seed drives the corpus and the random cases.
"""
import json
import os
import random

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_JSON = os.path.join(ROOT, "data", "glm-constructed-tokenizer.json")
OUT_CASES = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "glm-cases.jsonl")

GLM4_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")

ADDED = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
         "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
         "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>",
         "<|end_of_transcription|>", "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "<think>",
         "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>",
         "</arg_key>", "<arg_value>", "</arg_value>", "/nothink", "<|begin_of_box|>", "<|end_of_box|>",
         "<|image|>", "<|video|>"]
BASE_VOCAB = 4096 - len(ADDED)

SENTENCES = [
    "The quick brown fox jumps over the lazy dog. It's what we'll do, isn't it? They're here; I'd say so.",
    "def tokenize(text):\n    return [piece for piece in split(text) if piece]\n\n",
    "for (int i = 0; i < n; i++) {\n\tsum += values[i] * 2;\n}\n",
    "Le renard brun rapide saute par-dessus le chien paresseux. Déjà vu, ça va?",
    "Der schnelle braune Fuchs springt über den faulen Hund. Straße, Größe, Übung.",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "敏捷的棕色狐狸跳过了懒狗。今天天气很好，我们去公园散步吧。",
    "素早い茶色の狐が怠惰な犬を飛び越える。ひらがなとカタカナ。",
    "빠른 갈색 여우가 게으른 개를 뛰어넘는다.",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}",
    "Numbers: 0 1 12 123 1234 12345 3.14159 2026-12-01 +49 (30) 1234-5678 100% $5.00",
    "   indented   text\twith\ttabs\r\nand CRLF lines\n\n\nand blank ones  \n",
    "Emoji 😀🎉👍🏽 and symbols ∑∫√∞ ≤≥≠ «quotes» — dashes … ellipsis",
]


SYLLABLES = ("ka ri to na mi su ne lo pe da vi ch st tr an en in on er es al or th sh qu ou "
             "при ве ст но ка ро те ли 中 文 字 世 界 人 大 小 の か な で す ま").split()


def corpus(rng):
    """Sentences plus Zipf-distributed pseudo-words, enough to train 4060 tokens."""
    lexicon = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(6000)]
    weights = [1.0 / (k + 1) for k in range(len(lexicon))]
    lines = []
    for _ in range(4000):
        lines.append(rng.choice(SENTENCES))
        words = rng.choices(lexicon, weights, k=rng.randint(3, 14))
        words = [w.capitalize() if rng.random() < 0.1 else w for w in words]
        lines.append(" ".join(words) + rng.choice([".", "!", "?", ",", ":", "\n", " ", "'s", "'ll"]) +
                     str(rng.randint(0, 99999)))
    return lines


def build(base_vocab=BASE_VOCAB):
    """The tokenizer.json (as a dict) with base_vocab trained ids before the
    added tokens, and the trained count."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM4_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=base_vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(corpus(random.Random(20261201)), trainer=trainer)
    j = json.loads(tok.to_str())
    n = len(j["model"]["vocab"])
    assert n <= base_vocab, n
    j["added_tokens"] = [{"id": n + k, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for k, s in enumerate(ADDED)]
    return j, n


POOLS = [
    (30, "etaoinshrdlucmfwypvbgkjqxz ETAOINSHRDLU"),
    (12, "    \n\t\r"),
    (8, "0123456789"),
    (10, ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`"),
    (4, "éèàùçñöüßøåæœſ"),
    (4, "приветмирПРИВЕТ"),
    (4, "你好世界中文汉字测试"),
    (3, "ひらがなカタカナ・ー"),
    (2, "—–…“”‘’«»€£¥"),
    (2, "½²³¼①٣१"),
    (1, "\u00a0\u2003\u3000\u0085\u2028"),
    (1, "\u0301\u0308\u093f"),
    (1, "😀🎉👍🏽"),
    (3, ["<|user|>", "<think>", "</think>", "<tool_call>", "<arg_key>", "</arg_value>", "[gMASK]", "<sop>",
         "<|observation|>", "<|endoftext|>", "/nothink", "<|user", "</tool_", "'s", "'S", "'re", "'LL", "'ſ"]),
]

HANDPICKED = [
    "Hello, world! 你好世界 ひらがな café — “quotes” ½ ²",
    "It's I'm you're we've they'll he'd IT'S YOU'RE WE'VE THEY'LL HE'D 'ſ 'ſt 'stop 'Re 'rE",
    "1234567890 12345678901234567890 3.14159 1,000,000.00 v1.2.3 ١٢٣٤٥ ¹²³ Ⅻ",
    " ", "  ", "\t", "\n", "\r\n", "\n\n\n", " \n", "\n ", "  \n  ", "x  \n\n  y", "trailing   ",
    "a\u0085b\u00a0c\u1680d\u2000e\u2028g\u3000k", " \u00a0 ", "\u0085\n\u2028\r\n\u00a0\t",
    "    int x = 12345;\n  return x;\n\n", "a->b, c::d, e=>f, g!=h, i<=j, k>>=1, l&&m||n",
    "e\u0301 a\u0308 \u0301start n\u0303o", "😀 👍🏽 👨‍👩‍👧‍👦 🇮🇹", "Zero\u200bwidth\ufeffbom",
    "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>Hi<|assistant|><think>",
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call><|observation|>",
    "<|user|> forged </think> text <|user", "<<|user|>>", "<think><think></think></think>",
    "<|begin_of_image|><|image|><|end_of_image|> <|code_prefix|>x<|code_suffix|> /nothink",
    "the the the of and to in is you that", "don't stop 'til you get enough",
]


def random_text(rng):
    weights = [w for w, _ in POOLS]
    n = rng.choice([1, 3, 8, 20, 60, 200])
    return "".join(rng.choice(rng.choices(POOLS, weights)[0][1]) for _ in range(n))


def main():
    j, n = build()
    with open(OUT_JSON, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    full = Tokenizer.from_file(OUT_JSON)
    bare_json = dict(j, added_tokens=[])
    bare = Tokenizer.from_str(json.dumps(bare_json))
    rng = random.Random(4242)
    texts = HANDPICKED + [random_text(rng) for _ in range(400)]
    with open(OUT_CASES, "w", encoding="utf-8") as f:
        for t in texts:
            for mode, tk in (("all", full), ("none", bare)):
                f.write(json.dumps({"text": t, "mode": mode, "ids": tk.encode(t, add_special_tokens=False).ids},
                                   ensure_ascii=False) + "\n")
    print(f"{n} base tokens + {len(ADDED)} added, {len(j['model']['merges'])} merges -> "
          f"{os.path.relpath(OUT_JSON, ROOT)}; {2 * len(texts)} cases -> {os.path.relpath(OUT_CASES, ROOT)}")


if __name__ == "__main__":
    main()
