/*
 * json_scan.h - a linear pre-scan of a JSON request body that bounds what
 * the parser (jansson, which builds the whole tree) may allocate: the count
 * of values (every object, array, string - keys included -, number and
 * literal) and the nesting depth, read before json_loadb sees a byte.
 *
 * Not here: validation (json_loadb reports malformed JSON; the scan only
 * counts, skipping strings and their escapes correctly).
 */
#ifndef SAMPLER_JSON_SCAN_H
#define SAMPLER_JSON_SCAN_H

#include <stddef.h>

/* Limits every legitimate request fits: a batch of 8 prompts of 131072 token
 * ids, logit_bias over a 151936-token vocabulary (2 values per entry), a chat
 * of hundreds of long messages; jansson holds ~240 bytes per value, so one
 * body costs the parser at most ~250 MB. */
#define JSON_SCAN_MAX_VALUES (1u << 20)
#define JSON_SCAN_MAX_DEPTH 64

typedef struct JsonScan {
    size_t values; /* values seen (stops counting past the limit) */
    int depth;     /* deepest nesting seen */
} JsonScan;

/* Scan p[0..n); returns 0 when within both limits, 413 when there are more
 * than JSON_SCAN_MAX_VALUES values, 400 when nesting is deeper than
 * JSON_SCAN_MAX_DEPTH. */
int json_scan(const char *p, size_t n, JsonScan *out);

#endif
