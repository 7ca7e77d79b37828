/* quant_iq2xxs.c -- IQ2_XXS: the format tables (facts of the format, from
 * tests/fixtures/quant/iq2xxs-tables.txt via tests/oracles/quant_gen_iq2xxs_tables.py)
 * and the importance-weighted grid-search quantizer. */
#include "kernels/quant.h"
#include "kernels/quant_internal.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

const uint64_t ds4_iq2xxs_grid[256] = {
    0x0808080808080808ull, 0x080808080808082bull, 0x0808080808081919ull, 0x0808080808082b08ull,
    0x0808080808082b2bull, 0x0808080808190819ull, 0x0808080808191908ull, 0x08080808082b0808ull,
    0x08080808082b082bull, 0x08080808082b2b08ull, 0x08080808082b2b2bull, 0x0808080819080819ull,
    0x0808080819081908ull, 0x0808080819190808ull, 0x0808080819192b08ull, 0x08080808192b0819ull,
    0x08080808192b1908ull, 0x080808082b080808ull, 0x080808082b08082bull, 0x080808082b082b2bull,
    0x080808082b2b082bull, 0x0808081908080819ull, 0x0808081908081908ull, 0x0808081908190808ull,
    0x0808081908191919ull, 0x0808081919080808ull, 0x080808192b081908ull, 0x080808192b192b08ull,
    0x0808082b08080808ull, 0x0808082b0808082bull, 0x0808082b082b082bull, 0x0808082b2b08082bull,
    0x0808190808080819ull, 0x0808190808081908ull, 0x0808190808190808ull, 0x08081908082b0819ull,
    0x08081908082b1908ull, 0x0808190819080808ull, 0x080819081908082bull, 0x0808190819082b08ull,
    0x08081908192b0808ull, 0x080819082b080819ull, 0x080819082b081908ull, 0x080819082b190808ull,
    0x080819082b2b1908ull, 0x0808191908080808ull, 0x080819190808082bull, 0x0808191908082b08ull,
    0x08081919082b0808ull, 0x080819191908192bull, 0x08081919192b2b19ull, 0x080819192b080808ull,
    0x080819192b190819ull, 0x0808192b08082b19ull, 0x0808192b08190808ull, 0x0808192b19080808ull,
    0x0808192b2b081908ull, 0x0808192b2b2b1908ull, 0x08082b0808080808ull, 0x08082b0808081919ull,
    0x08082b0808082b08ull, 0x08082b0808191908ull, 0x08082b08082b2b08ull, 0x08082b0819080819ull,
    0x08082b0819081908ull, 0x08082b0819190808ull, 0x08082b081919082bull, 0x08082b082b082b08ull,
    0x08082b1908081908ull, 0x08082b1919080808ull, 0x08082b2b0808082bull, 0x08082b2b08191908ull,
    0x0819080808080819ull, 0x0819080808081908ull, 0x0819080808190808ull, 0x08190808082b0819ull,
    0x0819080819080808ull, 0x08190808192b0808ull, 0x081908082b081908ull, 0x081908082b190808ull,
    0x081908082b191919ull, 0x0819081908080808ull, 0x0819081908082b08ull, 0x08190819082b0808ull,
    0x0819081919190808ull, 0x0819081919192b2bull, 0x081908192b080808ull, 0x0819082b082b1908ull,
    0x0819082b19081919ull, 0x0819190808080808ull, 0x0819190808082b08ull, 0x08191908082b0808ull,
    0x08191908082b1919ull, 0x0819190819082b19ull, 0x081919082b080808ull, 0x0819191908192b08ull,
    0x08191919192b082bull, 0x0819192b08080808ull, 0x0819192b0819192bull, 0x08192b0808080819ull,
    0x08192b0808081908ull, 0x08192b0808190808ull, 0x08192b0819080808ull, 0x08192b082b080819ull,
    0x08192b1908080808ull, 0x08192b1908081919ull, 0x08192b192b2b0808ull, 0x08192b2b19190819ull,
    0x082b080808080808ull, 0x082b08080808082bull, 0x082b080808082b2bull, 0x082b080819081908ull,
    0x082b0808192b0819ull, 0x082b08082b080808ull, 0x082b08082b08082bull, 0x082b0819082b2b19ull,
    0x082b081919082b08ull, 0x082b082b08080808ull, 0x082b082b0808082bull, 0x082b190808080819ull,
    0x082b190808081908ull, 0x082b190808190808ull, 0x082b190819080808ull, 0x082b19081919192bull,
    0x082b191908080808ull, 0x082b191919080819ull, 0x082b1919192b1908ull, 0x082b192b2b190808ull,
    0x082b2b0808082b08ull, 0x082b2b08082b0808ull, 0x082b2b082b191908ull, 0x082b2b2b19081908ull,
    0x1908080808080819ull, 0x1908080808081908ull, 0x1908080808190808ull, 0x1908080808192b08ull,
    0x19080808082b0819ull, 0x19080808082b1908ull, 0x1908080819080808ull, 0x1908080819082b08ull,
    0x190808081919192bull, 0x19080808192b0808ull, 0x190808082b080819ull, 0x190808082b081908ull,
    0x190808082b190808ull, 0x1908081908080808ull, 0x19080819082b0808ull, 0x19080819192b0819ull,
    0x190808192b080808ull, 0x190808192b081919ull, 0x1908082b08080819ull, 0x1908082b08190808ull,
    0x1908082b19082b08ull, 0x1908082b1919192bull, 0x1908082b192b2b08ull, 0x1908190808080808ull,
    0x1908190808082b08ull, 0x19081908082b0808ull, 0x190819082b080808ull, 0x190819082b192b19ull,
    0x190819190819082bull, 0x19081919082b1908ull, 0x1908192b08080808ull, 0x19082b0808080819ull,
    0x19082b0808081908ull, 0x19082b0808190808ull, 0x19082b0819080808ull, 0x19082b0819081919ull,
    0x19082b1908080808ull, 0x19082b1919192b08ull, 0x19082b19192b0819ull, 0x19082b192b08082bull,
    0x19082b2b19081919ull, 0x19082b2b2b190808ull, 0x1919080808080808ull, 0x1919080808082b08ull,
    0x1919080808190819ull, 0x1919080808192b19ull, 0x19190808082b0808ull, 0x191908082b080808ull,
    0x191908082b082b08ull, 0x1919081908081908ull, 0x191908191908082bull, 0x191908192b2b1908ull,
    0x1919082b2b190819ull, 0x191919082b190808ull, 0x191919082b19082bull, 0x1919191908082b2bull,
    0x1919192b08080819ull, 0x1919192b19191908ull, 0x19192b0808080808ull, 0x19192b0808190819ull,
    0x19192b0808192b19ull, 0x19192b08192b1908ull, 0x19192b1919080808ull, 0x19192b2b08082b08ull,
    0x192b080808081908ull, 0x192b080808190808ull, 0x192b080819080808ull, 0x192b0808192b2b08ull,
    0x192b081908080808ull, 0x192b081919191919ull, 0x192b082b08192b08ull, 0x192b082b192b0808ull,
    0x192b190808080808ull, 0x192b190808081919ull, 0x192b191908190808ull, 0x192b19190819082bull,
    0x192b19192b081908ull, 0x192b2b081908082bull, 0x2b08080808080808ull, 0x2b0808080808082bull,
    0x2b08080808082b2bull, 0x2b08080819080819ull, 0x2b0808082b08082bull, 0x2b08081908081908ull,
    0x2b08081908192b08ull, 0x2b08081919080808ull, 0x2b08082b08190819ull, 0x2b08190808080819ull,
    0x2b08190808081908ull, 0x2b08190808190808ull, 0x2b08190808191919ull, 0x2b08190819080808ull,
    0x2b081908192b0808ull, 0x2b08191908080808ull, 0x2b0819191908192bull, 0x2b0819192b191908ull,
    0x2b08192b08082b19ull, 0x2b08192b19080808ull, 0x2b08192b192b0808ull, 0x2b082b080808082bull,
    0x2b082b1908081908ull, 0x2b082b2b08190819ull, 0x2b19080808081908ull, 0x2b19080808190808ull,
    0x2b190808082b1908ull, 0x2b19080819080808ull, 0x2b1908082b2b0819ull, 0x2b1908190819192bull,
    0x2b1908192b080808ull, 0x2b19082b19081919ull, 0x2b19190808080808ull, 0x2b191908082b082bull,
    0x2b19190819081908ull, 0x2b19191919190819ull, 0x2b192b082b080819ull, 0x2b192b19082b0808ull,
    0x2b2b08080808082bull, 0x2b2b080819190808ull, 0x2b2b08082b081919ull, 0x2b2b081908082b19ull,
    0x2b2b082b08080808ull, 0x2b2b190808192b08ull, 0x2b2b2b0819190808ull, 0x2b2b2b1908081908ull,
};
const uint8_t ds4_ksigns_iq2xs[128] = {
    0x00, 0x81, 0x82, 0x03, 0x84, 0x05, 0x06, 0x87, 0x88, 0x09, 0x0a, 0x8b, 0x0c, 0x8d, 0x8e, 0x0f,
    0x90, 0x11, 0x12, 0x93, 0x14, 0x95, 0x96, 0x17, 0x18, 0x99, 0x9a, 0x1b, 0x9c, 0x1d, 0x1e, 0x9f,
    0xa0, 0x21, 0x22, 0xa3, 0x24, 0xa5, 0xa6, 0x27, 0x28, 0xa9, 0xaa, 0x2b, 0xac, 0x2d, 0x2e, 0xaf,
    0x30, 0xb1, 0xb2, 0x33, 0xb4, 0x35, 0x36, 0xb7, 0xb8, 0x39, 0x3a, 0xbb, 0x3c, 0xbd, 0xbe, 0x3f,
    0xc0, 0x41, 0x42, 0xc3, 0x44, 0xc5, 0xc6, 0x47, 0x48, 0xc9, 0xca, 0x4b, 0xcc, 0x4d, 0x4e, 0xcf,
    0x50, 0xd1, 0xd2, 0x53, 0xd4, 0x55, 0x56, 0xd7, 0xd8, 0x59, 0x5a, 0xdb, 0x5c, 0xdd, 0xde, 0x5f,
    0x60, 0xe1, 0xe2, 0x63, 0xe4, 0x65, 0x66, 0xe7, 0xe8, 0x69, 0x6a, 0xeb, 0x6c, 0xed, 0xee, 0x6f,
    0xf0, 0x71, 0x72, 0xf3, 0x74, 0xf5, 0xf6, 0x77, 0x78, 0xf9, 0xfa, 0x7b, 0xfc, 0x7d, 0x7e, 0xff,
};
const uint8_t ds4_kmask_iq2xs[8] = {
    0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80,
};

/* ---- search tables, built once by ds4_quant_init() ----
 * Patterns are 8 levels in {0,1,2} (standing for magnitudes 1,3,5 in units
 * of the sub-block scale), indexed in base 3 with element 0 least
 * significant. A pattern that is a grid point maps to its index; every other
 * pattern owns a neighbour list: the grid points at its two smallest distinct
 * squared distances, by distance then index (so ties resolve to the first). */
#define N_PATTERNS 6561

static int16_t pattern_grid[N_PATTERNS];     /* grid index, or -1 */
static uint32_t nb_start[N_PATTERNS + 1];    /* neighbour list of pattern p */
/* the lists of this grid hold 113157 entries in total (at most 150 each) */
static uint8_t nb_list[1 << 17];
static uint8_t grid_level[256][8];
static float grid_q[256][8];                /* 2·level + 1 */
static uint8_t grid_pair[256][4];           /* level pair (2p, 2p+1) as l0 + 3·l1 */
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void build_tables(void) {
    static const int pow3[8] = {1, 3, 9, 27, 81, 243, 729, 2187};
    for (int p = 0; p < N_PATTERNS; p++) pattern_grid[p] = -1;
    for (int g = 0; g < 256; g++) {
        int code = 0;
        for (int j = 0; j < 8; j++) {
            int byte = (int)((ds4_iq2xxs_grid[g] >> (8 * j)) & 0xff);
            grid_level[g][j] = (uint8_t)(byte == 0x08 ? 0 : byte == 0x19 ? 1 : 2);
            grid_q[g][j] = (float)(2 * grid_level[g][j] + 1);
            code += grid_level[g][j] * pow3[j];
        }
        pattern_grid[code] = (int16_t)g;
        for (int p = 0; p < 4; p++)
            grid_pair[g][p] = (uint8_t)(grid_level[g][2 * p] + 3 * grid_level[g][2 * p + 1]);
    }
    size_t len = 0;
    for (int p = 0; p < N_PATTERNS; p++) {
        nb_start[p] = (uint32_t)len;
        if (pattern_grid[p] >= 0 || len + 256 > sizeof(nb_list)) continue;
        int dist[256], d1 = INT32_MAX, d2 = INT32_MAX;
        for (int g = 0; g < 256; g++) {
            dist[g] = 0;
            for (int j = 0; j < 8; j++) {
                int diff = (p / pow3[j]) % 3 - grid_level[g][j];
                dist[g] += diff * diff;
            }
            if (dist[g] < d1) { d2 = d1; d1 = dist[g]; }
            else if (dist[g] > d1 && dist[g] < d2) d2 = dist[g];
        }
        for (int g = 0; g < 256; g++) if (dist[g] == d1) nb_list[len++] = (uint8_t)g;
        for (int g = 0; g < 256; g++) if (dist[g] == d2) nb_list[len++] = (uint8_t)g;
    }
    nb_start[N_PATTERNS] = (uint32_t)len;
}

void ds4_quant_init(void) { pthread_once(&init_once, build_tables); }

/* Snap 8 magnitudes to levels at inverse scale id; off-grid patterns take
 * the neighbour minimising Σ sw·(scale·q - x)². Returns the grid index. */
static int snap_group(const float *xv, const float *sw, float id, float scale) {
    int code = 0, p3 = 1;
    for (int j = 0; j < 8; j++, p3 *= 3) {
        int l = ds4_round_even(0.5f * (id * xv[j] - 1.0f));
        code += (l < 0 ? 0 : l > 2 ? 2 : l) * p3;
    }
    if (pattern_grid[code] >= 0) return pattern_grid[code];
    /* the error of a candidate is a sum of per-element terms that depend only
     * on that element's level: tabulate them per element pair, so each of the
     * (up to 150) candidates costs four lookups */
    float cost[8][3], pair[4][9];
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 3; l++) {
            float diff = scale * (float)(2 * l + 1) - xv[j];
            cost[j][l] = sw[j] * diff * diff;
        }
    for (int p = 0; p < 4; p++)
        for (int l1 = 0; l1 < 3; l1++)
            for (int l0 = 0; l0 < 3; l0++) pair[p][l0 + 3 * l1] = cost[2 * p][l0] + cost[2 * p + 1][l1];
    int best_g = nb_list[nb_start[code]];
    float best = INFINITY;
    for (uint32_t t = nb_start[code]; t < nb_start[code + 1]; t++) {
        const uint8_t *gp = grid_pair[nb_list[t]];
        float d2 = (pair[0][gp[0]] + pair[1][gp[1]]) + (pair[2][gp[2]] + pair[3][gp[3]]);
        if (d2 < best) { best = d2; best_g = nb_list[t]; }
    }
    return best_g;
}

/* Snap all four groups at inverse scale id; returns Σ w·x·q and Σ w·q². */
static void snap_subblock(const float *xv, const float *w, const float *sw, float id,
                          uint8_t gidx[4], float *sqx, float *sq2) {
    *sqx = *sq2 = 0.0f;
    for (int k = 0; k < 4; k++) {
        gidx[k] = (uint8_t)snap_group(xv + 8 * k, sw + 8 * k, id, 1.0f / id);
        for (int j = 0; j < 8; j++) {
            float q = grid_q[gidx[k]][j];
            *sqx += w[8 * k + j] * xv[8 * k + j] * q;
            *sq2 += w[8 * k + j] * q * q;
        }
    }
}

/* One 32-element sub-block: grid indices and 7-bit sign indices; returns the
 * (non-negative) float scale, 0 for an all-zero sub-block. */
static float quantize_subblock(const float *x, const float *w, uint8_t gidx[4], uint8_t sign7[4]) {
    float xv[32], sw[32];
    for (int i = 0; i < 32; i++) sw[i] = sqrtf(w[i]);
    for (int k = 0; k < 4; k++) {
        uint8_t s = 0;
        int imin = 0;
        for (int j = 0; j < 8; j++) {
            int i = 8 * k + j;
            xv[i] = fabsf(x[i]);
            if (x[i] < 0.0f) s ^= (uint8_t)(1 << j);
            if (w[i] * x[i] * x[i] < w[8 * k + imin] * x[8 * k + imin] * x[8 * k + imin]) imin = j;
        }
        /* only even sign counts are representable: flip the cheapest one */
        if (__builtin_popcount(s) & 1) {
            s ^= (uint8_t)(1 << imin);
            xv[8 * k + imin] = -xv[8 * k + imin];
        }
        sign7[k] = s & 127;
    }
    float vmax = 0.0f;
    for (int i = 0; i < 32; i++) vmax = fmaxf(vmax, xv[i]);
    memset(gidx, 0, 4);
    if (!(vmax >= DS4_GROUP_MAX_EPS)) return 0.0f;
    uint8_t codes[32], trial[4];
    float scale = ds4_quant_search_positive(32, 4, xv, w, codes);
    if (!(scale > 0.0f)) return 0.0f;
    float eff_max = 3.0f * scale, best = 0.0f, sqx, sq2;
    for (int t = -6; t <= 6; t++) {
        snap_subblock(xv, w, sw, (5.0f + 0.1f * (float)t) / eff_max, trial, &sqx, &sq2);
        if (sq2 > 0.0f && sqx * sqx > best * sq2) {
            scale = sqx / sq2;
            best = scale * sqx;
            memcpy(gidx, trial, 4);
        }
    }
    /* a negative winner (only possible through a parity-flipped element)
     * keeps its trial snapping and is fixed by flipping every sign */
    if (scale > 0.0f) {
        snap_subblock(xv, w, sw, 1.0f / scale, gidx, &sqx, &sq2);
        if (sq2 > 0.0f) scale = sqx / sq2;
    }
    if (scale < 0.0f) {
        scale = -scale;
        for (int k = 0; k < 4; k++) sign7[k] = (uint8_t)(~sign7[k] & 127);
    }
    return scale;
}

void ds4_quantize_iq2_xxs(const float *x, ds4_block_iq2_xxs *y, int64_t n, const float *imp) {
    ds4_quant_init();
    for (int64_t b = 0; b < n / DS4_QK_K; b++, x += DS4_QK_K, y++) {
        float sumx2 = 0.0f, scales[8], max_scale = 0.0f, w[32];
        uint8_t gidx[8][4], sign7[8][4];
        for (int i = 0; i < DS4_QK_K; i++) sumx2 += x[i] * x[i];
        float sigma2 = sumx2 / DS4_QK_K;
        for (int sb = 0; sb < 8; sb++) {
            for (int i = 0; i < 32; i++) {
                float xi = x[32 * sb + i];
                w[i] = (imp ? imp[b * DS4_QK_K + 32 * sb + i] : 1.0f) * sqrtf(sigma2 + xi * xi);
            }
            scales[sb] = quantize_subblock(x + 32 * sb, w, gidx[sb], sign7[sb]);
            max_scale = fmaxf(max_scale, scales[sb]);
        }
        memset(y, 0, sizeof(*y));
        if (!(max_scale > 0.0f)) continue;
        float d = max_scale / 31.0f, id = 1.0f / d;
        y->d = ds4_f32_to_half(d);
        for (int sb = 0; sb < 8; sb++) {
            if (!(scales[sb] > 0.0f)) continue;
            int s = ds4_round_even(0.5f * (id * scales[sb] - 1.0f));
            uint32_t W = (uint32_t)(s < 0 ? 0 : s > 15 ? 15 : s) << 28;
            for (int k = 0; k < 4; k++) W |= (uint32_t)sign7[sb][k] << (7 * k);
            y->qs[4 * sb + 0] = (uint16_t)(gidx[sb][0] | gidx[sb][1] << 8);
            y->qs[4 * sb + 1] = (uint16_t)(gidx[sb][2] | gidx[sb][3] << 8);
            y->qs[4 * sb + 2] = (uint16_t)(W & 0xffff);
            y->qs[4 * sb + 3] = (uint16_t)(W >> 16);
        }
    }
}
