/* imatrix.h -- importance-matrix collection: the squared inputs of every
 * matrix product, per weight and per expert, written in llama.cpp's GGUF
 * imatrix format (what `ds4-convert --imatrix` and llama.cpp's quantizer read).
 *
 * Contract
 * - ds4_imatrix_new() indexes the model file's matrices (tensors of 2 or 3
 *   dimensions) by data pointer; ds4_imatrix_observe() is a
 *   ds4_matmul_observer: for the weight it is shown it adds x^2 of each row
 *   to that matrix's sums (double) and counts the rows; an expert stack
 *   keeps one sum vector and one count per expert. Pointers that are not a
 *   matrix of the file are ignored. Thread-safe (one lock).
 * - ds4_imatrix_write() writes general.type = "imatrix", imatrix.datasets
 *   (the dataset names given), imatrix.chunk_count and imatrix.chunk_size,
 *   then for every matrix that saw a row "<name>.in_sum2" F32 [ne0, n_mat]
 *   and "<name>.counts" F32 [1, n_mat] (n_mat = experts, 1 for a plain
 *   matrix), sorted by name. The importance of a column is in_sum2 / counts.
 *   One line in err on failure (nothing is left at path).
 */
#ifndef DS4_IMATRIX_H
#define DS4_IMATRIX_H

#include <stddef.h>
#include <stdint.h>

struct ds4_gguf;
typedef struct ds4_imatrix ds4_imatrix;

ds4_imatrix *ds4_imatrix_new(const struct ds4_gguf *g);
void ds4_imatrix_free(ds4_imatrix *m);
void ds4_imatrix_observe(void *m, const void *weight, int64_t expert, const float *x, int64_t xstride, int64_t n, int T);
/* Matrices that saw at least one row. */
int ds4_imatrix_n_seen(const ds4_imatrix *m);
int ds4_imatrix_write(const ds4_imatrix *m, const char *path, const char *const *datasets, int n_datasets,
                      int chunk_count, int chunk_size, char *err, size_t errlen);

#endif
