"""DeepSeek V4 tokenization as the engine does it (src/text/tokenizer.c, src/text/chat.c):
the V3 byte-level BPE of data/deepseek-v3-tokenizer.json, with the seven chat
protocol strings of a rendered document mapped to their ids and every other
byte (client text included) encoded as plain text."""
import os
import re

from tokenizers import Tokenizer

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
SPECIALS = {"<｜begin▁of▁sentence｜>": 0, "<｜end▁of▁sentence｜>": 1, "<｜User｜>": 128803,
            "<｜Assistant｜>": 128804, "<think>": 128821, "</think>": 128822, "｜DSML｜": 128825}
N_VOCAB = 129280
_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")


class V4Tokenizer:
    def __init__(self):
        self.tk = Tokenizer.from_file(os.path.join(ROOT, "data", "deepseek-v3-tokenizer.json"))
        # Plain text must never turn into added tokens: encode pieces with the
        # model only (no added-token matching), as the engine's SPECIALS_NONE does.
        self.tk.encode_special_tokens = True

    def encode(self, text):
        """ids of a rendered document; protocol strings -> their ids."""
        ids = []
        for piece in _SPLIT.split(text):
            if not piece:
                continue
            if piece in SPECIALS:
                ids.append(SPECIALS[piece])
            else:
                ids.extend(self.tk.encode(piece, add_special_tokens=False).ids)
        return ids

    def encode_offsets(self, text, byte_from):
        """ids plus, per id, whether it starts at or after character offset byte_from."""
        ids, train = [], []
        pos = 0
        for piece in _SPLIT.split(text):
            if not piece:
                continue
            if piece in SPECIALS:
                ids.append(SPECIALS[piece])
                train.append(pos >= byte_from)
            else:
                enc = self.tk.encode(piece, add_special_tokens=False)
                for i, (s, _) in zip(enc.ids, enc.offsets):
                    ids.append(i)
                    train.append(pos + s >= byte_from)
            pos += len(piece)
        return ids, train

    def decode(self, ids):
        return self.tk.decode(ids, skip_special_tokens=False)
