/*
 * sse.h - server-sent events framing for streamed responses: one
 * "data: <json>\n\n" event per chunk and the final "data: [DONE]\n\n", as the
 * OpenAI streaming API sends them. Flushing is the HTTP layer's job (each
 * fill of a stream goes out at once, see http_send_stream).
 */
#ifndef SAMPLER_SSE_H
#define SAMPLER_SSE_H

#include <jansson.h>

#include "buf.h"

/* Append one event with the compact JSON of j (steals the reference). */
void sse_event_json(Buf *out, json_t *j);
/* Append one named event "event: <name>\ndata: <json>\n\n" (the Responses and
 * Anthropic Messages streams name every event; steals the reference). */
void sse_event_named(Buf *out, const char *name, json_t *j);
/* Append the terminating [DONE] event. */
void sse_done(Buf *out);

#endif
