/*
 * utf8.c - UTF-8 validation with the Unicode "maximal subpart" replacement
 * rule (what Python's errors="replace" and Rust's from_utf8_lossy do), and
 * the GPT-2 byte-level alphabet. Not a Unicode database: that is utf8proc.
 */
#include <stdlib.h>

#include "tok_internal.h"

size_t utf8_seq(const uint8_t *s, size_t n, size_t *maximal, bool *truncated) {
    uint8_t c = s[0];
    *truncated = false;
    *maximal = 1;
    if (c < 0x80) return 1;
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) need = 2;
    else if (c == 0xED) { need = 2; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) need = 2;
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    else return 0;
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) { *truncated = true; *maximal = i; return 0; }
        uint8_t b = s[i];
        if (b < lo || b > hi) { *maximal = i; return 0; }
        lo = 0x80; hi = 0xBF;
    }
    return need + 1;
}

char *utf8_repair(const char *s, size_t n, size_t *out_len) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, max;
    bool trunc;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        size_t k = utf8_seq(u + i, n - i, &max, &trunc);
        if (!k) break;
        i += k;
    }
    if (i == n) return NULL;
    char *out = malloc(n * 3 + 4), *o = out;
    if (!out) { /* request path: the caller's request sees alloc_failures grow and fails */
        alloc_failure_note();
        return NULL;
    }
    memcpy(o, s, i);
    o += i;
    while (i < n) {
        size_t k = utf8_seq(u + i, n - i, &max, &trunc);
        if (k) { memcpy(o, s + i, k); o += k; i += k; }
        else { memcpy(o, "\xEF\xBF\xBD", 3); o += 3; i += max; }
    }
    *out_len = (size_t)(o - out);
    *o = 0;
    return out;
}

int utf8_decode(const uint8_t *s, int32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c < 0xE0) { *cp = ((c & 0x1F) << 6) | (s[1] & 0x3F); return 2; }
    if (c < 0xF0) { *cp = ((c & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F); return 3; }
    *cp = ((c & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return 4;
}

int utf8_encode(int32_t cp, char *out) {
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { o[0] = 0xC0 | (cp >> 6); o[1] = 0x80 | (cp & 0x3F); return 2; }
    if (cp < 0x10000) {
        o[0] = 0xE0 | (cp >> 12); o[1] = 0x80 | ((cp >> 6) & 0x3F); o[2] = 0x80 | (cp & 0x3F);
        return 3;
    }
    o[0] = 0xF0 | (cp >> 18); o[1] = 0x80 | ((cp >> 12) & 0x3F);
    o[2] = 0x80 | ((cp >> 6) & 0x3F); o[3] = 0x80 | (cp & 0x3F);
    return 4;
}

/* bytes_to_unicode(): the printable bytes 33..126, 161..172 and 174..255 map
 * to themselves, the other 68 to 256, 257, ... in byte order: 0..32 to
 * 256..288, 127..160 to 289..322, 173 to 323. Closed forms both ways (no
 * table to build, no once-lock on the load's ~1.5M calls). */
static bool bl_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

int32_t bytelevel_char(uint8_t b) {
    if (bl_printable(b)) return b;
    return b <= 32 ? 256 + b : b <= 160 ? 256 + 33 + (b - 127) : 256 + 67; /* 173 */
}

int bytelevel_byte(int32_t cp) {
    if (cp >= 0 && cp < 256) return bl_printable(cp) ? cp : -1;
    int n = cp - 256;
    return n < 0 || n > 67 ? -1 : n <= 32 ? n : n <= 66 ? 127 + (n - 33) : 173;
}
