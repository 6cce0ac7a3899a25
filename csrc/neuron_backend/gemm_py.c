/*
** The call of a GEMM kernel (_C.Kernel(..., gemm=True)): its two matrices
** read and their product allocated here, computed by the external GEMM
** (gemm.h) across the kernel threads with the epilogue (the kernel, on
** the product and the rest of the arguments) run over each part; and
** _C.set_sgemm, the BLAS it calls.
*/
#include "../tn_py.h"

#include <string.h>

#include "gemm.h"
#include "kernel_internal.h"
#include "pool.h"

/* Reads matrices a (m x k) and b (k x n) into j and allocates their
** product, a new contiguous m x n tensor (returned). A layout BLAS cannot
** read is copied contiguous first; held[] keeps such copies. */
static PyObject *gemm_plan(KernelObject *k, PyObject *a, PyObject *b, tn_gemm_job *j, PyObject **held)
{
  int64_t sz[2][TN_MAX_RANK], st[2][TN_MAX_RANK];
  int rank[2];
  void *data[2];
  PyObject *mats[2] = {a, b};
  if (!tn_gemm_has_sgemm())
    return PyErr_Format(PyExc_RuntimeError, "no BLAS sgemm is registered");
  memset(j, 0, sizeof *j);
  for (int i = 0; i < 2; i++) {
    for (int pass = 0; pass < 2 && !j->gj_lay[i]; pass++) {
      if (tn_py_kernel_read_tensor(k, mats[i], i, 0, sz[i], st[i], &rank[i], &data[i]) < 0)
        return NULL;
      if (rank[i] != 2 && rank[i] != 3)
        return PyErr_Format(PyExc_ValueError, "GEMM operand %d must be a matrix or a batch of them, got rank %d",
                            i, rank[i]);
      if (rank[i] == 2) { /* a matrix: one product, as a batch of one */
        memmove(sz[i] + 1, sz[i], 2 * sizeof(int64_t));
        memmove(st[i] + 1, st[i], 2 * sizeof(int64_t));
        sz[i][0] = 1;
        st[i][0] = 0;
      }
      j->gj_lay[i] = tn_gemm_blas_layout(sz[i][1], sz[i][2], st[i][1], st[i][2], &j->gj_ld[i]);
      if (!j->gj_lay[i] && pass == 0) {
        if (!(held[i] = PyObject_CallMethod(mats[i], "contiguous", NULL)))
          return NULL;
        mats[i] = held[i];
      }
    }
  }
  if (rank[0] != rank[1] || sz[0][0] != sz[1][0] || sz[0][2] != sz[1][1] || sz[0][1] > INT32_MAX ||
      sz[1][2] > INT32_MAX || sz[0][2] > INT32_MAX)
    return PyErr_Format(PyExc_ValueError, "GEMM shapes (%lld x %lld x %lld) @ (%lld x %lld x %lld) do not fit",
                        (long long)sz[0][0], (long long)sz[0][1], (long long)sz[0][2], (long long)sz[1][0],
                        (long long)sz[1][1], (long long)sz[1][2]);
  j->gj_batch = sz[0][0];
  j->gj_bst[0] = st[0][0];
  j->gj_bst[1] = st[1][0];
  j->gj_m = (int)sz[0][1];
  j->gj_k = (int)sz[0][2];
  j->gj_n = (int)sz[1][2];
  j->gj_ldc = j->gj_n > 1 ? j->gj_n : 1;
  j->gj_a = data[0];
  j->gj_b = data[1];
  PyObject *shape = rank[0] == 3 ? Py_BuildValue("((Lii))", (long long)j->gj_batch, j->gj_m, j->gj_n)
                                 : Py_BuildValue("((ii))", j->gj_m, j->gj_n);
  PyObject *res = shape ? PyObject_Call(k->ke_empty, shape, PyTuple_GET_ITEM(k->ke_empty_kws, 0)) : NULL;
  Py_XDECREF(shape);
  PyObject *ptr = res ? PyObject_CallMethodNoArgs(res, tn_py_str_data_ptr) : NULL;
  j->gj_c = ptr ? PyLong_AsVoidPtr(ptr) : NULL; /* NULL for an empty result */
  Py_XDECREF(ptr);
  if (!ptr || PyErr_Occurred())
    Py_CLEAR(res);
  return res;
}

/* When the product splits by rows, each thread runs the epilogue over its
** rows right after computing them. */
PyObject *tn_py_gemm_run(KernelObject *k, PyObject *args)
{
  tn_gemm_job j;
  kernel_prepared p;
  PyObject *held[2] = {NULL, NULL}, *outs = NULL;
  Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  p.pr_held = NULL;
  PyObject *kargs = PyTuple_New(nargs - 1);
  PyObject *prod = kargs ? gemm_plan(k, PyTuple_GET_ITEM(args, 0), PyTuple_GET_ITEM(args, 1), &j, held) : NULL;
  if (!prod)
    goto done;
  PyTuple_SET_ITEM(kargs, 0, prod);
  for (Py_ssize_t i = 2; i < nargs; i++)
    PyTuple_SET_ITEM(kargs, i - 1, Py_NewRef(PyTuple_GET_ITEM(args, i)));
  if (!k->ke_epilogue) {
    outs = PyTuple_Pack(1, prod);
  } else if (!(outs = tn_py_kernel_prepare(k, kargs, &p))) {
    goto done;
  }
  int parts = tn_gemm_parts(&j);
  const tn_launch *la = &p.pr_la;
  /* the epilogue follows the product's rows when its space is the product's */
  if (k->ke_epilogue && p.pr_run && !j.gj_split_cols && p.pr_rank == 2 && p.pr_shape[0] == j.gj_m &&
      p.pr_shape[1] == j.gj_n && la->la_rank >= 1 && la->la_rank <= 2 &&
      la->la_sizes[0] == (la->la_rank == 2 ? j.gj_m : (int64_t)j.gj_m * j.gj_n)) {
    j.gj_epi = la;
    j.gj_epi_per_row = la->la_rank == 2 ? 1 : j.gj_n;
  }
  if (j.gj_batch != 1 && (int64_t)j.gj_m * j.gj_n > 0 && j.gj_batch > 0) { /* bmm: whole products per part */
    j.gj_epi = NULL;
    if (j.gj_k == 0) {
      memset(j.gj_c, 0, sizeof(float) * (size_t)(j.gj_batch * j.gj_m * j.gj_n));
    } else {
      int bparts = tn_launch_split_parts(j.gj_batch * j.gj_m * j.gj_n * j.gj_k, TN_GEMM_PART_FLOPS, j.gj_batch);
      Py_BEGIN_ALLOW_THREADS
      tn_pool_run(tn_gemm_batch_part, &j, bparts);
      Py_END_ALLOW_THREADS
    }
  } else if ((int64_t)j.gj_m * j.gj_n > 0 && j.gj_batch == 1) {
    if (j.gj_k == 0) {
      memset(j.gj_c, 0, sizeof(float) * (size_t)j.gj_m * (size_t)j.gj_n);
      j.gj_epi = NULL;
    } else {
      Py_BEGIN_ALLOW_THREADS
      if (parts == 1) {
        tn_gemm_block(&j, 0, j.gj_m, 0, j.gj_n);
        j.gj_epi = NULL;
      } else {
        tn_pool_run(tn_gemm_part, &j, parts);
      }
      Py_END_ALLOW_THREADS
    }
  }
  if (k->ke_epilogue && !j.gj_epi)
    tn_py_kernel_execute(&p);
done:
  Py_XDECREF(kargs);
  Py_XDECREF(held[0]);
  Py_XDECREF(held[1]);
  Py_XDECREF(p.pr_held);
  return outs;
}

static PyObject *py_set_sgemm(PyObject *self, PyObject *arg)
{
  (void)self;
  void *p = PyLong_AsVoidPtr(arg);
  if (!p && PyErr_Occurred())
    return NULL;
  tn_gemm_set_sgemm(p);
  Py_RETURN_NONE;
}

PyMethodDef tn_py_gemm_methods[] = {
  {"set_sgemm", py_set_sgemm, METH_O,
   "set_sgemm(address): the Fortran sgemm_ (LP64) GEMM kernels call (0 for none)."},
  {NULL, NULL, 0, NULL},
};
