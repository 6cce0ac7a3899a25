/*
** Python binding of fused kernels: _C.Kernel(source, ninputs, noutputs,
** empty, dtypes, reduce_dims=0, out_kinds=None, nonempty=False, gemm=False,
** epilogue=True) compiles one with libtcc and, called with the input
** tensors (of the dtypes given, one per operand the kernel loads, then one
** per output), allocates the outputs (contiguous, of their dtype, shaped
** as the broadcast of the inputs or, for per-row outputs of a row kernel,
** that shape with its last reduce_dims dims reduced) and runs it through
** the launcher (launch.h).
**
** A GEMM kernel takes the two matrices first; their product is computed by
** the external GEMM (gemm.h, called from gemm_py.c), which runs the
** epilogue, this kernel, over each part of it.
*/
#include "../tn_py.h"

#include "../graph/graph.h"
#include "../lowering/fuse.h"
#include "../tn_stats.h"
#include "../tn_yield.h"
#include "kernel_internal.h"

#include "../tn_config.h"
#include "launch.h"
#include "pool.h"
#include "runtime.h"
#include "tcc.h"

/* Launches smaller than this keep the GIL: releasing it costs more. */
#define KERNEL_NOGIL_ELEMENTS 32768

/* -- Kernel -------------------------------------------------------------------------- */

/* Reads a tuple-like of ints (shape or stride) into out (rank entries). */
static int read_ints(PyObject *seq, int64_t *out, int *rank)
{
  PyObject *fast = PySequence_Fast(seq, "expected a sequence of ints");
  if (!fast)
    return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  if (n > TN_MAX_RANK) {
    Py_DECREF(fast);
    PyErr_Format(PyExc_ValueError, "rank %zd exceeds %d", n, TN_MAX_RANK);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    if (out[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return -1;
    }
  }
  Py_DECREF(fast);
  *rank = (int)n;
  return 0;
}

/* views: None, or per input None or (base sizes, base strides, sizes,
** strides, offset). Sets *out to a PyMem array of nin (NULL for None). */
static int parse_views(PyObject *arg, int nin, kernel_view **out)
{
  *out = NULL;
  if (arg == Py_None)
    return 0;
  PyObject *fast = PySequence_Fast(arg, "views must be a sequence");
  if (!fast)
    return -1;
  kernel_view *v = PySequence_Fast_GET_SIZE(fast) == nin ? PyMem_Calloc((size_t)nin + 1, sizeof *v) : NULL;
  int rc = v ? 0 : -1, n2;
  if (!v && !PyErr_Occurred())
    PyErr_Format(PyExc_ValueError, "views must give one entry per input (%d)", nin);
  for (int i = 0; rc == 0 && i < nin; i++) {
    PyObject *e = PySequence_Fast_GET_ITEM(fast, i);
    if (e == Py_None)
      continue;
    kernel_view *w = &v[i];
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 5) {
      PyErr_Format(PyExc_ValueError, "views[%d] must be None or (base sizes, base strides, sizes, strides, offset)", i);
      rc = -1;
      break;
    }
    w->kv_on = 1;
    rc = read_ints(PyTuple_GET_ITEM(e, 0), w->kv_bsizes, &w->kv_brank) < 0 ||
         read_ints(PyTuple_GET_ITEM(e, 1), w->kv_bstrides, &n2) < 0 || n2 != w->kv_brank ||
         read_ints(PyTuple_GET_ITEM(e, 2), w->kv_sizes, &w->kv_rank) < 0 ||
         read_ints(PyTuple_GET_ITEM(e, 3), w->kv_strides, &n2) < 0 || n2 != w->kv_rank ? -1 : 0;
    w->kv_offset = rc == 0 ? PyLong_AsLongLong(PyTuple_GET_ITEM(e, 4)) : 0;
    if (rc == 0 && PyErr_Occurred())
      rc = -1;
    if (rc < 0 && !PyErr_Occurred())
      PyErr_Format(PyExc_ValueError, "views[%d]: sizes and strides of different ranks", i);
  }
  Py_DECREF(fast);
  if (rc < 0)
    PyMem_Free(v);
  else
    *out = v;
  return rc;
}

/* Whether out_strides entry t (a tuple) holds ints that are all strides
** (>= 0), or -1 - place for each dim, the places a permutation of
** 0..rank-1 (innermost 0): a dense layout whose strides follow from the
** sizes of each call (a dynamic variant's transposed result). */
static int strides_or_order(PyObject *t)
{
  Py_ssize_t rank = PyTuple_GET_SIZE(t);
  uint64_t seen = 0;
  int negative = 0;
  for (Py_ssize_t d = 0; d < rank; d++) {
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(t, d));
    if (v == -1 && PyErr_Occurred())
      return 0;
    if (d > 0 && (v < 0) != negative)
      return 0;
    negative = v < 0;
    if (negative && (v < -rank || (seen >> (-1 - v) & 1)))
      return 0;
    if (negative)
      seen |= 1ull << (-1 - v);
  }
  return 1;
}

/* Input i read as view w of tensor t (sizes, strides, rank, data as read):
** checks that t is laid out as the compiled graph said (else a ValueError:
** the caller runs the graph eagerly), then gives the view's. */
static int apply_view(const kernel_view *w, int i, int64_t *sizes, int64_t *strides, int *rank, void **data, int isz)
{
  int ok = *rank == w->kv_brank;
  for (int d = 0; ok && d < *rank; d++)
    ok = sizes[d] == w->kv_bsizes[d] && (sizes[d] == 1 || strides[d] == w->kv_bstrides[d]);
  if (!ok) {
    PyErr_Format(PyExc_ValueError, "kernel input %d: a tensor laid out unlike the compiled graph's", i);
    return -1;
  }
  *rank = w->kv_rank;
  memcpy(sizes, w->kv_sizes, sizeof(int64_t) * (size_t)w->kv_rank);
  memcpy(strides, w->kv_strides, sizeof(int64_t) * (size_t)w->kv_rank);
  *data = (char *)*data + w->kv_offset * isz;
  return 0;
}

static PyObject *Kernel_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
  static char *kwlist[] = {"source", "ninputs", "noutputs", "empty", "dtypes", "reduce_dims", "out_kinds",
                           "nonempty", "gemm", "epilogue", "out_strides", "gathers", "views", "donors", "into",
                           "object", "tier2", NULL};
  PyObject *source, *empty, *dtypes_arg, *kinds_arg = Py_None, *dtypes = NULL, *kws = NULL;
  PyObject *strides_arg = Py_None, *ostrides = NULL, *empty_strided = NULL, *gathers_arg = Py_None;
  PyObject *views_arg = Py_None, *donors_arg = Py_None, *into_arg = Py_None, *object = Py_None;
  PyObject *tier2 = Py_None;
  kernel_view *views = NULL;
  int donors[TN_LAUNCH_MAX_OPERANDS], into_dim[TN_LAUNCH_MAX_OPERANDS], ninto = 0;
  int64_t into_off[TN_LAUNCH_MAX_OPERANDS];
  int strided = 0, ngathers = 0, gathers[TN_LAUNCH_MAX_OPERANDS][3];
  int isz[TN_LAUNCH_MAX_OPERANDS];
  int nin, nout, rdims = 0, nonempty = 0, gemm = 0, epilogue = 1;
  uint8_t kinds[TN_LAUNCH_MAX_OPERANDS] = {0};
  char err[2048];
  tn_tcc_unit *u = NULL;
  int rc;

  if (!PyArg_ParseTupleAndKeywords(args, kwds, "UiiOO|iOpppOOOOOOO:Kernel", kwlist, &source, &nin, &nout, &empty,
                                   &dtypes_arg, &rdims, &kinds_arg, &nonempty, &gemm, &epilogue, &strides_arg,
                                   &gathers_arg, &views_arg, &donors_arg, &into_arg, &object, &tier2))
    return NULL;
  if (tier2 != Py_None && !PyUnicode_Check(tier2))
    return PyErr_Format(PyExc_TypeError, "tier2 must be the kernel's tier-2 source (str) or None, not %T", tier2);
  if (object != Py_None && !PyBytes_Check(object))
    return PyErr_Format(PyExc_TypeError, "object must be bytes (Kernel.object_code()) or None, not %T", object);
  if (gemm && (nin < 2 || rdims != 0))
    return PyErr_Format(PyExc_ValueError, "a GEMM kernel takes the two matrices first and reduces nothing");
  if (!epilogue && (!gemm || nin != 2 || nout != 1))
    return PyErr_Format(PyExc_ValueError, "only a GEMM kernel of two inputs and one output can skip its epilogue");
  nin -= gemm; /* the kernel loads their product as one operand */
  if (nin < 1 || nout < 1 || nin + nout > TN_LAUNCH_MAX_OPERANDS)
    return PyErr_Format(PyExc_ValueError, "a kernel takes 1..%d operands, got %d + %d",
                        TN_LAUNCH_MAX_OPERANDS, nin, nout);
  if (rdims < 0 || rdims > TN_MAX_RANK)
    return PyErr_Format(PyExc_ValueError, "reduce_dims must lie in [0, %d], got %d", TN_MAX_RANK, rdims);
  if (kinds_arg != Py_None) {
    PyObject *fast = PySequence_Fast(kinds_arg, "out_kinds must be a sequence of ints");
    if (!fast)
      return NULL;
    int ok = PySequence_Fast_GET_SIZE(fast) == nout;
    for (int j = 0; ok && j < nout; j++) {
      long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, j));
      ok = v >= TN_FO_FULL && v <= TN_FO_ROW && (v == TN_FO_FULL || rdims > 0);
      kinds[j] = (uint8_t)v;
    }
    Py_DECREF(fast);
    if (!ok)
      return PyErr_Occurred() ? NULL
                              : PyErr_Format(PyExc_ValueError, "out_kinds must give one of 0, 1, 2 per output "
                                                               "(1 and 2 only with reduce_dims > 0)");
  }
  if (gathers_arg != Py_None) { /* [(table, index, dim), ...]: distinct input operands, pointwise kernels only */
    PyObject *fast = PySequence_Fast(gathers_arg, "gathers must be a sequence of (table, index, dim) triples");
    if (!fast)
      return NULL;
    uint64_t used = 0;
    Py_ssize_t npairs = PySequence_Fast_GET_SIZE(fast);
    int ok = npairs == 0 || (!rdims && !gemm && npairs <= nin / 2);
    ngathers = ok ? (int)npairs : 0;
    for (int i = 0; ok && i < ngathers; i++)
      for (int j = 0; ok && j < 3; j++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(fast, i);
        PyObject *v = PySequence_Check(pair) && PySequence_Size(pair) == 3 ? PySequence_GetItem(pair, j) : NULL;
        long x = v ? PyLong_AsLong(v) : -2;
        Py_XDECREF(v);
        if (j == 2) { /* the dim of an element gather, or -1 */
          ok = x >= -1 && x < TN_MAX_RANK;
        } else {
          ok = x >= 0 && x < nin && !(used >> x & 1);
          used |= ok ? 1ull << x : 0;
        }
        gathers[i][j] = (int)x;
      }
    Py_DECREF(fast);
    if (!ok)
      return PyErr_Occurred() ? NULL
                              : PyErr_Format(PyExc_ValueError, "gathers must pair distinct input operands, with a "
                                                               "dim of -1 to %d (pointwise kernels only)",
                                             TN_MAX_RANK - 1);
  }
  const char *src = PyUnicode_AsUTF8(source);
  if (!src)
    return NULL;
  /* from here on, one exit: what is still owned at `done` is released */
  PyObject *res = NULL;
  KernelObject *k = NULL;
  if (views_arg != Py_None && (gemm || rdims)) { /* (rows that are no run are materialised from the tensor) */
    PyErr_SetString(PyExc_ValueError, "GEMM and row kernels read their inputs as passed (views=None)");
    goto done;
  }
  if (parse_views(views_arg, nin, &views) < 0)
    goto done;
  /* donors: None, or per output the input whose tensor it may be written into (-1: none; pointwise only) */
  for (int j = 0; j < nout; j++)
    donors[j] = -1;
  if (donors_arg != Py_None) {
    PyObject *fast = PySequence_Fast(donors_arg, "donors must be a sequence of ints");
    int ok = fast && PySequence_Fast_GET_SIZE(fast) == nout && !gemm && !rdims;
    for (int j = 0; ok && j < nout; j++) {
      long x = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, j));
      ok = !PyErr_Occurred() && x >= -1 && x < nin;
      donors[j] = (int)x;
    }
    Py_XDECREF(fast);
    if (!ok) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "donors must give an input (or -1) per output (%d; pointwise kernels only)",
                     nout);
      goto done;
    }
  }
  /* into: None, or per output None or (dim, offset): the output is that slice of a tensor passed after the
  ** inputs (one per such output, in output order), not a tensor of its own (pointwise only) */
  for (int j = 0; j < nout; j++) {
    into_dim[j] = -1;
    into_off[j] = 0;
  }
  if (into_arg != Py_None) {
    PyObject *fast = PySequence_Fast(into_arg, "into must be a sequence");
    int ok = fast && PySequence_Fast_GET_SIZE(fast) == nout && !gemm && !rdims;
    for (int j = 0; ok && j < nout; j++) {
      PyObject *e = PySequence_Fast_GET_ITEM(fast, j);
      long long dim = -1, off = 0;
      ok = e == Py_None || (PyArg_ParseTuple(e, "LL", &dim, &off) && dim >= 0 && dim < TN_MAX_RANK && off >= 0);
      into_dim[j] = (int)dim;
      into_off[j] = off;
      ninto += dim >= 0;
    }
    Py_XDECREF(fast);
    if (!ok) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "into must give None or (dim, offset) per output (%d; pointwise kernels only)",
                   nout);
      goto done;
    }
  }
  /* out_strides: None, or per output None or a tuple of ints (pointwise kernels only) */
  if (strides_arg == Py_None) {
    ostrides = PyTuple_New(nout);
    for (int j = 0; ostrides && j < nout; j++)
      PyTuple_SET_ITEM(ostrides, j, Py_NewRef(Py_None));
  } else {
    /* a fresh tuple (never the caller's), its lists (a plan read back
    ** from the cache's JSON) made tuples */
    PyObject *l = PySequence_List(strides_arg);
    for (Py_ssize_t j = 0; l && j < PyList_GET_SIZE(l); j++) {
      PyObject *t = PyList_GET_ITEM(l, j);
      if (PyList_Check(t)) {
        PyObject *tt = PyList_AsTuple(t);
        if (!tt)
          Py_CLEAR(l);
        else
          PyList_SetItem(l, j, tt);
      }
    }
    ostrides = l ? PyList_AsTuple(l) : NULL;
    Py_XDECREF(l);
  }
  if (!ostrides)
    goto done;
  if (PyTuple_GET_SIZE(ostrides) != nout) {
    PyErr_Format(PyExc_ValueError, "out_strides must give one entry per output (%d)", nout);
    goto done;
  }
  for (int j = 0; j < nout; j++) {
    PyObject *t = PyTuple_GET_ITEM(ostrides, j);
    if (t != Py_None && (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) > TN_MAX_RANK || rdims || gemm ||
                         !strides_or_order(t))) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "out_strides[%d] must be None or a tuple of at most %d ints: strides, or "
                                     "-1 - each dim's place in a dense order, innermost 0 (pointwise kernels only)",
                   j, TN_MAX_RANK);
      goto done;
    }
    strided |= t != Py_None;
  }
  if (strided) {
    PyObject *torch = PyImport_ImportModule("torch");
    empty_strided = torch ? PyObject_GetAttrString(torch, "empty_strided") : NULL;
    Py_XDECREF(torch);
    if (!empty_strided)
      goto done;
  }
  if (!(dtypes = PySequence_Tuple(dtypes_arg)))
    goto done;
  if (PyTuple_GET_SIZE(dtypes) != nin + nout) {
    PyErr_Format(PyExc_ValueError, "dtypes must give one dtype per operand (%d), got %zd", nin + nout,
                 PyTuple_GET_SIZE(dtypes));
    goto done;
  }
  if (!(kws = PyTuple_New(nout)))
    goto done;
  for (int i = 0; i < nin + nout; i++) {
    PyObject *d = PyTuple_GET_ITEM(dtypes, i), *sz = PyObject_GetAttrString(d, "itemsize");
    long v = sz ? PyLong_AsLong(sz) : -1;
    Py_XDECREF(sz);
    if (v != 1 && v != 2 && v != 4 && v != 8) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "kernel operand %d: dtype %R is not 1, 2, 4 or 8 bytes wide", i, d);
      goto done;
    }
    isz[i] = (int)v;
    if (i >= nin) {
      PyObject *kw = Py_BuildValue("{s:O}", "dtype", d);
      if (!kw)
        goto done;
      PyTuple_SET_ITEM(kws, i - nin, kw);
    }
  }
  tn_tcc_symbol syms[TN_RT_MAX_SYMBOLS];
  size_t nsyms = 0;
  for (const tn_rt_symbol *s = tn_rt_symbols(); s->rs_name && nsyms < TN_RT_MAX_SYMBOLS; s++)
    syms[nsyms++] = (tn_tcc_symbol){s->rs_name, s->rs_addr};
  /* object code (a stored plan's kernel) is loaded, not compiled; the bytes object outlives the call */
  const uint8_t *obj = object != Py_None ? (const uint8_t *)PyBytes_AS_STRING(object) : NULL;
  size_t objlen = object != Py_None ? (size_t)PyBytes_GET_SIZE(object) : 0;
  Py_BEGIN_ALLOW_THREADS
  rc = obj ? tn_tcc_load_object(obj, objlen, syms, nsyms, &u, err, sizeof err)
           : tn_tcc_compile(src, syms, nsyms, &u, err, sizeof err);
  Py_END_ALLOW_THREADS
  if (rc != TN_OK) {
    PyErr_Format(PyExc_RuntimeError, "libtcc rejected a generated kernel%s: %s", obj ? "'s object code" : "", err);
    goto done;
  }
  tn_launch_fn fn = (tn_launch_fn)tn_tcc_get(u, "tn_kernel");
  if (!fn) {
    PyErr_Format(PyExc_RuntimeError, "generated kernel has no tn_kernel");
    goto done;
  }
  if (!(k = (KernelObject *)type->tp_alloc(type, 0)))
    goto done;
  /* the kernel takes over what it holds */
  k->ke_empty_kws = kws;
  k->ke_out_strides = ostrides;
  k->ke_empty_strided = empty_strided;
  k->ke_dtypes = dtypes;
  k->ke_unit = u;
  k->ke_views = views;
  kws = ostrides = empty_strided = dtypes = NULL;
  u = NULL;
  views = NULL;
  k->ke_strided = strided;
  memcpy(k->ke_donor, donors, sizeof(int) * (size_t)nout);
  k->ke_ninto = ninto;
  memcpy(k->ke_into_dim, into_dim, sizeof(int) * (size_t)nout);
  memcpy(k->ke_into_off, into_off, sizeof(int64_t) * (size_t)nout);
  k->ke_ngathers = ngathers;
  memcpy(k->ke_gather, gathers, sizeof(int) * 3 * (size_t)ngathers);
  k->ke_fn = fn;
  k->ke_ninputs = nin;
  k->ke_noutputs = nout;
  memcpy(k->ke_isz, isz, sizeof(int) * (size_t)(nin + nout));
  k->ke_rdims = rdims;
  k->ke_nonempty = nonempty;
  k->ke_gemm = gemm;
  k->ke_epilogue = epilogue;
  memcpy(k->ke_out_kinds, kinds, sizeof kinds);
  k->ke_empty = Py_NewRef(empty);
  k->ke_source = Py_NewRef(source);
  k->ke_tier2_source = tier2 == Py_None ? NULL : Py_NewRef(tier2);
  tn_stat_add(obj ? TN_STAT_kernels_loaded : TN_STAT_kernels_compiled, 1);
  res = (PyObject *)k;
done:
  Py_XDECREF(dtypes);
  Py_XDECREF(kws);
  Py_XDECREF(ostrides);
  Py_XDECREF(empty_strided);
  PyMem_Free(views);
  tn_tcc_free(u);
  return res;
}

static void Kernel_dealloc(PyObject *o)
{
  KernelObject *k = (KernelObject *)o;
  PyTypeObject *tp = Py_TYPE(o);
  tn_tcc_free(k->ke_unit);
  Py_XDECREF(k->ke_empty);
  Py_XDECREF(k->ke_dtypes);
  Py_XDECREF(k->ke_empty_kws);
  Py_XDECREF(k->ke_out_strides);
  Py_XDECREF(k->ke_empty_strided);
  Py_XDECREF(k->ke_source);
  Py_XDECREF(k->ke_tier2_source);
  tn_tier2_free(k->ke_t2);
  PyMem_Free(k->ke_views);
  tp->tp_free(o);
  Py_DECREF(tp);
}

/* Interned names of the tensor attributes a launch reads (made once, at
** module init: a lookup by interned name skips building a string). */
static PyObject *str_dtype, *str_shape, *str_stride;
PyObject *tn_py_str_data_ptr;

int tn_py_kernel_read_tensor(KernelObject *k, PyObject *t, int i, int op, int64_t *sizes, int64_t *strides,
                             int *rank, void **data)
{
  PyObject *dtype = PyObject_GetAttr(t, str_dtype), *want = PyTuple_GET_ITEM(k->ke_dtypes, op);
  if (!dtype)
    return -1;
  int ok = dtype == want;
  Py_DECREF(dtype);
  if (!ok) {
    PyErr_Format(PyExc_TypeError, "kernel input %d: expected a tensor of dtype %R", i, want);
    return -1;
  }
  PyObject *shape = PyObject_GetAttr(t, str_shape);
  PyObject *stride = shape ? PyObject_CallMethodNoArgs(t, str_stride) : NULL;
  PyObject *ptr = stride ? PyObject_CallMethodNoArgs(t, tn_py_str_data_ptr) : NULL;
  int rc = -1, srank;
  if (stride && !ptr && PyErr_ExceptionMatches(PyExc_RuntimeError)) {
    /* a torch.func transform's (vmap, grad): a wrapper "that doesn't have storage" */
    PyErr_Clear();
    PyErr_Format(tn_py_NoMemory, "kernel input %d is a tensor without memory (a torch.func transform's)", i);
  }
  if (ptr && read_ints(shape, sizes, rank) == 0 && read_ints(stride, strides, &srank) == 0) {
    *data = PyLong_AsVoidPtr(ptr);
    rc = PyErr_Occurred() ? -1 : 0;
    int64_t numel = 1;
    for (int d = 0; d < *rank; d++)
      numel *= sizes[d];
    if (rc == 0 && !*data && numel > 0) { /* FakeTensorMode's tensors (a meta tensor's graph is not ours) */
      PyErr_Format(tn_py_NoMemory, "kernel input %d is a tensor without memory (a fake or meta tensor)", i);
      rc = -1;
    }
  }
  Py_XDECREF(shape);
  Py_XDECREF(stride);
  Py_XDECREF(ptr);
  return rc;
}

/* A tuple of ints: sizes[0..n), then `ones` ones. */
static PyObject *shape_tuple(const int64_t *sizes, int n, int ones)
{
  PyObject *t = PyTuple_New(n + ones);
  for (int d = 0; t && d < n + ones; d++) {
    PyObject *v = PyLong_FromLongLong(d < n ? sizes[d] : 1);
    if (!v) {
      Py_CLEAR(t);
      break;
    }
    PyTuple_SET_ITEM(t, d, v);
  }
  return t;
}

/* tn_pool_run with the GIL released: the index checks' parts. */
static int pool_run_nogil(void (*fn)(void *ctx, int part, int nparts), void *ctx, int nparts)
{
  int parts;
  Py_BEGIN_ALLOW_THREADS
  parts = tn_pool_run(fn, ctx, nparts);
  Py_END_ALLOW_THREADS
  return parts;
}

/* Element gather gi of k (aten.gather along dim): checks its indices
** (RuntimeError, as eager) and the table's sizes, then gives the table the
** index's sizes, at stride 0 along dim (the kernel adds index * *rowst,
** the table's stride there). */
static int gather_elements(KernelObject *k, int gi, int64_t (*sizes)[TN_MAX_RANK], int64_t (*strides)[TN_MAX_RANK],
                           const int *rank, void **ptrs, int64_t *rowst)
{
  int t = k->ke_gather[gi][0], q = k->ke_gather[gi][1], dim = k->ke_gather[gi][2], r = rank[q];
  int64_t bad = 0;
  if (rank[t] != r || dim >= r) {
    PyErr_Format(PyExc_ValueError, "kernel gather %d: a table of rank %d, an index of rank %d, dim %d", gi, rank[t],
                 r, dim);
    return -1;
  }
  for (int d = 0; d < r; d++)
    if (d != dim && sizes[q][d] > sizes[t][d]) {
      PyErr_Format(PyExc_RuntimeError, "Size does not match at dimension %d expected index [%lld] to be no larger "
                   "than self [%lld] apart from dimension %d", d, (long long)sizes[q][d], (long long)sizes[t][d], dim);
      return -1;
    }
  if (!tn_launch_indices_in_range(ptrs[q], sizes[q], strides[q], r, k->ke_isz[q], sizes[t][dim], &bad,
                                  pool_run_nogil)) {
    PyErr_Format(PyExc_RuntimeError, "index %lld is out of bounds for dimension %d with size %lld", (long long)bad, dim,
                 (long long)sizes[t][dim]);
    return -1;
  }
  *rowst = strides[t][dim];
  for (int d = 0; d < r; d++)
    sizes[t][d] = sizes[q][d];
  strides[t][dim] = 0;
  return 0;
}

/* Gather gi of k: checks its indices (IndexError, as eager) and gives its
** table and index the shapes they broadcast with: table sizes = index
** sizes + the table's row sizes, at strides 0 over the index's dims (the
** kernel adds the row offset); index sizes = its own + ones. Sets *rowst
** to the table's row stride. Element gathers: gather_elements. */
static int gather_operands(KernelObject *k, int gi, int64_t (*sizes)[TN_MAX_RANK], int64_t (*strides)[TN_MAX_RANK],
                           int *rank, void **ptrs, int64_t *rowst)
{
  if (k->ke_gather[gi][2] >= 0)
    return gather_elements(k, gi, sizes, strides, rank, ptrs, rowst);
  int t = k->ke_gather[gi][0], q = k->ke_gather[gi][1], ir = rank[q], tr = rank[t];
  int64_t ts[TN_MAX_RANK], tst[TN_MAX_RANK], bad = 0;
  if (tr < 2 || ir + tr - 1 > TN_MAX_RANK) {
    PyErr_Format(PyExc_ValueError, "kernel gather %d: a table of rank %d indexed by rank %d", gi, tr, ir);
    return -1;
  }
  if (!tn_launch_indices_in_range(ptrs[q], sizes[q], strides[q], ir, k->ke_isz[q], sizes[t][0], &bad,
                                  pool_run_nogil)) {
    PyErr_SetString(PyExc_IndexError, "index out of range in self");
    return -1;
  }
  *rowst = strides[t][0];
  memcpy(ts, sizes[t], sizeof ts);
  memcpy(tst, strides[t], sizeof tst);
  for (int d = 0; d < ir + tr - 1; d++) {
    sizes[t][d] = d < ir ? sizes[q][d] : ts[d - ir + 1];
    strides[t][d] = d < ir ? 0 : tst[d - ir + 1];
  }
  for (int d = ir; d < ir + tr - 1; d++) {
    sizes[q][d] = 1;
    strides[q][d] = 0;
  }
  rank[t] = rank[q] = ir + tr - 1;
  return 0;
}

/* Whether output j of k may be written into its donor input: a pointwise
** kernel's full-shape contiguous output, the donor read as passed (no
** view), contiguous, of the iteration shape (sizes, strides as read). */
static int donor_fits(const KernelObject *k, int j, const int64_t *shape, int rank,
                      int64_t (*sizes)[TN_MAX_RANK], int64_t (*strides)[TN_MAX_RANK], const int *ranks)
{
  int i = k->ke_donor[j];
  if (i < 0 || k->ke_out_kinds[j] != TN_FO_FULL || PyTuple_GET_ITEM(k->ke_out_strides, j) != Py_None ||
      (k->ke_views && k->ke_views[i].kv_on) || ranks[i] != rank)
    return 0;
  int64_t step = 1;
  for (int d = rank - 1; d >= 0; d--) {
    if (sizes[i][d] != shape[d] || (shape[d] != 1 && strides[i][d] != step))
      return 0;
    step *= shape[d];
  }
  return 1;
}

/* Output j of k, written into t (passed for it): t has the iteration
** shape but along ke_into_dim[j], where the output is the slice at
** ke_into_off[j]. Sets the output's strides (st) and place (*data). */
static int into_slice(KernelObject *k, int j, PyObject *t, const int64_t *shape, int rank, int64_t *st, void **data)
{
  int64_t sizes[TN_MAX_RANK];
  int trank, dim = k->ke_into_dim[j], op = k->ke_ninputs + j;
  int64_t off = k->ke_into_off[j];
  if (tn_py_kernel_read_tensor(k, t, op, op, sizes, st, &trank, data) < 0)
    return -1;
  int ok = trank == rank && dim < rank;
  for (int d = 0; ok && d < rank; d++)
    ok = d == dim ? off + shape[d] <= sizes[d] : sizes[d] == shape[d];
  if (!ok) {
    PyErr_Format(PyExc_ValueError, "kernel output %d: the tensor given for it has no slice of its shape at "
                                   "%lld along dim %d", j, (long long)off, dim);
    return -1;
  }
  *data = (char *)*data + off * st[dim] * k->ke_isz[op];
  return 0;
}

/* The strides (st, rank entries) of an output whose out_strides entry ost
** is not None: its strides, or where its entries are negative the dense
** layout they order, for sizes shape (strides_or_order checked the form).
** Returns 1 for an order, 0 for strides, -1 with an exception. */
static int out_strides_of(PyObject *ost, const int64_t *shape, int rank, int64_t *st)
{
  int64_t step = 1;
  for (int d = 0; d < rank; d++)
    st[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(ost, d));
  if (PyErr_Occurred())
    return -1;
  if (rank == 0 || st[0] >= 0)
    return 0;
  for (int place = 0; place < rank; place++)
    for (int d = 0; d < rank; d++)
      if (st[d] == -1 - place) {
        st[d] = step;
        step *= shape[d];
        break;
      }
  return 1;
}

PyObject *tn_py_kernel_prepare(KernelObject *k, PyObject *args, kernel_prepared *p)
{
  int nops = k->ke_ninputs + k->ke_noutputs, rank = 0, rdims = k->ke_rdims, ninto = 0;
  int64_t in_sizes[TN_LAUNCH_MAX_OPERANDS][TN_MAX_RANK], in_strides[TN_LAUNCH_MAX_OPERANDS][TN_MAX_RANK];
  int64_t rowst[TN_LAUNCH_MAX_OPERANDS];
  int in_rank[TN_LAUNCH_MAX_OPERANDS];
  int64_t *shape = p->pr_shape;
  int64_t bst[TN_LAUNCH_MAX_OPERANDS][TN_MAX_RANK]; /* per operand, per dim of the iteration space */
  int64_t *st = p->pr_st, *cst = p->pr_cst, *csizes = p->pr_csizes;
  void **ptrs = p->pr_ptrs;
  PyObject *outs = NULL, *shape_t = NULL, *held = NULL;

  p->pr_held = NULL;
  p->pr_run = 0;
  /* a kernel asks once: after that (or without a tier 2) the launch reads no setting */
  k->ke_calls++;
  if (!k->ke_t2_asked && k->ke_tier2_source && k->ke_calls >= tn_config_int(TN_CFG_tier2_after_calls) &&
      tn_py_tier2_hook && tn_py_tier2_hook != Py_None) {
    k->ke_t2_asked = 1; /* once; the hook warns about its own failures */
    PyObject *r = PyObject_CallOneArg(tn_py_tier2_hook, (PyObject *)k);
    if (!r)
      PyErr_WriteUnraisable(tn_py_tier2_hook);
    Py_XDECREF(r);
  }

  for (int i = 0; i < k->ke_ninputs; i++)
    if (tn_py_kernel_read_tensor(k, PyTuple_GET_ITEM(args, i), i, i, in_sizes[i], in_strides[i], &in_rank[i],
                                 &ptrs[i]) < 0 ||
        (k->ke_views && k->ke_views[i].kv_on &&
         apply_view(&k->ke_views[i], i, in_sizes[i], in_strides[i], &in_rank[i], &ptrs[i], k->ke_isz[i]) < 0))
      return NULL;
  for (int gi = 0; gi < k->ke_ngathers; gi++)
    if (gather_operands(k, gi, in_sizes, in_strides, in_rank, ptrs, &rowst[gi]) < 0)
      return NULL;
  for (int i = 0; i < k->ke_ninputs; i++)
    if (in_rank[i] > rank)
      rank = in_rank[i];
  /* the iteration shape: the broadcast of the inputs */
  for (int d = 0; d < rank; d++) {
    shape[d] = 1;
    for (int i = 0; i < k->ke_ninputs; i++) {
      int di = d - (rank - in_rank[i]);
      if (di < 0 || in_sizes[i][di] == 1)
        continue;
      if (shape[d] != 1 && shape[d] != in_sizes[i][di])
        return PyErr_Format(PyExc_ValueError, "kernel inputs do not broadcast at dim %d", d);
      shape[d] = in_sizes[i][di];
    }
  }
  if (rdims > rank)
    return PyErr_Format(PyExc_ValueError, "kernel reduces %d dims of a rank-%d iteration space", rdims, rank);
  int rrank = rank - rdims; /* dims of the rows' space (all of them for pointwise kernels) */
  int64_t cols = 1, rows = 1;
  for (int d = 0; d < rank; d++)
    *(d < rrank ? &rows : &cols) *= shape[d];
  if (k->ke_nonempty && cols == 0)
    return PyErr_Format(PyExc_IndexError, "kernel: reduction over dims with no elements");
  if (!(shape_t = shape_tuple(shape, rank, 0)))
    goto error;
  for (int i = 0; i < k->ke_ninputs; i++) {
    for (int pass = 0; pass < 2; pass++) {
      for (int d = 0; d < rank; d++) {
        int di = d - (rank - in_rank[i]);
        bst[i][d] = di < 0 || (in_sizes[i][di] == 1 && shape[d] != 1) ? 0 : in_strides[i][di];
      }
      cst[i] = rdims ? tn_launch_run_stride(bst[i], shape, rrank, rank) : 0;
      if (cst[i] >= 0)
        break;
      /* a row that is not one strided run: materialise this operand */
      PyObject *x = PyObject_CallMethod(PyTuple_GET_ITEM(args, i), "expand", "O", shape_t);
      PyObject *c = x ? PyObject_CallMethod(x, "contiguous", NULL) : NULL;
      Py_XDECREF(x);
      if (!held && c)
        held = PyList_New(0);
      if (!c || !held || PyList_Append(held, c) < 0 ||
          tn_py_kernel_read_tensor(k, c, i, i, in_sizes[i], in_strides[i], &in_rank[i], &ptrs[i]) < 0) {
        Py_XDECREF(c);
        goto error;
      }
      Py_DECREF(c);
    }
  }

  for (int gi = 0; gi < k->ke_ngathers; gi++)
    cst[k->ke_gather[gi][0]] = rowst[gi];

  /* outputs: contiguous, of the iteration shape or the rows' shape */
  if (!(outs = PyTuple_New(k->ke_noutputs)))
    goto error;
  for (int j = 0; j < k->ke_noutputs; j++) {
    int kind = k->ke_out_kinds[j];
    PyObject *ost = PyTuple_GET_ITEM(k->ke_out_strides, j), *ord = NULL;
    int64_t ostv[TN_MAX_RANK];
    int ordered = 0;
    if (ost != Py_None && PyTuple_GET_SIZE(ost) != rank) {
      PyErr_Format(PyExc_ValueError, "kernel output %d: %zd strides for a rank-%d result", j, PyTuple_GET_SIZE(ost),
                   rank);
      goto error;
    }
    if (ost != Py_None && (ordered = out_strides_of(ost, shape, rank, ostv)) < 0)
      goto error;
    if (k->ke_into_dim[j] >= 0) { /* a slice of the tensor passed for it */
      if (into_slice(k, j, PyTuple_GET_ITEM(args, k->ke_ninputs + ninto++), shape, rank, bst[k->ke_ninputs + j],
                     &ptrs[k->ke_ninputs + j]) < 0)
        goto error;
      PyTuple_SET_ITEM(outs, j, Py_NewRef(PyTuple_GET_ITEM(args, k->ke_ninputs + ninto - 1)));
      cst[k->ke_ninputs + j] = 1;
      continue;
    }
    /* a layout order: the strides of this call's sizes, as a tuple for empty_strided */
    if (ordered && !(ost = ord = shape_tuple(ostv, rank, 0)))
      goto error;
    int donor = donor_fits(k, j, shape, rank, in_sizes, in_strides, in_rank) ? k->ke_donor[j] : -1;
    PyObject *shp = donor >= 0 ? NULL
                  : kind == TN_FO_FULL ? Py_NewRef(shape_t) : shape_tuple(shape, rrank, kind == TN_FO_KEEPDIM ? rdims : 0);
    PyObject *eargs = shp ? (ost == Py_None ? PyTuple_Pack(1, shp) : PyTuple_Pack(2, shp, ost)) : NULL;
    Py_XDECREF(ord);
    PyObject *t = donor >= 0 ? Py_NewRef(PyTuple_GET_ITEM(args, donor)) /* its last use: written in place */
                : eargs ? PyObject_Call(ost == Py_None ? k->ke_empty : k->ke_empty_strided, eargs,
                                        PyTuple_GET_ITEM(k->ke_empty_kws, j))
                        : NULL;
    Py_XDECREF(shp);
    Py_XDECREF(eargs);
    if (!t)
      goto error;
    for (int jj = 0; donor >= 0 && jj < j; jj++) /* one output per donor */
      if (PyTuple_GET_ITEM(outs, jj) == t) {
        PyErr_SetString(PyExc_ValueError, "kernel: two outputs given one donor");
        Py_DECREF(t);
        goto error;
      }
    PyTuple_SET_ITEM(outs, j, t);
    PyObject *ptr = PyObject_CallMethodNoArgs(t, tn_py_str_data_ptr);
    if (!ptr)
      goto error;
    ptrs[k->ke_ninputs + j] = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    int64_t step = 1;
    for (int d = rank - 1; d >= 0; d--) {
      if (ost != Py_None) {
        bst[k->ke_ninputs + j][d] = ostv[d];
      } else if (kind == TN_FO_FULL || d < rrank) {
        bst[k->ke_ninputs + j][d] = step;
        step *= shape[d];
      }
    }
    if (PyErr_Occurred())
      goto error;
    cst[k->ke_ninputs + j] = kind == TN_FO_FULL ? 1 : 0;
  }
  if (k->ke_strided && !k->ke_ngathers) /* gathers need their index's dims outermost */
    tn_launch_iteration_order(shape, bst, nops, rank, bst[k->ke_ninputs]);

  /* coalesce the rows' dims: merge dim d into d+1 when every operand steps
  ** through both as one */
  int crank = 0;
  int64_t cstr[TN_LAUNCH_MAX_OPERANDS * TN_MAX_RANK];
  for (int d = 0; d < rrank; d++) {
    if (shape[d] == 1 && rrank > 1 && !k->ke_ngathers) /* a gather's rows stay innermost, even of 1 */
      continue;
    if (crank > 0) {
      int merge = 1;
      for (int p = 0; p < nops && merge; p++)
        merge = cstr[p * TN_MAX_RANK + crank - 1] == bst[p][d] * shape[d];
      if (merge) {
        csizes[crank - 1] *= shape[d];
        for (int p = 0; p < nops; p++)
          cstr[p * TN_MAX_RANK + crank - 1] = bst[p][d];
        continue;
      }
    }
    csizes[crank] = shape[d];
    for (int p = 0; p < nops; p++)
      cstr[p * TN_MAX_RANK + crank] = bst[p][d];
    crank++;
  }
  for (int p = 0; p < nops; p++) /* the kernel's layout: strides[p * rank + d] */
    for (int d = 0; d < crank; d++)
      st[p * crank + d] = cstr[p * TN_MAX_RANK + d];
  p->pr_la = (tn_launch){k->ke_fn, k->ke_fn2, crank, nops, k->ke_isz, csizes, ptrs, st, cols, cst};
  p->pr_rank = rank;
  p->pr_numel = rows * cols;
  p->pr_run = rows > 0 && (p->pr_numel > 0 || rdims > 0);
  p->pr_held = held;
  Py_DECREF(shape_t);
  return outs;
error:
  Py_XDECREF(shape_t);
  p->pr_held = held;
  Py_XDECREF(outs);
  return NULL;
}

void tn_py_kernel_execute(const kernel_prepared *p)
{
  const tn_launch *la = &p->pr_la;
  if (!p->pr_run)
    return;
  int parts =
      tn_launch_split_parts(p->pr_numel, TN_LAUNCH_PART_ELEMENTS, la->la_rank == 0 ? 1 : la->la_sizes[0]);
  if (p->pr_numel >= KERNEL_NOGIL_ELEMENTS) {
    Py_BEGIN_ALLOW_THREADS
    tn_pool_run(tn_launch_part, (void *)la, parts);
    Py_END_ALLOW_THREADS
  } else {
    tn_launch_range(la, 0, la->la_rank == 0 ? 1 : la->la_sizes[0]);
  }
}

static PyObject *kernel_run(KernelObject *k, PyObject *args)
{
  kernel_prepared p;
  PyObject *outs = tn_py_kernel_prepare(k, args, &p);
  if (outs)
    tn_py_kernel_execute(&p);
  Py_XDECREF(p.pr_held);
  return outs;
}

static PyObject *Kernel_call(PyObject *o, PyObject *args, PyObject *kwds)
{
  KernelObject *k = (KernelObject *)o;
  Py_ssize_t nargs = k->ke_ninputs + k->ke_gemm + k->ke_ninto;
  if (kwds && PyDict_Size(kwds))
    return PyErr_Format(PyExc_TypeError, "a kernel takes no keyword arguments");
  if (PyTuple_GET_SIZE(args) != nargs)
    return PyErr_Format(PyExc_TypeError, "kernel takes %zd tensors, got %zd", nargs, PyTuple_GET_SIZE(args));
  tn_yield_mkl_serial_in_child(); /* MKL's functions our kernels call, serial in a forked child */
  return k->ke_gemm ? tn_py_gemm_run(k, args) : kernel_run(k, args);
}

static PyObject *py_set_openmp(PyObject *self, PyObject *args)
{
  PyObject *a, *b, *c;
  (void)self;
  if (!PyArg_ParseTuple(args, "OOO:set_openmp", &a, &b, &c))
    return NULL;
  void *pa = PyLong_AsVoidPtr(a), *pb = PyLong_AsVoidPtr(b), *pc = PyLong_AsVoidPtr(c);
  if (PyErr_Occurred())
    return NULL;
  tn_pool_use_openmp(pa, pb, pc);
  Py_RETURN_NONE;
}

static PyObject *Kernel_get_source(PyObject *o, void *closure)
{
  (void)closure;
  return Py_NewRef(((KernelObject *)o)->ke_source);
}

static PyObject *Kernel_get_name(PyObject *o, void *closure)
{
  (void)o;
  (void)closure;
  return PyUnicode_FromString("neuron_kernel");
}

static PyObject *Kernel_object_code(PyObject *o, PyObject *unused)
{
  (void)unused;
  const char *src = PyUnicode_AsUTF8(((KernelObject *)o)->ke_source);
  uint8_t *obj = NULL;
  size_t len = 0;
  char err[2048];
  int rc;
  if (!src)
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = tn_tcc_compile_object(src, &obj, &len, err, sizeof err);
  Py_END_ALLOW_THREADS
  if (rc != TN_OK)
    return rc == TN_ENOMEM ? PyErr_NoMemory()
                           : PyErr_Format(PyExc_RuntimeError, "compiling a kernel to object code failed: %s", err);
  PyObject *res = PyBytes_FromStringAndSize((const char *)obj, (Py_ssize_t)len);
  free(obj);
  return res;
}

static PyObject *Kernel_set_tier2(PyObject *o, PyObject *arg)
{
  KernelObject *k = (KernelObject *)o;
  char err[1024];
  tn_tier2_obj *t2 = NULL;
  Py_buffer view;
  int rc;
  if (!k->ke_tier2_source)
    return PyErr_Format(PyExc_ValueError, "this kernel has no tier 2");
  if (k->ke_t2)
    return PyErr_Format(PyExc_ValueError, "this kernel is at tier 2 already");
  if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
    return NULL;
  rc = tn_tier2_load(view.buf, (size_t)view.len, "tn_kernel2", &t2, err, sizeof err);
  PyBuffer_Release(&view);
  if (rc != TN_OK)
    return rc == TN_ENOMEM ? PyErr_NoMemory()
                           : PyErr_Format(PyExc_RuntimeError, "loading a tier-2 kernel failed: %s", err);
  k->ke_t2 = t2;
  k->ke_fn2 = (tn_launch_fn2)tn_tier2_symbol(t2); /* under the GIL: the next launch prepared takes it */
  tn_stat_add(TN_STAT_tier2_kernels, 1);
  Py_RETURN_NONE;
}

static PyObject *Kernel_get_tier2_source(PyObject *o, void *closure)
{
  (void)closure;
  KernelObject *k = (KernelObject *)o;
  return Py_NewRef(k->ke_tier2_source ? k->ke_tier2_source : Py_None);
}

static PyObject *Kernel_get_tier(PyObject *o, void *closure)
{
  (void)closure;
  return PyLong_FromLong(((KernelObject *)o)->ke_fn2 ? 2 : 1);
}

static PyObject *Kernel_get_tier2_asked(PyObject *o, void *closure)
{
  (void)closure;
  return PyBool_FromLong(((KernelObject *)o)->ke_t2_asked);
}

static int Kernel_set_tier2_asked(PyObject *o, PyObject *value, void *closure)
{
  (void)closure;
  int on = value ? PyObject_IsTrue(value) : 0;
  if (on < 0)
    return -1;
  ((KernelObject *)o)->ke_t2_asked = on;
  return 0;
}

static PyObject *Kernel_get_calls(PyObject *o, void *closure)
{
  (void)closure;
  return PyLong_FromLongLong(((KernelObject *)o)->ke_calls);
}

static PyMethodDef Kernel_methods[] = {
  {"set_tier2", Kernel_set_tier2, METH_O,
   "set_tier2(object): loads the kernel's tier 2 (a shared object compiled from tier2_source, as bytes); launches "
   "prepared from then on try it first. Once per kernel."},
  {"object_code", Kernel_object_code, METH_NOARGS,
   "The kernel's source compiled again to relocatable object code (bytes): Kernel(..., object=) loads it "
   "without compiling."},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef Kernel_getset[] = {
  {"source", Kernel_get_source, NULL, "the generated C", NULL},
  {"tier2_source", Kernel_get_tier2_source, NULL, "the generated C of its tier 2, or None", NULL},
  {"tier", Kernel_get_tier, NULL, "2 once its tier 2 is loaded, else 1", NULL},
  {"tier2_asked", Kernel_get_tier2_asked, Kernel_set_tier2_asked,
   "whether it asked the tier-2 hook already (it asks once); False: it asks again at its next launch", NULL},
  {"calls", Kernel_get_calls, NULL, "launches prepared so far", NULL},
  {"__name__", Kernel_get_name, NULL, "name in FX graphs and tracebacks", NULL},
  {"__qualname__", Kernel_get_name, NULL, "name in FX graphs and tracebacks", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Kernel_slots[] = {
  {Py_tp_new, Kernel_new},
  {Py_tp_dealloc, Kernel_dealloc},
  {Py_tp_call, Kernel_call},
  {Py_tp_getset, Kernel_getset},
  {Py_tp_methods, Kernel_methods},
  {Py_tp_doc, "Kernel(source, ninputs, noutputs, empty, dtypes, ..., object=None): a fused kernel compiled by "
              "libtcc (or loaded from object, its object_code()); call it with the input tensors to get a tuple "
              "of outputs."},
  {0, NULL},
};

static PyType_Spec Kernel_spec = {"torchneuron_jit._C.Kernel", sizeof(KernelObject), 0, Py_TPFLAGS_DEFAULT,
                                  Kernel_slots};

static PyObject *py_set_kernel_threads(PyObject *self, PyObject *arg)
{
  (void)self;
  long n = PyLong_AsLong(arg);
  if (n == -1 && PyErr_Occurred())
    return NULL;
  if (n < 1 || n > 64)
    return PyErr_Format(PyExc_ValueError, "threads must lie in [1, 64], got %ld", n);
  tn_launch_set_threads((int)n);
  Py_RETURN_NONE;
}

static PyObject *py_set_eager_math(PyObject *self, PyObject *args)
{
  (void)self;
  const char *name;
  int f64;
  PyObject *address;
  if (!PyArg_ParseTuple(args, "spO:set_eager_math", &name, &f64, &address))
    return NULL;
  void *fn = address == Py_None ? NULL : PyLong_AsVoidPtr(address);
  if (!fn && PyErr_Occurred())
    return NULL;
  if (tn_rt_set_eager_math(tn_rt_unary_named(name), f64, fn) != TN_OK)
    return PyErr_Format(PyExc_ValueError, "set_eager_math: no eager math function for op %R", PyTuple_GET_ITEM(args, 0));
  Py_RETURN_NONE;
}

PyMethodDef tn_py_kernel_methods[] = {
  {"set_eager_math", py_set_eager_math, METH_VARARGS,
   "set_eager_math(op, f64, address): the function f(n, a, r, mode) (MKL's vmsExp ... signature) computing "
   "eager's values of unary op ('exp', 'log', 'sin', 'cos', 'tanh' or 'erf') over float32 (f64 False) or float64 "
   "values, which the runtime's blocks of that op call (None: the runtime's own)."},
  {"set_openmp", py_set_openmp, METH_VARARGS,
   "set_openmp(GOMP_parallel, omp_get_thread_num, omp_get_num_threads): addresses of the OpenMP runtime "
   "large launches split across (PyTorch's); 0, 0, 0 for our own pool."},
  {"set_kernel_threads", py_set_kernel_threads, METH_O,
   "set_kernel_threads(n): threads a large kernel launch is split across (default 1)."},
  {NULL, NULL, 0, NULL},
};

int tn_py_kernel_init(PyObject *m)
{
  if (!(str_dtype = PyUnicode_InternFromString("dtype")) || !(str_shape = PyUnicode_InternFromString("shape")) ||
      !(str_stride = PyUnicode_InternFromString("stride")) ||
      !(tn_py_str_data_ptr = PyUnicode_InternFromString("data_ptr")))
    return -1;
  PyObject *t = PyType_FromSpec(&Kernel_spec);
  if (!t)
    return -1;
  int rc = PyModule_AddObjectRef(m, "Kernel", t);
  Py_DECREF(t);
  return rc;
}

