"""Decoder of the "sampling_mask" field of the sampler's responses (the
encoding is documented in README.md, section "RL extensions").

    {"encoding": "csr" | "csr_base64", "vocab_size": V, "n_tokens": T,
     "offsets": [T + 1 ints] | base64 of int64 little-endian,
     "ids":     [offsets[T] ints] | base64 of int32 little-endian,
     "complement": [T ints 0/1] | base64 of uint8}

Token t's list is ids[offsets[t]:offsets[t+1]]; when complement[t] is 1 the
list holds the ids that were NOT kept (the kept set is the rest of the vocab).
"""
import base64

import numpy as np


def _arr(v, dtype):
    if isinstance(v, str):
        return np.frombuffer(base64.b64decode(v), dtype=dtype)
    return np.asarray(v, dtype=dtype)


def decode_sampling_mask(m):
    """-> list (one per token) of sorted int32 arrays of kept ids."""
    binary = m["encoding"] == "csr_base64"
    assert m["encoding"] in ("csr", "csr_base64"), m["encoding"]
    off = _arr(m["offsets"], "<i8" if binary else np.int64)
    ids = _arr(m["ids"], "<i4" if binary else np.int32)
    comp = _arr(m["complement"], np.uint8)
    T, V = m["n_tokens"], m["vocab_size"]
    assert len(off) == T + 1 and len(comp) == T and off[-1] == len(ids)
    out = []
    for t in range(T):
        lst = ids[off[t]:off[t + 1]]
        assert np.all(np.diff(lst) > 0), "ids of a token must be strictly ascending"
        if comp[t]:
            keep = np.ones(V, dtype=bool)
            keep[lst] = False
            lst = np.nonzero(keep)[0].astype(np.int32)
        out.append(lst)
    return out


def concat_masks(chunks):
    """Masks of a stream arrive per chunk; decode and concatenate them."""
    out = []
    for c in chunks:
        out.extend(decode_sampling_mask(c))
    return out
