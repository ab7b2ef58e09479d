/*
 * test_safetensors.c - the checkpoint reader refuses truncated, lying and
 * malformed files with an error that names the file and tensor, and never
 * reads outside the file (run under ASan in CI).
 */
#include <stdlib.h>
#include <unistd.h>

#include "safetensors.h"
#include "test.h"

/* Build a safetensors image: header JSON + data bytes. */
static size_t image(uint8_t *buf, const char *hdr, size_t data_len) {
    uint64_t n = strlen(hdr);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(n >> (8 * i));
    memcpy(buf + 8, hdr, n);
    for (size_t i = 0; i < data_len; i++) buf[8 + n + i] = (uint8_t)i;
    return 8 + n + data_len;
}

static int parse(const char *hdr, size_t data_len, size_t cut, Err *err) {
    static uint8_t buf[1 << 16];
    size_t n = image(buf, hdr, data_len);
    if (cut) n -= cut;
    uint8_t *copy = malloc(n ? n : 1); /* exact-size copy so ASan sees overreads */
    memcpy(copy, buf, n);
    SafeTensors st = {0};
    int rc = safetensors_parse(&st, 0, copy, n, "t.safetensors", err);
    for (int i = 0; i < st.n; i++) free(st.t[i].name);
    free(st.t);
    free(copy);
    return rc;
}

int main(void) {
    Err e = {0};
    const char *ok = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},\"__metadata__\":{\"format\":\"pt\"}}";
    T_ASSERT(parse(ok, 12, 0, &e) == 0, "valid file rejected: %s", e.msg);
    T_ASSERT(parse(ok, 12, 1, &e) != 0 && strstr(e.msg, "'w'"), "truncated data accepted (%s)", e.msg);
    T_ASSERT(parse(ok, 12, 12 + 30, &e) != 0, "truncated header accepted");
    T_ASSERT(parse("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,10]}}", 12, 0, &e) != 0 &&
             strstr(e.msg, "need 12 bytes"), "size/shape mismatch accepted (%s)", e.msg);
    T_ASSERT(parse("{\"w\":{\"dtype\":\"Q9\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, 0, &e) != 0 &&
             strstr(e.msg, "unsupported dtype"), "unknown dtype accepted (%s)", e.msg);
    T_ASSERT(parse("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, 0, &e) != 0,
             "negative dim accepted");
    T_ASSERT(parse("{\"w\":{\"dtype\":\"F32\",\"shape\":[1099511627775,1099511627775,1099511627775],"
                   "\"data_offsets\":[0,4]}}", 4, 0, &e) != 0, "overflowing shape accepted");
    T_ASSERT(parse("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, 0, &e) != 0,
             "reversed offsets accepted");
    T_ASSERT(parse("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 0, &e) != 0,
             "duplicate tensor name accepted");
    T_ASSERT(parse("[1,2]", 0, 0, &e) != 0, "non-object header accepted");
    T_ASSERT(parse("{\"w\":", 0, 0, &e) != 0 && strstr(e.msg, "JSON"), "bad JSON accepted");
    uint8_t huge[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    SafeTensors st = {0};
    T_ASSERT(safetensors_parse(&st, 0, huge, 8, "h", &e) != 0, "huge header length accepted");

    /* Directory opening: real sharded fixture, then a missing directory. */
    SafeTensors *s = NULL;
    T_ASSERT(safetensors_open(&s, "tests/fixtures/qwen3_mha_sharded", &e) == 0, "%s", e.msg);
    if (s) {
        T_ASSERT(s->n_files >= 2, "sharded fixture should map several files, got %d", s->n_files);
        T_ASSERT(safetensors_get(s, "model.norm.weight") != NULL, "tensor lookup failed");
        T_ASSERT(safetensors_get(s, "model.nope") == NULL, "absent tensor found");
        safetensors_free(s);
    }
    T_ASSERT(safetensors_open(&s, "tests/fixtures/does-not-exist", &e) != 0 && s == NULL, "missing dir opened");
    return T_DONE();
}
