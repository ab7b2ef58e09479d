/*
 * test_dialect.c - dialect_feed (dialect.h) hands the agent dialects their
 * output blocks in output order: reasoning, then text and tool calls
 * interleaved as the model wrote them, whether the text arrives whole or cut
 * at every byte boundary (a stream's pieces); adjacent pieces of one kind
 * join into one block. Plain tool_parser_take cannot say this order (it
 * returns content, reasoning and calls apart), which is what the dialects'
 * content blocks and output items need. Also the error renaming.
 */
#include <stdlib.h>
#include <string.h>

#include "dialect.h"
#include "test.h"

#define MAX_BLOCKS 16

typedef struct Blocks {
    int n;
    BlockKind kind[MAX_BLOCKS];
    Buf text[MAX_BLOCKS]; /* text, or the call's "name arguments" */
} Blocks;

static void on_block(void *ctx, BlockKind k, const char *text, size_t n, const ToolCall *call) {
    Blocks *b = ctx;
    if (k != BLOCK_CALL && b->n && b->kind[b->n - 1] == k) { /* one block, in pieces */
        buf_append(&b->text[b->n - 1], text, n);
        return;
    }
    if (b->n == MAX_BLOCKS) return;
    b->kind[b->n] = k;
    memset(&b->text[b->n], 0, sizeof(Buf));
    if (k == BLOCK_CALL) {
        buf_puts(&b->text[b->n], call->name);
        buf_puts(&b->text[b->n], " ");
        buf_puts(&b->text[b->n], call->arguments);
    } else {
        buf_append(&b->text[b->n], text, n);
    }
    b->n++;
}

static void blocks_free(Blocks *b) {
    for (int i = 0; i < b->n; i++) buf_free(&b->text[i]);
    b->n = 0;
}

static const char *TEXT =
    "<think>plan a > b</think>First <b>bold</b> words."
    "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": \"1>0\"}}</tool_call>"
    "between"
    "<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>"
    "after <tool_c";

static const BlockKind WANT_KIND[] = {BLOCK_THINKING, BLOCK_TEXT, BLOCK_CALL, BLOCK_TEXT, BLOCK_CALL, BLOCK_TEXT};
static const char *WANT_TEXT[] = {"plan a > b", "First <b>bold</b> words.", "f {\"x\": \"1>0\"}", "between",
                                  "g {}", "after <tool_c"};

static int matches(const Blocks *b) {
    if (b->n != 6) return 0;
    for (int i = 0; i < 6; i++)
        if (b->kind[i] != WANT_KIND[i] || b->text[i].n != strlen(WANT_TEXT[i]) ||
            memcmp(b->text[i].p, WANT_TEXT[i], b->text[i].n))
            return 0;
    return 1;
}

static void test_order_whole_and_split(void) {
    size_t n = strlen(TEXT);
    Blocks b = {0};
    ToolParser *tp = tool_parser_create(1, 1);
    dialect_feed(tp, TEXT, n, 1, on_block, &b);
    T_ASSERT(matches(&b), "whole: %d blocks, block 1 '%.*s'", b.n, b.n > 1 ? (int)b.text[1].n : 0,
             b.n > 1 ? b.text[1].p : "");
    tool_parser_free(tp);
    blocks_free(&b);
    int bad = 0;
    for (size_t step = 1; step <= 7; step++) { /* pieces of every size up to 7 bytes */
        tp = tool_parser_create(1, 1);
        for (size_t i = 0; i < n; i += step) {
            size_t k = n - i < step ? n - i : step;
            dialect_feed(tp, TEXT + i, k, i + k == n, on_block, &b);
        }
        bad += !matches(&b);
        tool_parser_free(tp);
        blocks_free(&b);
    }
    T_ASSERT(bad == 0, "split feeds out of order: %d", bad);
}

static void test_rename(void) {
    DialectRename r[] = {{"max_tokens", "max_output_tokens"}, {"stop", "stop_sequences"}};
    Err e = {0};
    snprintf(e.msg, sizeof e.msg, "max_tokens: must be in [1, 1073741824], got 0");
    dialect_rename_err(&e, r, 2);
    T_ASSERT(!strcmp(e.msg, "max_output_tokens: must be in [1, 1073741824], got 0"), "%s", e.msg);
    snprintf(e.msg, sizeof e.msg, "stop_token_ids: must be a list");
    dialect_rename_err(&e, r, 2); /* a longer name with the same start is another field */
    T_ASSERT(!strcmp(e.msg, "stop_token_ids: must be a list"), "%s", e.msg);
}

int main(void) {
    test_order_whole_and_split();
    test_rename();
    return T_DONE();
}
