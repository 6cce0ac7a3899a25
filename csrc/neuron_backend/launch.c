/*
** The launcher (launch.h): a launch split across the kernel threads, its
** iteration order and row runs, and the range checks of gathers' indices.
*/
#include "launch.h"

#include "../tn_stats.h"
#include "../tn_yield.h"

#include <string.h>

#include "runtime.h"

/* -- Threads ------------------------------------------------------------------ */

static int launch_threads = 1; /* set from torch.get_num_threads() */

void tn_launch_set_threads(int n)
{
  launch_threads = n;
}

int tn_launch_split_parts(int64_t work, int64_t per_part, int64_t most)
{
  int64_t parts = work / per_part;
  int threads = launch_threads - tn_yield_lending(); /* a call lending a thread to a build (tn_yield.h) */
  if (parts > threads)
    parts = threads;
  if (parts > most)
    parts = most;
  return parts < 1 ? 1 : (int)parts;
}

void tn_launch_part_range(int64_t n, int part, int nparts, int64_t *start, int64_t *end)
{
  int64_t chunk = (n + nparts - 1) / nparts;
  *start = chunk * part < n ? chunk * part : n;
  *end = *start + chunk < n ? *start + chunk : n;
}

/* -- Launch ------------------------------------------------------------------- */

/* One call of the kernel: its tier 2 where it has one and takes the
** layout, else tier 1. */
static void launch_run(const tn_launch *la, const int64_t *sizes, void **ptrs)
{
  if (la->la_fn2 && la->la_fn2(la->la_rank, sizes, ptrs, la->la_strides, la->la_cols, la->la_cstrides) == 0) {
    tn_stat_add(TN_STAT_tier2_runs, 1);
    return;
  }
  la->la_fn(la->la_rank, sizes, ptrs, la->la_strides, la->la_cols, la->la_cstrides);
}

void tn_launch_range(const tn_launch *la, int64_t start, int64_t len)
{
  int64_t sizes[TN_MAX_RANK];
  void *ptrs[TN_LAUNCH_MAX_OPERANDS];
  if (la->la_rank == 0) {
    if (start == 0)
      launch_run(la, la->la_sizes, (void **)la->la_ptrs);
    return;
  }
  if (len <= 0)
    return;
  for (int d = 0; d < la->la_rank; d++)
    sizes[d] = la->la_sizes[d];
  sizes[0] = len;
  for (int k = 0; k < la->la_nops; k++)
    ptrs[k] = (char *)la->la_ptrs[k] + start * la->la_strides[k * la->la_rank] * la->la_isz[k];
  launch_run(la, sizes, ptrs);
}

void tn_launch_part(void *vctx, int part, int nparts)
{
  const tn_launch *la = vctx;
  if (la->la_rank == 0) {
    if (part == 0)
      tn_launch_range(la, 0, 1);
    return;
  }
  int64_t start, end;
  tn_launch_part_range(la->la_sizes[0], part, nparts, &start, &end);
  tn_launch_range(la, start, end - start);
}

/* -- Layout ------------------------------------------------------------------- */

int64_t tn_launch_run_stride(const int64_t *st, const int64_t *shape, int from, int rank)
{
  int64_t first = 0, expect = -1;
  for (int d = rank - 1; d >= from; d--) {
    if (shape[d] == 1)
      continue;
    if (expect >= 0 && st[d] != expect)
      return -1;
    if (expect < 0)
      first = st[d];
    expect = st[d] * shape[d];
  }
  return first;
}

void tn_launch_iteration_order(int64_t *shape, int64_t (*bst)[TN_MAX_RANK], int nops, int rank, const int64_t *key)
{
  int perm[TN_MAX_RANK];
  int64_t k[TN_MAX_RANK], tmp[TN_MAX_RANK];
  for (int d = 0; d < rank; d++) {
    perm[d] = d;
    k[d] = shape[d] == 1 ? INT64_MAX : key[d]; /* size-1 dims go outermost, where they cost nothing */
  }
  for (int i = 1; i < rank; i++) /* stable insertion sort, by stride decreasing */
    for (int j = i; j > 0 && k[perm[j - 1]] < k[perm[j]]; j--) {
      int t = perm[j];
      perm[j] = perm[j - 1];
      perm[j - 1] = t;
    }
  for (int d = 0; d < rank; d++)
    tmp[d] = shape[perm[d]];
  memcpy(shape, tmp, sizeof(int64_t) * (size_t)rank);
  for (int p = 0; p < nops; p++) {
    for (int d = 0; d < rank; d++)
      tmp[d] = bst[p][perm[d]];
    memcpy(bst[p], tmp, sizeof(int64_t) * (size_t)rank);
  }
}

/* -- Index checks ------------------------------------------------------------- */

/* An index tensor being checked: the rows (all dims but the innermost)
** split across threads; each part records its first bad row. */
typedef struct index_check {
  const char *ic_data;
  const int64_t *ic_sizes, *ic_strides;
  int ic_rank, ic_isz;
  int64_t ic_lim, ic_outer, ic_inner;
  int64_t ic_bad_row[64]; /* per part: the first row with a bad index, or -1 */
} index_check;

/* Byte offset of row o (an index over all dims but the innermost). */
static int64_t check_row_offset(const index_check *c, int64_t o)
{
  int64_t off = 0;
  for (int d = c->ic_rank - 2; d >= 0; d--) {
    off += o % c->ic_sizes[d] * c->ic_strides[d];
    o /= c->ic_sizes[d];
  }
  return off * c->ic_isz;
}

static void check_part(void *vctx, int part, int nparts)
{
  index_check *c = vctx;
  int64_t start, end, ist = c->ic_rank ? c->ic_strides[c->ic_rank - 1] : 0;
  tn_launch_part_range(c->ic_outer, part, nparts, &start, &end);
  c->ic_bad_row[part] = -1;
  for (int64_t o = start; o < end; o++)
    if (tn_rt_index_scan(c->ic_data + check_row_offset(c, o), ist, c->ic_isz, c->ic_lim, c->ic_inner) >= 0) {
      c->ic_bad_row[part] = o;
      return;
    }
}

int tn_launch_indices_in_range(const void *data, const int64_t *sizes, const int64_t *strides, int rank, int isz,
                               int64_t n, int64_t *bad, tn_launch_pool_fn pool_run)
{
  index_check c = {data, sizes, strides, rank, isz, n, 1, rank ? sizes[rank - 1] : 1, {0}};
  for (int d = 0; d + 1 < rank; d++)
    c.ic_outer *= sizes[d];
  if (c.ic_inner == 0 || c.ic_outer == 0)
    return 1;
  int parts = tn_launch_split_parts(c.ic_outer * c.ic_inner, 4 * TN_LAUNCH_PART_ELEMENTS, c.ic_outer);
  if (parts > 1) {
    parts = pool_run(check_part, &c, parts);
  } else {
    check_part(&c, 0, 1);
  }
  for (int part = 0; part < parts; part++)
    if (c.ic_bad_row[part] >= 0) {
      const char *row = c.ic_data + check_row_offset(&c, c.ic_bad_row[part]);
      int64_t ist = rank ? strides[rank - 1] : 0, e = tn_rt_index_scan(row, ist, isz, n, c.ic_inner);
      *bad = isz == 8 ? *(const int64_t *)(row + e * ist * isz) : *(const int32_t *)(row + e * ist * isz);
      return 0;
    }
  return 1;
}
