/*
** The external GEMM: products of float32 matrices computed by BLAS (the
** registered Fortran sgemm_, torch's own MKL one when PyTorch has it),
** split across the kernel threads by rows of the result (by columns when
** it has few rows), a batch by whole products. A split by rows runs the
** fused epilogue (a launch, launch.h) over each part as soon as it is
** computed, while it is in its thread's cache. Inside PyTorch's OpenMP
** team each BLAS call runs on its caller's thread, so the two pools never
** oversubscribe the cores. Plain C; the GEMM kernels' binding (gemm_py.c)
** reads the tensors and releases the GIL around the parts.
*/
#ifndef TN_GEMM_H
#define TN_GEMM_H

#include <stdint.h>

#include "launch.h"

/* Multiply-adds below which a GEMM runs as one BLAS call. */
#define TN_GEMM_PART_FLOPS (1 << 21)

/* One GEMM c = a b (row-major, m x n) as column-major BLAS sees it:
** c^T = b^T a^T, and the fused epilogue to run over each finished part. */
typedef struct tn_gemm_job {
  char gj_lay[2]; /* tn_gemm_blas_layout of a and b */
  int gj_ld[2], gj_m, gj_n, gj_k, gj_ldc;
  const float *gj_a, *gj_b;
  float *gj_c;
  int64_t gj_batch;       /* products (bmm: the batch; 1 for mm) */
  int64_t gj_bst[2];      /* elements from one product's a (b) to the next's */
  int gj_split_cols;      /* parts are column (else row) ranges of c */
  const tn_launch *gj_epi; /* run over each row part as soon as it is done; or NULL */
  int64_t gj_epi_per_row; /* units of the epilogue's outer dim per row of c */
} tn_gemm_job;

/* Registers the address of the Fortran sgemm_ (LP64) GEMMs call; NULL for
** none. Call with no GEMM running. */
void tn_gemm_set_sgemm(void *sgemm);

/* Whether an sgemm is registered (tn_gemm_block needs one). */
int tn_gemm_has_sgemm(void);

/* How BLAS reads row-major matrix x (r x c, strides sr, sc) as the
** column-major operand x^T: 'N' with ld = sr when rows are contiguous,
** 'T' with ld = sc when columns are. 0 when neither. */
char tn_gemm_blas_layout(int64_t r, int64_t c, int64_t sr, int64_t sc, int *ld);

/* Computes rows [r0, r1) and columns [c0, c1) of j's c with one BLAS call. */
void tn_gemm_block(const tn_gemm_job *j, int r0, int r1, int c0, int c1);

/* A pool job (tn_pool_run) of one product: part `part` of nparts of the
** job vctx's rows (gj_split_cols: columns), whole register blocks of the
** BLAS kernels each; a row part then runs gj_epi over its rows. */
void tn_gemm_part(void *vctx, int part, int nparts);

/* A pool job of a batched GEMM: products [part * chunk, ...) of the job
** vctx, each whole, one BLAS call each. */
void tn_gemm_batch_part(void *vctx, int part, int nparts);

/* How many parts j's product splits into (tn_gemm_part), and along which
** dimension (sets gj_split_cols). */
int tn_gemm_parts(tn_gemm_job *j);

#endif /* TN_GEMM_H */
