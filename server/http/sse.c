/*
 * sse.c - server-sent events framing (sse.h).
 */
#include "sse.h"

#include <stdlib.h>
#include <string.h>

void sse_event_json(Buf *out, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)); /* float32 round-trips */
    json_decref(j);
    buf_puts(out, "data: ");
    if (s) buf_puts(out, s);
    buf_puts(out, "\n\n");
    free(s);
}

void sse_event_named(Buf *out, const char *name, json_t *j) {
    buf_puts(out, "event: ");
    buf_puts(out, name);
    buf_puts(out, "\n");
    sse_event_json(out, j);
}

void sse_done(Buf *out) { buf_puts(out, "data: [DONE]\n\n"); }

