#!/usr/bin/env python3
"""Golden files for tests/test_tokenizer.c and tests/test_chat_template.c.

Reference: the Python `tokenizers` package (token ids, decode) and
transformers' AutoTokenizer.apply_chat_template (rendered text), both loaded
from the local tokenizer directories; no hub access.

Writes under tests/data/tokenizers/:
  <name>/tokenizer.json.zst, <name>/tokenizer_config.json   (copies of the model files)
  corpus.bin.zst      deterministic >= 1 MB corpus: u32 n_docs, then per doc u32 len + raw bytes
                      (may contain invalid UTF-8)
  <name>/encode.bin.zst  per doc: u8 add_special, u32 n, n x i32 ids, u32 len, decode(ids) bytes,
                         u32 len, decode(ids, skip_special_tokens=True) bytes
  <name>/decode.bin.zst  random id sequences: u32 n_seq, per seq u32 n, n x i32 ids, u32 len,
                         decode bytes, u32 len, decode skip-special bytes
  chat/conversations.json  the conversations and render options
  <name>/chat.json       per case: rendered text (or error) and ids of tokenizer(text, add_special_tokens=False)

Invalid UTF-8 in the corpus is given to `tokenizers` as bytes.decode("utf-8", "replace"),
the only way to hand it such text.

Usage: python3 scripts/make_tokenizer_goldens.py [--src ../shared/tokenizers]
"""
import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizers")
NAMES = ["qwen3", "llama3.1"]

CODE = [
    # C
    '''#include <stdio.h>
static int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
int main(int argc, char **argv) {
\tfor (int i = 0; i < 30; i++) printf("%d: %d\\n", i, fib(i));
\treturn argc > 1 ? 1 : 0; // done
}
''',
    # Python
    '''def tokenize(text: str, *, lower=False) -> list[str]:
    """Split text on whitespace."""
    if lower:
        text = text.lower()
    return [w for w in text.split() if w]  # 4 spaces of indent


class Cache(dict):
    def __missing__(self, key):
        self[key] = value = len(key) ** 2
        return value
''',
    # JavaScript
    '''const fetchAll = async (urls) => {
  const res = await Promise.all(urls.map((u) => fetch(u).then((r) => r.json())));
  return res.filter(Boolean).reduce((acc, x) => ({ ...acc, [x.id]: x }), {});
};
export default fetchAll;
''',
    # Rust
    '''fn main() {
    let v: Vec<u64> = (1..=10).map(|x| x * x).collect();
    println!("{:?} sum={}", v, v.iter().sum::<u64>());
    if let Some(&last) = v.last() { assert_eq!(last, 100); }
}
''',
    # Go
    '''package main

import "fmt"

func main() {
\tm := map[string]int{"a": 1, "b": 2}
\tfor k, v := range m {
\t\tfmt.Printf("%s=%d\\n", k, v)
\t}
}
''',
    # SQL
    '''SELECT u.id, u.name, COUNT(o.id) AS n_orders
FROM users u LEFT JOIN orders o ON o.user_id = u.id
WHERE u.created_at >= '2024-01-01' AND u.email LIKE '%@example.com'
GROUP BY u.id, u.name HAVING COUNT(o.id) > 3 ORDER BY n_orders DESC;
''',
    # HTML/CSS
    '''<!DOCTYPE html>
<html lang="en"><head><style>body { margin: 0; font: 14px/1.4 sans-serif; } .x>p{color:#ff0}</style></head>
<body><div class="x" id='main'><p>Hello &amp; welcome&nbsp;&mdash; &lt;tag&gt;</p></div></body></html>
''',
    # shell
    '''#!/usr/bin/env bash
set -euo pipefail
for f in "$@"; do
  [[ -f "$f" ]] || { echo "missing: $f" >&2; exit 1; }
  sha256sum -- "$f" | awk '{print $1}'
done
''',
    # JSON + YAML
    '''{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7, "max_tokens": 1024}
---
server:
  port: 8080
  workers: [1, 2, 3]
  tls: {enabled: false}
''',
    # C++ / templates
    '''template <typename T, std::size_t N>
constexpr auto sum(const std::array<T, N>& a) -> T {
    T s{};
    for (auto&& x : a) s += x;
    return s;
}
static_assert(sum(std::array<int, 3>{1, 2, 3}) == 6);
''',
]

WORDS = ("the of and to in is was he for it with as his on be at by had are but from or have an they which "
         "one you were her all she there would their we him been has when who will more no if out so said what "
         "up its about into than them can only other new some could time these two may then do first any my now "
         "such like our over man me even most made after also did many before must through back years where much "
         "your way well down should because each just those people Mr how too little state good very make world "
         "still own see men work long get here between both life being under never day same another know while "
         "last might us great old year off come since against go came right used take three tokenizer merges "
         "byte-level inference sampler throughput latency GPU").split()
CONTRACTIONS = ["it's", "don't", "they're", "we've", "I'm", "you'll", "she'd", "IT'S", "DON'T", "We'Re", "O'Neil",
                "rock'n'roll", "'tis", "y'all", "won't", "shan't"]
CJK = ["我们今天讨论一下分词器的实现细节。", "东京は日本の首都です。カタカナとひらがなを混ぜます。", "한국어 문장도 포함합니다. 감사합니다!",
       "机器学习模型需要大量的训练数据，并且计算成本很高。", "「引用」と『二重引用』、そして全角記号：！？"]
ARABIC = ["مرحبا بالعالم، هذه جملة عربية للاختبار.", "اللُّغَةُ العَرَبِيَّةُ جَمِيلَةٌ جِدًّا", "الأرقام ٠١٢٣٤٥٦٧٨٩ مهمة"]
HINDI = ["नमस्ते दुनिया, यह एक परीक्षण वाक्य है।", "हिन्दी में संयुक्ताक्षर: क्ष त्र ज्ञ श्र", "संख्याएँ: ०१२३४५६७८९"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵🇺🇸", "1️⃣", "🧑🏿‍💻", "❤️‍🔥", "🫠", "👩🏻‍🤝‍👨🏾", "✨🚀🔥"]
COMBINING = ["e\u0301", "a\u0308", "A\u030a", "\u212b", "o\u0302\u0323", "\u1100\u1161\u11a8", "n\u0303o", "Z\u0335\u0324\u0301",
             "\ufb01", "\u00c5", "x\u0338", "\u0915\u094d\u0937", "\u0627\u064e\u0644"]
WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\n\n\n", "   \n", " \t \n\t", "\u00a0", "\u3000", "\u2028", "\u0085",
              "\u200b", "\u2009", "\u202f", "\r", "\x0b", "\x0c", "\n \n  \n"]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
           "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_5|>",
           "<|im_sta", "<|", "|>", "<|im_start|><|im_end|>", "<|python_tag|>", "<|vision_pad|>", "<tool_response>"]
INVALID = [b"\xff", b"\xfe\xfe", b"\xc0\x80", b"\xed\xa0\x80", b"\xe2\x82", b"\x80", b"\xf0\x9f\x98", b"\xf4\x90\x80\x80",
           b"\xc3", b"\xe0\x80\xaf", b"\xf8\x88\x80\x80\x80", b"a\xc3(b", b"\xef\xbf\xbd", b"\xc2"]
SCRIPTS_RANGES = [(0x4E00, 0x9FFF), (0x3040, 0x30FF), (0xAC00, 0xD7A3), (0x0600, 0x06FF), (0x0900, 0x097F),
                  (0x0400, 0x04FF), (0x0370, 0x03FF), (0x0590, 0x05FF), (0x0E00, 0x0E7F), (0x1F300, 0x1FAFF),
                  (0x0300, 0x036F), (0x2000, 0x206F), (0xFF00, 0xFFEF), (0x00A0, 0x024F)]


def prose(r, n):
    out = []
    for _ in range(n):
        k = r.randint(4, 18)
        ws = [r.choice(WORDS) for _ in range(k)]
        if r.random() < 0.4:
            ws[r.randrange(k)] = r.choice(CONTRACTIONS)
        s = " ".join(ws)
        s = s[0].upper() + s[1:] + r.choice([".", ".", "!", "?", ";", ",", " —", "...", ":"])
        out.append(s)
    return " ".join(out)


def digits(r):
    k = r.choice([1, 2, 3, 4, 5, 7, 12, 40, 200])
    d = "".join(r.choice("0123456789") for _ in range(k))
    return r.choice([d, d + "." + d[:3], "$" + d, d + "%", "v" + d, "١٢٣" + d, "２０２４", "x²+y³", d + "e-5", "0x" + d])


def piece(r):
    kind = r.randrange(12)
    if kind == 0: return r.choice(CODE).encode()
    if kind == 1: return prose(r, r.randint(1, 6)).encode()
    if kind == 2: return "".join(r.choice(CJK) for _ in range(r.randint(1, 3))).encode()
    if kind == 3: return (r.choice(ARABIC) + " " + r.choice(HINDI)).encode()
    if kind == 4: return "".join(r.choice(EMOJI) + r.choice(["", " ", "", "x"]) for _ in range(r.randint(1, 6))).encode()
    if kind == 5: return "".join(r.choice(COMBINING) for _ in range(r.randint(1, 5))).encode()
    if kind == 6: return " ".join(digits(r) for _ in range(r.randint(1, 4))).encode()
    if kind == 7: return "".join(r.choice(WHITESPACE) for _ in range(r.randint(1, 8))).encode()
    if kind == 8: return r.choice(SPECIAL).encode()
    if kind == 9: return r.choice(INVALID)
    if kind == 10:
        lo, hi = r.choice(SCRIPTS_RANGES)
        return "".join(chr(r.randint(lo, hi)) for _ in range(r.randint(1, 12))).encode("utf-8", "surrogatepass")
    return r.choice(["Hello", " world", "HELLO", "naïve café", "Ça va?", "straße", "İstanbul", "ﬁne", "x=y+1",
                     "https://example.com/a?b=c&d=e#f", "user@mail.org", "C:\\path\\to\\file.txt", "ſs 'ſ 'S 'K"]).encode()


def make_corpus():
    r = random.Random(20261129)
    docs = []
    # Long runs that exercise the large-word BPE path and regex backtracking.
    docs += [b" " * 5000 + b"x", b"a" * 3000, b"7" * 2000, b"\n" * 1000 + b"end", b"ab" * 1500,
             ("é" * 500).encode(), b"\t \n" * 400, ("我" * 700).encode(), b"-" * 1200 + b">", b"".join(INVALID) * 20]
    size = sum(map(len, docs))
    while size < 1_100_000:
        n = r.choice([1, 2, 4, 8, 16, 32, 64])
        d = b"".join(piece(r) + (r.choice([b"", b" ", b"\n"])) for _ in range(n))
        docs.append(d)
        size += len(d)
    return docs


def zst(data: bytes) -> bytes:
    p = subprocess.run(["zstd", "-19", "--long=27", "-q", "-c", "--stream-size=%d" % len(data)], input=data, stdout=subprocess.PIPE, check=True)
    return p.stdout


def u32(x):
    return struct.pack("<I", x)


def blob(b: bytes):
    return u32(len(b)) + b


def ids_blob(ids):
    return u32(len(ids)) + struct.pack("<%di" % len(ids), *ids)


CONVERSATIONS_TOOLS = [{
    "type": "function",
    "function": {"name": "get_weather", "description": "Get the current weather in a city",
                 "parameters": {"type": "object", "properties": {
                     "city": {"type": "string", "description": "City name, e.g. Zürich"},
                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function",
     "function": {"name": "search", "description": "Search the web \"quoted\" & <escaped>?",
                  "parameters": {"type": "object", "properties": {"q": {"type": "string"},
                                                                  "k": {"type": "integer", "default": 5},
                                                                  "score": {"type": "number", "minimum": 0.5}}}}}]


def conversations():
    sys_msg = {"role": "system", "content": "You are a helpful assistant."}
    T = CONVERSATIONS_TOOLS
    call = lambda name, args, as_str=False: {"type": "function", "id": "call_1", "function": {
        "name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_str else args}}
    convs = [
        {"messages": [{"role": "user", "content": "Hello!"}]},
        {"messages": [sys_msg, {"role": "user", "content": "What is 2+2?"}]},
        {"messages": [sys_msg, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
                      {"role": "user", "content": "Tell me a joke."}]},
        {"messages": [{"role": "user", "content": ""}]},
        {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": ""}, {"role": "assistant", "content": ""}]},
        {"messages": [{"role": "user", "content": "  padded  \n"}, {"role": "assistant", "content": "\n\nanswer\n\n"}]},
        {"messages": [{"role": "user", "content": "Solve x^2=4"},
                      {"role": "assistant", "content": "x = ±2", "reasoning_content": "x^2 = 4 so x is 2 or -2."}]},
        {"messages": [{"role": "user", "content": "Q1"},
                      {"role": "assistant", "content": "A1", "reasoning_content": "think 1"},
                      {"role": "user", "content": "Q2"},
                      {"role": "assistant", "content": "A2", "reasoning_content": "think 2"}]},
        {"messages": [{"role": "user", "content": "Q1"},
                      {"role": "assistant", "content": "<think>\ninline reasoning\n</think>\n\nA1"},
                      {"role": "user", "content": "Q2"}]},
        {"messages": [{"role": "user", "content": "Q"},
                      {"role": "assistant", "content": "<think>only think</think>"}]},
        {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": T},
        {"messages": [sys_msg, {"role": "user", "content": "Weather in Paris?"}], "tools": T},
        {"messages": [{"role": "user", "content": "Weather in Paris?"},
                      {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris"})]},
                      {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
                      {"role": "assistant", "content": "It is 21°C and clear in Paris."}], "tools": T},
        {"messages": [{"role": "user", "content": "Weather in Paris and Rome?"},
                      {"role": "assistant", "content": "Let me check both.", "tool_calls": [
                          call("get_weather", {"city": "Paris"}), call("get_weather", {"city": "Rome", "unit": "celsius"}, True)]},
                      {"role": "tool", "content": "21"}, {"role": "tool", "content": "25"}], "tools": T},
        {"messages": [{"role": "user", "content": "Find it"},
                      {"role": "assistant", "content": "", "reasoning_content": "I should search.",
                       "tool_calls": [call("search", {"q": "日本語 query", "k": 3, "score": 0.75})]},
                      {"role": "tool", "content": "result one\nresult two"},
                      {"role": "assistant", "content": "Found two results.", "reasoning_content": "Summarize."},
                      {"role": "user", "content": "Thanks"}], "tools": T},
        {"messages": [{"role": "user", "content": "<tool_response>\nfake\n</tool_response>"},
                      {"role": "assistant", "content": "ok"}]},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
                                                         "tool_calls": [call("search", {"q": "none content"})]},
                      {"role": "tool", "content": "r"}]},
        {"messages": [{"role": "user", "content": "Special <|im_start|> tokens <|eot_id|> in text </think>"}]},
        {"messages": [{"role": "user", "content": "Ünïcödé: 中文, العربية, हिन्दी, 😀👨‍👩‍👧"}]},
        {"messages": [{"role": "system", "content": "Sys A"}, {"role": "user", "content": "u1"},
                      {"role": "system", "content": "Sys B mid-conversation"}, {"role": "user", "content": "u2"}]},
        {"messages": [{"role": "user", "content": "multi\nline\n\n\ncontent\twith\ttabs"},
                      {"role": "assistant", "content": "reply", "reasoning_content": "\n\nspaced reasoning\n\n"},
                      {"role": "user", "content": "again"},
                      {"role": "assistant", "content": "reply 2", "reasoning_content": ""}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                      {"role": "user", "content": "<tool_response>r</tool_response>"}]},
        {"messages": [{"role": "user", "content": "call tools"},
                      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                          "name": "get_weather", "arguments": {"city": "Zürich", "nested": {"a": [1, 2.5, True, None, "s"]}}}}]},
                      {"role": "tool", "content": "snow"},
                      {"role": "assistant", "content": "", "tool_calls": [call("search", {"q": "next"})]},
                      {"role": "tool", "content": "done"}], "tools": T},
        {"messages": [{"role": "user", "content": "A" * 300}, {"role": "assistant", "content": "B " * 100}]},
        {"messages": [{"role": "user", "content": "json? {\"a\": 1}"}, {"role": "assistant", "content": "```json\n{\"a\": 1}\n```"}]},
        {"messages": [{"role": "user", "content": "Think step by step: 17*23"},
                      {"role": "assistant", "content": "391", "reasoning": "17*23 = 391 (alias field)"}]},
        {"messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "second"},
                      {"role": "user", "content": "third"}, {"role": "assistant", "content": "fourth"},
                      {"role": "user", "content": "fifth"}, {"role": "assistant", "content": "sixth"},
                      {"role": "user", "content": "seventh"}]},
        {"messages": [sys_msg, {"role": "user", "content": "use tool"},
                      {"role": "assistant", "content": "<think>\nreason about tool\n</think>\n\ncalling",
                       "tool_calls": [call("get_weather", {"city": "Oslo"})]},
                      {"role": "tool", "content": "cold"}], "tools": T},
        {"messages": [{"role": "user", "content": "trailing spaces   "}, {"role": "assistant", "content": "   leading"}]},
        {"messages": [{"role": "user", "content": "tab\there"}], "tools": [T[1]]},
        {"messages": [{"role": "user", "content": "emoji only 🫠"}, {"role": "assistant", "content": "🚀",
                                                                     "reasoning_content": "🤔"}]},
        {"messages": [{"role": "tool", "content": "orphan tool result"}, {"role": "user", "content": "hm"}]},
    ]
    cases = []
    for i, c in enumerate(convs):
        for agp in (False, True):
            for think in (None, True, False):
                kw = {} if think is None else {"enable_thinking": think}
                cases.append({"conv": i, "add_generation_prompt": agp, "kwargs": kw})
    return convs, cases


# Llama 3.1's tool-calling template (as published with Llama-3.1-*-Instruct), to cover more of
# the Jinja subset: date_string/strftime_now, raise_exception, tojson(indent=4), "is not defined".
LLAMA31_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# Small templates for the rest of the subset, rendered by transformers' own Jinja environment.
MINI = [
    ("{{ 'Hello' }} {{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 8 }} {{ 1 / 4 }} {{ 3 * 'ab' }}", {}),
    ("{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1.5e-7 }} {{ 2.0 }} {{ 100.0 * 3 }} {{ 1/3 }} {{ -0.0 }} {{ 123456789.125 }}", {}),
    ("{{ x }}|{{ y }}|{{ z }}|{{ n }}|{{ u }}|{{ l }}|{{ d }}", {"x": True, "y": False, "z": None, "n": 3.25, "l": [1, "a'b", None, True, 2.5, {"k": "v"}], "d": {"a": [1, 2], "b": "it's \"q\""}}),
    ("{% for x in items %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.length }}/{{ loop.first }}/{{ loop.last }}:{{ x }};{% endfor %}", {"items": ["a", "b", "c"]}),
    ("{% for x in items if x > 1 %}{{ x }}{{ ',' if not loop.last }}{% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}", {"items": [1, 2, 3, 0, 5]}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}[{{ k }}]{% endfor %}{% for k, v in d | items %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2, "c": [3]}}),
    ("{{ s[::-1] }}|{{ s[1:3] }}|{{ s[-2:] }}|{{ s[:-1] }}|{{ s[::2] }}|{{ l[::-1] }}|{{ l[1:] }}|{{ l[-1] }}|{{ s[0] }}|{{ s[-1] }}", {"s": "héllo wörld 中文", "l": [1, 2, 3, 4]}),
    ("{{ s.startswith('ab') }} {{ s.endswith('yz') }} {{ s.startswith(('x', 'a')) }} {{ s.split() }} {{ s.split(' ') }} {{ s.split('c', 1) }} {{ s.rsplit('c', 1) }}", {"s": "abc  xcyz c"}),
    ("[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ s.strip('\n ') }}][{{ t.strip('xy') }}][{{ t.lstrip('x') }}][{{ t.rstrip('y') }}]", {"s": "  \n padded \t\n", "t": "xxyhixyy"}),
    ("{{ s.upper() }} {{ s.lower() }} {{ s.title() }} {{ s.capitalize() }} {{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 1) }} {{ s.find('o') }} {{ s.count('l') }}", {"s": "hello wOrld ünï"}),
    ("{{ s | trim }}|{{ s | length }}|{{ l | length }}|{{ d | length }}|{{ s | upper }}|{{ s | lower }}|{{ l | join(', ') }}|{{ l | first }}|{{ l | last }}|{{ l | reverse | list }}", {"s": "  Mixed Case ✓ ", "l": ["x", "y", "z"], "d": {"a": 1}}),
    ("{{ v | tojson }}", {"v": {"s": "a\"b\\c\n\t\u00e9中😀\u0001", "n": [1, 2.5, -0.0, 1e20, None, True, False], "e": {}, "l": []}}),
    ("{{ v | tojson(indent=2) }}|{{ v | tojson(indent=4) }}|{{ v | tojson(sort_keys=true) }}|{{ v | tojson(separators=(',', ':')) }}|{{ v | tojson(ensure_ascii=true) }}", {"v": {"z": [1, {"y": "é😀"}], "a": {}, "m": []}}),
    ("{{ x | default('dflt') }}|{{ y | default('dflt') }}|{{ z | default('d', true) }}|{{ x | d('short') }}|{{ undefined_thing is defined }}|{{ y is defined }}|{{ z is none }}|{{ y is not none }}", {"y": "set", "z": ""}),
    ("{{ a is string }} {{ b is number }} {{ b is integer }} {{ c is float }} {{ d is mapping }} {{ e is iterable }} {{ f is boolean }} {{ f is true }} {{ f is false }} {{ b is odd }} {{ b is even }} {{ b is divisibleby 3 }} {{ a is sequence }}", {"a": "s", "b": 3, "c": 1.5, "d": {}, "e": [1], "f": True}),
    ("{% set ns = namespace(count=0, items=[]) %}{% for i in range(5) %}{% set ns.count = ns.count + i %}{% endfor %}{{ ns.count }}{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% for i in range(10) %}{% if i is odd %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %}|{{ range(2, 8, 3) | list }}", {}),
    ("{% if a %}A{% elif b %}B{% elif c %}C{% else %}D{% endif %}{% if not a and (b or c) %}!{% endif %}{{ 'y' if b else 'n' }}{{ 'z' if a }}", {"a": False, "b": 0, "c": [1]}),
    ("{{ 'ab' in s }} {{ 'zz' not in s }} {{ 2 in l }} {{ 'k' in d }} {{ 'q' in d }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ 3 >= 3 }} {{ [1, 2] == [1, 2] }} {{ true == 1 }}", {"s": "xaby", "l": [1, 2], "d": {"k": 0}}),
    ("{{ 'a' ~ 1 ~ none ~ true }} {{ 'x' + 'y' }} {{ [1] + [2, 3] }} {{ l | map(attribute='n') | list }} {{ l | selectattr('n', 'equalto', 2) | list | length }} {{ l | rejectattr('n') | list }}", {"l": [{"n": 1}, {"n": 2}, {"n": 0}]}),
    ("{{ l | select('odd') | list }} {{ l | reject('odd') | list }} {{ l | sort | list }} {{ l | sort(reverse=true) | list }} {{ l | unique | list }} {{ l | max }} {{ l | min }} {{ l | sum }}", {"l": [3, 1, 2, 3, 5]}),
    ("{{ s | replace('a', 'o') }} {{ '3' | int + 1 }} {{ '2.5' | float }} {{ -4 | abs }} {{ x | string }} {{ 'abc' | list }} {{ s | capitalize }} {{ s | title }} {{ 2.567 | round(1) }}", {"s": "banana split", "x": [1, "a"]}),
    ("  {% if true %}\n    indented\n  {% endif %}\n{% for i in [1, 2] %}\n  - {{ i }}\n{% endfor %}\n{# comment #}\nend\n", {}),
    ("a  {%- if true -%}  b  {%- endif -%}  c {{- ' d ' -}} e {#- c -#} f {%+ if true %} g{% endif +%}\n h", {}),
    ("line1\r\nline2\n{% if true %}\r\nx\n{% endif %}\ntrailing\n", {}),
    ("{{ \"esc\\naped\\t\\\\ \\u00e9 \\x41\" }}{{ 'single \\'q\\'' }}{{ \"a\" \"b\" }}", {}),
    ("{% set d = {'a': 1, 'b': [1, 2]} %}{{ d.a }}{{ d['b'][1] }}{{ d.get('a') }}{{ d.get('z', 'none') }}{{ d.keys() | list }}{{ d.values() | list }}{% set t = (1, 2) %}{{ t[0] }}", {}),
    ("{{ x.y.z if x.y is defined else 'no' }} {{ m.content is string }} {{ m['role'] }} {{ m.tool_calls[0].function.name }}", {"x": {}, "m": {"role": "assistant", "content": "c", "tool_calls": [{"function": {"name": "f"}}]}}),
    ("{{ text | indent(2) }}|{{ text | indent(4, true) }}|{{ 'x' | e }}{{ '<&>' | escape }}|{{ s.splitlines() }}|{{ s.isdigit() }}{{ '123'.isdigit() }}", {"text": "a\nb\n\nc", "s": "l1\nl2\r\nl3"}),
    ("{{ strftime_now('%Y') | length }} {{ strftime_now('%d %b %Y') | length }}", {}),
    ("{{ x.content }}", {"x": None}),
    ("{{ 'a' + undefined_name }}", {}),
    ("{{ 1 < 'a' }}", {}),
    ("{% for a, b in pairs %}{{ a }}{{ b }}{% endfor %}{% for x in s %}<{{ x }}>{% endfor %}{% for x in items %}{{ loop.previtem | default('^') }}{{ x }}{{ loop.nextitem | default('$') }} {% endfor %}", {"pairs": [[1, 2], [3, 4]], "s": "añ😀", "items": [1, 2, 3]}),
]


# Variants of the Qwen3 tokenizer.json with components the two real tokenizers do not use,
# so that every supported option is compared with `tokenizers` too. The C test applies the
# same top-level replacements to qwen3/tokenizer.json before loading it.
def variant_added(extra):
    base = [{"id": 151643 + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for i, c in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])]
    out = base + [dict({"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": False},
                       id=151669 + i, **t) for i, t in enumerate(extra)]
    return out


VARIANT_EXTRA_TOKENS = [
    {"content": "<ls>", "lstrip": True, "special": True},
    {"content": "<rs>", "rstrip": True},
    {"content": "<both>", "lstrip": True, "rstrip": True, "special": True},
    {"content": "word", "single_word": True},
    {"content": "\ufb01x", "normalized": True},
    {"content": "Caf\u00e9", "normalized": True},
    {"content": "<|im_start|>user"},
]
VARIANTS = [
    {"name": "nfkc_digits_merged_prev_bytelevel_regex",
     "patch": {"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}]},
               "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                   {"type": "Digits", "individual_digits": False},
                   {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "MergedWithPrevious", "invert": False},
                   {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
               "added_tokens": variant_added(VARIANT_EXTRA_TOKENS)}},
    {"name": "nfd_merged_next_contiguous_template",
     "patch": {"normalizer": {"type": "NFD"},
               "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                   {"type": "Digits", "individual_digits": True},
                   {"type": "Split", "pattern": {"Regex": "[,.;:!?]"}, "behavior": "MergedWithNext", "invert": False},
                   {"type": "Split", "pattern": {"String": " "}, "behavior": "Contiguous", "invert": False},
                   {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
               "post_processor": {"type": "TemplateProcessing",
                                  "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                             {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
                                  "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                                  "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [151644], "tokens": ["<|im_start|>"]},
                                                     "<|im_end|>": {"id": "<|im_end|>", "ids": [151645], "tokens": ["<|im_end|>"]}}},
               "added_tokens": variant_added(VARIANT_EXTRA_TOKENS)}},
    {"name": "removed_inverted_nfkd_no_norm_added",
     "patch": {"normalizer": {"type": "NFKD"},
               "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                   {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\p{N}+"}, "behavior": "Removed", "invert": True},
                   {"type": "Split", "pattern": {"Regex": "[^\\s]+"}, "behavior": "Isolated", "invert": True},
                   {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
               "added_tokens": variant_added(VARIANT_EXTRA_TOKENS[:4])}},
    {"name": "bytelevel_only_no_normalizer",
     "patch": {"normalizer": None,
               "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}}},
]
VARIANT_TEXTS = ["a <ls> b  <ls>c", "x<rs>   y <rs>\nz", "  <both>  q <both>", "word words sword word_ a-word word.",
                 "the \ufb01x and fix and \ufb01xed Caf\u00e9 Cafe\u0301 CAF\u00c9", "<|im_start|>user hi<|im_end|>",
                 "<|im_start|>users <|im_start|>user", "123 4567 89, ok; fine. ½ ² \u2460 \uff11\uff12",
                 "tabs\t\tand   spaces \u00a0nbsp", "<ls><rs><both>word<ls>"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default=os.path.join(ROOT, "..", "shared", "tokenizers"))
    args = ap.parse_args()
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    os.makedirs(OUT, exist_ok=True)
    docs = make_corpus()
    print("corpus: %d docs, %d bytes" % (len(docs), sum(map(len, docs))))
    with open(os.path.join(OUT, "corpus.bin.zst"), "wb") as f:
        f.write(zst(u32(len(docs)) + b"".join(blob(d) for d in docs)))
    convs, cases = conversations()
    os.makedirs(os.path.join(OUT, "chat"), exist_ok=True)
    with open(os.path.join(OUT, "chat", "conversations.json"), "w") as f:
        json.dump({"conversations": convs, "cases": cases}, f, ensure_ascii=False, indent=1)

    from transformers.utils.chat_template_utils import _compile_jinja_template
    mini = []
    for tpl, ctx in MINI:
        try:
            mini.append({"template": tpl, "context": ctx, "text": _compile_jinja_template(tpl).render(**ctx)})
        except Exception as ex:
            mini.append({"template": tpl, "context": ctx, "error": "%s: %s" % (type(ex).__name__, ex)})
    with open(os.path.join(OUT, "chat", "llama31_tools.jinja"), "w") as f:
        f.write(LLAMA31_TEMPLATE)
    with open(os.path.join(OUT, "chat", "mini.json"), "w") as f:
        json.dump(mini, f, ensure_ascii=False, indent=1)
    print("mini templates:", len(mini), "errors:", [m["error"] for m in mini if "error" in m])

    # Tokenizer variants (patches on qwen3/tokenizer.json), on part of the corpus plus texts
    # that exercise the added-token flags.
    with open(os.path.join(args.src, "qwen3", "tokenizer.json")) as f:
        qwen_json = json.load(f)
    vdocs = [d.decode("utf-8", "replace") for d in docs[10:130]] + VARIANT_TEXTS
    vout = {"texts": vdocs, "variants": []}
    for v in VARIANTS:
        j = dict(qwen_json)
        j.update(v["patch"])
        vt = Tokenizer.from_str(json.dumps(j))
        vout["variants"].append({"name": v["name"], "patch": v["patch"],
                                 "ids": [vt.encode(t, add_special_tokens=(i % 2 == 0)).ids for i, t in enumerate(vdocs)],
                                 "decoded": [vt.decode(vt.encode(t).ids) for t in vdocs[-len(VARIANT_TEXTS):]]})
    with open(os.path.join(OUT, "variants.json.zst"), "wb") as f:
        f.write(zst(json.dumps(vout, ensure_ascii=False).encode()))
    print("variants:", [v["name"] for v in VARIANTS])

    for name in NAMES:
        src = os.path.join(args.src, name)
        dst = os.path.join(OUT, name)
        os.makedirs(dst, exist_ok=True)
        with open(os.path.join(src, "tokenizer.json"), "rb") as f:
            tj = f.read()
        with open(os.path.join(dst, "tokenizer.json.zst"), "wb") as f:
            f.write(zst(tj))
        shutil.copyfile(os.path.join(src, "tokenizer_config.json"), os.path.join(dst, "tokenizer_config.json"))
        tok = Tokenizer.from_file(os.path.join(src, "tokenizer.json"))
        out = [u32(len(docs))]
        for i, d in enumerate(docs):
            add = i % 2 == 0
            ids = tok.encode(d.decode("utf-8", "replace"), add_special_tokens=add).ids
            out += [bytes([add]), ids_blob(ids), blob(tok.decode(ids, skip_special_tokens=False).encode()),
                    blob(tok.decode(ids, skip_special_tokens=True).encode())]
        with open(os.path.join(dst, "encode.bin.zst"), "wb") as f:
            f.write(zst(b"".join(out)))
        # Random id sequences: partial UTF-8 tokens, specials, ids past the vocab.
        r = random.Random(7 + len(name))
        V = tok.get_vocab_size(with_added_tokens=True)
        added = [t for t in range(V) if tok.id_to_token(t) and tok.id_to_token(t).startswith("<|")]
        seqs = []
        for _ in range(400):
            n = r.randint(1, 40)
            seqs.append([r.choice([r.randrange(V), r.randrange(128, 400), r.choice(added), r.randrange(V, V + 300)])
                         if r.random() < 0.5 else r.randrange(256) for _ in range(n)])
        out = [u32(len(seqs))]
        for s in seqs:
            out += [ids_blob(s), blob(tok.decode(s, skip_special_tokens=False).encode()),
                    blob(tok.decode(s, skip_special_tokens=True).encode())]
        with open(os.path.join(dst, "decode.bin.zst"), "wb") as f:
            f.write(zst(b"".join(out)))
        # Chat templates through transformers.
        hf = AutoTokenizer.from_pretrained(src, local_files_only=True)
        V = tok.get_vocab_size(with_added_tokens=True)
        meta = {"vocab_size": V, "bos_id": hf.bos_token_id, "eos_id": hf.eos_token_id, "pad_id": hf.pad_token_id,
                "bos_token": hf.bos_token, "eos_token": hf.eos_token, "pad_token": hf.pad_token,
                "special_ids": sorted(i for i, t in tok.get_added_tokens_decoder().items() if t.special),
                "tokens": {str(i): tok.id_to_token(i) for i in list(range(0, V, 97)) + list(range(V - 300, V))}}
        with open(os.path.join(dst, "meta.json"), "w") as f:
            json.dump(meta, f, ensure_ascii=False, indent=0)
        res = []
        for c in cases:
            conv = convs[c["conv"]]
            kw = dict(c["kwargs"])
            try:
                text = hf.apply_chat_template(conv["messages"], tools=conv.get("tools"), tokenize=False,
                                              add_generation_prompt=c["add_generation_prompt"], **kw)
                ids = hf(text, add_special_tokens=False)["input_ids"]
                res.append({"text": text, "ids": ids})
            except Exception as ex:  # the template itself raised: C must fail too
                res.append({"error": "%s: %s" % (type(ex).__name__, ex)})
        if name == "llama3.1":  # the 3.1 tool template on the same conversations
            for c in cases:
                conv = convs[c["conv"]]
                try:
                    text = hf.apply_chat_template(conv["messages"], tools=conv.get("tools"), tokenize=False,
                                                  chat_template=LLAMA31_TEMPLATE,
                                                  add_generation_prompt=c["add_generation_prompt"], **c["kwargs"])
                    res.append({"template": "llama31_tools", "text": text,
                                "ids": hf(text, add_special_tokens=False)["input_ids"]})
                except Exception as ex:
                    res.append({"template": "llama31_tools", "error": "%s: %s" % (type(ex).__name__, ex)})
        with open(os.path.join(dst, "chat.json"), "w") as f:
            json.dump(res, f, ensure_ascii=False)
        print(name, "done; chat errors:", sum("error" in x for x in res))


if __name__ == "__main__":
    main()
