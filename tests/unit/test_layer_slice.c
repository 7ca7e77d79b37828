/* test_layer_slice.c -- layer-sliced loading (--layers, model.h): the slice
 * parser; binding a slice of a whole file sets exactly the slice's views
 * (embedding with layer 0, head with "output") and touches no other weight:
 * the resident set grows by the slice's bytes as counted from the file's
 * tensor table (the oracle), not by the file's; the split files that
 * ds4-make-model --slice writes hold exactly their range's tensors with the
 * whole file's shapes and types, bind their own range by default and refuse
 * a wider one with one line; a partial engine loads and refuses eval with
 * one line, leaving the session empty; a worker's engine pages in a range
 * file it binds whole, never part of a bigger one. Inputs: $BUILD/dist/
 * (mk/dist.mk). */
#include "check.h"
#include "base/mempages.h"
#include "base/log.h"
#include "engine/engine.h"
#include "format/gguf.h"
#include "models/dsv4/model.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *input(const char *file) {
    static char p[4][512];
    static int next;
    const char *b = getenv("BUILD");
    char *dst = p[next++ % 4];
    snprintf(dst, sizeof p[0], "%s/dist/%s", b ? b : "build", file);
    return dst;
}

static void test_parse(void) {
    char err[256];
    ds4_layer_slice s;
    CHECK(ds4_layer_slice_parse("0:3", &s, err, sizeof err) && s.first == 0 && s.last == 3 && !s.output, "0:3");
    CHECK(ds4_layer_slice_parse("5:5", &s, err, sizeof err) && s.first == 5 && s.last == 5, "5:5");
    CHECK(ds4_layer_slice_parse("4:output", &s, err, sizeof err) && s.first == 4 && s.last < 0 && s.output,
          "4:output");
    const char *bad[] = {"3:2", ":1", "1:", "a:b", "1:2x", "-1:2", "0:128", "", "1:output2", "12", "1:2:3", " 1:2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK(!ds4_layer_slice_parse(bad[i], &s, err, sizeof err) && strstr(err, "expected A:B"), "'%s' -> %s",
              bad[i], err);
    }
}

/* Sum of the file's tensor bytes that a slice holds, by name. */
static uint64_t slice_bytes(const ds4_gguf *g, int first, int last) {
    uint64_t n = 0;
    for (size_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        int l;
        if (sscanf(t->name.ptr, "blk.%d.", &l) == 1 && l >= first && l <= last) n += t->n_bytes;
    }
    return n;
}

/* Reads one byte of every page of every weight matrix the slice bound. */
static uint64_t touch_slice(const ds4_model *m) {
    uint64_t sum = 0;
    for (int l = m->slice.first; l <= m->slice.last; l++) {
        const ds4_layer *L = &m->layers[l];
        const ds4_tensor *views[] = {&L->hc_attn_fn, &L->hc_ffn_fn, &L->q_a, &L->q_b, &L->kv, &L->out_a, &L->out_b,
                                     &L->comp_kv, &L->comp_gate, &L->idx_q_b, &L->idx_proj, &L->idx_kv, &L->idx_gate,
                                     &L->gate_inp, &L->gate_exps, &L->up_exps, &L->down_exps, &L->gate_shexp,
                                     &L->up_shexp, &L->down_shexp};
        for (size_t v = 0; v < sizeof views / sizeof views[0]; v++) {
            const volatile uint8_t *p = views[v]->data;
            const size_t n = views[v]->row_bytes * (size_t)views[v]->ne[1] * (size_t)views[v]->ne[2];
            for (size_t o = 0; p && o < n; o += 4096) sum += p[o];
            if (p && n) sum += p[n - 1];      /* the last page when data does not start on one */
        }
        if (L->tid2eid) sum += (uint64_t)L->tid2eid[0];
    }
    return sum;
}

static void test_bind_whole_file(void) {
    char err[512];
    ds4_gguf *g = ds4_gguf_open(input("whole.gguf"), err, sizeof err);
    CHECK(g != NULL, "%s", err);
    if (!g) return;
    const struct { const char *arg; int first, last; bool output; } cases[] = {
        {"0:1", 0, 1, false}, {"2:5", 2, 5, false}, {"6:output", 6, 7, true}, {"3:7", 3, 7, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ds4_layer_slice want;
        CHECK(ds4_layer_slice_parse(cases[i].arg, &want, err, sizeof err), "%s", err);
        ds4_model *m = ds4_model_bind_slice(g, &want, err, sizeof err);
        CHECK(m != NULL, "%s: %s", cases[i].arg, err);
        if (!m) continue;
        CHECK(m->slice.first == cases[i].first && m->slice.last == cases[i].last && m->slice.output == cases[i].output,
              "%s resolved to %d..%d", cases[i].arg, m->slice.first, m->slice.last);
        CHECK((m->token_embd.data != NULL) == (cases[i].first == 0), "%s: embedding", cases[i].arg);
        CHECK((m->output.data != NULL) == cases[i].output && (m->output_norm != NULL) == cases[i].output,
              "%s: output head", cases[i].arg);
        for (int l = 0; l < m->cfg.n_layer; l++)
            CHECK((m->layers[l].q_a.data != NULL) == ds4_model_has_layer(m, l) &&
                  (m->layers[l].attn_norm != NULL) == ds4_model_has_layer(m, l), "%s: layer %d", cases[i].arg, l);
        CHECK(!ds4_model_is_whole(m), "%s is a part", cases[i].arg);
        ds4_model_free(m);
    }
    ds4_layer_slice all = DS4_SLICE_ALL, past = {0, 8, false};
    ds4_model *m = ds4_model_bind_slice(g, &all, err, sizeof err);
    CHECK(m && ds4_model_is_whole(m), "0:output is the whole model");
    ds4_model_free(m);
    err[0] = 0;
    CHECK(!ds4_model_bind_slice(g, &past, err, sizeof err) && strstr(err, "layers 0..7"), "0:8 -> %s", err);
    ds4_gguf_close(g);
}

/* Residency on a fresh mapping (earlier binds left their pages mapped):
 * binding reads the slice's small vectors only; reading every view adds the
 * slice's bytes, never the rest of the file. */
static void test_residency(void) {
    char err[512];
    ds4_gguf *g = ds4_gguf_open(input("whole.gguf"), err, sizeof err);
    CHECK(g != NULL, "%s", err);
    if (!g) return;
    const uint64_t want_bytes = slice_bytes(g, 2, 3);
    CHECK(want_bytes > ds4_gguf_file_bytes(g) / 8, "the slice is a large share of the file");
    const uint64_t before = ds4_process_rss_bytes();
    ds4_layer_slice two = {2, 3, false};
    ds4_model *m = ds4_model_bind_slice(g, &two, err, sizeof err);
    CHECK(m != NULL, "%s", err);
    const uint64_t bound = ds4_process_rss_bytes();
    if (m) {
        (void)touch_slice(m);
        const uint64_t touched = ds4_process_rss_bytes();
        const double MiB = 1 << 20;
        printf("slice 2:3: %.2f MiB in the file, RSS +%.2f MiB at bind, +%.2f MiB after reading every view\n",
               want_bytes / MiB, (bound - before) / MiB, (touched - bound) / MiB);
        CHECK(bound - before < (uint64_t)(2 << 20), "binding touched %.1f MiB", (bound - before) / MiB);
        /* Fault-around maps up to 64 KiB of cached neighbours with each fault,
         * so the small vectors read at bind bring some matrix pages early and
         * the slice's edges a little of the next layer: bounds, not equality. */
        CHECK(touched - before >= want_bytes * 99 / 100 && touched - before <= want_bytes + (uint64_t)(2 << 20),
              "RSS grew %.2f MiB for a %.2f MiB slice of a %.2f MiB file", (touched - before) / MiB, want_bytes / MiB,
              ds4_gguf_file_bytes(g) / MiB);
        ds4_model_free(m);
    }
    ds4_gguf_close(g);
}

/* The split files hold exactly their range, with the whole file's shapes and types. */
static void test_split_files(void) {
    char err[512];
    ds4_gguf *whole = ds4_gguf_open(input("whole.gguf"), err, sizeof err);
    CHECK(whole != NULL, "%s", err);
    const struct { const char *file; int first, last; bool output; } parts[] = {
        {"slice-0-3.gguf", 0, 3, false}, {"slice-4-output.gguf", 4, 7, true}};
    size_t tensors_in_parts = 0;
    for (size_t i = 0; whole && i < 2; i++) {
        ds4_gguf *g = ds4_gguf_open(input(parts[i].file), err, sizeof err);
        CHECK(g != NULL, "%s: %s", parts[i].file, err);
        if (!g) continue;
        tensors_in_parts += ds4_gguf_n_tensors(g);
        for (size_t t = 0; t < ds4_gguf_n_tensors(g); t++) {
            const ds4_gguf_tensor *pt = ds4_gguf_tensor_at(g, t);
            char name[96];
            snprintf(name, sizeof name, "%.*s", (int)pt->name.len, pt->name.ptr);
            const ds4_gguf_tensor *wt = ds4_gguf_find_tensor(whole, name);
            CHECK(wt && wt->type == pt->type && !memcmp(wt->ne, pt->ne, sizeof wt->ne), "%s: %s", parts[i].file, name);
            int l;
            bool in = sscanf(name, "blk.%d.", &l) == 1 ? l >= parts[i].first && l <= parts[i].last
                      : !strcmp(name, "token_embd.weight") ? parts[i].first == 0
                      : parts[i].output;
            CHECK(in, "%s holds %s", parts[i].file, name);
        }
        ds4_model *m = ds4_model_bind(g, err, sizeof err);
        CHECK(m && m->slice.first == parts[i].first && m->slice.last == parts[i].last &&
              m->slice.output == parts[i].output, "%s binds its own range: %s", parts[i].file, m ? "" : err);
        ds4_model_free(m);
        ds4_layer_slice wider = {parts[i].first, parts[i].last, true};
        if (parts[i].first > 0) wider.first--;
        err[0] = 0;
        CHECK(!ds4_model_bind_slice(g, &wider, err, sizeof err) && strstr(err, "this file holds layers"),
              "%s refuses a wider slice: %s", parts[i].file, err);
        ds4_gguf_close(g);
    }
    /* every tensor of the whole file is in exactly one part */
    CHECK(whole && tensors_in_parts == ds4_gguf_n_tensors(whole), "%zu tensors in the parts", tensors_in_parts);
    ds4_gguf_close(whole);
}

static void test_partial_engine(void) {
    char err[512];
    ds4_engine_params p;
    ds4_engine_params_default(&p);
    p.model_path = input("slice-4-output.gguf");
    p.n_threads = 2;
    p.quiet = true;
    ds4_engine *e = ds4_engine_load(&p, err, sizeof err);
    CHECK(e != NULL, "%s", err);
    if (!e) return;
    ds4_session *s = ds4_session_new(e, 64, err, sizeof err);
    CHECK(s != NULL, "%s", err);
    const int32_t toks[] = {1, 2, 3};
    err[0] = 0;
    if (s) {
        CHECK(ds4_session_prefill(s, toks, 3, NULL, NULL, NULL, err, sizeof err) == -1 &&
              strstr(err, "holds layers 4..7 and the output head only"), "prefill refused: %s", err);
        CHECK(ds4_session_n_tokens(s) == 0, "session unchanged");
        ds4_session_free(s);
    }
    ds4_engine_free(e);
    p.layers = "2:output";
    err[0] = 0;
    CHECK(!ds4_engine_load(&p, err, sizeof err) && strstr(err, "this file holds layers 4..7"), "%s", err);
    p.model_path = input("whole.gguf");
    p.layers = "0:x";
    err[0] = 0;
    CHECK(!ds4_engine_load(&p, err, sizeof err) && strstr(err, "--layers 0:x"), "%s", err);
}

/* what the engine said while loading (base/log.h hook) */
static char said[4096];
static void hear(void *ud, ds4_log_level level, const char *text, size_t len) {
    (void)ud;
    (void)level;
    const size_t have = strlen(said);
    snprintf(said + have, sizeof said - have, "%.*s", (int)len, text);
}

/* Page-in at load follows what a process binds, not its role: a pipeline
 * worker over a range file (all the file holds) pages it in as any whole
 * model, and one over part of a bigger file does not (that would read the
 * other processes' layers). The attempt shows in the load lines: "weights
 * paged in", or "weights stay lazily mapped" where the kernel refuses. */
static bool pages_in(const char *file, const char *layers) {
    char err[512];
    ds4_engine_params p;
    ds4_engine_params_default(&p);
    p.model_path = input(file);
    p.layers = layers;
    p.n_threads = 2;
    p.dist.role = DS4_DIST_WORKER;
    said[0] = 0;
    ds4_log_set_hook(hear, NULL);
    ds4_engine *e = ds4_engine_load(&p, err, sizeof err);
    ds4_log_set_hook(NULL, NULL);
    CHECK(e != NULL, "%s %s: %s", file, layers, err);
    ds4_engine_free(e);
    return strstr(said, "ds4: weights paged in") || strstr(said, "ds4: weights stay lazily mapped");
}

static void test_page_in(void) {
    CHECK(pages_in("slice-4-output.gguf", "4:output"), "a worker over a range file pages it in: %s", said);
    CHECK(!pages_in("whole.gguf", "4:output"), "a worker over part of a whole file does not: %s", said);
}

int main(void) {
    test_parse();
    if (access(input("whole.gguf"), R_OK) || access(input("slice-0-3.gguf"), R_OK) ||
        access(input("slice-4-output.gguf"), R_OK))
        return check_skipped("test_layer_slice", "no $BUILD/dist models (make builds them for make test)");
    test_residency();
    test_bind_whole_file();
    test_split_files();
    test_partial_engine();
    test_page_in();
    return check_done("test_layer_slice");
}
