/*
** Python binding of fusion (fuse.h): _C.fuse(graph) lists a graph's fused
** groups with their generated source (codegen.h); _C.lowered_ops() names
** the ATen overloads fusion lowers.
*/
#include "../tn_py.h"

#include "../graph/graph.h"
#include "../neuron_backend/codegen.h"
#include "fuse.h"

static PyObject *py_fuse(PyObject *self, PyObject *args, PyObject *kwds)
{
  static char *kwlist[] = {"graph", "rows", "gemm", "linear_act", "min_row", "auto_rows", NULL};
  PyObject *arg;
  int rows = 0, gemm = 0, linear_act = 0, auto_rows = 0;
  long long min_row = 0;
  (void)self;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|pppLp:fuse", kwlist, &arg, &rows, &gemm, &linear_act, &min_row,
                                   &auto_rows))
    return NULL;
  tn_graph *g = tn_py_graph_get(arg);
  tn_fusion *f = NULL;
  PyObject *res = NULL;
  if (!g)
    return NULL;
  int rc = tn_fuse_graph(g, (rows ? TN_FUSE_ROWS : 0) | (gemm ? TN_FUSE_GEMM : 0) |
                              (linear_act ? TN_FUSE_LINEAR_ACT : 0) | (auto_rows ? TN_FUSE_AUTO_ROWS : 0),
                    (int64_t)min_row, &f);
  if (rc != TN_OK)
    return PyErr_NoMemory();
  res = PyList_New(0);
  for (uint32_t i = 0; res && i < tn_fusion_count(f); i++) {
    const tn_fgroup *grp = tn_fusion_group(f, i);
    char *src = NULL, *src2 = NULL;
    if (tn_codegen_kernel(grp, &src) != TN_OK || tn_codegen_tier2(grp, &src2) != TN_OK) {
      free(src);
      Py_CLEAR(res);
      PyErr_NoMemory();
      break;
    }
    PyObject *kinds = PyList_New(grp->fg_noutputs);
    for (uint32_t o = 0; kinds && o < grp->fg_noutputs; o++)
      PyList_SET_ITEM(kinds, o, PyLong_FromLong(grp->fg_out_kinds[o]));
    /* a GEMM group's callers pass the two matrices where the kernel loads their product */
    int gemm_grp = grp->fg_gemm_a >= 0;
    PyObject *ins = tn_py_ids_list(grp->fg_inputs + gemm_grp, grp->fg_ninputs - (uint32_t)gemm_grp);
    if (ins && gemm_grp) {
      int32_t ab[2] = {grp->fg_gemm_a, grp->fg_gemm_b};
      PyObject *front = tn_py_ids_list(ab, 2);
      if (!front || PyList_SetSlice(ins, 0, 0, front) < 0)
        Py_CLEAR(ins);
      Py_XDECREF(front);
    }
    /* a lone mm: the product is the result, no epilogue runs */
    int epilogue = !gemm_grp || grp->fg_nnodes > 1 || tn_graph_node(g, grp->fg_nodes[0])->no_op != TN_OP_mm;
    uint32_t nops = grp->fg_ninputs + grp->fg_noutputs;
    PyObject *dts = PyList_New(nops);
    for (uint32_t o = 0; dts && o < nops; o++) {
      PyObject *name = PyUnicode_FromString(tn_dtype_name(grp->fg_odtypes[o]));
      if (!name)
        Py_CLEAR(dts);
      else
        PyList_SET_ITEM(dts, o, name);
    }
    /* outputs laid out otherwise than contiguous: their strides, or of
    ** symbolic sizes their dims' places in the dense order, -1 - place
    ** (else None) */
    PyObject *ostr = dts ? PyList_New(grp->fg_noutputs) : NULL;
    for (uint32_t o = 0; ostr && o < grp->fg_noutputs; o++) {
      const tn_meta *m = &tn_graph_value(g, grp->fg_outputs[o])->va_meta;
      int8_t pos[TN_MAX_RANK];
      int ordered = tn_fuse_dense_order(m, pos);
      PyObject *t = tn_fuse_contiguous(m) ? Py_NewRef(Py_None) : PyTuple_New(m->me_rank);
      for (int dd = 0; t && t != Py_None && dd < m->me_rank; dd++) {
        PyObject *v = PyLong_FromLongLong(ordered ? -1 - pos[dd] : m->me_strides[dd].si_val);
        if (!v)
          Py_CLEAR(t);
        else
          PyTuple_SET_ITEM(t, dd, v);
      }
      if (!t)
        Py_CLEAR(ostr);
      else
        PyList_SET_ITEM(ostr, o, t);
    }
    /* gathers: [table operand, index operand, dim (-1: whole rows)] */
    PyObject *gat = ostr ? PyList_New(0) : NULL;
    for (uint32_t o = 0; gat && o < grp->fg_ninputs; o++) {
      PyObject *pair = grp->fg_gather[o] >= 0 ? Py_BuildValue("[iii]", (int)o, grp->fg_gather[o], grp->fg_gather_dim[o])
                                              : NULL;
      if (grp->fg_gather[o] >= 0 && (!pair || PyList_Append(gat, pair) < 0))
        Py_CLEAR(gat);
      Py_XDECREF(pair);
    }
    /* cat slots: per output None or [cat value, dim, offset] */
    PyObject *into = gat ? PyList_New(grp->fg_noutputs) : NULL;
    for (uint32_t o = 0; into && o < grp->fg_noutputs; o++) {
      PyObject *slot = grp->fg_into_cat[o] < 0 ? Py_NewRef(Py_None)
                                               : Py_BuildValue("[iiL]", grp->fg_into_cat[o], grp->fg_into_dim[o],
                                                               (long long)grp->fg_into_off[o]);
      if (!slot)
        Py_CLEAR(into);
      else
        PyList_SET_ITEM(into, o, slot);
    }
    if (gat && !into)
      Py_CLEAR(gat);
    if (ostr && !gat)
      Py_CLEAR(ostr);
    if (dts && !ostr)
      Py_CLEAR(dts);
    PyObject *d = kinds && ins && dts
                    ? Py_BuildValue("{s:N,s:N,s:N,s:s,s:z,s:N,s:N,s:N,s:N,s:N,s:i,s:N,s:O,s:O,s:O}", "nodes",
                                    tn_py_ids_list(grp->fg_nodes, grp->fg_nnodes), "inputs", ins, "outputs",
                                    tn_py_ids_list(grp->fg_outputs, grp->fg_noutputs), "source", src, "tier2", src2,
                                    "dtypes", dts,
                                    "out_strides", ostr, "gathers", gat, "into", into,
                                    "donors", tn_py_ids_list(grp->fg_donor, grp->fg_noutputs),
                                    "reduce_dims", grp->fg_reduce_dims, "out_kinds", kinds, "nonempty",
                                    grp->fg_nonempty ? Py_True : Py_False, "gemm", gemm_grp ? Py_True : Py_False,
                                    "epilogue", epilogue ? Py_True : Py_False)
                    : NULL;
    if (!kinds || !ins || !dts) { /* Py_BuildValue, when called, consumed all five */
      Py_XDECREF(kinds);
      Py_XDECREF(ins);
      Py_XDECREF(dts);
      Py_XDECREF(ostr);
      Py_XDECREF(gat);
      Py_XDECREF(into);
    }
    free(src);
    free(src2);
    if (!d || PyList_Append(res, d) < 0)
      Py_CLEAR(res);
    Py_XDECREF(d);
  }
  tn_fusion_free(f);
  return res;
}

static PyObject *py_lowered_ops(PyObject *self, PyObject *unused)
{
  (void)self;
  (void)unused;
  PyObject *l = PyList_New(0);
  for (int op = 0; l && op < tn_op_count(); op++) {
    if (!tn_fuse_lowers(op))
      continue;
    PyObject *s = PyUnicode_FromString(tn_op_name(op));
    if (!s || PyList_Append(l, s) < 0)
      Py_CLEAR(l);
    Py_XDECREF(s);
  }
  return l;
}

PyMethodDef tn_py_fuse_methods[] = {
  {"lowered_ops", py_lowered_ops, METH_NOARGS, "Qualified names of the ATen overloads lowered to generated code."},
  {"fuse", (PyCFunction)(void (*)(void))py_fuse, METH_VARARGS | METH_KEYWORDS,
   "fuse(graph, rows=False, gemm=False, linear_act=False, min_row=0, auto_rows=False) -> [{'nodes', 'inputs', 'outputs', 'source', 'tier2', 'dtypes', 'reduce_dims', "
   "'out_kinds', 'nonempty', 'gemm', 'epilogue'}] for each fused group."},
  {NULL, NULL, 0, NULL},
};
