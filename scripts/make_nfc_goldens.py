#!/usr/bin/env python3
"""tests/data/tokenizers/normalize_marks.json.zst: canonical ordering and composition of combining marks,
as HF `tokenizers` normalizes them, for tests/test_tokenizer.c (test_normalize_marks).

Strings (all on the base "a", which composes with many marks):
  - "a" + m1 + m2 for every ordered pair of combining classes that HF's Unicode (9.0, the tables inside
    tokenizers: scripts/make_hf_unicode_table.py) defines, class 0 included (U+034F), one mark per
    class: the lowest code point of that class that HF knows and that does not decompose;
  - for every mark that HF does not know but newer Unicode gives a class (U+08D0, U+1AC7, ...): "a" + it
    + m and "a" + m + it, m of the classes 0, 1, 220, 230, 240 and the two HF classes nearest its own;
  - for every other code point newer Unicode gives a decomposition or a composition HF does not know:
    "a" + it, "a" + it + U+0301, and each canonical pair it is part of.
Per string, the ids of the Qwen3 tokenizer (tests/data/tokenizers/qwen3/tokenizer.json.zst) with its
normalizer (NFC) and with the normalizer replaced by NFD, NFKC and NFKD.

Needs: tokenizers, unicodedata2==17.0.1 (the newest classes, to find the marks), zstd on PATH.
Usage: python3 scripts/make_nfc_goldens.py
"""
import json
import os
import subprocess
import sys

import tokenizers
import unicodedata2 as U
from tokenizers import Tokenizer, normalizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "tokenizers")
OUT = os.path.join(DATA, "normalize_marks.json.zst")
FORMS = ["NFC", "NFD", "NFKC", "NFKD"]
BASE = "a"
CGJ = "\u034f"  # COMBINING GRAPHEME JOINER: a mark of class 0
HF_NFC = normalizers.NFC()


def hf_knows_class(c):
    """HF reorders c against class-1 and class-230 marks: it knows c's (non-zero) class."""
    a, b = "\u4e00" + c + "\u0334", "\u4e00" + "\u0301" + c
    return HF_NFC.normalize_str(a) != a or HF_NFC.normalize_str(b) != b


def hf_inert(c, pairs):
    ps = [c, "\u4e00" + c + "\u0334", "\u4e00\u0301" + c] + pairs.get(c, [])
    return all(getattr(normalizers, f)().normalize_str(p) == p for f in FORMS for p in ps)


def main():
    assert U.unidata_version == "17.0.0", U.unidata_version
    zj = subprocess.run(["zstd", "-d", "-c", os.path.join(DATA, "qwen3", "tokenizer.json.zst")],
                        stdout=subprocess.PIPE, check=True).stdout
    base = json.loads(zj)
    assert base["normalizer"] == {"type": "NFC"}, base["normalizer"]
    toks = {}
    for f in FORMS:
        j = dict(base, normalizer={"type": f})
        toks[f] = Tokenizer.from_str(json.dumps(j))

    marks = [chr(cp) for cp in range(0x110000) if U.combining(chr(cp))]
    known = [c for c in marks if hf_knows_class(c)]
    late = [c for c in marks if not hf_knows_class(c)]
    reps = {0: CGJ}
    for c in known:
        if not U.decomposition(c):
            reps.setdefault(U.combining(c), c)
    classes = sorted(reps)
    assert set(classes[1:]) == {U.combining(c) for c in known}, "a class without a non-decomposing mark"

    cases = [BASE + reps[a] + reps[b] for a in classes for b in classes]
    for x in late:
        v = U.combining(x)
        below = max(c for c in classes if c < v)
        above = [c for c in classes if c > v]
        for c in sorted({0, 1, 220, 230, 240, below} | set(above[:1])):
            cases += [BASE + x + reps[c], BASE + reps[c] + x]
    pairs = {}
    for cp in range(0x110000):
        d = U.decomposition(chr(cp))
        if d and not d.startswith("<") and len(d.split()) == 2:
            p = "".join(chr(int(h, 16)) for h in d.split())
            for c in p:
                pairs.setdefault(c, []).append(p)
    n_late_other = 0
    for cp in range(0x110000):
        c = chr(cp)
        if (0xD800 <= cp <= 0xDFFF or U.combining(c)) or not (U.decomposition(c) or c in pairs):
            continue
        if hf_inert(c, pairs) and not all(U.normalize(f, p) == p for f in FORMS for p in [c] + pairs.get(c, [])):
            cases += [BASE + c, BASE + c + "\u0301"] + [BASE + p for p in pairs.get(c, [])]
            n_late_other += 1
    cases = list(dict.fromkeys(cases))
    out = {"generator": "scripts/make_nfc_goldens.py", "tokenizers": tokenizers.__version__, "hf_unicode": "9.0.0",
           "forms": FORMS, "cases": [[s] + [toks[f].encode(s, add_special_tokens=False).ids for f in FORMS]
                                     for s in cases]}
    data = json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()
    z = subprocess.run(["zstd", "-19", "-q", "-c", "--stream-size=%d" % len(data)], input=data, stdout=subprocess.PIPE, check=True).stdout
    with open(OUT, "wb") as f:
        f.write(z)
    print(f"{OUT}: {len(cases)} strings ({len(classes)} classes: {len(classes) ** 2} pairs, {len(late)} late marks,"
          f" {n_late_other} other late code points), {len(z)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
