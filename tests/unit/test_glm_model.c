/* test_glm_model.c -- the GLM 5.2 (glm-dsa) layout and binder.
 * - The layout with GLM 5.2's real hyperparameters gives exactly the tensor
 *   names, block ranges and GGUF shapes the fact sheet lists for the
 *   released files (docs glm-5.2-model.md section 4.1: 1809 tensors with the
 *   indexer on all 79 blocks), and the default indexer schedule is the
 *   published full-layer list 0,1,2,6,...,74.
 * - A small GLM file written through the layout binds; every hyperparameter
 *   round-trips through the metadata (indexer.types key included).
 * - Bad files give one "not a GLM 5.2 GGUF: ..." line naming the problem:
 *   dropped / misshaped / mistyped tensors, a missing key, a wrong gating
 *   function, a bad indexer.types array (ds4_engine_load gives the same
 *   line for each); the DeepSeek binder refuses a GLM
 *   file naming its architecture. Indexer tensors may be missing on shared
 *   layers, not on full ones.
 * - transformers' tiny GLM (tests/fixtures/glmtiny/A) converted by make test
 *   ($BUILD/glmtiny/A-<type>.gguf) binds with config.json's values in f32,
 *   f16 and q8_0. */
#include "check.h"
#include "engine/engine.h"
#include "format/gguf.h"
#include "models/glm/glm_layout.h"
#include "models/glm/glm_model.h"
#include "models/dsv4/model.h"
#include "kernels/quant.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* GLM 5.2's config.json values (fact sheet section 2), 78 trunk layers + MTP. */
static void glm52(glm_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    hp->n_block = 79; hp->n_nextn = 1; hp->n_ctx_train = 1048576;
    hp->n_embd = 6144; hp->n_vocab = 154880; hp->n_head = 64; hp->n_head_kv = 1;
    hp->key_length = 576; hp->value_length = 512; hp->key_length_mla = 256; hp->value_length_mla = 256;
    hp->n_rot = 64; hp->q_lora_rank = 2048; hp->kv_lora_rank = 512;
    hp->dense_ff = 12288; hp->n_leading_dense = 3;
    hp->n_expert = 256; hp->n_expert_used = 8; hp->expert_ff = 2048; hp->n_expert_shared = 1;
    hp->n_expert_groups = 1; hp->n_expert_groups_used = 1;
    hp->expert_weights_scale = 2.5f; hp->expert_weights_norm = true; hp->expert_gating_func = 2;
    hp->rope_base = 8e6f; hp->rms_eps = 1e-5f;
    hp->idx_n_head = 32; hp->idx_head_dim = 128; hp->idx_topk = 2048;
    ds4_glm_default_indexer_types(hp);
}

typedef struct { const char *name; uint64_t ne[3]; } sheet_tensor;

static const sheet_tensor *sheet_find(const sheet_tensor *t, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++) if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

static void test_real_layout(void) {
    glm_hparams hp;
    glm52(&hp);
    char err[256];
    CHECK(ds4_glm_hparams_check(&hp, err, sizeof err) == 0, "GLM 5.2 hparams: %s", err);
    /* sheet section 2: full indexer layers */
    static const int full[] = {0, 1, 2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58, 62, 66, 70, 74};
    int n_full = 0;
    for (int l = 0; l < 78; l++) {
        bool want = false;
        for (size_t i = 0; i < sizeof full / sizeof full[0]; i++) want |= full[i] == l;
        CHECK(hp.indexer_full[l] == want, "layer %d full %d", l, hp.indexer_full[l]);
        n_full += hp.indexer_full[l];
    }
    CHECK(n_full == 21, "%d full layers", n_full);
    /* a short-context file (GLM 5 / 5.1) has every layer full */
    hp.n_ctx_train = 202752;
    ds4_glm_default_indexer_types(&hp);
    int all = 0;
    for (int l = 0; l < 78; l++) all += hp.indexer_full[l];
    CHECK(all == 78, "short context: %d full", all);
    glm52(&hp);

    /* sheet section 4.1, GGUF order */
    static const sheet_tensor global[] = {
        {"token_embd.weight", {6144, 154880, 1}}, {"output_norm.weight", {6144, 1, 1}},
        {"output.weight", {6144, 154880, 1}}};
    static const sheet_tensor block[] = {
        {"attn_norm.weight", {6144, 1, 1}}, {"attn_q_a.weight", {6144, 2048, 1}},
        {"attn_q_a_norm.weight", {2048, 1, 1}}, {"attn_q_b.weight", {2048, 16384, 1}},
        {"attn_kv_a_mqa.weight", {6144, 576, 1}}, {"attn_kv_a_norm.weight", {512, 1, 1}},
        {"attn_k_b.weight", {192, 512, 64}}, {"attn_v_b.weight", {512, 256, 64}},
        {"attn_output.weight", {16384, 6144, 1}}, {"ffn_norm.weight", {6144, 1, 1}},
        {"indexer.attn_q_b.weight", {2048, 4096, 1}}, {"indexer.attn_k.weight", {6144, 128, 1}},
        {"indexer.k_norm.weight", {128, 1, 1}}, {"indexer.k_norm.bias", {128, 1, 1}},
        {"indexer.proj.weight", {6144, 32, 1}}};
    static const sheet_tensor dense[] = {
        {"ffn_gate.weight", {6144, 12288, 1}}, {"ffn_up.weight", {6144, 12288, 1}},
        {"ffn_down.weight", {12288, 6144, 1}}};
    static const sheet_tensor moe[] = {
        {"ffn_gate_inp.weight", {6144, 256, 1}}, {"exp_probs_b.bias", {256, 1, 1}},
        {"ffn_gate_exps.weight", {6144, 2048, 256}}, {"ffn_up_exps.weight", {6144, 2048, 256}},
        {"ffn_down_exps.weight", {2048, 6144, 256}}, {"ffn_gate_shexp.weight", {6144, 2048, 1}},
        {"ffn_up_shexp.weight", {6144, 2048, 1}}, {"ffn_down_shexp.weight", {2048, 6144, 1}}};
    static const sheet_tensor nextn[] = {
        {"nextn.eh_proj.weight", {12288, 6144, 1}}, {"nextn.enorm.weight", {6144, 1, 1}},
        {"nextn.hnorm.weight", {6144, 1, 1}}, {"nextn.shared_head_norm.weight", {6144, 1, 1}}};
    size_t n_tensors = 0;
    for (int l = -1; l < 79; l++)
        for (int id = 0; id < GLM_T_COUNT; id++) {
            if (!ds4_glm_tensor_present(&hp, (enum glm_tensor_id)id, l)) continue;
            n_tensors++;
            char name[160];
            uint64_t ne[4];
            ds4_glm_tensor_name((enum glm_tensor_id)id, l, name, sizeof name);
            ds4_glm_tensor_shape(&hp, (enum glm_tensor_id)id, l, ne);
            const char *suffix = name;
            if (l >= 0) {
                char prefix[32];
                snprintf(prefix, sizeof prefix, "blk.%d.", l);
                CHECK(!strncmp(name, prefix, strlen(prefix)), "%s prefix", name);
                suffix = name + strlen(prefix);
            }
            const sheet_tensor *s = l < 0 ? sheet_find(global, 3, suffix) : sheet_find(block, 15, suffix);
            if (!s && l >= 0 && l < 3) s = sheet_find(dense, 3, suffix);
            if (!s && l >= 3) s = sheet_find(moe, 8, suffix);
            if (!s && l == 78) s = sheet_find(nextn, 4, suffix);
            CHECK(s != NULL, "%s is not in the sheet's inventory for block %d", name, l);
            if (s) CHECK(ne[0] == s->ne[0] && ne[1] == s->ne[1] && ne[2] == s->ne[2],
                         "%s shape [%llu,%llu,%llu]", name, (unsigned long long)ne[0],
                         (unsigned long long)ne[1], (unsigned long long)ne[2]);
        }
    CHECK(n_tensors == 1809, "%zu tensors, the released files have 1809", n_tensors);
}

/* ---- a small file through the layout ---- */

static void tiny(glm_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    hp->n_block = 5; hp->n_nextn = 1; hp->n_ctx_train = 4096;
    hp->n_embd = 64; hp->n_vocab = 96; hp->n_head = 2; hp->n_head_kv = 1;
    hp->key_length = 48; hp->value_length = 32; hp->key_length_mla = 48; hp->value_length_mla = 32;
    hp->n_rot = 16; hp->q_lora_rank = 32; hp->kv_lora_rank = 32;
    hp->dense_ff = 96; hp->n_leading_dense = 1;
    hp->n_expert = 4; hp->n_expert_used = 2; hp->expert_ff = 32; hp->n_expert_shared = 1;
    hp->n_expert_groups = 1; hp->n_expert_groups_used = 1;
    hp->expert_weights_scale = 2.5f; hp->expert_weights_norm = true; hp->expert_gating_func = 2;
    hp->rope_base = 8e6f; hp->rms_eps = 1e-5f;
    hp->idx_n_head = 4; hp->idx_head_dim = 32; hp->idx_topk = 8;
    hp->indexer_types_key = true;
    hp->indexer_full[0] = hp->indexer_full[2] = true;   /* 1 and 3 share */
}

typedef struct {
    const char *drop, *reshape, *retype;
    const char *arch;                     /* replaces general.architecture */
    void (*edit)(glm_hparams *);          /* metadata edit (tensors stay) */
    const char *skip_key;                 /* metadata key left out */
} mutation;

static bool write_tiny(const char *path, const glm_hparams *src, const mutation *mu) {
    glm_hparams hp = *src, meta = *src;
    if (mu && mu->edit) mu->edit(&meta);
    ds4_gguf_writer *w = ds4_gguf_writer_new(32);
    if (mu && (mu->arch || mu->skip_key)) {
        /* hand-written metadata: every key but the skipped one */
        ds4_gguf_w_str(w, "general.architecture", mu->arch ? mu->arch : GLM_ARCH);
        for (size_t i = 0; i < ds4_glm_n_hparam_keys; i++) {
            const ds4_hparam_key *k = &ds4_glm_hparam_keys[i];
            if (mu->skip_key && !strcmp(k->key, mu->skip_key)) continue;
            ds4_hparam_table_write(w, k, 1, &meta, meta.n_block);
        }
    } else {
        ds4_glm_hparams_write(w, &meta);
    }
    ds4_gguf_w_str(w, "general.name", "glm tiny");
    static float zeros[1 << 16];
    for (int l = -1; l < (int)hp.n_block; l++)
        for (int id = 0; id < GLM_T_COUNT; id++) {
            if (!ds4_glm_tensor_present(&hp, (enum glm_tensor_id)id, l)) continue;
            char name[160];
            uint64_t ne[4];
            ds4_glm_tensor_name((enum glm_tensor_id)id, l, name, sizeof name);
            int nd = ds4_glm_tensor_shape(&hp, (enum glm_tensor_id)id, l, ne);
            if (mu && mu->drop && !strcmp(name, mu->drop)) continue;
            if (mu && mu->reshape && !strcmp(name, mu->reshape)) ne[nd > 1 ? 1 : 0]--;
            uint32_t type = mu && mu->retype && !strcmp(name, mu->retype) ? DS4_TYPE_I32 : DS4_TYPE_F32;
            if (ne[0] * ne[1] * ne[2] > sizeof zeros / sizeof zeros[0]) { ds4_gguf_writer_free(w); return false; }
            ds4_gguf_w_tensor(w, name, type, (uint32_t)nd, ne, zeros);
        }
    char err[256];
    int rc = ds4_gguf_writer_write_file(w, path, NULL, NULL, err, sizeof err);
    if (rc) fprintf(stderr, "write %s: %s\n", path, err);
    ds4_gguf_writer_free(w);
    return rc == 0;
}

static glm_model *bind_file(const char *path, ds4_gguf **g, char *err, size_t errlen) {
    *g = ds4_gguf_open(path, err, errlen);
    if (!*g) return NULL;
    glm_model *m = ds4_glm_model_bind(*g, err, errlen);
    if (!m) { ds4_gguf_close(*g); *g = NULL; }
    return m;
}

static void test_roundtrip(const char *tmp) {
    glm_hparams hp;
    tiny(&hp);
    char err[512];
    CHECK(ds4_glm_hparams_check(&hp, err, sizeof err) == 0, "tiny: %s", err);
    CHECK(write_tiny(tmp, &hp, NULL), "write");
    ds4_gguf *g;
    glm_model *m = bind_file(tmp, &g, err, sizeof err);
    CHECK(m != NULL, "bind: %s", err);
    if (!m) return;
    CHECK(ds4_glm_gguf_is_glm(g), "is glm");
    CHECK(memcmp(&m->hp, &hp, sizeof hp) == 0, "hparams round-trip");
    CHECK(!strcmp(m->name, "glm tiny"), "name %s", m->name);
    for (int l = 0; l < 5; l++) {
        const glm_layer *L = &m->layers[l];
        bool full = l < 4 && hp.indexer_full[l];
        CHECK((L->idx_q_b.data != NULL) == full && (L->idx_proj != NULL) == full, "indexer bound layer %d", l);
        CHECK((L->ffn_gate.data != NULL) == (l == 0), "dense layer %d", l);
        CHECK((L->gate_exps.data != NULL) == (l > 0) && (L->exp_probs_b != NULL) == (l > 0), "moe layer %d", l);
        CHECK((L->eh_proj.data != NULL) == (l == 4) && (L->shared_head_norm != NULL) == (l == 4), "nextn %d", l);
        CHECK(L->nextn_embed.data == NULL && L->nextn_head.data == NULL, "no extra MTP head %d", l);
    }
    CHECK(m->layers[2].k_b.ne[0] == 32 && m->layers[2].k_b.ne[1] == 32 && m->layers[2].k_b.ne[2] == 2, "k_b view");
    ds4_model *dm = ds4_model_bind(g, err, sizeof err);
    CHECK(dm == NULL && strstr(err, "not a DeepSeek V4 GGUF") && strstr(err, "\"glm-dsa\""),
          "DeepSeek binder on a GLM file: %s", err);
    ds4_model_free(dm);
    ds4_glm_model_free(m);
    ds4_gguf_close(g);
}

static void expect_error(const char *tmp, const mutation *mu, const char *want) {
    glm_hparams hp;
    tiny(&hp);
    char err[512] = "";
    if (!write_tiny(tmp, &hp, mu)) { CHECK(false, "write for '%s'", want); return; }
    ds4_gguf *g;
    glm_model *m = bind_file(tmp, &g, err, sizeof err);
    CHECK(m == NULL, "'%s' should fail", want);
    CHECK(!strncmp(err, "not a GLM 5.2 GGUF: ", 20) && strstr(err, want) && !strchr(err, '\n'),
          "error '%s' should name '%s'", err, want);
    ds4_glm_model_free(m);
    if (g) ds4_gguf_close(g);
    /* the engine refuses a glm-dsa file with the same line (another
     * architecture goes to the DeepSeek binder, which names it) */
    if (mu->arch) return;
    ds4_engine_params p;
    ds4_engine_params_default(&p);
    p.model_path = tmp;
    p.quiet = true;
    char eerr[512] = "";
    ds4_engine *e = ds4_engine_load(&p, eerr, sizeof eerr);
    CHECK(e == NULL && !strcmp(eerr, err), "engine on '%s': %s", want, eerr);
    ds4_engine_free(e);
}

static void gating_softmax(glm_hparams *hp) { hp->expert_gating_func = 1; }
static void two_kv_heads(glm_hparams *hp) { hp->n_head_kv = 2; }
static void shared_first(glm_hparams *hp) { hp->indexer_full[0] = false; }
static void grouped(glm_hparams *hp) { hp->n_expert_groups = 8; }

static void test_bad_files(const char *tmp) {
    expect_error(tmp, &(mutation){.drop = "blk.3.ffn_gate_inp.weight"}, "missing tensor blk.3.ffn_gate_inp.weight");
    expect_error(tmp, &(mutation){.drop = "blk.2.indexer.attn_k.weight"}, "missing tensor blk.2.indexer.attn_k.weight");
    expect_error(tmp, &(mutation){.drop = "blk.4.nextn.eh_proj.weight"}, "missing tensor blk.4.nextn.eh_proj.weight");
    expect_error(tmp, &(mutation){.drop = "output.weight"}, "missing tensor output.weight");
    expect_error(tmp, &(mutation){.reshape = "blk.1.attn_k_b.weight"}, "blk.1.attn_k_b.weight has shape");
    expect_error(tmp, &(mutation){.reshape = "blk.0.ffn_down.weight"}, "blk.0.ffn_down.weight has shape");
    expect_error(tmp, &(mutation){.retype = "blk.2.attn_q_b.weight"}, "blk.2.attn_q_b.weight has type I32");
    expect_error(tmp, &(mutation){.retype = "blk.1.attn_kv_a_norm.weight"}, "blk.1.attn_kv_a_norm.weight must be");
    expect_error(tmp, &(mutation){.arch = "llama"}, "general.architecture is not \"glm-dsa\"");
    expect_error(tmp, &(mutation){.skip_key = "glm-dsa.attention.kv_lora_rank"}, "missing key glm-dsa.attention.kv_lora_rank");
    expect_error(tmp, &(mutation){.edit = gating_softmax}, "expert_gating_func 1");
    expect_error(tmp, &(mutation){.edit = two_kv_heads}, "head_count_kv is 2");
    expect_error(tmp, &(mutation){.edit = shared_first}, "trunk layer 0 is a shared indexer layer");
    expect_error(tmp, &(mutation){.edit = grouped}, "expert_group_count 8");

    /* indexer tensors of a shared layer are not needed */
    glm_hparams hp;
    tiny(&hp);
    char err[512];
    CHECK(write_tiny(tmp, &hp, &(mutation){.drop = "blk.3.indexer.attn_q_b.weight"}), "write");
    ds4_gguf *g;
    glm_model *m = bind_file(tmp, &g, err, sizeof err);
    CHECK(m != NULL, "shared layer without indexer: %s", err);
    ds4_glm_model_free(m);
    if (g) ds4_gguf_close(g);

    /* indexer.types must have one entry per trunk layer */
    ds4_gguf_writer *w = ds4_gguf_writer_new(32);
    hp.indexer_types_key = false;
    ds4_glm_hparams_write(w, &hp);
    const bool types[3] = {true, false, true};
    ds4_gguf_w_arr(w, "glm-dsa.attention.indexer.types", DS4_GGUF_BOOL, types, 3);
    CHECK(ds4_gguf_writer_write_file(w, tmp, NULL, NULL, err, sizeof err) == 0, "write: %s", err);
    ds4_gguf_writer_free(w);
    g = ds4_gguf_open(tmp, err, sizeof err);
    m = g ? ds4_glm_model_bind(g, err, sizeof err) : NULL;
    CHECK(m == NULL && strstr(err, "indexer.types must be an array of 4 entries"), "short types: %s", err);
    ds4_glm_model_free(m);
    if (g) ds4_gguf_close(g);
}

/* ---- the converted transformers fixture ---- */

static int jint(const cJSON *o, const char *k) { return cJSON_GetObjectItem(o, k)->valueint; }

static void test_fixture(const char *type) {
    char path[512], err[512];
    const char *b = getenv("BUILD");
    snprintf(path, sizeof path, "%s/glmtiny/A-%s.gguf", b ? b : "build", type);
    FILE *f = fopen("tests/fixtures/glmtiny/A/config.json", "rb");
    CHECK(f != NULL, "config.json");
    if (!f) return;
    char buf[1 << 14];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    ds4_gguf *g;
    glm_model *m = bind_file(path, &g, err, sizeof err);
    CHECK(m != NULL, "bind %s: %s", path, err);
    if (m) {
        const glm_hparams *hp = &m->hp;
        CHECK(hp->n_block == (uint32_t)jint(j, "num_hidden_layers") && hp->n_nextn == 0, "blocks %u", hp->n_block);
        CHECK(hp->n_embd == (uint32_t)jint(j, "hidden_size") && hp->n_vocab == (uint32_t)jint(j, "vocab_size"), "embd/vocab");
        CHECK(hp->n_head == (uint32_t)jint(j, "num_attention_heads") && hp->n_head_kv == 1, "heads");
        CHECK(hp->n_rot == (uint32_t)jint(j, "qk_rope_head_dim") &&
              hp->key_length_mla == (uint32_t)(jint(j, "qk_nope_head_dim") + jint(j, "qk_rope_head_dim")) &&
              hp->value_length_mla == (uint32_t)jint(j, "v_head_dim"), "head dims");
        CHECK(hp->q_lora_rank == (uint32_t)jint(j, "q_lora_rank") && hp->kv_lora_rank == (uint32_t)jint(j, "kv_lora_rank"),
              "lora ranks");
        CHECK(hp->n_leading_dense == (uint32_t)jint(j, "first_k_dense_replace") &&
              hp->dense_ff == (uint32_t)jint(j, "intermediate_size"), "dense layers");
        CHECK(hp->n_expert == (uint32_t)jint(j, "n_routed_experts") &&
              hp->n_expert_used == (uint32_t)jint(j, "num_experts_per_tok") &&
              hp->expert_ff == (uint32_t)jint(j, "moe_intermediate_size"), "experts");
        CHECK(hp->idx_n_head == (uint32_t)jint(j, "index_n_heads") && hp->idx_head_dim == (uint32_t)jint(j, "index_head_dim") &&
              hp->idx_topk == (uint32_t)jint(j, "index_topk"), "indexer");
        CHECK(fabsf(hp->expert_weights_scale - (float)cJSON_GetObjectItem(j, "routed_scaling_factor")->valuedouble) < 1e-6f &&
              fabsf(hp->rms_eps - (float)cJSON_GetObjectItem(j, "rms_norm_eps")->valuedouble) < 1e-12f, "scale/eps");
        const cJSON *it = cJSON_GetObjectItem(j, "indexer_types");
        for (uint32_t l = 0; l < hp->n_block; l++) {
            bool full = !strcmp(cJSON_GetArrayItem(it, (int)l)->valuestring, "full");
            CHECK(hp->indexer_full[l] == full, "%s: indexer type of layer %u", type, l);
            CHECK((m->layers[l].idx_q_b.data != NULL) == full, "%s: indexer bound on layer %u", type, l);
        }
        ds4_glm_model_free(m);
        ds4_gguf_close(g);
    }
    cJSON_Delete(j);
}

int main(void) {
    ds4_quant_init();
    test_real_layout();
    char tmp[64];
    snprintf(tmp, sizeof tmp, "/tmp/ds4-test-glm-%d.gguf", (int)getpid());
    test_roundtrip(tmp);
    test_bad_files(tmp);
    unlink(tmp);
    test_fixture("f32");
    test_fixture("f16");
    test_fixture("q8_0");
    return check_done("test_glm_model");
}
