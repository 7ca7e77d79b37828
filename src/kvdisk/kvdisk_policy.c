/* kvdisk_policy.c -- save points and eviction order (kvdisk_policy.h). */
#include "kvdisk/kvdisk_policy.h"

#include <math.h>
#include <string.h>

#include "kvdisk/kvdisk_file.h"

#define HIT_WORTH_S (6.0 * 3600.0)

void ds4_kvdisk_opts_default(ds4_kvdisk_opts *o) {
    memset(o, 0, sizeof *o);
    o->space_bytes = (uint64_t)4096 << 20;
    o->min_tokens = 512;
    o->cold_max_tokens = 30000;
    o->continued_interval = 10000;
    o->boundary_trim = 32;
    o->boundary_align = 2048;
}

static int frontier_step(const ds4_kvdisk_opts *o) {
    if (o->continued_interval <= 0) return 0;
    int a = o->boundary_align > 0 ? o->boundary_align : 1;
    return (o->continued_interval + a - 1) / a * a;
}

bool ds4_kvdisk_is_frontier(const ds4_kvdisk_opts *o, int n) {
    int f = frontier_step(o);
    return f > 0 && n > 0 && n % f == 0 && n >= o->min_tokens;
}

/* Where a cold save of a first prompt goes: the system/tools prefix when it
 * alone is long enough, else the prompt minus a BPE-unstable tail, aligned. */
static int cold_point(const ds4_kvdisk_opts *o, const int32_t *toks, int n, int32_t user_tok, int32_t assistant_tok) {
    if (o->cold_max_tokens <= 0 || n < o->min_tokens || n > o->cold_max_tokens) return -1;
    int last_user = -1;
    for (int i = 0; i < n && toks[i] != assistant_tok; i++)
        if (toks[i] == user_tok) last_user = i;
    if (last_user >= o->min_tokens) return last_user;
    int a = o->boundary_align > 0 ? o->boundary_align : 1;
    int c = (n - o->boundary_trim) / a * a;
    return c >= o->min_tokens ? c : -1;
}

int ds4_kvdisk_next_stop(const ds4_kvdisk_opts *o, const int32_t *toks, int n_prompt, int from, bool cold,
                         int32_t user_tok, int32_t assistant_tok, int *reason) {
    int best = -1;
    int f = frontier_step(o);
    if (f > 0) {
        int next = (from / f + 1) * f;
        if (next <= n_prompt && next >= o->min_tokens) { best = next; *reason = DS4_KVC_CONTINUED; }
    }
    int c = cold ? cold_point(o, toks, n_prompt, user_tok, assistant_tok) : -1;
    if (c > from && (best < 0 || c < best)) { best = c; *reason = DS4_KVC_COLD; }
    return best;
}

static double score(const ds4_kvdisk_rank *r) {
    return (double)r->last_used + HIT_WORTH_S * log2(1.0 + r->hits);
}

bool ds4_kvdisk_evict_first(const ds4_kvdisk_rank *a, const ds4_kvdisk_rank *b) {
    double sa = score(a), sb = score(b);
    if (sa != sb) return sa < sb;
    if (a->mtime.tv_sec != b->mtime.tv_sec) return a->mtime.tv_sec < b->mtime.tv_sec;
    return a->mtime.tv_nsec < b->mtime.tv_nsec;
}
