"""Golden prompt token ids for tests/py/test_server_chat.py: chat requests
rendered and tokenized by transformers' apply_chat_template on the bundled
model's tokenizer (Qwen3 template), with tools, chat_template_kwargs and
add_generation_prompt as the server receives them.

    python3 scripts/make_server_chat_goldens.py   # writes tests/data/server_chat_golden.json
"""
import json
import os

from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "models/tiny-qwen3"))

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

CASES = [
    {"messages": [{"role": "user", "content": "Hello!"}]},
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
     "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"id": "call_1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}],
     "tools": TOOLS},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello."},
                  {"role": "user", "content": "Again, ünïcödé 日本"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Continue"}], "add_generation_prompt": False},
]

out = []
for c in CASES:
    # the server joins text parts with "\n"; the template sees the joined string
    text = tok.apply_chat_template(c["messages"], tools=c.get("tools"), tokenize=False,
                                  add_generation_prompt=c.get("add_generation_prompt", True),
                                  **c.get("chat_template_kwargs", {}))
    ids = tok.encode(text, add_special_tokens=False)  # what vLLM does with the rendered text
    out.append(dict(c, prompt_token_ids=list(map(int, ids))))
with open(os.path.join(ROOT, "tests/data/server_chat_golden.json"), "w") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
print(f"{len(out)} cases")
