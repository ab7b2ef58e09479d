/*
 * json_scan.c - the pre-scan of JSON request bodies (json_scan.h): one pass,
 * no allocation, counting values and nesting depth so an amplifying body
 * ("[{},{},...]" in an ignored field) is refused before jansson builds it.
 *
 * Not here: parsing (routes.c calls json_loadb after this says yes).
 */
#include "json_scan.h"

int json_scan(const char *p, size_t n, JsonScan *out) {
    size_t values = 0;
    int depth = 0, max_depth = 0, in_token = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (ch == '"') { /* a string (or key): skip to its closing quote, escapes included */
            values++;
            in_token = 0;
            for (i++; i < n && p[i] != '"'; i++)
                if (p[i] == '\\') i++;
        } else if (ch == '{' || ch == '[') {
            values++;
            in_token = 0;
            if (++depth > max_depth) max_depth = depth;
        } else if (ch == '}' || ch == ']') {
            in_token = 0;
            if (depth > 0) depth--;
        } else if (ch == ',' || ch == ':' || ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n') {
            in_token = 0;
        } else if (!in_token) { /* the first byte of a number or literal */
            values++;
            in_token = 1;
        }
        if (values > JSON_SCAN_MAX_VALUES || max_depth > JSON_SCAN_MAX_DEPTH) break;
    }
    out->values = values;
    out->depth = max_depth;
    if (max_depth > JSON_SCAN_MAX_DEPTH) return 400;
    if (values > JSON_SCAN_MAX_VALUES) return 413;
    return 0;
}
