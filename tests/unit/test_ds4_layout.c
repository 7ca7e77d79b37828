/* ds4_layout: the table against the fact sheet's own totals for DeepSeek V4
 * Flash (section 4: 1328 tensors; section 5: q2 and q4 tensor bytes, which
 * pin every shape and type of the released mixes), spot shapes from the
 * section-4 tables, the released Flash and Pro tables against the model
 * cards' parameter counts, and a metadata write -> GGUF -> read round trip. */
#include "check.h"
#include "models/dsv4/ds4_layout.h"
#include "format/gguf.h"
#include "kernels/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void flash(ds4_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    hp->n_layer = 43; hp->n_ctx_train = 1048576; hp->n_embd = 4096; hp->n_vocab = 129280;
    hp->n_head = 64; hp->n_head_kv = 1; hp->key_length = hp->value_length = 512; hp->n_rot = 64;
    hp->q_lora_rank = 1024; hp->o_lora_rank = 1024; hp->o_groups = 8; hp->sliding_window = 128;
    for (uint32_t l = 0; l < 43; l++) {
        hp->compress_ratio[l] = l < 2 ? 0 : l % 2 ? 128 : 4;
        hp->swiglu_clamp_exp[l] = hp->swiglu_clamp_shexp[l] = 10.0f;
    }
    hp->compress_rope_base = 160000; hp->rope_base = 10000; hp->yarn_factor = 16;
    hp->yarn_orig_ctx = 65536; hp->yarn_beta_fast = 32; hp->yarn_beta_slow = 1; hp->rms_eps = 1e-6f;
    hp->idx_n_head = 64; hp->idx_head_dim = 128; hp->idx_topk = 512;
    hp->hc_count = 4; hp->hc_sinkhorn_iters = 20; hp->hc_eps = 1e-6f;
    hp->n_expert = 256; hp->n_expert_used = 6; hp->expert_ff = 2048; hp->n_expert_shared = 1;
    hp->n_hash_layer = 3; hp->expert_weights_scale = 1.5f; hp->expert_weights_norm = true;
    hp->expert_gating_func = 4; hp->nextn_predict_layers = 1;
    ds4_hparams_default_kinds(hp);
}

static int shape_is(const ds4_hparams *hp, enum ds4_tensor_id id, int l, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t ne[4];
    ds4_tensor_shape(hp, id, l, ne);
    return ne[0] == a && ne[1] == b && ne[2] == c && ne[3] == 1;
}

/* Parameters (elements) of every tensor, of the routed experts, of the embedding. */
static void count_params(const ds4_hparams *hp, double *total, double *routed, double *embd) {
    *total = *routed = *embd = 0;
    for (int l = -1; l < (int)hp->n_layer; l++)
        for (int id = 0; id < DS4_T_COUNT; id++) {
            if (!ds4_tensor_present(hp, id, l)) continue;
            uint64_t ne[4];
            ds4_tensor_shape(hp, id, l, ne);
            const double n = (double)ne[0] * ne[1] * ne[2] * ne[3];
            *total += n;
            if (id == DS4_T_TOKEN_EMBD) *embd = n;
            if (ds4_tensor_table[id].cls == DS4_TC_EXP_GATE_UP || ds4_tensor_table[id].cls == DS4_TC_EXP_DOWN)
                *routed += n;
        }
}

/* The released models' tables (ds4_hparams_v4) against independent numbers:
 * Flash field by field against this file's transcription of the sheet, and
 * both models' parameter totals against their model cards (Flash 284B total
 * / 13B active, Pro 1.6T / 49B, given to two digits: within 3%); a token's
 * active parameters are the non-routed weights but the embedding (a row
 * lookup) and 6 of the routed experts (the sheet's 13.27B for Flash). */
static void test_released_tables(void) {
    ds4_hparams got, want;
    char err[256];
    ds4_hparams_v4(&got, DS4_V4_FLASH);
    flash(&want);
    want.nextn_predict_layers = 0;       /* the GGUFs carry no MTP block */
    CHECK(memcmp(&got, &want, sizeof got) == 0, "ds4_hparams_v4(FLASH) differs from the sheet's Flash");
    const struct { enum ds4_v4_model m; const char *name; double total, active; uint32_t layers; } cards[] = {
        {DS4_V4_FLASH, "Flash", 284e9, 13e9, 43}, {DS4_V4_PRO, "Pro", 1.6e12, 49e9, 61}};
    for (int i = 0; i < 2; i++) {
        ds4_hparams hp;
        ds4_hparams_v4(&hp, cards[i].m);
        CHECK(ds4_hparams_check(&hp, err, sizeof err) == 0, "%s rejected: %s", cards[i].name, err);
        double total, routed, embd;
        count_params(&hp, &total, &routed, &embd);
        const double active = total - routed - embd + routed * hp.n_expert_used / hp.n_expert;
        printf("%s: %.4g parameters (%.4g routed), %.4g active per token\n", cards[i].name, total, routed, active);
        CHECK(hp.n_layer == cards[i].layers, "%s: %u layers", cards[i].name, hp.n_layer);
        CHECK(total > cards[i].total * 0.97 && total < cards[i].total * 1.03, "%s: %.4g parameters, card says %.3g",
              cards[i].name, total, cards[i].total);
        CHECK(active > cards[i].active * 0.97 && active < cards[i].active * 1.03, "%s: %.4g active, card says %.3g",
              cards[i].name, active, cards[i].active);
    }
    ds4_hparams pro;
    ds4_hparams_v4(&pro, DS4_V4_PRO);
    CHECK(shape_is(&pro, DS4_T_ATTN_OUTPUT_A, 0, 4096, 16384, 1), "Pro attn_output_a: 16 groups of 8 heads x 512 -> 1024");
    CHECK(shape_is(&pro, DS4_T_ATTN_OUTPUT_B, 0, 16384, 7168, 1), "Pro attn_output_b");
    CHECK(shape_is(&pro, DS4_T_ATTN_Q_B, 0, 1536, 65536, 1), "Pro attn_q_b");
    CHECK(shape_is(&pro, DS4_T_FFN_GATE_EXPS, 10, 7168, 3072, 384), "Pro routed gate");
    CHECK(pro.compress_ratio[0] == 128 && pro.compress_ratio[1] == 128 && ds4_tensor_present(&pro, DS4_T_COMP_KV, 0),
          "Pro's first layers compress by 128 (no raw-window-only layer)");
    int csa = 0;
    for (uint32_t l = 0; l < pro.n_layer; l++) csa += pro.compress_ratio[l] == 4;
    CHECK(csa == 30 && pro.idx_topk == 1024 && pro.n_hash_layer == 3, "Pro: %d ratio-4 layers", csa);
    /* the released Pro halves: every tensor of the model is in exactly one */
    size_t n_whole = 0, n_halves = 0;
    for (int l = -1; l < (int)pro.n_layer; l++)
        for (int id = 0; id < DS4_T_COUNT; id++) {
            if (!ds4_tensor_present(&pro, id, l)) continue;
            n_whole++;
            n_halves += ds4_tensor_in_slice(id, l, 0, 30, false) + ds4_tensor_in_slice(id, l, 31, 60, true);
        }
    CHECK(n_whole == n_halves, "Layers00-30 + Layers31-output hold %zu of %zu tensors", n_halves, n_whole);
}

/* Writes hp's metadata to a GGUF file and reads it back: equal, with
 * extra_keys keys besides the table and general.architecture. */
static void roundtrip(const ds4_hparams *hp, size_t extra_keys) {
    char err[256], path[] = "/tmp/ds4_layout_testXXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    ds4_gguf_writer *w = ds4_gguf_writer_new(32);
    ds4_hparams_write(w, hp);
    CHECK(ds4_gguf_writer_write_file(w, path, NULL, NULL, err, sizeof err) == 0, "write: %s", err);
    ds4_gguf_writer_free(w);
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "open: %s", err);
    if (g) {
        ds4_hparams back;
        CHECK(ds4_hparams_read(g, &back, err, sizeof err) == 0, "read: %s", err);
        CHECK(memcmp(&back, hp, sizeof *hp) == 0, "hparams differ after the round trip");
        ds4_gguf_str s;
        CHECK(ds4_gguf_get_str(g, "general.architecture", &s) && s.len == 9 && !memcmp(s.ptr, "deepseek4", 9),
              "architecture");
        CHECK(ds4_gguf_n_kv(g) == ds4_n_hparam_keys + 1 + extra_keys, "%zu keys", ds4_gguf_n_kv(g));
        CHECK((ds4_gguf_find_kv(g, DS4_KEY_LAYER_KINDS) != NULL) == (extra_keys == 1), "kinds key");
        ds4_gguf_close(g);
    }
    unlink(path);
}

int main(void) {
    test_released_tables();
    ds4_hparams hp;
    flash(&hp);
    char err[256];
    CHECK(ds4_hparams_check(&hp, err, sizeof err) == 0, "flash rejected: %s", err);

    size_t n = 0;
    uint64_t bytes[2] = {0, 0};
    const enum ds4_mix mixes[2] = {DS4_MIX_Q2, DS4_MIX_Q4};
    for (int l = -1; l < 43; l++)
        for (int id = 0; id < DS4_T_COUNT; id++) {
            if (!ds4_tensor_present(&hp, id, l)) continue;
            n++;
            uint64_t ne[4];
            ds4_tensor_shape(&hp, id, l, ne);
            for (int m = 0; m < 2; m++)
                bytes[m] += ds4_type_row_bytes(ds4_tensor_type(id, mixes[m]), ne[0]) * ne[1] * ne[2] * ne[3];
        }
    CHECK(n == 1328, "Flash tensor count %zu, sheet says 1328", n);
    CHECK(bytes[0] == 86714775900ull, "q2 tensor bytes %llu, sheet says 86714775900", (unsigned long long)bytes[0]);
    CHECK(bytes[1] == 164628167004ull, "q4 tensor bytes %llu, sheet says 164628167004", (unsigned long long)bytes[1]);

    /* spot checks from the section-4 tables */
    CHECK(shape_is(&hp, DS4_T_ATTN_Q_B, 0, 1024, 32768, 1), "attn_q_b");
    CHECK(shape_is(&hp, DS4_T_ATTN_OUTPUT_A, 0, 4096, 8192, 1), "attn_output_a");
    CHECK(shape_is(&hp, DS4_T_HC_ATTN_FN, 0, 16384, 24, 1), "hc_attn_fn");
    CHECK(shape_is(&hp, DS4_T_FFN_DOWN_EXPS, 5, 2048, 4096, 256), "ffn_down_exps");
    CHECK(shape_is(&hp, DS4_T_FFN_GATE_TID2EID, 1, 6, 129280, 1), "tid2eid");
    CHECK(shape_is(&hp, DS4_T_COMP_APE, 2, 1024, 4, 1), "ratio-4 ape");
    CHECK(shape_is(&hp, DS4_T_COMP_APE, 3, 512, 128, 1), "ratio-128 ape");
    CHECK(shape_is(&hp, DS4_T_IDX_Q_B, 4, 1024, 8192, 1), "indexer q_b");
    CHECK(shape_is(&hp, DS4_T_IDX_COMP_KV, 4, 4096, 256, 1), "indexer compressor kv");
    CHECK(!ds4_tensor_present(&hp, DS4_T_IDX_PROJ, 3) && ds4_tensor_present(&hp, DS4_T_IDX_PROJ, 2),
          "indexer only on ratio-4 layers");
    CHECK(!ds4_tensor_present(&hp, DS4_T_EXP_PROBS_B, 2) && ds4_tensor_present(&hp, DS4_T_EXP_PROBS_B, 3),
          "exp_probs_b only on top-k layers");
    CHECK(!ds4_tensor_present(&hp, DS4_T_COMP_KV, 1), "no compressor on ratio-0 layers");
    char name[96];
    ds4_tensor_name(DS4_T_IDX_COMP_APE, 42, name, sizeof name);
    CHECK(!strcmp(name, "blk.42.indexer_compressor_ape.weight"), "name %s", name);
    ds4_tensor_name(DS4_T_OUTPUT_HC_FN, -1, name, sizeof name);
    CHECK(!strcmp(name, "output_hc_fn.weight"), "name %s", name);
    CHECK(ds4_tensor_type(DS4_T_ATTN_NORM, DS4_MIX_F16) == DS4_TYPE_F32, "norms stay F32");
    CHECK(ds4_tensor_type(DS4_T_TOKEN_EMBD, DS4_MIX_Q8_0) == DS4_TYPE_F16, "q8_0 mix keeps F16 class");
    CHECK(ds4_mix_from_name("Q8_0") == DS4_MIX_Q8_0 && ds4_mix_from_name("q3") == -1, "mix names");

    /* metadata round trip through a real GGUF file */
    hp.compress_ratio[7] = 16;           /* distinguishable per-layer values */
    hp.swiglu_clamp_shexp[5] = 7.5f;
    roundtrip(&hp, 0);
    /* layers whose kind the ratio does not imply (a CSA layer compressing by
     * 8, an HCA one by 4) add the kinds array, and only then */
    hp.compress_ratio[4] = 8;
    hp.compress_ratio[5] = 4;
    CHECK(ds4_layer_indexed(&hp, 4) && ds4_layer_coff(&hp, 4) == 2 && !ds4_layer_indexed(&hp, 5) &&
          ds4_layer_coff(&hp, 5) == 1, "the kind, not the ratio, decides overlap and indexer");
    CHECK(shape_is(&hp, DS4_T_COMP_APE, 4, 2 * 512, 8, 1) && shape_is(&hp, DS4_T_COMP_APE, 5, 512, 4, 1) &&
          shape_is(&hp, DS4_T_IDX_COMP_APE, 4, 2 * 128, 8, 1) && !ds4_tensor_present(&hp, DS4_T_IDX_Q_B, 5),
          "compressor shapes follow the kind");
    roundtrip(&hp, 1);
    hp.attn_kind[5] = DS4_ATTN_WINDOW;
    CHECK(ds4_hparams_check(&hp, err, sizeof err) != 0 && strstr(err, "layer 5: attention kind 0"), "kind: %s", err);
    hp.attn_kind[5] = DS4_ATTN_HCA;

    hp.o_groups = 7;
    CHECK(ds4_hparams_check(&hp, err, sizeof err) != 0 && strstr(err, "output_group_count"), "groups: %s", err);
    return check_done("ds4_layout");
}
