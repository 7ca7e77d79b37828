/* test_dist_proto.c -- pipeline frames (dist_proto.h): every frame type
 * round-trips field for field and float for float (bit patterns, NaN and
 * -0 included), hop telemetry included; every truncation and every extension of a valid frame is
 * refused with one line; the rolling hash composes (hash of a prefix then
 * a span = hash of the whole) and tells spans apart; registration checks
 * refuse another model, another quant and slices outside the model, each
 * with its own line; the challenge-response's frames carry no secret, its
 * proofs and keys depend on the secret and both nonces. The hidden states'
 * transport formats (--dist-activation-bits): f16 equals the compiler's
 * _Float16 conversion (libgcc's, an independent implementation) past the
 * saturation at 65504 and keeps the format's bound; 8-bit rows keep |error|
 * <= max|x| x (1/254 + 2^-22) (dist_proto.h); payload sizes are 2 and
 * 1 + 4/row bytes a float; a decoded payload re-encodes to the same bytes;
 * malformed formats are refused. */
#include "check.h"
#include "dist/dist_proto.h"
#include "base/sha1.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HEADER_BYTES = 8 };   /* magic, version, type */

static void check_all_cuts(const uint8_t *buf, size_t len, const char *what) {
    ds4_dist_frame f;
    char err[256];
    bool all_refused = true;
    for (size_t n = 0; n < len; n++) all_refused &= !ds4_dist_decode(buf, n, &f, err, sizeof err);
    CHECK(all_refused, "%s: a truncated frame decoded", what);
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, buf, len);
    longer[len] = 0;
    CHECK(!ds4_dist_decode(longer, len + 1, &f, err, sizeof err) && strstr(err, "malformed"), "%s: trailing byte: %s",
          what, err);
    free(longer);
}

static void test_hello(void) {
    const uint8_t nonce[DS4_DIST_NONCE_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    const uint8_t reg[DS4_DIST_NONCE_BYTES] = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 7};
    ds4_dist_hello h = {nonce, reg, "ds4tiny-A", 9, 6, 256, 4, 1024, 8, 3, 5, true, 4096, "tcp://127.0.0.1:5555", 20, true,
                        {0xab, 0xcd, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 0x99}};
    size_t len;
    uint8_t *buf = ds4_dist_encode_hello(&h, &len);
    ds4_dist_frame f;
    char err[256];
    CHECK(buf && ds4_dist_decode(buf, len, &f, err, sizeof err) && f.type == DS4_DIST_HELLO, "hello decodes");
    const ds4_dist_hello *g = &f.hello;
    CHECK(!memcmp(g->challenge, nonce, sizeof nonce) && !memcmp(g->nonce, reg, sizeof reg) && g->model_len == 9 && !memcmp(g->model, "ds4tiny-A", 9),
          "challenge and strings");
    CHECK(g->n_layer == 6 && g->n_embd == 256 && g->n_hc == 4 && g->n_vocab == 1024 && g->expert_bits == 8 &&
          g->first == 3 && g->last == 5 && g->output && g->ctx == 4096 && g->data_url_len == 20 && g->numerics, "numbers");
    CHECK(!memcmp(g->steering, h.steering, sizeof h.steering), "steering id round-trips");
    check_all_cuts(buf, len, "hello");

    ds4_dist_hello mine = h;
    mine.first = 0; mine.last = 2; mine.output = false;
    CHECK(ds4_dist_hello_compatible(&mine, g, err, sizeof err), "compatible: %s", err);
    ds4_dist_hello bad = *g;
    bad.model = "ds4tiny-B";
    CHECK(!ds4_dist_hello_compatible(&mine, &bad, err, sizeof err) && strstr(err, "another model"), "%s", err);
    bad = *g; bad.n_embd = 512;
    CHECK(!ds4_dist_hello_compatible(&mine, &bad, err, sizeof err) && strstr(err, "another model"), "%s", err);
    bad = *g; bad.numerics = false;
    CHECK(!ds4_dist_hello_compatible(&mine, &bad, err, sizeof err) && strstr(err, "--numerics"), "%s", err);
    bad = *g; bad.expert_bits = 4;
    CHECK(!ds4_dist_hello_compatible(&mine, &bad, err, sizeof err) && strstr(err, "another quant"), "%s", err);
    bad = *g; bad.last = 6;
    CHECK(!ds4_dist_hello_compatible(&mine, &bad, err, sizeof err) && strstr(err, "outside"), "%s", err);
    bad = *g; bad.first = 5; bad.last = 4;
    CHECK(!ds4_dist_hello_compatible(&mine, &bad, err, sizeof err) && strstr(err, "outside"), "%s", err);
    /* every slice steers with the same directions, or none does */
    bad = *g; bad.steering[19] ^= 1;
    CHECK(!ds4_dist_hello_compatible(&mine, &bad, err, sizeof err) &&
          strstr(err, "this worker steers with file sha1 abcdef010203, the coordinator with file sha1 abcdef010203"),
          "%s", err);
    memset(bad.steering, 0, sizeof bad.steering);
    CHECK(!ds4_dist_hello_compatible(&mine, &bad, err, sizeof err) &&
          strstr(err, "this worker steers with no file, the coordinator with file sha1 abcdef"), "%s", err);
    memset(mine.steering, 0, sizeof mine.steering);
    CHECK(ds4_dist_hello_compatible(&mine, &bad, err, sizeof err), "neither steers: %s", err);
    CHECK(!ds4_dist_hello_compatible(&mine, g, err, sizeof err) &&
          strstr(err, "this worker steers with file sha1 abcdef010203, the coordinator with no file"), "%s", err);
    free(buf);
}

static void check_hops(const uint8_t *enc, const ds4_dist_hop *want, uint32_t n, const char *what) {
    for (uint32_t i = 0; i < n; i++) {
        const ds4_dist_hop h = ds4_dist_hop_at(enc, i);
        CHECK(!memcmp(&h, &want[i], sizeof h), "%s: hop %u round-trips", what, i);
    }
}

static void test_work_and_result(void) {
    const int32_t toks[] = {0, 1, 129279, -1, 77};
    float fl[7] = {1.0f, -0.0f, NAN, INFINITY, 1e-45f, -3.25f, 65504.0f};
    const ds4_dist_hop hops[2] = {{0, 2, 4096, 5, 1234, 0, 56, 0}, {3, 5, 4096, 5, 4000000000u, 7, 8, 123456}};
    ds4_dist_work w = {77, 9, 0xfeedface12345678ull, 4096, 5, 11, 22, DS4_DIST_ALL, true, NULL, 7, NULL, 2, NULL,
                       DS4_DIST_ACT_F32, 0, -0.75f, 1.5f};
    size_t len;
    uint8_t *buf = ds4_dist_encode_work(DS4_DIST_WORK, &w, toks, fl, hops, &len);
    ds4_dist_frame f;
    char err[256];
    CHECK(buf && ds4_dist_decode(buf, len, &f, err, sizeof err) && f.type == DS4_DIST_WORK, "work decodes: %s", err);
    CHECK(f.work.route == 77 && f.work.seq == 9 && f.work.session == w.session && f.work.pos == 4096 &&
          f.work.n == 5 && f.work.hash_before == 11 && f.work.hash_after == 22 && f.work.logits == DS4_DIST_ALL &&
          f.work.checkpoint && f.work.n_floats == 7 && f.work.n_hops == 2, "work fields");
    CHECK(f.work.steer_attn == -0.75f && f.work.steer_ffn == 1.5f, "steering scales round-trip");
    for (int i = 0; i < 5; i++) CHECK(ds4_dist_token_at(f.work.tokens, (size_t)i) == toks[i], "token %d", i);
    for (int i = 0; i < 7; i++) {
        float v = ds4_dist_float_at(f.work.floats, (size_t)i);
        CHECK(!memcmp(&v, &fl[i], 4), "float %d bit pattern", i);
    }
    check_hops(f.work.hops, hops, 2, "work");
    /* the sender's own send time lands in its (last) hop only */
    ds4_dist_set_send_us(buf, len, 31337);
    CHECK(ds4_dist_decode(buf, len, &f, err, sizeof err) && ds4_dist_hop_at(f.work.hops, 1).send_us == 31337 &&
          ds4_dist_hop_at(f.work.hops, 0).send_us == 56 && ds4_dist_hop_at(f.work.hops, 1).bytes_in == 123456,
          "send time patched into the last hop");
    check_all_cuts(buf, len, "work");
    free(buf);

    /* KV_GET carries no tokens; a WORK without tokens is refused */
    ds4_dist_work g = {1, 2, 3, 40, 0, 5, 5, DS4_DIST_ACK, false, NULL, 0, NULL, 0, NULL, DS4_DIST_ACT_F32, 0, 0, 0};
    buf = ds4_dist_encode_work(DS4_DIST_KV_GET, &g, NULL, NULL, NULL, &len);
    CHECK(buf && ds4_dist_decode(buf, len, &f, err, sizeof err) && f.type == DS4_DIST_KV_GET && f.work.pos == 40 &&
          f.work.n == 0, "kv_get decodes: %s", err);
    check_all_cuts(buf, len, "kv_get");
    free(buf);
    buf = ds4_dist_encode_work(DS4_DIST_WORK, &g, NULL, NULL, NULL, &len);
    CHECK(buf && !ds4_dist_decode(buf, len, &f, err, sizeof err), "work without tokens refused");
    free(buf);
    g.logits = 3;
    buf = ds4_dist_encode_work(DS4_DIST_KV_PUT, &g, NULL, NULL, NULL, &len);
    CHECK(buf && !ds4_dist_decode(buf, len, &f, err, sizeof err), "unknown logits mode refused");
    free(buf);
    g.logits = DS4_DIST_ACK;
    for (int k = 0; k < 2; k++) {
        /* a scale no command line could give is not a frame either */
        g.steer_attn = k ? 0 : NAN;
        g.steer_ffn = k ? -INFINITY : 0;
        buf = ds4_dist_encode_work(DS4_DIST_KV_GET, &g, NULL, NULL, NULL, &len);
        CHECK(buf && !ds4_dist_decode(buf, len, &f, err, sizeof err), "non-finite steering scale %d refused", k);
        free(buf);
    }
    g.steer_attn = g.steer_ffn = 0;
    ds4_dist_hop many[DS4_DIST_MAX_HOPS + 1] = {{0}};
    g.logits = DS4_DIST_ACK;
    g.n_hops = DS4_DIST_MAX_HOPS + 1;
    buf = ds4_dist_encode_work(DS4_DIST_KV_PUT, &g, NULL, NULL, many, &len);
    CHECK(buf && !ds4_dist_decode(buf, len, &f, err, sizeof err), "more hops than a route holds refused");
    free(buf);

    ds4_dist_result r = {5, 6, 42, DS4_DIST_HASH_MISMATCH, 99, 3, NULL, 2, NULL, "position 0, asked for 17", 24};
    buf = ds4_dist_encode_result(&r, fl, hops, &len);
    CHECK(buf && ds4_dist_decode(buf, len, &f, err, sizeof err) && f.type == DS4_DIST_RESULT, "result decodes");
    CHECK(f.result.route == 5 && f.result.seq == 6 && f.result.session == 42 &&
          f.result.status == DS4_DIST_HASH_MISMATCH && f.result.hash_after == 99 && f.result.n_floats == 3 &&
          f.result.text_len == 24 && !memcmp(f.result.text, r.text, 24) && f.result.n_hops == 2, "result fields");
    check_hops(f.result.hops, hops, 2, "result");
    check_all_cuts(buf, len, "result");
    free(buf);

    const uint8_t nn[DS4_DIST_NONCE_BYTES] = {1, 1, 2, 3, 5, 8, 13, 21}, hn[DS4_DIST_NONCE_BYTES] = {2, 7, 1, 8, 2, 8};
    ds4_dist_route rt = {123, 64, "tcp://127.0.0.1:4000", 20, nn, "tcp://127.0.0.1:4001", 20, hn};
    buf = ds4_dist_encode_route(&rt, &len);
    CHECK(buf && ds4_dist_decode(buf, len, &f, err, sizeof err) && f.type == DS4_DIST_ROUTE && f.route.route == 123 &&
          f.route.max_tokens == 64 && f.route.next_len == 20 && !memcmp(f.route.next, rt.next, 20) &&
          !memcmp(f.route.next_nonce, nn, sizeof nn) && f.route.home_len == 20 && !memcmp(f.route.home, rt.home, 20) &&
          !memcmp(f.route.home_nonce, hn, sizeof hn), "route decodes: %s", err);
    check_all_cuts(buf, len, "route");
    CHECK(len + DS4_DIST_SEAL_BYTES <= ds4_dist_route_frame_max(20), "a route within its bound");
    free(buf);

    buf = ds4_dist_encode_text(DS4_DIST_REFUSED, "refused: wrong --dist-secret", &len);
    CHECK(buf && ds4_dist_decode(buf, len, &f, err, sizeof err) && f.type == DS4_DIST_REFUSED &&
          f.result.text_len == 28, "refused decodes");
    buf[6] = 99;    /* type */
    CHECK(!ds4_dist_decode(buf, len, &f, err, sizeof err) && strstr(err, "unknown pipeline frame type 99"), "%s", err);
    buf[6] = DS4_DIST_REFUSED;
    buf[4] = 1;     /* version */
    CHECK(!ds4_dist_decode(buf, len, &f, err, sizeof err) && strstr(err, "version 1"), "%s", err);
    buf[0] = 'X';
    CHECK(!ds4_dist_decode(buf, len, &f, err, sizeof err) && strstr(err, "not a ds4 pipeline frame"), "%s", err);
    free(buf);
}

/* A WORK frame of n floats in format act (rows of `row`), decoded back into out. */
static size_t act_round_trip(uint8_t act, uint32_t row, const float *x, uint32_t n, float *out) {
    const int32_t tok = 1;
    ds4_dist_work w = {1, 2, 3, 0, 1, 0, 0, DS4_DIST_ACK, false, NULL, n, NULL, 0, NULL, act, row, 0, 0};
    size_t len = 0;
    uint8_t *buf = ds4_dist_encode_work(DS4_DIST_WORK, &w, &tok, x, NULL, &len);
    ds4_dist_frame f;
    char err[256];
    const bool ok = buf && ds4_dist_decode(buf, len, &f, err, sizeof err) && f.work.act == act && f.work.row == row &&
                    f.work.n_floats == n;
    CHECK(ok, "format %d frame decodes: %s", act, ok ? "" : err);
    if (ok) {
        ds4_dist_work_floats(&f.work, out);
        /* a decoded payload goes on byte for byte (w.floats set: no re-rounding) */
        size_t again_len = 0;
        uint8_t *again = ds4_dist_encode_work(DS4_DIST_WORK, &f.work, &tok, NULL, NULL, &again_len);
        CHECK(again && again_len == len && !memcmp(again, buf, len), "format %d payload re-encodes as is", act);
        free(again);
        check_all_cuts(buf, len, "activation frame");
    }
    free(buf);
    return ok ? len : 0;
}

static void test_activation_formats(void) {
    enum { ROW = 64, ROWS = 8, N = ROW * ROWS };
    float x[N], y[N];
    uint64_t r = 0x243f6a8885a308d3ull;
    for (int i = 0; i < N; i++) {   /* magnitudes 2^-30 .. 2^20, both signs */
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const float unit = (float)((r >> 40) & 0xffffff) / 16777216.0f;
        x[i] = ldexpf(1.0f + unit, (int)((r >> 20) % 51) - 30) * ((r >> 10) & 1 ? -1.0f : 1.0f);
    }
    const float edges[] = {0.0f, -0.0f, 65504.0f, -65504.0f, 65519.0f, 65520.0f, 1e6f, -1e30f, 1.0f + 0x1p-11f,
                           1.0f + 0x1p-11f + 0x1p-23f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-14f, 0x1.ffcp-15f};
    memcpy(x, edges, sizeof edges);
    x[sizeof edges / sizeof edges[0]] = NAN;

    const size_t len32 = act_round_trip(DS4_DIST_ACT_F32, 0, x, N, y);
    CHECK(len32 && !memcmp(x, y, sizeof x), "f32 keeps every bit");

    const size_t len16 = act_round_trip(DS4_DIST_ACT_F16, 0, x, N, y);
    CHECK(len32 - len16 == 2 * (size_t)N, "f16 payload: %zu bytes less than f32, want %d", len32 - len16, 2 * N);
    bool same = true, bounded = true;
    for (int i = 0; i < N; i++) {
        if (isnan(x[i])) { same &= isnan(y[i]); continue; }
        const float clamped = fminf(fmaxf(x[i], -65504.0f), 65504.0f);
        const float want = (float)(_Float16)clamped;
        same &= !memcmp(&want, &y[i], 4);
        const float a = fabsf(clamped);
        bounded &= fabsf(y[i] - clamped) <= (a >= 0x1p-14f ? a * 0x1p-11f : 0x1p-25f);
        if (!same || !bounded) { CHECK(false, "f16 of %a gives %a (_Float16: %a)", x[i], y[i], want); break; }
    }
    CHECK(same && bounded, "f16 equals _Float16 after saturation, within 2^-11 relative / 2^-25 absolute");

    for (int i = 0; i < N; i++) x[i] = isnan(x[i]) ? 1.0f : x[i];
    for (int i = 0; i < ROW; i++) x[ROW + i] = 0.0f;                /* an all-zero row */
    for (int i = 0; i < ROW; i++) x[2 * ROW + i] = 0.001f * (float)(i - 32);
    x[2 * ROW + 5] = -1e4f;                                          /* one outlier sets the row's scale */
    const size_t len8 = act_round_trip(DS4_DIST_ACT_Q8, ROW, x, N, y);
    CHECK(len32 - len8 == 4 * (size_t)N - (size_t)ROWS * (4 + ROW), "q8 payload: %zu bytes less than f32", len32 - len8);
    bounded = true;
    for (int row = 0; row < ROWS; row++) {
        float amax = 0;
        for (int i = 0; i < ROW; i++) amax = fmaxf(amax, fabsf(x[row * ROW + i]));
        for (int i = 0; i < ROW; i++) {
            const int k = row * ROW + i;
            if (!(fabsf(y[k] - x[k]) <= amax * (1.0f / 254 + 0x1p-22f))) {
                CHECK(false, "q8 row %d: %a gives %a (row max %a)", row, x[k], y[k], amax);
                bounded = false;
                break;
            }
        }
    }
    CHECK(bounded, "q8 within max|x| x (1/254 + 2^-22) per row");
    bool zeros = true;
    for (int i = 0; i < ROW; i++) zeros &= y[ROW + i] == 0.0f;
    CHECK(zeros, "q8: an all-zero row stays zero");

    /* the encoder refuses what the decoder would */
    const int32_t one = 1;
    size_t n_out = 0;
    ds4_dist_work q = {1, 2, 3, 0, 1, 0, 0, DS4_DIST_ACK, false, NULL, 8, NULL, 0, NULL, DS4_DIST_ACT_Q8, 0, 0, 0};
    CHECK(!ds4_dist_encode_work(DS4_DIST_WORK, &q, &one, x, NULL, &n_out), "q8 without a row not encoded");
    q.row = 3;
    CHECK(!ds4_dist_encode_work(DS4_DIST_WORK, &q, &one, x, NULL, &n_out), "q8 row not dividing not encoded");

    /* one spelling per frame: unknown formats, rows that do not fit, a row outside Q8 */
    const struct { uint8_t act; uint32_t row; uint32_t n; } bad[] = {
        {3, 0, 4}, {DS4_DIST_ACT_Q8, 0, 4}, {DS4_DIST_ACT_Q8, 3, 4}, {DS4_DIST_ACT_F32, 2, 4}, {DS4_DIST_ACT_F16, 1, 4}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        const int32_t tok = 1;
        ds4_dist_work w = {1, 2, 3, 0, 1, 0, 0, DS4_DIST_ACK, false, NULL, bad[k].n, NULL, 0, NULL, DS4_DIST_ACT_F32, 0, 0, 0};
        size_t len = 0;
        uint8_t *buf = ds4_dist_encode_work(DS4_DIST_WORK, &w, &tok, x, NULL, &len);
        ds4_dist_frame f;
        char err[256];
        /* the format fields follow the header (8), the fixed fields (46), the two steering scales (8) and the
         * one token (4) */
        const size_t at = 8 + 46 + 8 + 4;
        CHECK(buf && buf[at] == DS4_DIST_ACT_F32 && ds4_dist_decode(buf, len, &f, err, sizeof err), "unpatched decodes");
        if (buf) {
            buf[at] = bad[k].act;
            for (int b = 0; b < 4; b++) buf[at + 1 + b] = (uint8_t)(bad[k].row >> (8 * b));
        }
        CHECK(buf && !ds4_dist_decode(buf, len, &f, err, sizeof err) && strstr(err, "malformed"),
              "format %d row %u refused", bad[k].act, bad[k].row);
        free(buf);
    }
}

static void test_hash(void) {
    const int32_t t[] = {5, 6, 7, 8, 9};
    const uint64_t whole = ds4_dist_hash_tokens(DS4_DIST_HASH_EMPTY, t, 5);
    for (int cut = 0; cut <= 5; cut++)
        CHECK(ds4_dist_hash_tokens(ds4_dist_hash_tokens(DS4_DIST_HASH_EMPTY, t, cut), t + cut, 5 - cut) == whole,
              "cut %d composes", cut);
    const int32_t u[] = {5, 6, 7, 9, 8};
    CHECK(ds4_dist_hash_tokens(DS4_DIST_HASH_EMPTY, u, 5) != whole, "order matters");
    CHECK(ds4_dist_hash_tokens(DS4_DIST_HASH_EMPTY, t, 4) != whole, "length matters");
    CHECK(ds4_dist_hash_tokens(DS4_DIST_HASH_EMPTY, t, 0) == DS4_DIST_HASH_EMPTY, "empty span");
}

static bool hex_is(const unsigned char d[20], const char *hex) {
    char got[41];
    for (int i = 0; i < 20; i++) snprintf(got + 2 * i, 3, "%02x", d[i]);
    return !strcmp(got, hex);
}

/* HMAC-SHA1 against RFC 2202's test cases 1, 2 and 6 (a key longer than the
 * block), then sealing: a sealed frame unseals to itself; a wrong secret, any
 * flipped bit, a truncation or an unsealed frame are refused. */
static void test_seal(void) {
    unsigned char d[20], key[80];
    memset(key, 0x0b, 20);
    ds4_hmac_sha1(key, 20, "Hi There", 8, d);
    CHECK(hex_is(d, "b617318655057264e28bc0b6fb378c8ef146be00"), "RFC 2202 case 1");
    ds4_hmac_sha1("Jefe", 4, "what do ya want for nothing?", 28, d);
    CHECK(hex_is(d, "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"), "RFC 2202 case 2");
    memset(key, 0xaa, 80);
    const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    ds4_hmac_sha1(key, 80, m6, strlen(m6), d);
    CHECK(hex_is(d, "aa4ae5e15272d00e95705637ce8a3b55ed402112"), "RFC 2202 case 6");

    const uint8_t zero[DS4_DIST_NONCE_BYTES] = {0};
    ds4_dist_route r = {7, 1, "tcp://10.0.0.2:5000", 19, zero, "tcp://10.0.0.1:5001", 19, zero};
    size_t len = 0;
    uint8_t *frame = ds4_dist_encode_route(&r, &len);
    const size_t frame_bytes = len;
    uint8_t *plain = malloc(frame_bytes);
    if (frame && plain) memcpy(plain, frame, frame_bytes);
    uint8_t *sealed = ds4_dist_seal(frame, &len, "s3cret", 6);
    CHECK(sealed && plain && len == frame_bytes + DS4_DIST_SEAL_BYTES, "sealed length");
    if (!sealed || !plain) { free(sealed); free(plain); return; }
    size_t got = 0;
    CHECK(ds4_dist_unseal(sealed, len, "s3cret", 6, &got) && got == frame_bytes && !memcmp(sealed, plain, got),
          "a sealed frame unseals to itself");
    CHECK(!ds4_dist_unseal(sealed, len, "s3creT", 6, &got), "another secret is refused");
    CHECK(!ds4_dist_unseal(sealed, len, "", 0, &got), "no secret is refused");
    bool all_refused = true;
    for (size_t i = 0; i < len; i++)
        for (int bit = 0; bit < 8; bit++) {
            sealed[i] ^= (uint8_t)(1u << bit);
            all_refused &= !ds4_dist_unseal(sealed, len, "s3cret", 6, &got);
            sealed[i] ^= (uint8_t)(1u << bit);
        }
    CHECK(all_refused, "every flipped bit is refused");
    for (size_t n = 0; n < len; n++) all_refused &= !ds4_dist_unseal(sealed, n, "s3cret", 6, &got);
    CHECK(all_refused, "every truncation is refused");
    CHECK(!ds4_dist_unseal(plain, frame_bytes, "s3cret", 6, &got), "an unsealed frame is refused");
    free(sealed);
    free(plain);
}

/* The challenge-response (dist_proto.h): KNOCK and CHALLENGE round-trip;
 * the coordinator's proof and the handshake key are HMAC-SHA1 over the
 * label and both nonces (checked against the one-shot HMAC over the
 * spelled-out message), differ from each other and change with the secret
 * and either nonce; no frame of a registration contains the secret. */
static void test_handshake(void) {
    uint8_t nw[DS4_DIST_NONCE_BYTES], nc[DS4_DIST_NONCE_BYTES], again[DS4_DIST_NONCE_BYTES];
    CHECK(ds4_dist_random(nw, sizeof nw) && ds4_dist_random(nc, sizeof nc) && ds4_dist_random(again, sizeof again),
          "getrandom");
    CHECK(memcmp(nw, nc, sizeof nw) && memcmp(nc, again, sizeof nc), "fresh nonces differ");
    uint8_t proof[DS4_DIST_SEAL_BYTES], key[DS4_DIST_SEAL_BYTES], other[DS4_DIST_SEAL_BYTES], want[DS4_DIST_SEAL_BYTES];
    const char *secret = "correct horse battery staple";
    ds4_dist_handshake_key(secret, DS4_DIST_COORDINATOR_PROOF, nw, nc, proof);
    ds4_dist_handshake_key(secret, DS4_DIST_HANDSHAKE_KEY, nw, nc, key);
    uint8_t msg[64];
    memcpy(msg, "ds4 coordinator", 15);
    memcpy(msg + 15, nw, 16);
    memcpy(msg + 31, nc, 16);
    ds4_hmac_sha1(secret, strlen(secret), msg, 47, want);
    CHECK(!memcmp(proof, want, sizeof want), "proof = HMAC(secret, \"ds4 coordinator\" Nw Nc)");
    memcpy(msg, "ds4 worker", 10);
    memcpy(msg + 10, nw, 16);
    memcpy(msg + 26, nc, 16);
    ds4_hmac_sha1(secret, strlen(secret), msg, 42, want);
    CHECK(!memcmp(key, want, sizeof want), "key = HMAC(secret, \"ds4 worker\" Nw Nc)");
    CHECK(memcmp(proof, key, sizeof key), "proof and key differ");
    ds4_dist_handshake_key("correct horse battery stapler", DS4_DIST_HANDSHAKE_KEY, nw, nc, other);
    CHECK(memcmp(other, key, sizeof key), "another secret, another key");
    ds4_dist_handshake_key(secret, DS4_DIST_HANDSHAKE_KEY, nw, again, other);
    CHECK(memcmp(other, key, sizeof key), "another coordinator nonce, another key");
    ds4_dist_handshake_key(secret, DS4_DIST_HANDSHAKE_KEY, again, nc, other);
    CHECK(memcmp(other, key, sizeof key), "another worker nonce, another key");
    CHECK(ds4_dist_same(key, key, sizeof key) && !ds4_dist_same(key, other, sizeof key), "same");

    size_t len;
    ds4_dist_frame f;
    char err[256];
    uint8_t *buf = ds4_dist_encode_challenge(nw, NULL, &len);
    CHECK(buf && ds4_dist_decode(buf, len, &f, err, sizeof err) && f.type == DS4_DIST_KNOCK &&
          !memcmp(f.challenge.nonce, nw, sizeof nw) && !f.challenge.proof, "knock decodes: %s", err);
    check_all_cuts(buf, len, "knock");
    free(buf);
    buf = ds4_dist_encode_challenge(nc, proof, &len);
    CHECK(buf && ds4_dist_decode(buf, len, &f, err, sizeof err) && f.type == DS4_DIST_CHALLENGE &&
          !memcmp(f.challenge.nonce, nc, sizeof nc) && !memcmp(f.challenge.proof, proof, sizeof proof),
          "challenge decodes: %s", err);
    check_all_cuts(buf, len, "challenge");
    free(buf);

    /* a sealed HELLO holds the challenge and the identity, never the secret */
    ds4_dist_hello h = {nc, again, "ds4tiny-A", 9, 6, 256, 4, 1024, 8, 3, 5, true, 4096, "tcp://127.0.0.1:5555", 20, true, {0}};
    buf = ds4_dist_seal(ds4_dist_encode_hello(&h, &len), &len, key, sizeof key);
    size_t frame_len;
    CHECK(buf && ds4_dist_unseal(buf, len, key, sizeof key, &frame_len) &&
          ds4_dist_decode(buf, frame_len, &f, err, sizeof err) && f.type == DS4_DIST_HELLO, "sealed hello: %s", err);
    CHECK(buf && !memmem(buf, len, secret, strlen(secret)), "the secret is not in the HELLO");
    CHECK(buf && !ds4_dist_unseal(buf, len, other, sizeof other, &frame_len), "another handshake's key is refused");
    free(buf);
}

/* Data-port frames are sealed under the receiver's link key HMAC(secret,
 * "ds4 link" N): a frame sealed for one registration (nonce) fails the seal
 * of another, even under the same secret; so does one sealed under the bare
 * secret. A RESULT may say WRONG_ROUTE, and no status past it decodes. The
 * frame bounds hold the largest frames the encoders make. */
static void test_link_keys(void) {
    uint8_t n1[DS4_DIST_NONCE_BYTES], n2[DS4_DIST_NONCE_BYTES], k1[DS4_DIST_SEAL_BYTES], k2[DS4_DIST_SEAL_BYTES],
        want[DS4_DIST_SEAL_BYTES];
    CHECK(ds4_dist_random(n1, sizeof n1) && ds4_dist_random(n2, sizeof n2), "getrandom");
    const char *secret = "test-secret";
    ds4_dist_link_key(secret, n1, k1);
    ds4_dist_link_key(secret, n2, k2);
    uint8_t msg[8 + DS4_DIST_NONCE_BYTES];
    memcpy(msg, "ds4 link", 8);
    memcpy(msg + 8, n1, sizeof n1);
    ds4_hmac_sha1(secret, strlen(secret), msg, sizeof msg, want);
    CHECK(!memcmp(k1, want, sizeof want), "link key = HMAC(secret, \"ds4 link\" N)");
    CHECK(memcmp(k1, k2, sizeof k1), "another registration, another key");
    const uint8_t zero[DS4_DIST_NONCE_BYTES] = {0};
    ds4_dist_route r = {9, 8, "", 0, zero, "tcp://127.0.0.1:1", 17, n2};
    size_t len, got;
    uint8_t *sealed = ds4_dist_seal(ds4_dist_encode_route(&r, &len), &len, k1, sizeof k1);
    CHECK(sealed && ds4_dist_unseal(sealed, len, k1, sizeof k1, &got), "the registration's own key unseals");
    CHECK(sealed && !ds4_dist_unseal(sealed, len, k2, sizeof k2, &got), "a later registration's key refuses it");
    CHECK(sealed && !ds4_dist_unseal(sealed, len, secret, strlen(secret), &got), "the bare secret refuses it");
    free(sealed);

    ds4_dist_result res = {.route = 9, .seq = 1, .status = DS4_DIST_WRONG_ROUTE, .text = "x", .text_len = 1};
    uint8_t *buf = ds4_dist_encode_result(&res, NULL, NULL, &len);
    ds4_dist_frame f;
    char err[256];
    CHECK(buf && ds4_dist_decode(buf, len, &f, err, sizeof err) && f.result.status == DS4_DIST_WRONG_ROUTE,
          "WRONG_ROUTE decodes: %s", err);
    if (buf) buf[8 + 8 + 4 + 8] = DS4_DIST_WRONG_ROUTE + 1;   /* the status byte */
    CHECK(buf && !ds4_dist_decode(buf, len, &f, err, sizeof err), "an unknown status is refused");
    free(buf);

    enum { T = 5, F = 5 * 12 };
    int32_t toks[T] = {1, 2, 3, 4, 5};
    float fl[F] = {0};
    ds4_dist_hop hops[DS4_DIST_MAX_HOPS] = {{0}};
    ds4_dist_work w = {.route = 1, .seq = 1, .session = 1, .n = T, .n_floats = F, .n_hops = DS4_DIST_MAX_HOPS};
    buf = ds4_dist_encode_work(DS4_DIST_KV_PUT, &w, toks, fl, hops, &len);
    CHECK(buf && len + DS4_DIST_SEAL_BYTES == ds4_dist_work_frame_max(T, F), "the largest work frame: %zu vs %zu",
          len + DS4_DIST_SEAL_BYTES, ds4_dist_work_frame_max(T, F));
    free(buf);
    static char text[0x10000];
    memset(text, 'x', sizeof text - 1);
    ds4_dist_result big = {.n_floats = F, .n_hops = DS4_DIST_MAX_HOPS, .text = text, .text_len = sizeof text - 1};
    buf = ds4_dist_encode_result(&big, fl, hops, &len);
    CHECK(buf && len + DS4_DIST_SEAL_BYTES == ds4_dist_result_frame_max(F), "the largest result frame");
    free(buf);
}

/* The tensor-parallel frames: round trips, every truncation refused, the
 * STEP's records checked against its tokens, an unknown PART status refused. */
static void test_tp_frames(void) {
    ds4_dist_frame f;
    char err[256];
    const uint64_t drop[2] = {7, 0x1122334455667788ull};
    const ds4_dist_tp_seq seqs[2] = {{3, 4096, 0, 3, true}, {0xabcdef0123ull, 64, 17, 1, false}};
    const int32_t toks[4] = {5, -1, 129279, 42};
    size_t len;
    uint8_t *m = ds4_dist_encode_tp_step(9, drop, 2, seqs, 2, toks, &len);
    CHECK(m && ds4_dist_decode(m, len, &f, err, sizeof err) && f.type == DS4_DIST_TP_STEP, "step: %s", err);
    CHECK(f.tp.counter == 9 && f.tp.n_drop == 2 && ds4_dist_u64_at(f.tp.drop, 1) == drop[1] && f.tp.n_seqs == 2 &&
              f.tp.n_tokens == 4, "step fields");
    const ds4_dist_tp_seq b = ds4_dist_tp_seq_at(f.tp.seqs, 1);
    CHECK(b.session == seqs[1].session && b.ctx == 64 && b.pos == 17 && b.n == 1 && !b.all_logits &&
              ds4_dist_tp_seq_at(f.tp.seqs, 0).all_logits, "step record");
    CHECK(ds4_dist_token_at(f.tp.tokens, 1) == -1 && ds4_dist_token_at(f.tp.tokens, 3) == 42, "step tokens");
    check_all_cuts(m, len, "tp step");
    /* a record claiming one token more than the frame carries */
    const ds4_dist_tp_seq over[1] = {{1, 64, 0, 2, false}};
    uint8_t *bad = ds4_dist_encode_tp_step(0, NULL, 0, over, 1, toks, &len);
    const size_t at = len - 4 - 4 * 2;   /* the token count, before the two tokens */
    bad[at] = 1;
    CHECK(!ds4_dist_decode(bad, len - 4, &f, err, sizeof err), "a STEP whose records claim more tokens decoded");
    free(bad);
    free(m);

    const uint8_t state[5] = {1, 2, 3, 4, 5};
    m = ds4_dist_encode_tp_state(3, 77, 2048, state, sizeof state, &len);
    CHECK(m && ds4_dist_decode(m, len, &f, err, sizeof err) && f.type == DS4_DIST_TP_STATE && f.tp.session == 77 &&
              f.tp.ctx == 2048 && f.tp.n_bytes == 5 && !memcmp(f.tp.bytes, state, 5), "state: %s", err);
    check_all_cuts(m, len, "tp state");
    free(m);

    const float x[3] = {1.5f, -0.0f, 3e-30f};
    m = ds4_dist_encode_tp_part(12, 5, 3, DS4_DIST_OK, x, 3, NULL, &len);
    CHECK(m && ds4_dist_decode(m, len, &f, err, sizeof err) && f.type == DS4_DIST_TP_PART && f.tp.counter == 12 &&
              f.tp.step == 5 && f.tp.layer == 3 && f.tp.status == DS4_DIST_OK && f.tp.n_floats == 3 &&
              ds4_dist_float_at(f.tp.floats, 2) == x[2] && f.tp.text_len == 0, "part: %s", err);
    check_all_cuts(m, len, "tp part");
    CHECK(len <= ds4_dist_tp_part_frame_max(3), "part larger than its bound");
    m[HEADER_BYTES + 8 + 8 + 4] = DS4_DIST_WRONG_ROUTE;
    CHECK(!ds4_dist_decode(m, len, &f, err, sizeof err), "a PART with status WRONG_ROUTE decoded");
    free(m);
    m = ds4_dist_encode_tp_part(0, 0, 0, DS4_DIST_ERROR, x, 3, "worker: no", &len);
    CHECK(m && ds4_dist_decode(m, len, &f, err, sizeof err) && f.tp.status == DS4_DIST_ERROR && f.tp.n_floats == 0 &&
              f.tp.text_len == 10 && !memcmp(f.tp.text, "worker: no", 10), "error part: %s", err);
    free(m);
}

/* TP_RDMA: a round trip, every truncation refused, and the fields a queue
 * pair cannot have (numbers past 24 bits, an MTU outside the verbs
 * enumeration, no slot, a slot smaller than a frame header) refused. */
static void test_tp_rdma_frame(void) {
    ds4_dist_frame f;
    char err[256];
    const uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 2};
    const ds4_dist_rdma q = {5, 0xabcdef, 0x123456, 0x4321, gid, 5, 8, 1 << 20};
    size_t len;
    uint8_t *m = ds4_dist_encode_tp_rdma(&q, &len);
    CHECK(m && ds4_dist_decode(m, len, &f, err, sizeof err) && f.type == DS4_DIST_TP_RDMA, "rdma: %s", err);
    CHECK(f.rdma.counter == 5 && f.rdma.qpn == 0xabcdef && f.rdma.psn == 0x123456 && f.rdma.lid == 0x4321 &&
              !memcmp(f.rdma.gid, gid, 16) && f.rdma.mtu == 5 && f.rdma.slots == 8 && f.rdma.slot_bytes == 1 << 20,
          "rdma fields");
    check_all_cuts(m, len, "tp rdma");
    free(m);
    const ds4_dist_rdma bad[] = {{0, 1u << 24, 0, 0, gid, 3, 1, 4096}, {0, 1, 1u << 24, 0, gid, 3, 1, 4096},
                                 {0, 1, 1, 0, gid, 0, 1, 4096}, {0, 1, 1, 0, gid, 6, 1, 4096},
                                 {0, 1, 1, 0, gid, 3, 0, 4096}, {0, 1, 1, 0, gid, 3, 1, 7}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        m = ds4_dist_encode_tp_rdma(&bad[i], &len);
        CHECK(m && !ds4_dist_decode(m, len, &f, err, sizeof err), "bad rdma frame %zu decoded", i);
        free(m);
    }
}

int main(void) {
    test_tp_frames();
    test_tp_rdma_frame();
    test_link_keys();
    test_handshake();
    test_hello();
    test_work_and_result();
    test_activation_formats();
    test_hash();
    test_seal();
    return check_done("test_dist_proto");
}
