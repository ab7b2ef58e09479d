/*
 * fuzz_chat_template.c - libFuzzer target: the Jinja interpreter compiles
 * arbitrary template text (refusing what it does not support) and renders
 * whatever compiles against a fixed chat context. Any crash, leak, UB or
 * runaway (the render budgets must stop it) fails.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"

static json_t *ctx;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ctx)
        ctx = json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi <b>\"},"
                         " {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"r\", \"tool_calls\": [{\"function\":"
                         " {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null, true]}}}]}, {\"role\": \"tool\", \"content\": \"ok\"}],"
                         " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"add_generation_prompt\": true,"
                         " \"bos_token\": \"<s>\", \"enable_thinking\": false}", 0, NULL);
    char *src = malloc(size + 1);
    memcpy(src, data, size);
    src[size] = 0;
    Err e = {0};
    ChatTemplate *t = chat_template_compile(src, &e);
    if (t) {
        char *out = NULL;
        if (chat_template_render(t, ctx, &out, &e) == 0) free(out);
        chat_template_free(t);
    }
    free(src);
    return 0;
}
