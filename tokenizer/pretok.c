/*
 * pretok.c - the pre-tokenizer pipeline of `tokenizers`: Split (regex or
 * string, five behaviours, invert), Digits, and ByteLevel's own GPT-2 regex,
 * applied in sequence to byte spans of the normalized text. Regexes written
 * for Oniguruma run on PCRE2 (UTF + UCP + JIT) after a small rewrite.
 * Not here: added tokens (added.c) and BPE (bpe.c).
 */
#include <stdlib.h>

#include <utf8proc.h>

#include "tok_internal.h"

void spanvec_push(SpanVec *s, uint32_t a, uint32_t b) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        CHECK(s->v, "out of memory in pre-tokenizer");
    }
    s->v[s->n++] = (Span){a, b};
}

void pre_scratch_free(PreScratch *s) {
    free(s->a.v);
    free(s->b.v);
    free(s->m.v);
    free(s->is_match);
    if (s->md) pcre2_match_data_free(s->md);
    if (s->jit) pcre2_jit_stack_free(s->jit);
    memset(s, 0, sizeof *s);
}

/* Oniguruma's (?i) folds only simple cases: "(?i:'s)" does not match "'ſ"
 * there, but does in PCRE2. Rewrite case-insensitive groups into explicit
 * [sS] classes of their ASCII letters; refuse what this cannot express. */
static char *rewrite_caseless(const char *p, Err *e) {
    size_t n = strlen(p);
    char *out = xmalloc(n * 4 + 1), *o = out;
    int depth = 0, ci_depth = -1; /* group depth at which (?i: opened */
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\') {
            *o++ = c;
            if (++i >= n) break;
            *o++ = p[i];
            if (strchr("pPxu", p[i]) && i + 1 < n && p[i + 1] == '{')
                while (++i < n && (*o++ = p[i]) != '}') {}
            continue;
        }
        if (in_class) {
            if (c == ']') in_class = false;
            else if (ci_depth >= 0 && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
                free(out);
                ERR(e, 400, "regex: letters in a character class inside (?i:...) are not supported: %s", p);
                return NULL;
            }
            *o++ = c;
            continue;
        }
        if (c == '[') { in_class = true; *o++ = c; if (p[i + 1] == '^') *o++ = p[++i]; if (p[i + 1] == ']') *o++ = p[++i]; continue; }
        if (c == '(') {
            depth++;
            if (!strncmp(p + i, "(?i:", 4)) {
                if (ci_depth < 0) ci_depth = depth;
                memcpy(o, "(?:", 3); o += 3; i += 3;
                continue;
            }
            if (!strncmp(p + i, "(?i", 3)) {
                free(out);
                ERR(e, 400, "regex: inline flag group (?i...) other than (?i:...) is not supported: %s", p);
                return NULL;
            }
        }
        if (c == ')') { if (depth == ci_depth) ci_depth = -1; depth--; }
        if (ci_depth >= 0 && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
            o += sprintf(o, "[%c%c]", c | 0x20, c & ~0x20);
            continue;
        }
        *o++ = c;
    }
    *o = 0;
    return out;
}

pcre2_code *pretok_compile(const char *pattern, bool literal, Err *e) {
    char *pat = literal ? xstrdup(pattern) : rewrite_caseless(pattern, e);
    if (!pat) return NULL;
    int ec;
    PCRE2_SIZE eo;
    uint32_t opt = PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opt, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        ERR(e, 400, "regex %s: %s at offset %zu", pattern, (char *)msg, (size_t)eo);
        free(pat);
        return NULL;
    }
    free(pat);
    if (pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) != 0) {
        pcre2_code_free(re);
        ERR(e, 500, "regex %s: PCRE2 JIT compilation failed", pattern);
        return NULL;
    }
    return re;
}

/* Matches of re in text[0..n) as spans relative to text (find_iter). */
static int regex_matches(const pcre2_code *re, const char *text, size_t n, PreScratch *s, Err *e) {
    s->m.n = 0;
    if (!s->md) s->md = pcre2_match_data_create(4, NULL);
    size_t off = 0;
    while (off <= n) {
        int rc = pcre2_jit_match(re, (PCRE2_SPTR)text, n, off, PCRE2_NO_UTF_CHECK, s->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !s->jit) {
            /* Big input with deep backtracking: retry on a large JIT stack. */
            s->jit = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
            CHECK_PTR(s->jit, "out of memory for a PCRE2 JIT stack");
            pcre2_match_context *mc = pcre2_match_context_create(NULL);
            pcre2_jit_stack_assign(mc, NULL, s->jit);
            rc = pcre2_jit_match(re, (PCRE2_SPTR)text, n, off, PCRE2_NO_UTF_CHECK, s->md, mc);
            pcre2_match_context_free(mc);
            if (rc == PCRE2_ERROR_NOMATCH) break;
        }
        if (rc < 0) return ERR(e, 500, "pre-tokenizer regex failed with PCRE2 error %d", rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        spanvec_push(&s->m, (uint32_t)ov[0], (uint32_t)ov[1]);
        if (ov[1] > ov[0]) off = ov[1];
        else {
            if (ov[1] >= n) break;
            off = ov[1] + 1;
            while (off < n && ((uint8_t)text[off] & 0xC0) == 0x80) off++;
        }
    }
    return 0;
}

/* Each numeric char (Rust char::is_numeric: Nd, Nl, No) is one match. */
static void digit_matches(const char *text, size_t n, PreScratch *s) {
    s->m.n = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = utf8_decode((const uint8_t *)text + i, &cp);
        if (cp >= '0' && cp <= '9') spanvec_push(&s->m, (uint32_t)i, (uint32_t)(i + k));
        else if (cp >= 0x80) {
            utf8proc_category_t cat = utf8proc_category(cp);
            if (cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO)
                spanvec_push(&s->m, (uint32_t)i, (uint32_t)(i + k));
        }
        i += (size_t)k;
    }
}

/* Turn the matches of one piece [a, b) into the split pieces appended to
 * out, following SplitDelimiterBehavior; empty pieces are dropped. */
static void apply_behavior(const Span *m, size_t nm, uint32_t a, uint32_t b, SplitBehavior beh,
                           bool invert, PreScratch *s, SpanVec *out) {
    /* Segments covering [a, b): gaps (false) and matches (true). */
    size_t cap = 2 * nm + 1;
    if (cap > s->im_cap) {
        s->im_cap = cap * 2;
        s->is_match = realloc(s->is_match, s->im_cap);
        CHECK(s->is_match, "out of memory in pre-tokenizer");
    }
    SpanVec *seg = &s->b;
    seg->n = 0;
    uint32_t prev = 0, len = b - a;
    for (size_t i = 0; i < nm; i++) {
        if (prev != m[i].start) { s->is_match[seg->n] = invert; spanvec_push(seg, prev, m[i].start); }
        s->is_match[seg->n] = !invert;
        spanvec_push(seg, m[i].start, m[i].end);
        prev = m[i].end;
    }
    if (prev != len) { s->is_match[seg->n] = invert; spanvec_push(seg, prev, len); }
    size_t n0 = out->n;
    bool prev_match = false;
    if (beh == SPLIT_MERGED_NEXT) {
        /* Fold from the right, then reverse. */
        for (size_t k = seg->n; k-- > 0;) {
            bool im = s->is_match[k];
            if (im && !prev_match && out->n > n0) out->v[out->n - 1].start = seg->v[k].start;
            else spanvec_push(out, seg->v[k].start, seg->v[k].end);
            prev_match = im;
        }
        for (size_t i = n0, j = out->n - 1; i < j; i++, j--) { Span t = out->v[i]; out->v[i] = out->v[j]; out->v[j] = t; }
    } else {
        for (size_t k = 0; k < seg->n; k++) {
            bool im = s->is_match[k];
            Span sp = seg->v[k];
            switch (beh) {
            case SPLIT_REMOVED: if (!im) spanvec_push(out, sp.start, sp.end); break;
            case SPLIT_ISOLATED: spanvec_push(out, sp.start, sp.end); break;
            case SPLIT_MERGED_PREV:
                if (im && !prev_match && out->n > n0) out->v[out->n - 1].end = sp.end;
                else spanvec_push(out, sp.start, sp.end);
                break;
            case SPLIT_CONTIGUOUS:
                if (im == prev_match && out->n > n0) out->v[out->n - 1].end = sp.end;
                else spanvec_push(out, sp.start, sp.end);
                break;
            default: break;
            }
            prev_match = im;
        }
    }
    /* Make absolute and drop empty pieces. */
    size_t w = n0;
    for (size_t i = n0; i < out->n; i++)
        if (out->v[i].end > out->v[i].start) out->v[w++] = (Span){out->v[i].start + a, out->v[i].end + a};
    out->n = w;
}

int pretok_run(const PreStep *steps, int n_steps, const char *text, size_t n, PreScratch *s, Err *e) {
    s->a.n = 0;
    if (n) spanvec_push(&s->a, 0, (uint32_t)n);
    SpanVec out = {0};
    for (int k = 0; k < n_steps; k++) {
        const PreStep *st = &steps[k];
        out.n = 0;
        for (size_t i = 0; i < s->a.n; i++) {
            Span p = s->a.v[i];
            if (st->kind == PRE_DIGITS) digit_matches(text + p.start, p.end - p.start, s);
            else {
                int rc = regex_matches(st->re, text + p.start, p.end - p.start, s, e);
                if (rc) { free(out.v); return rc; }
            }
            SplitBehavior beh = st->kind == PRE_SPLIT ? st->behavior
                              : st->kind == PRE_DIGITS ? (st->individual_digits ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS)
                              : SPLIT_ISOLATED;
            apply_behavior(s->m.v, s->m.n, p.start, p.end, beh, st->kind == PRE_SPLIT && st->invert, s, &out);
        }
        SpanVec t = s->a; s->a = out; out = t;
    }
    free(out.v);
    return 0;
}
