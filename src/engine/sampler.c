/* sampler.c -- see sampler.h. Works on unnormalised weights
 * w_i = exp((l_i - l_max) / T): the most likely token has weight 1, so the
 * min-p rule is simply w_i >= min_p, and it commutes with top-k (both keep a
 * top slice), which lets one pass collect the candidates before sorting. */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

typedef struct { double w; int id; } cand;

struct ds4_sampler {
    ds4_sampler_params p;
    int n_vocab;
    uint64_t rng[4];
    cand *c;        /* n_vocab slots; the first m are the survivors */
};

/* ---- RNG: xoshiro256** seeded through splitmix64 ------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t *s) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* uniform in [0, 1) with 53 random bits */
static double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

uint64_t ds4_sampler_random_seed(void) {
    uint64_t v;
    if (getrandom(&v, sizeof v, 0) == (ssize_t)sizeof v) return v;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec;
    return splitmix64(&x);
}

/* ---- sampler ---------------------------------------------------------------- */

void ds4_sampler_params_default(ds4_sampler_params *p) {
    *p = (ds4_sampler_params){ .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.05f, .seed = 0 };
}

ds4_sampler *ds4_sampler_new(const ds4_sampler_params *p, int n_vocab) {
    if (n_vocab <= 0) return NULL;
    ds4_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->c = malloc((size_t)n_vocab * sizeof *s->c);
    if (!s->c) { ds4_sampler_free(s); return NULL; }
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    return s;
}

void ds4_sampler_free(ds4_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s);
}

static int argmax(const float *l, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(l[i]) && (best < 0 || l[i] > l[best])) best = i;
    return best < 0 || l[best] == -INFINITY ? 0 : best;
}

static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->w != y->w) return x->w > y->w ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Fills s->c[0..m) with the surviving ids, most likely first; returns m
 * and their total weight in *total. m == 0 means "take the argmax". */
static int filter(ds4_sampler *s, const float *logits, double *total) {
    int n = s->n_vocab;
    int best = argmax(logits, n);
    float lmax = logits[best];
    if (isinf(lmax)) return 0;
    double T = s->p.temperature;
    double min_p = s->p.min_p > 0 ? s->p.min_p : 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        float l = logits[i];
        double w = isnan(l) ? 0 : exp(((double)l - lmax) / T);
        if (w > 0 && w >= min_p) s->c[m++] = (cand){ w, i };
    }
    qsort(s->c, (size_t)m, sizeof *s->c, cmp_cand);
    int k = s->p.top_k > DS4_SAMPLER_MAX_TOP_K ? DS4_SAMPLER_MAX_TOP_K : s->p.top_k;
    if (k > 0 && m > k) m = k;
    double z = 0;
    for (int i = 0; i < m; i++) z += s->c[i].w;
    double top_p = s->p.top_p > 0 && s->p.top_p <= 1 ? s->p.top_p : 1;
    if (top_p < 1) {
        double cum = 0;
        for (int i = 0; i < m; i++) {
            cum += s->c[i].w;
            if (cum >= top_p * z) { m = i + 1; z = cum; break; }
        }
    }
    *total = z;
    return m;
}

int ds4_sampler_sample(ds4_sampler *s, const float *logits, bool force_greedy) {
    if (force_greedy || !(s->p.temperature > 0)) return argmax(logits, s->n_vocab);
    double z;
    int m = filter(s, logits, &z);
    if (m == 0) return argmax(logits, s->n_vocab);
    double u = rng_uniform(s->rng) * z, cum = 0;
    for (int i = 0; i < m; i++) {
        cum += s->c[i].w;
        if (u < cum) return s->c[i].id;
    }
    return s->c[m - 1].id;
}

int ds4_sampler_candidates(ds4_sampler *s, const float *logits, int *ids, float *probs, int max) {
    double z = 0;
    int m = s->p.temperature > 0 ? filter(s, logits, &z) : 0;
    if (m == 0) {   /* greedy: the argmax with certainty */
        if (max > 0) { ids[0] = argmax(logits, s->n_vocab); probs[0] = 1; }
        return 1;
    }
    for (int i = 0; i < m && i < max; i++) {
        ids[i] = s->c[i].id;
        probs[i] = (float)(s->c[i].w / z);
    }
    return m;
}

/* ---- log-probabilities ---------------------------------------------------------- */

static double log_sum_exp(const float *l, int n) {
    int best = argmax(l, n);
    double m = l[best], sum = 0;
    if (isinf(m)) return m;
    for (int i = 0; i < n; i++)
        if (!isnan(l[i])) sum += exp((double)l[i] - m);
    return m + log(sum);
}

float ds4_logprob(const float *logits, int n_vocab, int id) {
    if (id < 0 || id >= n_vocab || isnan(logits[id])) return -INFINITY;
    return (float)((double)logits[id] - log_sum_exp(logits, n_vocab));
}

int ds4_top_logprobs(const float *logits, int n_vocab, int k, int *ids, float *logprobs) {
    if (k > n_vocab) k = n_vocab;
    if (k <= 0) return 0;
    int m = 0;
    /* insertion into a k-long sorted list: k is small (OpenAI caps it at 20) */
    for (int i = 0; i < n_vocab; i++) {
        float l = logits[i];
        if (isnan(l) || (m == k && l <= logits[ids[m - 1]])) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && logits[ids[j - 1]] < l) { ids[j] = ids[j - 1]; j--; }
        ids[j] = i;
    }
    double lse = log_sum_exp(logits, n_vocab);
    for (int i = 0; i < m; i++) logprobs[i] = (float)((double)logits[ids[i]] - lse);
    return m;
}
