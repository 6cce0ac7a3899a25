/*
** The external GEMM (gemm.h): BLAS calls over blocks of a product.
*/
#include "gemm.h"

/* Fewest rows (columns) of the result a part of a split GEMM computes. */
#define GEMM_PART_ROWS 32
#define GEMM_PART_COLS 64

/* Fortran sgemm (LP64), column-major; torch's own (MKL) when registered. */
typedef void (*sgemm_fn)(const char *ta, const char *tb, const int *m, const int *n, const int *k, const float *alpha,
                         const float *a, const int *lda, const float *b, const int *ldb, const float *beta, float *c,
                         const int *ldc);
static sgemm_fn gemm_sgemm;

void tn_gemm_set_sgemm(void *sgemm)
{
  gemm_sgemm = (sgemm_fn)sgemm;
}

int tn_gemm_has_sgemm(void)
{
  return gemm_sgemm != NULL;
}

char tn_gemm_blas_layout(int64_t r, int64_t c, int64_t sr, int64_t sc, int *ld)
{
  if (c == 1)
    sc = 1;
  if (r == 1)
    sr = c;
  if (sc == 1 && sr >= (c > 1 ? c : 1) && sr <= INT32_MAX) {
    *ld = (int)sr;
    return 'N';
  }
  if (sr == 1 && sc >= (r > 1 ? r : 1) && sc <= INT32_MAX) {
    *ld = (int)sc;
    return 'T';
  }
  return 0;
}

void tn_gemm_block(const tn_gemm_job *j, int r0, int r1, int c0, int c1)
{
  const float one = 1.0f, zero = 0.0f;
  int m = r1 - r0, n = c1 - c0;
  /* row r of a starts at r * lda ('N': rows contiguous) or at r ('T') */
  const float *a = j->gj_a + (int64_t)r0 * (j->gj_lay[0] == 'N' ? j->gj_ld[0] : 1);
  const float *b = j->gj_b + (int64_t)c0 * (j->gj_lay[1] == 'N' ? 1 : j->gj_ld[1]);
  gemm_sgemm(&j->gj_lay[1], &j->gj_lay[0], &n, &m, &j->gj_k, &one, b, &j->gj_ld[1], a, &j->gj_ld[0], &zero,
             j->gj_c + (int64_t)r0 * j->gj_ldc + c0, &j->gj_ldc);
}

void tn_gemm_part(void *vctx, int part, int nparts)
{
  const tn_gemm_job *j = vctx;
  int total = j->gj_split_cols ? j->gj_n : j->gj_m;
  int align = j->gj_split_cols ? 16 : 8; /* whole register blocks of the BLAS kernels */
  int chunk = ((total + nparts - 1) / nparts + align - 1) / align * align;
  int from = chunk * part, to = from + chunk < total ? from + chunk : total;
  if (from >= to)
    return;
  if (j->gj_split_cols) {
    tn_gemm_block(j, 0, j->gj_m, from, to);
  } else {
    tn_gemm_block(j, from, to, 0, j->gj_n);
    if (j->gj_epi) /* while the part is in this core's cache */
      tn_launch_range(j->gj_epi, from * j->gj_epi_per_row, (to - from) * j->gj_epi_per_row);
  }
}

void tn_gemm_batch_part(void *vctx, int part, int nparts)
{
  tn_gemm_job j = *(const tn_gemm_job *)vctx;
  int64_t start, end;
  tn_launch_part_range(j.gj_batch, part, nparts, &start, &end);
  const float *a = j.gj_a, *b = j.gj_b;
  float *c = j.gj_c;
  for (int64_t p = start; p < end; p++) {
    j.gj_a = a + p * j.gj_bst[0];
    j.gj_b = b + p * j.gj_bst[1];
    j.gj_c = c + p * (int64_t)j.gj_m * j.gj_n;
    tn_gemm_block(&j, 0, j.gj_m, 0, j.gj_n);
  }
}

int tn_gemm_parts(tn_gemm_job *j)
{
  j->gj_split_cols = j->gj_m < 2 * GEMM_PART_ROWS && j->gj_n >= j->gj_m;
  return tn_launch_split_parts((int64_t)j->gj_m * j->gj_n * j->gj_k, TN_GEMM_PART_FLOPS,
                               j->gj_split_cols ? j->gj_n / GEMM_PART_COLS : j->gj_m / GEMM_PART_ROWS);
}
