"""The SentencePiece tokenizers' ids for texts that exercise them (multilingual text, byte fallback, runs of
spaces, digits, newlines, an empty text), from Debian's python3-sentencepiece, the reference the C++ wrapper
and llama2.c's tokenizer are tested against (tests/fixtures/sentencepiece_cases.json). The models themselves
stay in ../shared/models (read, not copied): Llama 2's 32,000-token tokenizer and stories260K's 512-token one.

Usage: /usr/bin/python3 tools/sentencepiece_fixtures.py [--out tests/fixtures/sentencepiece_cases.json]
(needs python3-sentencepiece: scripts/install-deps.sh)
"""
import argparse
import json
import os

import sentencepiece as spm

MODELS = {"llama2": "llama2-tokenizer/tokenizer.model", "tok512": "stories260K/tok512.model"}
TEXTS = [
    "Once upon a time, there was a little girl named Lily.",
    "Hello world",
    "The year 1999 ended; 2000 began. 3.14159 and 42!",
    "  leading spaces, and   runs   of    spaces  ",
    "tabs\tand\nnewlines\n\nand \r\n carriage returns",
    "Déjà vu — «naïve» café, Straße, façade",
    "東京は日本の首都です。北京是中国的首都。",
    "Привет, мир! Γειά σου Κόσμε! مرحبا بالعالم",
    "emoji 🙂🚀 and a rare one: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "def f(x):\n    return x ** 2  # code",
    "<s> and </s> in text are not the special tokens",
    "",
]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "sentencepiece_cases.json"))
    ap.add_argument("--models", default=os.path.join(here, "..", "..", "shared", "models"))
    args = ap.parse_args()
    cases = {}
    for name, path in MODELS.items():
        sp = spm.SentencePieceProcessor(model_file=os.path.join(args.models, path))
        cases[name] = {"model": path, "size": sp.get_piece_size(), "bos": sp.bos_id(), "eos": sp.eos_id(),
                       "cases": [{"text": t, "ids": sp.encode(t), "decoded": sp.decode(sp.encode(t))} for t in TEXTS]}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
