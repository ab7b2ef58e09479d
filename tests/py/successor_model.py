"""A Qwen3 checkpoint written at test time (numpy only) whose greedy output is
a chosen token sequence: attention and MLP weights are zero, so the last
hidden state is the (normalised) embedding of the current token; embeddings
are one-hot and lm_head maps token i's direction to the next token of the
chain. Lets the server tests see real tool calls and reasoning from a model."""
import json
import os
import shutil
import struct

import numpy as np

from conftest import ROOT


def _bf16(a):
    return (np.asarray(a, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def write_successor_model(path, chain, vocab=151936, hidden=32):
    """chain: token ids t0 -> t1 -> ... ; greedy decoding from a prompt whose
    last token is t0 yields t1, t2, ... (ids must be distinct)."""
    assert len(set(chain)) == len(chain) and len(chain) - 1 <= hidden
    os.makedirs(path, exist_ok=True)
    src = os.path.join(ROOT, "models/tiny-qwen3")
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.update(hidden_size=hidden, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
               intermediate_size=32, tie_word_embeddings=False, vocab_size=vocab)
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
    shutil.copy(os.path.join(src, "generation_config.json"), path)
    emb = np.zeros((vocab, hidden), np.float32)
    head = np.zeros((vocab, hidden), np.float32)
    for i in range(len(chain) - 1):
        emb[chain[i], i] = 1.0
        head[chain[i + 1], i] = 10.0
    H, I = hidden, 32
    t = {
        "model.embed_tokens.weight": emb, "lm_head.weight": head, "model.norm.weight": np.ones(H),
        "model.layers.0.input_layernorm.weight": np.ones(H),
        "model.layers.0.post_attention_layernorm.weight": np.ones(H),
        "model.layers.0.self_attn.q_proj.weight": np.zeros((32, H)),
        "model.layers.0.self_attn.k_proj.weight": np.zeros((16, H)),
        "model.layers.0.self_attn.v_proj.weight": np.zeros((16, H)),
        "model.layers.0.self_attn.o_proj.weight": np.zeros((H, 32)),
        "model.layers.0.self_attn.q_norm.weight": np.ones(16),
        "model.layers.0.self_attn.k_norm.weight": np.ones(16),
        "model.layers.0.mlp.gate_proj.weight": np.zeros((I, H)),
        "model.layers.0.mlp.up_proj.weight": np.zeros((I, H)),
        "model.layers.0.mlp.down_proj.weight": np.zeros((H, I)),
    }
    hdr, blobs, off = {}, [], 0
    for name, a in t.items():
        b = _bf16(a).tobytes()
        hdr[name] = {"dtype": "BF16", "shape": list(np.shape(a)), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return path
