/* test_dspark.c -- the DSpark block drafter in both layouts: the dense one
 * against nemo-automodel's DeepSeek V4 DSpark draft module
 * (tests/oracles/ds4_dspark_oracle.py, fixture tests/fixtures/ds4tiny/A/dspark/)
 * and the released DeepSeek sidecar (MoE stages with hyper-connections)
 * against a reference assembled from transformers' DeepSeek V4 modules
 * (tests/oracles/ds4_dspark_sidecar_oracle.py, fixtures
 * tests/fixtures/ds4tiny/{A,B}/dspark-sidecar/: three stages over a window of
 * 8 rows, two over a window of 128 with contexts up to 299). For every anchor
 * of a fixture, the block after the target features of the positions before
 * it must give the reference's logits within float tolerance, the same
 * greedy drafts (argmax) and the same confidences; the confidence schedule
 * keeps the prefix whose product of confidences reaches the threshold;
 * rewinding the context and pushing the same features again gives the same
 * block bit for bit; a sidecar's block depends on its window only, and
 * after a rewind past the rows it holds it proposes nothing until a window
 * is made again. Then bad support files are refused with one line: another
 * model's, a truncated one, one naming a layer the model does not expose,
 * one missing a stage's tensor. */
#include "check.h"
#include "format/gguf.h"
#include "models/dsv4/dspark.h"
#include "models/dsv4/model.h"
#include "engine/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIX "tests/fixtures/ds4tiny/A/dspark/"
#define MAIN_A "build/ds4tiny/A-f32.gguf"
#define MAIN_B "build/ds4tiny/B-f32.gguf"
#define MAIN_C "build/ds4tiny/C-f32.gguf"

/* a drafter's fixture: its directory, its main model's token file, the
 * main model's layers it reads (their outputs) */
typedef struct {
    const char *dir, *tokens;
    int n_tgt, targets[3];
} fixture;
static const fixture DENSE_A = {FIX, "tests/fixtures/ds4tiny/A/tokens", 2, {1, 3}};
static const fixture SIDECAR_A = {"tests/fixtures/ds4tiny/A/dspark-sidecar/", "tests/fixtures/ds4tiny/A/tokens", 3, {2, 3, 4}};
static const fixture SIDECAR_B = {"tests/fixtures/ds4tiny/B/dspark-sidecar/", "tests/fixtures/ds4tiny/B/tokens", 2, {0, 1}};

static char *fixture_path(const fixture *fx, const char *file) {
    static char buf[256];
    snprintf(buf, sizeof buf, "%s%s", fx->dir, file);
    return buf;
}

static void *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc((size_t)n);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static ds4_model *bind_main(const char *path, ds4_gguf **g) {
    char err[256];
    *g = ds4_gguf_open(path, err, sizeof err);
    if (!*g) { fprintf(stderr, "%s: %s\n", path, err); return NULL; }
    ds4_model *m = ds4_model_bind(*g, err, sizeof err);
    if (!m) fprintf(stderr, "%s: %s\n", path, err);
    return m;
}

/* the oracle model's token sequence: the block at anchor a starts with token a */
static int32_t *fixture_tokens;
static int32_t anchor_token(int a) { return fixture_tokens[a]; }

static void oracle(const fixture *fx, const ds4_model *m) {
    char err[512];
    ds4_dspark *d = ds4_dspark_load(fixture_path(fx, "dspark.gguf"), m, NULL, err, sizeof err);
    CHECK(d, "%s", err);
    if (!d) return;
    const int B = ds4_dspark_block_size(d), V = m->cfg.n_vocab, E = m->cfg.n_embd, nt = ds4_dspark_n_targets(d);
    CHECK(B == 5 && nt == fx->n_tgt && !memcmp(ds4_dspark_targets(d), fx->targets, sizeof(int) * (size_t)nt),
          "%s: B=%d targets=%d", fx->dir, B, nt);
    size_t flen, blen;
    float *feat = slurp(fixture_path(fx, "features"), &flen);
    unsigned char *blocks = slurp(fixture_path(fx, "blocks"), &blen);
    CHECK(feat && blocks, "fixture missing");
    if (!feat || !blocks) { ds4_dspark_free(d); free(feat); free(blocks); return; }
    const int T = (int)(flen / (sizeof(float) * nt * E));
    const size_t rec = sizeof(int32_t) * (1 + B) + sizeof(float) * B * (1 + (size_t)V);
    ds4_dspark_state *st = ds4_dspark_state_new(d, T + B, 0);
    float *logits = malloc((size_t)B * V * sizeof(float)), *again = malloc((size_t)B * V * sizeof(float));
    float conf[DS4_DSPARK_BLOCK_MAX];
    int32_t toks[DS4_DSPARK_BLOCK_MAX], toks2[DS4_DSPARK_BLOCK_MAX];
    double worst = 0, top = 0, worst_conf = 0;
    int blocks_seen = 0;
    for (size_t off = 0; off + rec <= blen; off += rec, blocks_seen++) {
        int32_t hdr[1 + DS4_DSPARK_BLOCK_MAX];
        memcpy(hdr, blocks + off, sizeof(int32_t) * (1 + B));
        const float *rconf = (const float *)(blocks + off + sizeof(int32_t) * (1 + B));
        const float *rlog = rconf + B;
        const int a = hdr[0];
        /* the context grows one position at a time, as decoding feeds it */
        while (ds4_dspark_context(st) < a) ds4_dspark_push(st, feat + (size_t)ds4_dspark_context(st) * nt * E);
        ds4_dspark_rewound(st, a);
        const int keep = ds4_dspark_block(st, anchor_token(a), 0, B, toks, logits, conf);
        CHECK(keep == B, "threshold 0 kept %d of %d", keep, B);
        for (int t = 0; t < B; t++) {
            CHECK(toks[t] == hdr[1 + t], "anchor %d row %d: draft %d, reference %d", a, t, toks[t], hdr[1 + t]);
            const double dc = fabs((double)conf[t] - rconf[t]);
            if (dc > worst_conf) worst_conf = dc;
            for (int v = 0; v < V; v++) {
                const double e = fabs((double)logits[(size_t)t * V + v] - rlog[(size_t)t * V + v]);
                if (e > worst) worst = e;
                if (fabs(rlog[(size_t)t * V + v]) > top) top = fabs(rlog[(size_t)t * V + v]);
            }
        }
        /* the schedule: the longest prefix whose confidence product reaches the threshold */
        for (float thr = 0.05f; thr < 1; thr += 0.1f) {
            double prod = 1;
            int want = 0;
            for (int t = 0; t < B; t++) {
                prod *= conf[t];
                if (prod >= thr && want == t) want++;
            }
            CHECK(ds4_dspark_block(st, anchor_token(a), thr, B, toks2, NULL, NULL) == want, "anchor %d thr %.2f", a, thr);
        }
        CHECK(ds4_dspark_block(st, anchor_token(a), 0, 2, toks2, NULL, NULL) == 2, "max caps the proposal");
        /* rewound and pushed again: the same rows, the same block bit for bit */
        ds4_dspark_rewound(st, a / 2);
        while (ds4_dspark_context(st) < a) ds4_dspark_push(st, feat + (size_t)ds4_dspark_context(st) * nt * E);
        ds4_dspark_block(st, anchor_token(a), 0, B, toks2, again, NULL);
        CHECK(!memcmp(logits, again, (size_t)B * V * sizeof(float)) && !memcmp(toks, toks2, sizeof(int32_t) * B),
              "anchor %d: a rebuilt context changed the block", a);
    }
    printf("%s: %d blocks of %d, max |logit err| %.3g (logits up to %.3g), max |confidence err| %.3g\n",
           fx->dir, blocks_seen, B, worst, top, worst_conf);
    CHECK(blocks_seen >= 8, "only %d blocks in the fixture", blocks_seen);
    CHECK(worst <= 1e-4 * (top > 1 ? top : 1), "logits differ by %.3g", worst);
    CHECK(worst_conf <= 1e-5, "confidences differ by %.3g", worst_conf);
    free(logits);
    free(again);
    ds4_dspark_state_free(st);
    ds4_dspark_free(d);
    free(feat);
    free(blocks);
}

static int32_t *read_tokens(const char *path) {
    size_t n;
    char *s = slurp(path, &n);
    if (!s) return NULL;
    int32_t *t = calloc(n, sizeof *t);
    int k = 0;
    for (char *p = s; p < s + n;) {
        if (*p >= '0' && *p <= '9') t[k++] = (int32_t)strtol(p, &p, 10);
        else p++;
    }
    free(s);
    return t;
}

/* A copy of the fixture with one key's u32 value replaced, or cut short. */
static void bad_files(const ds4_model *a, const ds4_model *b, const ds4_model *c) {
    char err[512];
    ds4_dspark *d = ds4_dspark_load(FIX "dspark.gguf", b, NULL, err, sizeof err);
    CHECK(!d && strstr(err, "not a DSpark file for this model") && !strchr(err, '\n'), "another model's: %s", err);
    ds4_dspark_free(d);
    d = ds4_dspark_load("build/ds4tiny/A-f32.gguf", a, NULL, err, sizeof err);
    CHECK(!d && strstr(err, "general.architecture"), "a main model as support file: %s", err);
    ds4_dspark_free(d);
    size_t len;
    unsigned char *buf = slurp(FIX "dspark.gguf", &len);
    CHECK(buf != NULL, "fixture");
    if (!buf) return;
    const char *cut = "build/tests/dspark-truncated.gguf";
    FILE *f = fopen(cut, "wb");
    fwrite(buf, 1, len - 4096, f);
    fclose(f);
    d = ds4_dspark_load(cut, a, NULL, err, sizeof err);
    CHECK(!d && strstr(err, "--dspark") && !strchr(err, '\n'), "truncated: %s", err);
    ds4_dspark_free(d);
    /* target layer 3 -> 5: the last layer is not exposed as streams */
    const char *key = "dspark.target_layers";
    unsigned char *p = memmem(buf, len, key, strlen(key));
    CHECK(p != NULL, "key in fixture");
    if (p) {
        /* name, then u32 type (array), u32 element type, u64 count, elements */
        int32_t *elems = (int32_t *)(p + strlen(key) + 4 + 4 + 8);
        elems[1] = 5;
        const char *bad = "build/tests/dspark-badlayer.gguf";
        f = fopen(bad, "wb");
        fwrite(buf, 1, len, f);
        fclose(f);
        d = ds4_dspark_load(bad, a, NULL, err, sizeof err);
        CHECK(!d && strstr(err, "target_layers"), "layer 5 of 6: %s", err);
        ds4_dspark_free(d);
    }
    free(buf);
    /* the sidecar: target layers model B does not have, expert shapes model
     * C does not have, a stage's tensor missing */
    d = ds4_dspark_load(fixture_path(&SIDECAR_A, "dspark.gguf"), b, NULL, err, sizeof err);
    CHECK(!d && strstr(err, "not a DSpark file for this model") && strstr(err, "target_layer_ids") && !strchr(err, '\n'),
          "A's sidecar on B: %s", err);
    ds4_dspark_free(d);
    d = ds4_dspark_load(fixture_path(&SIDECAR_B, "dspark.gguf"), c, NULL, err, sizeof err);
    CHECK(!d && strstr(err, "not a DSpark file for this model") && !strchr(err, '\n'), "B's sidecar on C: %s", err);
    ds4_dspark_free(d);
    buf = slurp(fixture_path(&SIDECAR_A, "dspark.gguf"), &len);
    const char *name = "mtp.1.ffn_up_exps.weight";
    unsigned char *at = buf ? memmem(buf, len, name, strlen(name)) : NULL;
    CHECK(at != NULL, "tensor in fixture");
    if (at) {
        at[strlen(name) - 8] = 'z';
        const char *bad = "build/tests/dspark-sidecar-missing.gguf";
        f = fopen(bad, "wb");
        fwrite(buf, 1, len, f);
        fclose(f);
        d = ds4_dspark_load(bad, a, NULL, err, sizeof err);
        CHECK(!d && strstr(err, name) && !strchr(err, '\n'), "missing stage tensor: %s", err);
        ds4_dspark_free(d);
    }
    free(buf);
}

/* Through the engine: the main model (f32 numerics, as transformers
 * computes) feeds the drafter its own target features through the CPU
 * backend's layer ring, whether the context came one token at a time or in
 * one prefill; the first row's logits and the block's drafts must be the
 * reference's, within the main model's float tolerance; tokens appended
 * and rewound away change nothing. */
static void through_engine(const fixture *fx, const char *main_path, int ctx) {
    char err[512];
    ds4_engine_params p;
    ds4_engine_params_default(&p);
    p.model_path = main_path;
    char gguf[256];
    snprintf(gguf, sizeof gguf, "%s", fixture_path(fx, "dspark.gguf"));
    p.dspark_path = gguf;
    p.n_threads = 2;
    p.numerics = 0;
    p.quiet = true;
    ds4_engine *e = ds4_engine_load(&p, err, sizeof err);
    CHECK(e != NULL, "%s", err);
    if (!e) return;
    const int V = ds4_engine_n_vocab(e), B = 5;
    size_t blen;
    unsigned char *blocks = slurp(fixture_path(fx, "blocks"), &blen);
    const size_t rec = sizeof(int32_t) * (1 + B) + sizeof(float) * B * (1 + (size_t)V);
    float *logits = malloc((size_t)V * sizeof(float)), *again = malloc((size_t)V * sizeof(float));
    const size_t n_blocks = blocks ? blen / rec : 0;
    float *mode0 = malloc((n_blocks + 1) * (size_t)V * sizeof(float));   /* mode 0's first rows, per block */
    double worst = 0;
    int n_checked = 0;
    for (int mode = 0; mode < 3 && blocks && mode0; mode++) {
        ds4_session *s = ds4_session_new(e, ctx, err, sizeof err);
        CHECK(s != NULL, "%s", err);
        if (!s) break;
        for (size_t off = 0; off + rec <= blen; off += rec) {
            int32_t hdr[6];
            memcpy(hdr, blocks + off, sizeof hdr);
            const float *rlog = (const float *)(blocks + off + sizeof hdr) + B;
            const int a = hdr[0], have = ds4_session_n_tokens(s);
            /* mode 0: one decode per token, the drafter's context rows made
             * at the anchor in chunks; mode 1: each anchor's missing tokens
             * as one prefill; mode 2: one decode per token with a draft
             * after each, so every context row is made alone */
            if (mode != 1)
                for (int i = have; i < a; i++) {
                    CHECK(!ds4_session_decode(s, fixture_tokens[i], err, sizeof err), "%s", err);
                    if (mode == 2)
                        CHECK(!ds4_session_draft_logits(s, fixture_tokens[i], again, err, sizeof err), "%s", err);
                }
            else
                CHECK(!ds4_session_prefill(s, fixture_tokens + have, a - have, NULL, NULL, NULL, err, sizeof err), "%s", err);
            CHECK(!ds4_session_draft_logits(s, anchor_token(a), logits, err, sizeof err), "anchor %d: %s", a, err);
            float *first = mode0 + off / rec * (size_t)V;
            if (mode == 0) memcpy(first, logits, (size_t)V * sizeof(float));
            else CHECK(!memcmp(first, logits, (size_t)V * sizeof(float)), "anchor %d (mode %d): logits differ from "
                       "the context made in chunks", a, mode);
            for (int v = 0; v < V; v++) {
                const double d = fabs((double)logits[v] - rlog[v]);
                if (d > worst) worst = d;
            }
            int32_t drafts[5];
            const int k = ds4_session_draft(s, anchor_token(a), B, 0, drafts, err, sizeof err);
            CHECK(k == B && !memcmp(drafts, hdr + 1, sizeof drafts), "anchor %d (mode %d): drafts differ", a, mode);
            /* tokens appended and rewound away leave the drafter's context as it was */
            const int32_t junk[3] = {7, 8, 9};
            CHECK(!ds4_session_prefill(s, junk, 3, NULL, NULL, NULL, err, sizeof err) &&
                  !ds4_session_rewind(s, a, err, sizeof err), "%s", err);
            CHECK(!ds4_session_draft_logits(s, anchor_token(a), again, err, sizeof err) &&
                  !memcmp(logits, again, (size_t)V * sizeof(float)), "anchor %d: the draft changed after a rewind", a);
            n_checked++;
        }
        ds4_session_free(s);
    }
    printf("%s through the engine: %d blocks, max |first-row logit err| %.3g\n", fx->dir, n_checked, worst);
    CHECK(n_blocks >= 8 && n_checked == 3 * (int)n_blocks, "checked %d blocks", n_checked);
    CHECK(worst <= 1e-4, "first-row logits differ by %.3g", worst);
    free(logits);
    free(again);
    free(mode0);
    free(blocks);
    ds4_engine_free(e);
}

/* A sidecar's block reads its window of context rows only, kept in a ring
 * of a few windows: rows made for positions outside it (here garbage)
 * change nothing, and a rewind past the rows the ring still holds stops
 * the drafts until a window has been made again. */
static void sidecar_window(const ds4_model *m) {
    char err[512];
    ds4_dspark *d = ds4_dspark_load(fixture_path(&SIDECAR_A, "dspark.gguf"), m, NULL, err, sizeof err);
    CHECK(d, "%s", err);
    if (!d) return;
    const int E = m->cfg.n_embd, V = m->cfg.n_vocab, W = m->cfg.window, nt = ds4_dspark_n_targets(d), B = 5;
    size_t flen;
    float *feat = slurp(fixture_path(&SIDECAR_A, "features"), &flen), *zero = calloc((size_t)nt * E, sizeof(float));
    const int T = (int)(flen / (sizeof(float) * nt * E)), ctx = 1000, at = 200;
    ds4_dspark_state *st = ds4_dspark_state_new(d, ctx, 0), *other = ds4_dspark_state_new(d, ctx, 0);
    float *logits = malloc((size_t)B * V * sizeof(float)), *again = malloc((size_t)B * V * sizeof(float));
    int32_t toks[DS4_DSPARK_BLOCK_MAX], toks2[DS4_DSPARK_BLOCK_MAX];
    CHECK(feat && zero && st && other && logits && again, "setup");
    if (feat && zero && st && other && logits && again) {
        CHECK(ds4_dspark_state_bytes(d, ctx, 0) < (uint64_t)3 * ctx * m->cfg.head_dim * sizeof(float), "a ring, not a row per position");
        for (int p = 0; p < at; p++) ds4_dspark_push(st, feat + (size_t)(p % T) * nt * E);
        for (int p = 0; p < at; p++) ds4_dspark_push(other, p < at - W ? zero : feat + (size_t)(p % T) * nt * E);
        CHECK(ds4_dspark_block(st, 7, 0, B, toks, logits, NULL) == B, "a block at %d", at);
        CHECK(ds4_dspark_block(other, 7, 0, B, toks2, again, NULL) == B &&
              !memcmp(logits, again, (size_t)B * V * sizeof(float)), "rows outside the window changed the block");
        ds4_dspark_rewound(st, 100);
        CHECK(ds4_dspark_block(st, 7, 0, B, toks, logits, NULL) == 0, "rows overwritten in the ring: no proposal");
        for (int p = 100; p < 100 + W; p++) ds4_dspark_push(st, feat + (size_t)(p % T) * nt * E);
        ds4_dspark_rewound(other, 0);
        for (int p = 0; p < 100 + W; p++) ds4_dspark_push(other, feat + (size_t)(p % T) * nt * E);
        CHECK(ds4_dspark_block(st, 7, 0, B, toks, logits, NULL) == B &&
              ds4_dspark_block(other, 7, 0, B, toks2, again, NULL) == B &&
              !memcmp(logits, again, (size_t)B * V * sizeof(float)), "a window made again drafts as before");
    }
    free(feat); free(zero); free(logits); free(again);
    ds4_dspark_state_free(st);
    ds4_dspark_state_free(other);
    ds4_dspark_free(d);
}

static void with_tokens(const fixture *fx) {
    free(fixture_tokens);
    fixture_tokens = read_tokens(fx->tokens);
    CHECK(fixture_tokens, "%s", fx->tokens);
}

int main(void) {
    ds4_gguf *ga, *gb, *gc;
    ds4_model *a = bind_main(MAIN_A, &ga), *b = bind_main(MAIN_B, &gb), *c = bind_main(MAIN_C, &gc);
    CHECK(a && b && c, "the oracle models (make " MAIN_A " " MAIN_B " " MAIN_C ")");
    if (a && b && c) {
        with_tokens(&DENSE_A);
        oracle(&DENSE_A, a);
        bad_files(a, b, c);
        through_engine(&DENSE_A, MAIN_A, 128);
        with_tokens(&SIDECAR_A);
        oracle(&SIDECAR_A, a);
        through_engine(&SIDECAR_A, MAIN_A, 128);
        sidecar_window(a);
        with_tokens(&SIDECAR_B);
        oracle(&SIDECAR_B, b);
        through_engine(&SIDECAR_B, MAIN_B, 512);
    }
    free(fixture_tokens);
    ds4_model_free(a);
    ds4_model_free(b);
    ds4_model_free(c);
    ds4_gguf_close(ga);
    ds4_gguf_close(gb);
    ds4_gguf_close(gc);
    return check_done("test_dspark");
}
