/*
 * test_delta_sign.c - the delta signature helper (delta_sign.h): HMAC-SHA256
 * against the RFC 4231 test vectors (cases 1-4, 6, 7; case 5 is a truncated
 * MAC), then sign/verify round trips, and refusals of a wrong key, a changed
 * byte, a malformed or missing signature, and a bad key file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "delta_sign.h"
#include "test.h"

typedef struct Vec {
    uint8_t key[131];
    size_t nk;
    const char *data;
    size_t nd;
    const char *mac; /* RFC 4231 section 4, HMAC-SHA-256 */
} Vec;

static void hex(const uint8_t *p, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", p[i]);
}

static void rfc4231(void) {
    static Vec v[6];
    memset(v[0].key, 0x0b, 20); v[0].nk = 20; v[0].data = "Hi There";
    v[0].mac = "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7";
    memcpy(v[1].key, "Jefe", 4); v[1].nk = 4; v[1].data = "what do ya want for nothing?";
    v[1].mac = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
    static char dd[50], cd[50];
    memset(dd, 0xdd, 50); memset(cd, 0xcd, 50);
    memset(v[2].key, 0xaa, 20); v[2].nk = 20; v[2].data = dd; v[2].nd = 50;
    v[2].mac = "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe";
    for (int i = 0; i < 25; i++) v[3].key[i] = (uint8_t)(i + 1);
    v[3].nk = 25; v[3].data = cd; v[3].nd = 50;
    v[3].mac = "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b";
    memset(v[4].key, 0xaa, 131); v[4].nk = 131; v[4].data = "Test Using Larger Than Block-Size Key - Hash Key First";
    v[4].mac = "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54";
    memset(v[5].key, 0xaa, 131); v[5].nk = 131;
    v[5].data = "This is a test using a larger than block-size key and a larger than block-size data. The key needs "
                "to be hashed before being used by the HMAC algorithm.";
    v[5].mac = "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2";
    for (int i = 0; i < 6; i++) {
        size_t nd = v[i].nd ? v[i].nd : strlen(v[i].data);
        uint8_t mac[32];
        char h[65];
        Err err = {0};
        T_ASSERT(delta_hmac_sha256(v[i].key, v[i].nk, (const uint8_t *)v[i].data, nd, mac, &err) == 0, "%s", err.msg);
        hex(mac, 32, h);
        T_ASSERT(strcmp(h, v[i].mac) == 0, "RFC 4231 vector %d: got %s, want %s", i, h, v[i].mac);
        /* the verify path agrees with the reference MAC */
        char sig[DELTA_SIG_CHARS + 1];
        snprintf(sig, sizeof sig, "%s%s", DELTA_SIG_PREFIX, v[i].mac);
        T_ASSERT(delta_verify(v[i].key, v[i].nk, (const uint8_t *)v[i].data, nd, sig, &err) == 0, "vector %d: %s", i,
                 err.msg);
    }
}

static void round_trip(void) {
    const uint8_t key[] = "0123456789abcdef0123456789abcdef", other[] = "0123456789abcdef0123456789abcdeF";
    uint8_t msg[300];
    for (int i = 0; i < 300; i++) msg[i] = (uint8_t)(i * 7);
    char sig[DELTA_SIG_CHARS + 1], bad[DELTA_SIG_CHARS + 8];
    Err err = {0};
    T_ASSERT(delta_sign(key, 32, msg, sizeof msg, sig, &err) == 0, "%s", err.msg);
    T_ASSERT(strlen(sig) == DELTA_SIG_CHARS && !strncmp(sig, DELTA_SIG_PREFIX, 12), "shape: %s", sig);
    T_ASSERT(delta_verify(key, 32, msg, sizeof msg, sig, &err) == 0, "%s", err.msg);
    snprintf(bad, sizeof bad, "%s\n", sig); /* a sidecar's trailing newline */
    T_ASSERT(delta_verify(key, 32, msg, sizeof msg, bad, &err) == 0, "%s", err.msg);
    memset(&err, 0, sizeof err);
    T_ASSERT(delta_verify(other, 32, msg, sizeof msg, sig, &err) < 0 && err.code == 401, "wrong key accepted");
    msg[150] ^= 1;
    memset(&err, 0, sizeof err);
    T_ASSERT(delta_verify(key, 32, msg, sizeof msg, sig, &err) < 0 && err.code == 401, "changed byte accepted");
    msg[150] ^= 1;
    memset(&err, 0, sizeof err);
    T_ASSERT(delta_verify(key, 32, msg, sizeof msg - 1, sig, &err) < 0 && err.code == 401, "truncation accepted");
    memset(&err, 0, sizeof err);
    T_ASSERT(delta_verify(key, 32, msg, sizeof msg, NULL, &err) < 0 && err.code == 401 && strstr(err.msg, "unsigned"),
             "unsigned accepted: %s", err.msg);
    snprintf(bad, sizeof bad, "%s", sig);
    bad[20] = 'g';
    memset(&err, 0, sizeof err);
    T_ASSERT(delta_verify(key, 32, msg, sizeof msg, bad, &err) < 0 && strstr(err.msg, "malformed"), "non-hex: %s", err.msg);
    memset(&err, 0, sizeof err);
    T_ASSERT(delta_verify(key, 32, msg, sizeof msg, sig + 1, &err) < 0 && err.code == 401, "bad prefix accepted");
    snprintf(bad, sizeof bad, "sha1=%s", sig + 12);
    memset(&err, 0, sizeof err);
    T_ASSERT(delta_verify(key, 32, msg, sizeof msg, bad, &err) < 0 && err.code == 401, "other algorithm accepted");
}

static void key_files(void) {
    char dir[] = "/tmp/test_delta_sign_XXXXXX", path[64];
    T_ASSERT(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/k", dir);
    uint8_t *k = NULL;
    size_t nk = 0;
    Err err = {0};
    FILE *f = fopen(path, "w");
    fputs("00112233445566778899aabbccddeeff\n", f);
    fclose(f);
    T_ASSERT(delta_key_load(path, &k, &nk, &err) == 0 && nk == 32 && !memcmp(k, "00112233445566778899aabbccddeeff", 32),
             "hex key file: %s", err.msg);
    free(k);
    f = fopen(path, "w");
    fputs("short\n", f);
    fclose(f);
    memset(&err, 0, sizeof err);
    T_ASSERT(delta_key_load(path, &k, &nk, &err) < 0 && strstr(err.msg, "openssl rand"), "short key: %s", err.msg);
    remove(path);
    memset(&err, 0, sizeof err);
    T_ASSERT(delta_key_load(path, &k, &nk, &err) < 0 && strstr(err.msg, "cannot open"), "missing: %s", err.msg);
    remove(dir);
}

int main(void) {
    rfc4231();
    round_trip();
    key_files();
    return T_DONE();
}
