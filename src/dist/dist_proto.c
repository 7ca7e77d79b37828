/* dist_proto.c -- pipeline-parallel frames (see dist_proto.h). */
#include "dist/dist_proto.h"
#include "kernels/quant.h"
#include "base/sha1.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

enum { VERSION = 7, HEADER = 8, HOP_BYTES = 8 * 4 };
static const uint8_t MAGIC[4] = {'D', 'S', '4', 'P'};

uint64_t ds4_dist_hash_tokens(uint64_t h, const int32_t *toks, int n) {
    for (int i = 0; i < n; i++) {
        const uint32_t t = (uint32_t)toks[i];
        for (int b = 0; b < 4; b++) {
            h ^= (t >> (8 * b)) & 0xff;
            h *= 0x100000001b3ull;
        }
    }
    return h;
}

/* ---- encoding: the size is known before writing, so one allocation ---- */

typedef struct { uint8_t *p; size_t at; } writer;

static void put_le(writer *w, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) w->p[w->at++] = (uint8_t)(v >> (8 * i));
}
static void put_bytes(writer *w, const void *src, size_t n) {
    if (n) memcpy(w->p + w->at, src, n);
    w->at += n;
}
static void put_str(writer *w, const char *s, size_t n) { put_le(w, n, 2); put_bytes(w, s, n); }
static void put_floats(writer *w, const float *f, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &f[i], 4);
        put_le(w, u, 4);
    }
}

size_t ds4_dist_act_bytes(uint8_t act, uint32_t row, size_t n) {
    if (act == DS4_DIST_ACT_Q8) return row ? n / row * (4 + (size_t)row) : 0;
    return n * (act == DS4_DIST_ACT_F16 ? 2 : 4);
}

/* The largest finite half: a hidden state past it keeps its sign and the
 * largest magnitude the format has, not an infinity the next layer would
 * spread. */
#define HALF_MAX 65504.0f

/* Q8: per row, s = max|x| / 127 and q = round(x / s) in -127..127, so
 * |x - q s| <= s / 2 up to the f32 roundings (dist_proto.h). */
static void put_q8_row(writer *w, const float *x, uint32_t row) {
    float amax = 0;
    for (uint32_t i = 0; i < row; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float scale = amax / 127.0f;
    uint32_t u;
    memcpy(&u, &scale, 4);
    put_le(w, u, 4);
    for (uint32_t i = 0; i < row; i++) {
        const float v = scale > 0 ? x[i] / scale : 0;
        const long q = isnan(v) ? 0 : v >= 127 ? 127 : v <= -127 ? -127 : lrintf(v);
        w->p[w->at++] = (uint8_t)(int8_t)q;
    }
}

static void put_act(writer *w, uint8_t act, uint32_t row, const float *f, size_t n) {
    if (act == DS4_DIST_ACT_F32) { put_floats(w, f, n); return; }
    if (act == DS4_DIST_ACT_Q8) {
        for (size_t r = 0; r + row <= n; r += row) put_q8_row(w, f + r, row);
        return;
    }
    for (size_t i = 0; i < n; i++) {   /* comparisons, not fminf/fmaxf: a NaN stays NaN */
        const float v = f[i] > HALF_MAX ? HALF_MAX : f[i] < -HALF_MAX ? -HALF_MAX : f[i];
        put_le(w, ds4_f32_to_half(v), 2);
    }
}

static bool start(writer *w, enum ds4_dist_type type, size_t body) {
    w->p = malloc(HEADER + body);
    w->at = 0;
    if (!w->p) return false;
    put_bytes(w, MAGIC, 4);
    put_le(w, VERSION, 2);
    put_le(w, type, 2);
    return true;
}

/* strings longer than a u16 are refused by truncation at the caller's cost: names and URLs are short */
static size_t str_len(size_t n) { return n > 0xffff ? 0xffff : n; }

uint8_t *ds4_dist_encode_hello(const ds4_dist_hello *h, size_t *len) {
    const size_t lm = str_len(h->model_len), lu = str_len(h->data_url_len);
    writer w;
    if (!start(&w, DS4_DIST_HELLO, 2 * DS4_DIST_NONCE_BYTES + 4 + lm + lu + 4 * 8 + 2 + DS4_DIST_STEER_ID_BYTES))
        return NULL;
    put_bytes(&w, h->challenge, DS4_DIST_NONCE_BYTES);
    put_bytes(&w, h->nonce, DS4_DIST_NONCE_BYTES);
    put_str(&w, h->model, lm);
    put_le(&w, h->n_layer, 4); put_le(&w, h->n_embd, 4); put_le(&w, h->n_hc, 4); put_le(&w, h->n_vocab, 4);
    put_le(&w, h->expert_bits, 4); put_le(&w, h->first, 4); put_le(&w, h->last, 4);
    put_le(&w, h->output, 1);
    put_le(&w, h->ctx, 4);
    put_str(&w, h->data_url, lu);
    put_le(&w, h->numerics, 1);
    put_bytes(&w, h->steering, DS4_DIST_STEER_ID_BYTES);
    *len = w.at;
    return w.p;
}

uint8_t *ds4_dist_encode_text(enum ds4_dist_type type, const char *text, size_t *len) {
    const size_t n = str_len(strlen(text));
    writer w;
    if (!start(&w, type, 2 + n)) return NULL;
    put_str(&w, text, n);
    *len = w.at;
    return w.p;
}

uint8_t *ds4_dist_encode_challenge(const uint8_t *nonce, const uint8_t *proof, size_t *len) {
    writer w;
    if (!start(&w, proof ? DS4_DIST_CHALLENGE : DS4_DIST_KNOCK,
               DS4_DIST_NONCE_BYTES + (proof ? DS4_DIST_SEAL_BYTES : 0)))
        return NULL;
    put_bytes(&w, nonce, DS4_DIST_NONCE_BYTES);
    if (proof) put_bytes(&w, proof, DS4_DIST_SEAL_BYTES);
    *len = w.at;
    return w.p;
}

enum { TP_SEQ_BYTES = 8 + 3 * 4 + 1, TP_RDMA_BYTES = 8 + 4 + 4 + 2 + 16 + 1 + 4 + 4 };

uint8_t *ds4_dist_encode_tp_step(uint64_t counter, const uint64_t *drop, uint32_t n_drop, const ds4_dist_tp_seq *seqs,
                                 uint32_t n_seqs, const int32_t *toks, size_t *len) {
    size_t n_tok = 0;
    for (uint32_t i = 0; i < n_seqs; i++) n_tok += seqs[i].n;
    writer w;
    if (!start(&w, DS4_DIST_TP_STEP, 8 + 4 + 8 * (size_t)n_drop + 4 + TP_SEQ_BYTES * (size_t)n_seqs + 4 + 4 * n_tok))
        return NULL;
    put_le(&w, counter, 8);
    put_le(&w, n_drop, 4);
    for (uint32_t i = 0; i < n_drop; i++) put_le(&w, drop[i], 8);
    put_le(&w, n_seqs, 4);
    for (uint32_t i = 0; i < n_seqs; i++) {
        put_le(&w, seqs[i].session, 8);
        put_le(&w, seqs[i].ctx, 4); put_le(&w, seqs[i].pos, 4); put_le(&w, seqs[i].n, 4);
        put_le(&w, seqs[i].all_logits, 1);
    }
    put_le(&w, n_tok, 4);
    for (size_t i = 0; i < n_tok; i++) put_le(&w, (uint32_t)toks[i], 4);
    *len = w.at;
    return w.p;
}

uint8_t *ds4_dist_encode_tp_state(uint64_t counter, uint64_t session, uint32_t ctx, const void *bytes, size_t n_bytes,
                                  size_t *len) {
    writer w;
    if (n_bytes > 0xffffffffu || !start(&w, DS4_DIST_TP_STATE, 8 + 8 + 4 + 4 + n_bytes)) return NULL;
    put_le(&w, counter, 8);
    put_le(&w, session, 8);
    put_le(&w, ctx, 4);
    put_le(&w, n_bytes, 4);
    put_bytes(&w, bytes, n_bytes);
    *len = w.at;
    return w.p;
}

uint8_t *ds4_dist_encode_tp_part(uint64_t counter, uint64_t step, uint32_t layer, uint8_t status, const float *floats,
                                 size_t n, const char *text, size_t *len) {
    if (status != DS4_DIST_OK) n = 0;
    const size_t lt = status != DS4_DIST_OK && text ? str_len(strlen(text)) : 0;
    writer w;
    if (n > 0xffffffffu || !start(&w, DS4_DIST_TP_PART, 8 + 8 + 4 + 1 + 4 + 4 * n + 2 + lt)) return NULL;
    put_le(&w, counter, 8);
    put_le(&w, step, 8);
    put_le(&w, layer, 4);
    put_le(&w, status, 1);
    put_le(&w, n, 4);
    put_floats(&w, floats, n);
    put_str(&w, text, lt);
    *len = w.at;
    return w.p;
}

uint8_t *ds4_dist_encode_tp_rdma(const ds4_dist_rdma *r, size_t *len) {
    writer w;
    if (!start(&w, DS4_DIST_TP_RDMA, TP_RDMA_BYTES)) return NULL;
    put_le(&w, r->counter, 8);
    put_le(&w, r->qpn, 4);
    put_le(&w, r->psn, 4);
    put_le(&w, r->lid, 2);
    put_bytes(&w, r->gid, 16);
    put_le(&w, r->mtu, 1);
    put_le(&w, r->slots, 4);
    put_le(&w, r->slot_bytes, 4);
    *len = w.at;
    return w.p;
}

size_t ds4_dist_tp_step_frame_max(size_t tokens, size_t seqs, size_t drops) {
    return HEADER + 8 + 4 + 8 * drops + 4 + TP_SEQ_BYTES * seqs + 4 + 4 * tokens + DS4_DIST_SEAL_BYTES;
}
size_t ds4_dist_tp_state_frame_max(size_t bytes) { return HEADER + 8 + 8 + 4 + 4 + bytes + DS4_DIST_SEAL_BYTES; }
size_t ds4_dist_tp_part_frame_max(size_t floats) {
    return HEADER + 8 + 8 + 4 + 1 + 4 + 4 * floats + 2 + 0xffff + DS4_DIST_SEAL_BYTES;
}

static void put_hops(writer *w, const ds4_dist_hop *hops, uint32_t n) {
    put_le(w, n, 4);
    for (uint32_t i = 0; i < n; i++) {
        const ds4_dist_hop *h = &hops[i];
        const uint32_t v[8] = {h->first, h->last, h->pos, h->n, h->eval_us, h->wait_us, h->send_us, h->bytes_in};
        for (int k = 0; k < 8; k++) put_le(w, v[k], 4);
    }
}

uint8_t *ds4_dist_encode_work(enum ds4_dist_type type, const ds4_dist_work *wk, const int32_t *toks,
                              const float *floats, const ds4_dist_hop *hops, size_t *len) {
    /* the decoder's rule for the format fields: a row only for Q8, cutting the floats evenly */
    if (wk->act > DS4_DIST_ACT_Q8 || (wk->act == DS4_DIST_ACT_Q8 ? !wk->row || wk->n_floats % wk->row : wk->row))
        return NULL;
    writer w;
    const size_t payload = ds4_dist_act_bytes(wk->act, wk->row, wk->n_floats);
    if (!start(&w, type, 8 + 4 + 8 + 4 + 4 + 8 + 8 + 1 + 1 + 2 * 4 + 4 * (size_t)wk->n + 1 + 4 + 4 + payload + 4 +
                             HOP_BYTES * (size_t)wk->n_hops))
        return NULL;
    put_le(&w, wk->route, 8);
    put_le(&w, wk->seq, 4);
    put_le(&w, wk->session, 8);
    put_le(&w, wk->pos, 4);
    put_le(&w, wk->n, 4);
    put_le(&w, wk->hash_before, 8);
    put_le(&w, wk->hash_after, 8);
    put_le(&w, wk->logits, 1);
    put_le(&w, wk->checkpoint, 1);
    put_floats(&w, (const float[2]){wk->steer_attn, wk->steer_ffn}, 2);
    for (uint32_t i = 0; i < wk->n; i++) put_le(&w, (uint32_t)toks[i], 4);
    put_le(&w, wk->act, 1);
    put_le(&w, wk->row, 4);
    put_le(&w, wk->n_floats, 4);
    if (wk->floats) put_bytes(&w, wk->floats, payload);
    else put_act(&w, wk->act, wk->row, floats, wk->n_floats);
    put_hops(&w, hops, wk->n_hops);
    *len = w.at;
    return w.p;
}

uint8_t *ds4_dist_encode_result(const ds4_dist_result *r, const float *floats, const ds4_dist_hop *hops, size_t *len) {
    const size_t lt = str_len(r->text_len);
    writer w;
    if (!start(&w, DS4_DIST_RESULT,
               8 + 4 + 8 + 1 + 8 + 4 + 4 * (size_t)r->n_floats + 4 + HOP_BYTES * (size_t)r->n_hops + 2 + lt))
        return NULL;
    put_le(&w, r->route, 8);
    put_le(&w, r->seq, 4);
    put_le(&w, r->session, 8);
    put_le(&w, r->status, 1);
    put_le(&w, r->hash_after, 8);
    put_le(&w, r->n_floats, 4);
    put_floats(&w, floats, r->n_floats);
    put_str(&w, r->text, lt);
    put_hops(&w, hops, r->n_hops);
    *len = w.at;
    return w.p;
}

void ds4_dist_set_send_us(uint8_t *frame, size_t len, uint32_t send_us) {
    writer w = {frame, len - HOP_BYTES + 6 * 4};
    put_le(&w, send_us, 4);
}

uint8_t *ds4_dist_encode_route(const ds4_dist_route *r, size_t *len) {
    const size_t ln = str_len(r->next_len), lh = str_len(r->home_len);
    writer w;
    if (!start(&w, DS4_DIST_ROUTE, 8 + 4 + 2 + ln + 2 + lh + 2 * DS4_DIST_NONCE_BYTES)) return NULL;
    put_le(&w, r->route, 8);
    put_le(&w, r->max_tokens, 4);
    put_str(&w, r->next, ln);
    put_bytes(&w, r->next_nonce, DS4_DIST_NONCE_BYTES);
    put_str(&w, r->home, lh);
    put_bytes(&w, r->home_nonce, DS4_DIST_NONCE_BYTES);
    *len = w.at;
    return w.p;
}

/* ---- decoding: every read checked against the end ---- */

typedef struct { const uint8_t *p; size_t n, at; bool bad; } reader;

static uint64_t get_le(reader *r, int bytes) {
    if (r->bad || r->n - r->at < (size_t)bytes) { r->bad = true; return 0; }
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)r->p[r->at + i] << (8 * i);
    r->at += (size_t)bytes;
    return v;
}
static const uint8_t *get_bytes(reader *r, uint64_t n) {
    if (r->bad || r->n - r->at < n) { r->bad = true; return NULL; }
    const uint8_t *p = r->p + r->at;
    r->at += (size_t)n;
    return p;
}
static float get_f32(reader *r) {
    const uint32_t u = (uint32_t)get_le(r, 4);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static const char *get_str(reader *r, size_t *len) {
    *len = (size_t)get_le(r, 2);
    return (const char *)get_bytes(r, *len);
}

float ds4_dist_float_at(const uint8_t *floats, size_t i) {
    uint32_t u = (uint32_t)floats[4 * i] | (uint32_t)floats[4 * i + 1] << 8 | (uint32_t)floats[4 * i + 2] << 16 |
                 (uint32_t)floats[4 * i + 3] << 24;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void ds4_dist_floats(const uint8_t *floats, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) out[i] = ds4_dist_float_at(floats, i);
}

void ds4_dist_work_floats(const ds4_dist_work *w, float *out) {
    const uint8_t *p = w->floats;
    if (w->act == DS4_DIST_ACT_F32) {
        ds4_dist_floats(p, w->n_floats, out);
    } else if (w->act == DS4_DIST_ACT_F16) {
        for (size_t i = 0; i < w->n_floats; i++) out[i] = ds4_half_to_f32((ds4_half)(p[2 * i] | p[2 * i + 1] << 8));
    } else {
        for (size_t r = 0; r + w->row <= w->n_floats; r += w->row, p += 4 + w->row) {
            const float scale = ds4_dist_float_at(p, 0);
            for (uint32_t i = 0; i < w->row; i++) out[r + i] = (float)(int8_t)p[4 + i] * scale;
        }
    }
}

int32_t ds4_dist_token_at(const uint8_t *tokens, size_t i) {
    return (int32_t)((uint32_t)tokens[4 * i] | (uint32_t)tokens[4 * i + 1] << 8 | (uint32_t)tokens[4 * i + 2] << 16 |
                     (uint32_t)tokens[4 * i + 3] << 24);
}

ds4_dist_hop ds4_dist_hop_at(const uint8_t *hops, size_t i) {
    uint32_t v[8];
    for (int k = 0; k < 8; k++) v[k] = (uint32_t)ds4_dist_token_at(hops + HOP_BYTES * i, (size_t)k);
    return (ds4_dist_hop){v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
}

uint64_t ds4_dist_u64_at(const uint8_t *p, size_t i) {
    return (uint64_t)(uint32_t)ds4_dist_token_at(p + 8 * i, 0) | (uint64_t)(uint32_t)ds4_dist_token_at(p + 8 * i, 1) << 32;
}

ds4_dist_tp_seq ds4_dist_tp_seq_at(const uint8_t *seqs, size_t i) {
    const uint8_t *p = seqs + TP_SEQ_BYTES * i;
    return (ds4_dist_tp_seq){ds4_dist_u64_at(p, 0), (uint32_t)ds4_dist_token_at(p + 8, 0),
                             (uint32_t)ds4_dist_token_at(p + 8, 1), (uint32_t)ds4_dist_token_at(p + 8, 2),
                             p[20] == 1};
}

static const uint8_t *get_hops(reader *r, uint32_t *n) {
    *n = (uint32_t)get_le(r, 4);
    if (*n > DS4_DIST_MAX_HOPS) r->bad = true;
    return get_bytes(r, (uint64_t)HOP_BYTES * *n);
}

bool ds4_dist_decode(const uint8_t *buf, size_t len, ds4_dist_frame *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    reader r = {buf, len, 0, false};
    const uint8_t *magic = get_bytes(&r, 4);
    const unsigned version = (unsigned)get_le(&r, 2), type = (unsigned)get_le(&r, 2);
    if (r.bad || memcmp(magic, MAGIC, 4)) { snprintf(err, errlen, "not a ds4 pipeline frame"); return false; }
    if (version != VERSION) {
        snprintf(err, errlen, "pipeline protocol version %u, this build speaks %d (build both sides from one commit)",
                 version, VERSION);
        return false;
    }
    out->type = (enum ds4_dist_type)type;
    switch (type) {
    case DS4_DIST_HELLO: {
        ds4_dist_hello *h = &out->hello;
        h->challenge = get_bytes(&r, DS4_DIST_NONCE_BYTES);
        h->nonce = get_bytes(&r, DS4_DIST_NONCE_BYTES);
        h->model = get_str(&r, &h->model_len);
        h->n_layer = (uint32_t)get_le(&r, 4); h->n_embd = (uint32_t)get_le(&r, 4);
        h->n_hc = (uint32_t)get_le(&r, 4); h->n_vocab = (uint32_t)get_le(&r, 4);
        h->expert_bits = (uint32_t)get_le(&r, 4);
        h->first = (uint32_t)get_le(&r, 4); h->last = (uint32_t)get_le(&r, 4);
        const uint64_t o = get_le(&r, 1);
        h->output = o == 1;
        if (o > 1) r.bad = true;
        h->ctx = (uint32_t)get_le(&r, 4);
        h->data_url = get_str(&r, &h->data_url_len);
        const uint64_t nu = get_le(&r, 1);
        h->numerics = nu == 1;
        if (nu > 1) r.bad = true;
        const uint8_t *steering = get_bytes(&r, DS4_DIST_STEER_ID_BYTES);
        if (steering) memcpy(h->steering, steering, DS4_DIST_STEER_ID_BYTES);
        break;
    }
    case DS4_DIST_KNOCK: case DS4_DIST_CHALLENGE:
        out->challenge.nonce = get_bytes(&r, DS4_DIST_NONCE_BYTES);
        if (type == DS4_DIST_CHALLENGE) out->challenge.proof = get_bytes(&r, DS4_DIST_SEAL_BYTES);
        break;
    case DS4_DIST_WELCOME: case DS4_DIST_REFUSED:
        out->result.text = get_str(&r, &out->result.text_len);
        break;
    case DS4_DIST_WORK: case DS4_DIST_KV_GET: case DS4_DIST_KV_PUT: {
        ds4_dist_work *w = &out->work;
        w->route = get_le(&r, 8);
        w->seq = (uint32_t)get_le(&r, 4);
        w->session = get_le(&r, 8);
        w->pos = (uint32_t)get_le(&r, 4);
        w->n = (uint32_t)get_le(&r, 4);
        w->hash_before = get_le(&r, 8);
        w->hash_after = get_le(&r, 8);
        w->logits = (uint8_t)get_le(&r, 1);
        const uint64_t ck = get_le(&r, 1);
        w->checkpoint = ck == 1;
        w->steer_attn = get_f32(&r);
        w->steer_ffn = get_f32(&r);
        /* a scale the engine would refuse on a command line is refused here too */
        if (w->logits > DS4_DIST_ALL || ck > 1 || (type == DS4_DIST_WORK && w->n == 0) || !isfinite(w->steer_attn) ||
            !isfinite(w->steer_ffn))
            r.bad = true;
        w->tokens = get_bytes(&r, 4 * (uint64_t)w->n);
        w->act = (uint8_t)get_le(&r, 1);
        w->row = (uint32_t)get_le(&r, 4);
        w->n_floats = (uint32_t)get_le(&r, 4);
        /* one spelling per frame: a row only for Q8, where it cuts the floats evenly */
        const bool q8 = w->act == DS4_DIST_ACT_Q8;
        if (w->act > DS4_DIST_ACT_Q8 || (q8 ? !w->row || w->n_floats % w->row : w->row != 0)) r.bad = true;
        if (!r.bad) w->floats = get_bytes(&r, ds4_dist_act_bytes(w->act, w->row, w->n_floats));
        w->hops = get_hops(&r, &w->n_hops);
        break;
    }
    case DS4_DIST_RESULT: {
        ds4_dist_result *res = &out->result;
        res->route = get_le(&r, 8);
        res->seq = (uint32_t)get_le(&r, 4);
        res->session = get_le(&r, 8);
        res->status = (uint8_t)get_le(&r, 1);
        if (res->status > DS4_DIST_WRONG_ROUTE) r.bad = true;
        res->hash_after = get_le(&r, 8);
        res->n_floats = (uint32_t)get_le(&r, 4);
        res->floats = get_bytes(&r, 4 * (uint64_t)res->n_floats);
        res->text = get_str(&r, &res->text_len);
        res->hops = get_hops(&r, &res->n_hops);
        break;
    }
    case DS4_DIST_ROUTE: {
        ds4_dist_route *rt = &out->route;
        rt->route = get_le(&r, 8);
        rt->max_tokens = (uint32_t)get_le(&r, 4);
        rt->next = get_str(&r, &rt->next_len);
        rt->next_nonce = get_bytes(&r, DS4_DIST_NONCE_BYTES);
        rt->home = get_str(&r, &rt->home_len);
        rt->home_nonce = get_bytes(&r, DS4_DIST_NONCE_BYTES);
        break;
    }
    case DS4_DIST_TP_STEP: {
        ds4_dist_tp *t = &out->tp;
        t->counter = get_le(&r, 8);
        t->n_drop = (uint32_t)get_le(&r, 4);
        t->drop = get_bytes(&r, 8 * (uint64_t)t->n_drop);
        t->n_seqs = (uint32_t)get_le(&r, 4);
        t->seqs = get_bytes(&r, (uint64_t)TP_SEQ_BYTES * t->n_seqs);
        t->n_tokens = (uint32_t)get_le(&r, 4);
        t->tokens = get_bytes(&r, 4 * (uint64_t)t->n_tokens);
        /* the records must account for the tokens, each with at least one */
        uint64_t sum = 0;
        for (uint32_t i = 0; !r.bad && i < t->n_seqs; i++) {
            const ds4_dist_tp_seq q = ds4_dist_tp_seq_at(t->seqs, i);
            if (q.n == 0 || t->seqs[TP_SEQ_BYTES * i + 20] > 1) r.bad = true;
            sum += q.n;
        }
        if (sum != t->n_tokens) r.bad = true;
        break;
    }
    case DS4_DIST_TP_STATE: {
        ds4_dist_tp *t = &out->tp;
        t->counter = get_le(&r, 8);
        t->session = get_le(&r, 8);
        t->ctx = (uint32_t)get_le(&r, 4);
        t->n_bytes = (uint32_t)get_le(&r, 4);
        t->bytes = get_bytes(&r, t->n_bytes);
        break;
    }
    case DS4_DIST_TP_PART: {
        ds4_dist_tp *t = &out->tp;
        t->counter = get_le(&r, 8);
        t->step = get_le(&r, 8);
        t->layer = (uint32_t)get_le(&r, 4);
        t->status = (uint8_t)get_le(&r, 1);
        t->n_floats = (uint32_t)get_le(&r, 4);
        t->floats = get_bytes(&r, 4 * (uint64_t)t->n_floats);
        t->text = get_str(&r, &t->text_len);
        if (t->status != DS4_DIST_OK && t->status != DS4_DIST_ERROR) r.bad = true;
        break;
    }
    case DS4_DIST_TP_RDMA: {
        ds4_dist_rdma *q = &out->rdma;
        q->counter = get_le(&r, 8);
        q->qpn = (uint32_t)get_le(&r, 4);
        q->psn = (uint32_t)get_le(&r, 4);
        q->lid = (uint16_t)get_le(&r, 2);
        q->gid = get_bytes(&r, 16);
        q->mtu = (uint8_t)get_le(&r, 1);
        q->slots = (uint32_t)get_le(&r, 4);
        q->slot_bytes = (uint32_t)get_le(&r, 4);
        /* 24-bit numbers, a verbs MTU, at least one slot of a header's size */
        if (q->qpn >> 24 || q->psn >> 24 || q->mtu < 1 || q->mtu > 5 || !q->slots || q->slot_bytes < HEADER)
            r.bad = true;
        break;
    }
    default:
        snprintf(err, errlen, "unknown pipeline frame type %u", type);
        return false;
    }
    if (r.bad || r.at != r.n) {
        snprintf(err, errlen, "malformed pipeline frame (type %u, %zu bytes)", type, len);
        return false;
    }
    return true;
}

/* "file sha1 0123456789ab" or "no file" */
static void steering_name(const uint8_t *id, char *out, size_t outlen) {
    static const uint8_t none[DS4_DIST_STEER_ID_BYTES];
    if (!memcmp(id, none, sizeof none)) { snprintf(out, outlen, "no file"); return; }
    snprintf(out, outlen, "file sha1 %02x%02x%02x%02x%02x%02x", id[0], id[1], id[2], id[3], id[4], id[5]);
}

bool ds4_dist_hello_compatible(const ds4_dist_hello *mine, const ds4_dist_hello *theirs, char *err, size_t errlen) {
    if (mine->model_len != theirs->model_len || memcmp(mine->model, theirs->model, mine->model_len) ||
        mine->n_layer != theirs->n_layer || mine->n_embd != theirs->n_embd || mine->n_hc != theirs->n_hc ||
        mine->n_vocab != theirs->n_vocab) {
        snprintf(err, errlen, "refused: another model (%.*s, %u layers, hidden %u) than the coordinator's "
                 "(%.*s, %u layers, hidden %u)", (int)str_len(theirs->model_len), theirs->model, theirs->n_layer,
                 theirs->n_embd, (int)str_len(mine->model_len), mine->model, mine->n_layer, mine->n_embd);
        return false;
    }
    if (mine->numerics != theirs->numerics) {
        snprintf(err, errlen, "refused: numerics %s, the coordinator runs %s (--numerics)",
                 theirs->numerics ? "ds4" : "exact", mine->numerics ? "ds4" : "exact");
        return false;
    }
    if (mine->expert_bits != theirs->expert_bits) {
        snprintf(err, errlen, "refused: routed experts of %u bits, the coordinator's are %u bits (another quant)",
                 theirs->expert_bits, mine->expert_bits);
        return false;
    }
    if (memcmp(mine->steering, theirs->steering, DS4_DIST_STEER_ID_BYTES)) {
        char here[48], there[48];
        steering_name(mine->steering, here, sizeof here);
        steering_name(theirs->steering, there, sizeof there);
        snprintf(err, errlen, "refused: this worker steers with %s, the coordinator with %s (every slice needs the "
                 "same --dir-steering-file, or none)", there, here);
        return false;
    }
    if (theirs->first > theirs->last || theirs->last >= theirs->n_layer) {
        snprintf(err, errlen, "refused: layer slice %u..%u outside the model's 0..%u", theirs->first, theirs->last,
                 theirs->n_layer - 1);
        return false;
    }
    return true;
}

uint8_t *ds4_dist_seal(uint8_t *msg, size_t *len, const void *key, size_t key_len) {
    uint8_t *sealed = msg ? realloc(msg, *len + DS4_DIST_SEAL_BYTES) : NULL;
    if (!sealed) { free(msg); return NULL; }
    ds4_hmac_sha1(key, key_len, sealed, *len, sealed + *len);
    *len += DS4_DIST_SEAL_BYTES;
    return sealed;
}

/* constant time: a forger learns nothing from how far a guess matched */
bool ds4_dist_same(const uint8_t *a, const uint8_t *b, size_t n) {
    uint8_t diff = 0;
    for (size_t i = 0; i < n; i++) diff |= (uint8_t)(a[i] ^ b[i]);
    return diff == 0;
}

bool ds4_dist_unseal(const void *buf, size_t n, const void *key, size_t key_len, size_t *frame_len) {
    if (n < DS4_DIST_SEAL_BYTES) return false;
    const size_t len = n - DS4_DIST_SEAL_BYTES;
    unsigned char want[DS4_DIST_SEAL_BYTES];
    ds4_hmac_sha1(key, key_len, buf, len, want);
    *frame_len = len;
    return ds4_dist_same(want, (const uint8_t *)buf + len, DS4_DIST_SEAL_BYTES);
}

void ds4_dist_handshake_key(const char *secret, enum ds4_dist_key which, const uint8_t *nonce_w,
                            const uint8_t *nonce_c, uint8_t out[DS4_DIST_SEAL_BYTES]) {
    /* distinct labels: the coordinator's proof never serves as the key a worker seals with */
    static const char *const labels[] = {"ds4 coordinator", "ds4 worker"};
    const size_t ll = strlen(labels[which]);
    uint8_t msg[16 + 2 * DS4_DIST_NONCE_BYTES];
    memcpy(msg, labels[which], ll);
    memcpy(msg + ll, nonce_w, DS4_DIST_NONCE_BYTES);
    memcpy(msg + ll + DS4_DIST_NONCE_BYTES, nonce_c, DS4_DIST_NONCE_BYTES);
    ds4_hmac_sha1(secret, strlen(secret), msg, ll + 2 * DS4_DIST_NONCE_BYTES, out);
}

void ds4_dist_link_key(const char *secret, const uint8_t *nonce, uint8_t out[DS4_DIST_SEAL_BYTES]) {
    static const char label[] = "ds4 link";
    uint8_t msg[sizeof label - 1 + DS4_DIST_NONCE_BYTES];
    memcpy(msg, label, sizeof label - 1);
    memcpy(msg + sizeof label - 1, nonce, DS4_DIST_NONCE_BYTES);
    ds4_hmac_sha1(secret, strlen(secret), msg, sizeof msg, out);
}

/* The encoders' sizes at their largest: every hop's telemetry, every
 * string at its u16 limit (text) and f32 payloads (no transport format is
 * larger). */
size_t ds4_dist_work_frame_max(size_t tokens, size_t floats) {
    return HEADER + 8 + 4 + 8 + 4 + 4 + 8 + 8 + 1 + 1 + 2 * 4 + 4 * tokens + 1 + 4 + 4 + 4 * floats + 4 +
           HOP_BYTES * (size_t)DS4_DIST_MAX_HOPS + DS4_DIST_SEAL_BYTES;
}

size_t ds4_dist_result_frame_max(size_t floats) {
    return HEADER + 8 + 4 + 8 + 1 + 8 + 4 + 4 * floats + 2 + 0xffff + 4 + HOP_BYTES * (size_t)DS4_DIST_MAX_HOPS +
           DS4_DIST_SEAL_BYTES;
}

size_t ds4_dist_route_frame_max(size_t url_max) {
    return HEADER + 8 + 4 + 2 * (2 + url_max + DS4_DIST_NONCE_BYTES) + DS4_DIST_SEAL_BYTES;
}

bool ds4_dist_random(uint8_t *out, size_t n) {
    for (size_t got = 0; got < n;) {
        const ssize_t r = getrandom(out + got, n - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        got += (size_t)r;
    }
    return true;
}
