"""Golden cases for tests/test_tool_parse.c: assistant turns with reasoning,
content and tool calls rendered by the real Qwen3 chat template
(transformers' apply_chat_template on models/tiny-qwen3). The parser must
recover the original reasoning, content and calls from the rendered text.

    python3 scripts/make_tool_parse_goldens.py   # writes tests/data/tool_parse_golden.json
"""
import json
import os

from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "models/tiny-qwen3"))

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]

CASES = [
    {"reasoning": "The user wants weather.", "content": "", "calls": [("get_weather", {"city": "Paris"})]},
    {"reasoning": "Two cities.", "content": "Checking both.",
     "calls": [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Zürich", "unit": "c"})]},
    {"reasoning": "No tool needed.", "content": "Hello there! <b>bold</b> a < b", "calls": []},
    {"reasoning": "Nested args.", "content": "",
     "calls": [("search", {"q": "a \"quoted\" </tool_call text", "opts": {"n": 3, "tags": ["x", "y"]}, "f": True})]},
    {"reasoning": "Line\nbreaks\n\ninside.", "content": "Multi\nline", "calls": [("noargs", {})]},
]


def render(case):
    msg = {"role": "assistant", "content": case["content"], "reasoning_content": case["reasoning"]}
    if case["calls"]:
        msg["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in case["calls"]]
    msgs = [{"role": "user", "content": "hi"}, msg]
    text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False)
    start = text.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
    return text[start:text.index("<|im_end|>", start)]


out = []
for c in CASES:
    out.append({"text": render(c), "reasoning": c["reasoning"], "content": c["content"],
                "calls": [{"name": n, "arguments": json.dumps(a, ensure_ascii=False)} for n, a in c["calls"]]})
with open(os.path.join(ROOT, "tests/data/tool_parse_golden.json"), "w") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
print(f"{len(out)} cases")
