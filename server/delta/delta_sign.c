/*
 * delta_sign.c - HMAC-SHA256 signatures of delta containers (delta_sign.h)
 * through OpenSSL's libcrypto; no cryptography of our own here beyond hex.
 *
 * Not here: where signatures are required (api_admin.c, trainer/).
 */
#include "delta_sign.h"

#include <ctype.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int delta_hmac_sha256(const uint8_t *key, size_t nk, const uint8_t *msg, size_t n, uint8_t out[32], Err *err) {
    unsigned int len = 0;
    static const uint8_t empty[1];
    /* HMAC() takes NULL data as "no data" only in some versions: pass a real pointer */
    ENSURE(err, HMAC(EVP_sha256(), key, (int)nk, msg ? msg : empty, n, out, &len) && len == 32, 500,
           "HMAC-SHA256 failed in libcrypto");
    return 0;
}

int delta_sign(const uint8_t *key, size_t nk, const uint8_t *msg, size_t n, char *out, Err *err) {
    uint8_t mac[32];
    if (delta_hmac_sha256(key, nk, msg, n, mac, err) < 0) return -1;
    size_t k = (size_t)sprintf(out, "%s", DELTA_SIG_PREFIX);
    for (int i = 0; i < 32; i++) k += (size_t)sprintf(out + k, "%02x", mac[i]);
    return 0;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int delta_verify(const uint8_t *key, size_t nk, const uint8_t *msg, size_t n, const char *sig, Err *err) {
    ENSURE(err, sig, 401, "unsigned delta: this sampler requires a signature (%s: %s<hex>, made with "
           "`trainer sign` / `trainer push --key-file`)", DELTA_SIG_HEADER, DELTA_SIG_PREFIX);
    size_t ns = strlen(sig);
    while (ns > 0 && isspace((unsigned char)sig[ns - 1])) ns--;
    size_t np = sizeof DELTA_SIG_PREFIX - 1;
    ENSURE(err, ns == DELTA_SIG_CHARS && strncasecmp(sig, DELTA_SIG_PREFIX, np) == 0, 401,
           "malformed delta signature: expected %s followed by 64 hex digits", DELTA_SIG_PREFIX);
    uint8_t got[32], want[32];
    for (int i = 0; i < 32; i++) {
        int hi = hexval(sig[np + 2 * i]), lo = hexval(sig[np + 2 * i + 1]);
        ENSURE(err, hi >= 0 && lo >= 0, 401, "malformed delta signature: expected %s followed by 64 hex digits",
               DELTA_SIG_PREFIX);
        got[i] = (uint8_t)(hi << 4 | lo);
    }
    if (delta_hmac_sha256(key, nk, msg, n, want, err) < 0) return -1;
    ENSURE(err, CRYPTO_memcmp(got, want, 32) == 0, 401,
           "wrong delta signature: the delta was not signed with this sampler's key (--delta-key-file), "
           "or its bytes were changed after signing");
    return 0;
}

int delta_key_load(const char *path, uint8_t **key, size_t *nk, Err *err) {
    FILE *f = fopen(path, "rb");
    ENSURE(err, f, 400, "%s: cannot open the delta key file: %s", path, strerror(errno));
    uint8_t *k = malloc(DELTA_KEY_MAX + 2);
    if (!k) { fclose(f); return ERR(err, 500, "out of memory"); }
    size_t n = fread(k, 1, DELTA_KEY_MAX + 1, f);
    int bad = ferror(f);
    fclose(f);
    while (n > 0 && isspace(k[n - 1])) n--;
    if (bad || n < DELTA_KEY_MIN || n > DELTA_KEY_MAX) {
        OPENSSL_cleanse(k, DELTA_KEY_MAX + 2);
        free(k);
        return ERR(err, 400, "%s: a delta key must be %d to %d bytes (trailing whitespace ignored)%s; "
                   "make one with `openssl rand -hex 32 > %s`", path, DELTA_KEY_MIN, DELTA_KEY_MAX,
                   bad ? ", and the file could not be read" : "", path);
    }
    *key = k;
    *nk = n;
    return 0;
}
