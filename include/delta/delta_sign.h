/*
 * delta_sign.h - authenticity of delta containers: HMAC-SHA256 (OpenSSL
 * libcrypto) with a key shared by the trainer and the samplers. The MAC
 * covers the exact container bytes, whose header carries the fingerprint and
 * the base and target versions, so a signature cannot be moved to other bytes
 * or another version. It travels as "hmac-sha256=<64 lowercase hex>": the
 * X-Delta-Signature header of POST /admin/v1/weights/delta, or the FILE.sig
 * sidecar of `--delta FILE`. See docs/delta-format.md, "Signatures".
 *
 * Not here: integrity (the container's XXH3 checksums, delta.h), the key
 * exchange (the operator copies the key file).
 */
#ifndef SAMPLER_DELTA_SIGN_H
#define SAMPLER_DELTA_SIGN_H

#include <stddef.h>
#include <stdint.h>

#include "check.h"

#define DELTA_SIG_PREFIX "hmac-sha256="
#define DELTA_SIG_HEADER "X-Delta-Signature"
#define DELTA_SIG_CHARS (sizeof DELTA_SIG_PREFIX - 1 + 64) /* without the NUL */
#define DELTA_KEY_MIN 16  /* bytes; `openssl rand -hex 32 > delta.key` gives 64 */
#define DELTA_KEY_MAX 4096

/* out = HMAC-SHA256(key, msg). Returns 0, or -1 (err 500) if libcrypto fails. */
int delta_hmac_sha256(const uint8_t *key, size_t nk, const uint8_t *msg, size_t n, uint8_t out[32], Err *err);
/* out = "hmac-sha256=<hex>" NUL-terminated (DELTA_SIG_CHARS + 1 bytes). */
int delta_sign(const uint8_t *key, size_t nk, const uint8_t *msg, size_t n, char *out, Err *err);
/* 0 when sig (a header value or a sidecar's text; trailing whitespace is
 * ignored) is the right signature of msg; else -1 with err 401. NULL sig:
 * unsigned. Compares in constant time (CRYPTO_memcmp). */
int delta_verify(const uint8_t *key, size_t nk, const uint8_t *msg, size_t n, const char *sig, Err *err);
/* The key: the file's bytes without trailing whitespace (so `openssl rand
 * -hex 32 > K` works), DELTA_KEY_MIN..DELTA_KEY_MAX bytes. Start-up path:
 * returns 0 or -1 with a message that says how to fix it. *key is malloc'd. */
int delta_key_load(const char *path, uint8_t **key, size_t *nk, Err *err);

#endif
