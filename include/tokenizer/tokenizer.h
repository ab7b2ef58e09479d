/*
 * tokenizer.h - byte-level BPE tokenizer loaded from a Hugging Face model
 * directory (tokenizer.json + tokenizer_config.json), giving the same token ids
 * and text as the `tokenizers` package, and the model's chat template.
 *
 * Supported tokenizer.json components (anything else is refused at load, with
 * its name): model BPE (merges as "a b" or ["a","b"], ignore_merges, no
 * dropout/unk/byte_fallback); added tokens (special, lstrip, rstrip,
 * normalized, single_word); normalizers NFC/NFD/NFKC/NFKD/Sequence/none;
 * pre-tokenizers Split (Regex or String pattern, every behaviour, invert),
 * ByteLevel (use_regex, no add_prefix_space), Digits, Sequence; post-processors
 * ByteLevel, TemplateProcessing, Sequence; decoder ByteLevel.
 *
 * Text input that is not valid UTF-8 is first decoded the way Python's
 * bytes.decode("utf-8", "replace") does (each maximal invalid subpart becomes
 * U+FFFD), which is what a caller of `tokenizers` has to do to get a str.
 * Decoding follows `tokenizers`' Tokenizer.decode (no clean_up_tokenization_spaces).
 *
 * Thread-safety: every function taking a const Tokenizer * may run from many
 * threads at once. A loaded Tokenizer's tables are immutable; encoding fills
 * one cache (which tokens BPE reproduces whole), with atomic stores of values
 * that do not depend on the thread. A TokDecoder belongs
 * to one stream (one thread at a time).
 *
 * Not here: the Jinja interpreter (chat_template.h).
 */
#ifndef SAMPLER_TOKENIZER_H
#define SAMPLER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "check.h"

typedef struct Tokenizer Tokenizer;
typedef struct ChatTemplate ChatTemplate;

/* A growable id array; encode appends to it so callers can reuse one. */
typedef struct TokIds {
    int32_t *ids; /* [n] token ids */
    size_t n, cap;
} TokIds;

void tok_ids_free(TokIds *v);

/* Load `dir`/tokenizer.json (or tokenizer.json.zst) and, when present,
 * `dir`/tokenizer_config.json (special token names, chat_template compiled
 * here). Returns NULL with e filled on an unsupported or malformed file:
 * start-up code should CHECK the result and print e->msg. */
Tokenizer *tokenizer_load(const char *dir, Err *e);
/* The same from in-memory JSON texts; config_json may be NULL. */
Tokenizer *tokenizer_load_json(const char *tokenizer_json, size_t len, const char *config_json, Err *e);
void tokenizer_free(Tokenizer *t);

/* Encode text[0..len) and append the ids to out. add_special_tokens applies
 * the post-processor template (e.g. Llama's <|begin_of_text|>). Special and
 * added tokens written in the text become their ids (HF's default,
 * split_special_tokens=false). Returns 0, or <0 with e filled (out unchanged). */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, bool add_special_tokens,
                     TokIds *out, Err *e);

/* Decode ids to a malloc'd NUL-terminated string (*out, length *out_len).
 * Unknown ids are skipped, as `tokenizers` does; skip_special_tokens drops
 * added tokens marked special. Invalid UTF-8 produced by the token bytes
 * becomes U+FFFD. Returns 0 or <0 with e filled. */
int tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, bool skip_special_tokens,
                     char **out, size_t *out_len, Err *e);

/* Lookups. vocab size is max id + 1 over the model vocab and added tokens. */
int32_t tokenizer_vocab_size(const Tokenizer *t);
/* The token's string as in tokenizer.json (byte-level form, e.g. "Ġthe"), or NULL. */
const char *tokenizer_id_to_token(const Tokenizer *t, int32_t id);
/* Inverse of tokenizer_id_to_token; -1 if unknown. */
int32_t tokenizer_token_to_id(const Tokenizer *t, const char *token);
/* The raw bytes one token decodes to (may be a partial UTF-8 character); 0 or -1 if unknown. */
int tokenizer_token_bytes(const Tokenizer *t, int32_t id, const char **bytes, size_t *len);
bool tokenizer_is_special(const Tokenizer *t, int32_t id);
/* From tokenizer_config.json (bos_token, eos_token, pad_token, unk_token):
 * the id, or -1 when unset; the string, or NULL. */
int32_t tokenizer_bos_id(const Tokenizer *t);
int32_t tokenizer_eos_id(const Tokenizer *t);
int32_t tokenizer_pad_id(const Tokenizer *t);
const char *tokenizer_eos_token(const Tokenizer *t);

/* The compiled chat_template of tokenizer_config.json, or NULL if it has none. */
const ChatTemplate *tokenizer_chat_template(const Tokenizer *t);

/* transformers' apply_chat_template(messages, tools=tools,
 * add_generation_prompt=..., **kwargs, tokenize=False): render the model's
 * template with messages (JSON array), tools (array or NULL), and kwargs
 * (object or NULL, e.g. {"enable_thinking": false}); bos_token, eos_token,
 * pad_token and unk_token come from tokenizer_config.json. *out is malloc'd.
 * Returns 0, or <0 with e filled (400 for a template raise_exception or a
 * bad context, 500 for an evaluation error). */
int tokenizer_apply_chat_template(const Tokenizer *t, json_t *messages, json_t *tools,
                                  bool add_generation_prompt, json_t *kwargs, char **out, Err *e);

/* The same with another compiled template (e.g. one sent with a request). */
int tokenizer_apply_template(const Tokenizer *t, const ChatTemplate *tpl, json_t *messages, json_t *tools,
                             bool add_generation_prompt, json_t *kwargs, char **out, Err *e);

/* Incremental (streaming) decoding. Push ids one at a time; each push yields
 * the newly completed text: never a partial UTF-8 character, and the
 * concatenation of all pieces plus the flush equals tokenizer_decode of all
 * ids. Nothing is allocated after create. */
typedef struct TokDecoder TokDecoder;

TokDecoder *tok_decoder_create(const Tokenizer *t, bool skip_special_tokens);
void tok_decoder_free(TokDecoder *d);
/* Forget pending bytes; start a new stream. */
void tok_decoder_reset(TokDecoder *d);
/* *piece points into d and stays valid until the next call on d. */
void tok_decoder_push(TokDecoder *d, int32_t id, const char **piece, size_t *len);
/* End of stream: pending incomplete bytes become U+FFFD. */
void tok_decoder_flush(TokDecoder *d, const char **piece, size_t *len);

#endif
