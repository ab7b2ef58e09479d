#!/usr/bin/env python3
"""Seed corpus of tests/fuzz/fuzz_http.c: one realistic request per endpoint
and per feature (tests/fuzz/corpus/http/), in the target's text form
"METHOD PATH\\nHeader: v\\n\\nbody". The delta seed is `trainer diff` of the
bundled model against a copy with a few norm weights moved (needs
build/trainer; numpy only)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests/fuzz/corpus/http")
KEY = "Authorization: Bearer fuzz-key"
ADMIN = "Authorization: Bearer fuzz-admin"
TRAINER = os.environ.get("TRAINER_BIN", os.path.join(ROOT, "build/trainer"))

MSG = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello!"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

SEEDS = {
    "completions_basic": ("POST /v1/completions", [KEY], {"model": "tiny-qwen3", "prompt": "The quick brown fox", "max_tokens": 4}),
    "completions_ids_n": ("POST /v1/completions", [KEY], {"prompt": [[9707, 11, 1879], [785, 3974]], "n": 2, "max_tokens": 3,
                          "temperature": 1.0, "top_k": 50, "top_p": 0.9, "min_p": 0.05, "seed": 1}),
    "completions_stream": ("POST /v1/completions", [KEY], {"prompt": ["a", "b c"], "max_tokens": 4, "stream": True,
                           "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "logprobs": 2}),
    "completions_stream_gone": ("POST /v1/completions", [KEY, "x-fuzz-disconnect: 2"], {"prompt": "hi", "max_tokens": 8,
                                "ignore_eos": True, "stream": True}),
    "completions_gone": ("POST /v1/completions", [KEY, "x-fuzz-disconnect: 0"], {"prompt": "hi", "max_tokens": 8}),
    "completions_rl": ("POST /v1/completions", [KEY], {"prompt": [9707, 11], "max_tokens": 3, "temperature": 0.7, "top_k": 20,
                       "return_token_ids": True, "return_sampler_logprobs": True, "return_raw_logprobs": True,
                       "return_sampling_mask": True, "return_routed_experts": True, "prompt_logprobs": 2}),
    "completions_echo": ("POST /v1/completions", [KEY], {"prompt": "echo me", "echo": True, "logprobs": 1, "max_tokens": 2,
                         "stop": ["\n", "xy"], "include_stop_str_in_output": True, "stop_token_ids": [151645]}),
    "completions_penalties": ("POST /v1/completions", [KEY], {"prompt": "x", "max_tokens": 4, "presence_penalty": 0.5,
                              "frequency_penalty": 0.3, "repetition_penalty": 1.2, "logit_bias": {"11": 5, "9707": -100},
                              "min_tokens": 2, "ignore_eos": True, "skip_special_tokens": False}),
    "completions_bad": ("POST /v1/completions", [KEY], {"prompt": "x", "max_tokens": -1, "temperature": "hot"}),
    "chat_basic": ("POST /v1/chat/completions", [KEY], {"model": "tiny-qwen3", "messages": MSG, "max_tokens": 4}),
    "chat_stream_tools": ("POST /v1/chat/completions", [KEY], {"messages": [{"role": "user", "content": "Weather in Paris?"}],
                          "tools": TOOLS, "tool_choice": "auto", "max_tokens": 4, "stream": True,
                          "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2}),
    "chat_history": ("POST /v1/chat/completions", [KEY], {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": "", "reasoning_content": "think",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], "tools": TOOLS, "max_completion_tokens": 3,
        "chat_template_kwargs": {"enable_thinking": False}, "add_generation_prompt": True, "n": 2,
        "return_token_ids": True, "return_sampler_logprobs": True}),
    "chat_bias_think": ("POST /v1/chat/completions", [KEY], {"messages": MSG, "max_tokens": 3, "temperature": 0,
                        "logit_bias": {"151667": 100}}),
    "tokenize_prompt": ("POST /tokenize", [KEY], {"prompt": "Hello, world!", "add_special_tokens": True, "return_token_strs": True}),
    "tokenize_messages": ("POST /tokenize", [KEY], {"model": "tiny-qwen3", "messages": MSG, "tools": TOOLS}),
    "detokenize": ("POST /detokenize", [KEY], {"tokens": [9707, 11, 1879, 0, 151643]}),
    "abort_rid": ("POST /abort_request", [ADMIN], {"rid": "cmpl-0000000000000000"}),
    "abort_all": ("POST /abort_request", [ADMIN], {"abort_all": True}),
}
RAW = {
    "models": "GET /v1/models\n" + KEY + "\n\n",
    "model_one": "GET /v1/models/tiny-qwen3\n" + KEY + "\n\n",
    "health": "GET /health\n\n",
    "metrics": "GET /metrics\n\n",
    "pause_keep": "POST /pause?mode=keep\n" + ADMIN + "\n\n",
    "pause_wait": "POST /pause?mode=wait\n" + ADMIN + "\n\n",
    "resume": "POST /resume\n" + ADMIN + "\n\n",
    "is_paused": "GET /is_paused\n" + ADMIN + "\n\n",
    "weights": "GET /admin/v1/weights\n" + ADMIN + "\n\n",
    "no_auth": "POST /v1/completions\n\n{\"prompt\": \"x\"}",
    "malformed": "POST /v1/chat/completions\n" + KEY + "\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"x\"",
}


def delta_seed():
    if not os.path.exists(TRAINER):
        print("no trainer binary: skipping the delta seed", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(ROOT, "models/tiny-qwen3")
        dst = os.path.join(d, "v1")
        shutil.copytree(src, dst)
        path = os.path.join(dst, "model.safetensors")
        raw = bytearray(open(path, "rb").read())
        n = int.from_bytes(raw[:8], "little")
        hdr = json.loads(raw[8:8 + n])
        b, e = hdr["model.norm.weight"]["data_offsets"]
        a = np.frombuffer(raw, dtype=np.uint16, count=(e - b) // 2, offset=8 + n + b).copy()
        a[::5] += 3
        raw[8 + n + b:8 + n + e] = a.tobytes()
        open(path, "wb").write(raw)
        out = os.path.join(d, "1.delta")
        subprocess.run([TRAINER, "diff", src, dst, "-o", out, "--base-version", "0", "--target-version", "1"],
                       check=True, capture_output=True)
        return open(out, "rb").read()


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (line, hdrs, body) in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(("\n".join([line] + hdrs) + "\n\n" + json.dumps(body)).encode())
    for name, text in RAW.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(text.encode())
    d = delta_seed()
    if d is not None:
        with open(os.path.join(OUT, "delta"), "wb") as f:
            f.write(("POST /admin/v1/weights/delta\n" + ADMIN + "\n\n").encode() + d)
    print(f"wrote {len(os.listdir(OUT))} seeds to {OUT}")


if __name__ == "__main__":
    main()
