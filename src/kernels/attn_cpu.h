/* attn_cpu.h -- one query row's attention over shared K = V rows, several
 * heads at once (the CPU kernel behind forward_cpu's attention, sheet 6.7).
 *
 * Contract
 * - ds4_attn_heads(q, n_heads, D, rows, n, scale, sinks, weights, out): for
 *   each head h < n_heads, with s_i = scale * ds4_vec_dot(F32, rows[i],
 *   q + h*D, D) and m = max(sinks[h], s_0..s_n-1),
 *       p_i = (float)(e_i / den),  e_i = (float)exp(s_i - m) (in double),
 *       den = exp(sinks[h] - m) + e_0 + ... + e_n-1 (in double, in order),
 *       out[h*D + d] = (...((0 + p_0 * rows[0][d]) + p_1 * rows[1][d]) ...)
 *   with every product and sum rounded to float (never fused), i in order.
 *   That is exactly the per-head loop it replaced, so results are bit for
 *   bit those of that loop, whatever n_heads, the SIMD level or the thread:
 *   a head's arithmetic never depends on which other heads share the call.
 * - Every row is read once per group of heads (all heads of a DS4 layer
 *   attend to the same rows: one KV head), the accumulation runs with the
 *   widest vectors the level has.
 * - weights is caller scratch of n_heads * n floats (left holding p);
 *   no allocation. n may be 0 (out is then 0: the sink takes everything).
 */
#ifndef DS4_ATTN_CPU_H
#define DS4_ATTN_CPU_H

void ds4_attn_heads(const float *q, int n_heads, int D, const float *const *rows, int n, float scale,
                    const float *sinks, float *weights, float *out);

#endif
