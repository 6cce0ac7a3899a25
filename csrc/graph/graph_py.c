/*
** Python binding of the graph IR: torchneuron_jit._C.Graph, Sym,
** decode_graph, op_names. Arguments arrive as (tag, payload) pairs, the tag
** being one of the ARG_* constants; the Python layer (torchneuron_jit.graph)
** builds them from FX nodes and torch schemas.
*/
#include "../tn_py.h"

#include "graph.h"

#include <xxhash.h>

/* -- Sym ---------------------------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  int32_t sym_id;
  int64_t sym_scale; /* 1, or a stride's factor >= 2 */
} SymObject;

static PyTypeObject *Sym_Type;

static PyObject *Sym_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
  static char *kwlist[] = {"id", "scale", NULL};
  int id;
  long long scale = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|L:Sym", kwlist, &id, &scale))
    return NULL;
  if (id < 0)
    return PyErr_Format(PyExc_ValueError, "Sym id must be >= 0, got %d", id);
  if (scale < 1)
    return PyErr_Format(PyExc_ValueError, "Sym scale must be >= 1, got %lld", scale);
  SymObject *s = (SymObject *)type->tp_alloc(type, 0);
  if (s) {
    s->sym_id = id;
    s->sym_scale = scale;
  }
  return (PyObject *)s;
}

static PyObject *Sym_repr(PyObject *self)
{
  SymObject *s = (SymObject *)self;
  if (s->sym_scale != 1)
    return PyUnicode_FromFormat("Sym(%d, scale=%lld)", s->sym_id, (long long)s->sym_scale);
  return PyUnicode_FromFormat("Sym(%d)", s->sym_id);
}

static Py_hash_t Sym_hash(PyObject *self)
{
  SymObject *s = (SymObject *)self;
  Py_hash_t h = (Py_hash_t)s->sym_id * 1000003 + 17 + (Py_hash_t)(s->sym_scale - 1) * 7919;
  return h == -1 ? -2 : h;
}

static PyObject *Sym_richcompare(PyObject *a, PyObject *b, int op)
{
  if (!PyObject_TypeCheck(b, Sym_Type) || (op != Py_EQ && op != Py_NE))
    Py_RETURN_NOTIMPLEMENTED;
  int eq = ((SymObject *)a)->sym_id == ((SymObject *)b)->sym_id &&
           ((SymObject *)a)->sym_scale == ((SymObject *)b)->sym_scale;
  return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static PyObject *Sym_get_id(PyObject *self, void *closure)
{
  (void)closure;
  return PyLong_FromLong(((SymObject *)self)->sym_id);
}

static PyObject *Sym_get_scale(PyObject *self, void *closure)
{
  (void)closure;
  return PyLong_FromLongLong(((SymObject *)self)->sym_scale);
}

static PyGetSetDef Sym_getset[] = {
  {"id", Sym_get_id, NULL, "symbol number within its graph", NULL},
  {"scale", Sym_get_scale, NULL, "factor of a scaled stride (scale * symbol); 1 for a plain symbol", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Sym_slots[] = {
  {Py_tp_new, Sym_new},
  {Py_tp_repr, Sym_repr},
  {Py_tp_hash, Sym_hash},
  {Py_tp_richcompare, Sym_richcompare},
  {Py_tp_getset, Sym_getset},
  {Py_tp_doc, "Sym(id, scale=1): a symbolic size in a graph's metadata or arguments; a stride may be "
              "scale * symbol."},
  {0, NULL},
};

static PyType_Spec Sym_spec = {"torchneuron_jit._C.Sym", sizeof(SymObject), 0, Py_TPFLAGS_DEFAULT, Sym_slots};

/* -- Conversions --------------------------------------------------------------- */

/* Parses an int or Sym into *out. what names the thing for messages. */
static int parse_sint(PyObject *o, tn_sint *out, const char *what, Py_ssize_t i)
{
  if (PyObject_TypeCheck(o, Sym_Type)) {
    SymObject *s = (SymObject *)o;
    *out = TN_SYM_SCALED(s->sym_scale == 1 ? 0 : s->sym_scale, s->sym_id);
    return 0;
  }
  if (!PyLong_Check(o) || PyBool_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s[%zd]: expected int or Sym, got %s", what, i, Py_TYPE(o)->tp_name);
    return -1;
  }
  int overflow;
  long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow) {
    PyErr_Format(PyExc_OverflowError, "%s[%zd]: int out of int64 range", what, i);
    return -1;
  }
  if (v == -1 && PyErr_Occurred())
    return -1;
  *out = TN_SINT(v);
  return 0;
}

/* Parses a sequence of int/Sym into a PyMem array (*out, *n). */
static int parse_sint_list(PyObject *seq, tn_sint **out, Py_ssize_t *n, const char *what)
{
  PyObject *fast = PySequence_Fast(seq, what);
  if (!fast)
    return -1;
  Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
  tn_sint *arr = PyMem_Calloc((size_t)(len ? len : 1), sizeof *arr);
  if (!arr) {
    Py_DECREF(fast);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < len; i++)
    if (parse_sint(PySequence_Fast_GET_ITEM(fast, i), &arr[i], what, i) < 0) {
      PyMem_Free(arr);
      Py_DECREF(fast);
      return -1;
    }
  Py_DECREF(fast);
  *out = arr;
  *n = len;
  return 0;
}

/* Parses (dtype, sizes, strides) into m; the arrays go to *sizes and
** *strides (PyMem, caller frees). */
static int parse_meta(PyObject *dtype, PyObject *sizes, PyObject *strides, tn_meta *m,
                      tn_sint **psz, tn_sint **pst)
{
  Py_ssize_t nsz, nst;
  *psz = *pst = NULL;
  long dt = PyLong_AsLong(dtype);
  if (dt == -1 && PyErr_Occurred())
    return -1;
  if (parse_sint_list(sizes, psz, &nsz, "sizes") < 0)
    return -1;
  if (parse_sint_list(strides, pst, &nst, "strides") < 0)
    return -1;
  if (nsz != nst) {
    PyErr_Format(PyExc_ValueError, "sizes has %zd entries but strides %zd", nsz, nst);
    return -1;
  }
  if (nsz > TN_MAX_RANK) {
    PyErr_Format(PyExc_ValueError, "rank %zd exceeds %d", nsz, TN_MAX_RANK);
    return -1;
  }
  m->me_dtype = (int)dt;
  m->me_rank = (int)nsz;
  m->me_sizes = *psz;
  m->me_strides = *pst;
  return 0;
}

/* -- Graph ---------------------------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  tn_graph *gr;
} GraphObject;

static PyTypeObject *Graph_Type;

static PyObject *graph_raise(GraphObject *self, int rc)
{
  if (rc == TN_ENOMEM)
    return PyErr_NoMemory();
  if (rc == TN_ETHREAD)
    return PyErr_Format(PyExc_RuntimeError, "graph used from a thread other than the one that created it");
  if (rc == TN_EPOISONED)
    return PyErr_Format(tn_py_GraphError, "graph rejected an earlier change (%s); call reset()",
                        tn_graph_errmsg(self->gr));
  PyErr_SetString(tn_py_GraphError, tn_graph_errmsg(self->gr));
  return NULL;
}

static PyObject *Graph_wrap(PyTypeObject *type, tn_graph *g)
{
  GraphObject *self = (GraphObject *)type->tp_alloc(type, 0);
  if (!self) {
    tn_graph_free(g);
    return NULL;
  }
  self->gr = g;
  return (PyObject *)self;
}

static PyObject *Graph_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
  tn_graph *g;
  if (!PyArg_ParseTuple(args, ":Graph") || (kwds && PyDict_Size(kwds)))
    return PyErr_Format(PyExc_TypeError, "Graph() takes no arguments");
  if (tn_graph_new(&g) != TN_OK)
    return PyErr_NoMemory();
  return Graph_wrap(type, g);
}

static void Graph_dealloc(PyObject *o)
{
  GraphObject *self = (GraphObject *)o;
  PyTypeObject *tp = Py_TYPE(o);
  tn_graph_free(self->gr);
  tp->tp_free(o);
  Py_DECREF(tp);
}

static PyObject *Graph_add_symbol(PyObject *o, PyObject *unused)
{
  GraphObject *self = (GraphObject *)o;
  int32_t id;
  (void)unused;
  int rc = tn_graph_add_symbol(self->gr, &id);
  return rc == TN_OK ? PyLong_FromLong(id) : graph_raise(self, rc);
}

static PyObject *Graph_add_input(PyObject *o, PyObject *args, PyObject *kwds)
{
  static char *kwlist[] = {"kind", "dtype", "sizes", "strides", "index", "name", NULL};
  GraphObject *self = (GraphObject *)o;
  const char *kind, *name = NULL;
  PyObject *dtype, *sizes, *strides;
  int index = 0;
  tn_sint *sz = NULL, *st = NULL;
  PyObject *res = NULL;
  tn_input_desc in = {0};

  if (!PyArg_ParseTupleAndKeywords(args, kwds, "sOOO|iz:add_input", kwlist, &kind, &dtype, &sizes,
                                   &strides, &index, &name))
    return NULL;
  if (strcmp(kind, "arg") == 0)
    in.in_kind = TN_VALUE_ARG;
  else if (strcmp(kind, "param") == 0)
    in.in_kind = TN_VALUE_PARAM;
  else if (strcmp(kind, "const") == 0)
    in.in_kind = TN_VALUE_CONST;
  else
    return PyErr_Format(PyExc_ValueError, "kind must be 'arg', 'param' or 'const', not '%s'", kind);
  in.in_index = index;
  in.in_name = name;
  if (parse_meta(dtype, sizes, strides, &in.in_meta, &sz, &st) == 0) {
    int32_t v;
    int rc = tn_graph_add_input(self->gr, &in, &v);
    res = rc == TN_OK ? PyLong_FromLong(v) : graph_raise(self, rc);
  }
  PyMem_Free(sz);
  PyMem_Free(st);
  return res;
}

/* Argument payload storage that must outlive parsing. */
typedef struct arg_store {
  void *as_ptr[TN_MAX_ARGS];
} arg_store;

static int parse_int64(PyObject *o, int64_t *out, Py_ssize_t i)
{
  int overflow;
  long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow) {
    PyErr_Format(PyExc_OverflowError, "arg %zd: int out of int64 range", i);
    return -1;
  }
  if (v == -1 && PyErr_Occurred())
    return -1;
  *out = v;
  return 0;
}

static int parse_arg(PyObject *item, tn_arg *a, void **store, Py_ssize_t i)
{
  PyObject *payload;
  int tag;
  if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
    PyErr_Format(PyExc_TypeError, "arg %zd: expected a (tag, payload) tuple", i);
    return -1;
  }
  tag = (int)PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
  if (tag == -1 && PyErr_Occurred())
    return -1;
  payload = PyTuple_GET_ITEM(item, 1);
  memset(a, 0, sizeof *a);
  a->ar_tag = tag;
  switch (tag) {
  case TN_ARG_NONE:
    return 0;
  case TN_ARG_TENSOR: case TN_ARG_SYM: {
    int64_t v;
    if (tag == TN_ARG_SYM && PyObject_TypeCheck(payload, Sym_Type) && ((SymObject *)payload)->sym_scale == 1) {
      a->u.ar_ref = ((SymObject *)payload)->sym_id;
      return 0;
    }
    if (!PyLong_Check(payload) || parse_int64(payload, &v, i) < 0) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "arg %zd: expected an int id, got %s", i, Py_TYPE(payload)->tp_name);
      return -1;
    }
    a->u.ar_ref = v < INT32_MIN || v > INT32_MAX ? -1 : (int32_t)v;
    return 0;
  }
  case TN_ARG_INT: case TN_ARG_BOOL: case TN_ARG_DTYPE: case TN_ARG_LAYOUT: case TN_ARG_MEMFMT:
    if (!PyLong_Check(payload)) {
      PyErr_Format(PyExc_TypeError, "arg %zd: expected int, got %s", i, Py_TYPE(payload)->tp_name);
      return -1;
    }
    return parse_int64(payload, &a->u.ar_int, i);
  case TN_ARG_FLOAT:
    a->u.ar_float = PyFloat_AsDouble(payload);
    return a->u.ar_float == -1.0 && PyErr_Occurred() ? -1 : 0;
  case TN_ARG_TENSOR_LIST:
  case TN_ARG_OPT_TENSOR_LIST: {  /* None elements (optional lists only) as -1 */
    PyObject *fast = PySequence_Fast(payload, "tensor list payload must be a sequence");
    if (!fast)
      return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int32_t *refs = PyMem_Calloc((size_t)(n ? n : 1), sizeof *refs);
    *store = refs;
    if (!refs) {
      Py_DECREF(fast);
      PyErr_NoMemory();
      return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
      int64_t v;
      PyObject *item = PySequence_Fast_GET_ITEM(fast, k);
      if (tag == TN_ARG_OPT_TENSOR_LIST && item == Py_None) {
        refs[k] = -1;
        continue;
      }
      if (parse_int64(item, &v, i) < 0) {
        Py_DECREF(fast);
        return -1;
      }
      /* out of range: an id no value has (-2), which the builder rejects */
      refs[k] = v < 0 || v > INT32_MAX ? -2 : (int32_t)v;
    }
    Py_DECREF(fast);
    a->ar_len = (uint32_t)n;
    a->u.ar_refs = refs;
    return 0;
  }
  case TN_ARG_INT_LIST: {
    tn_sint *v;
    Py_ssize_t n;
    if (parse_sint_list(payload, &v, &n, "int list") < 0)
      return -1;
    *store = v;
    a->ar_len = (uint32_t)n;
    a->u.ar_ints = v;
    return 0;
  }
  case TN_ARG_STRING: case TN_ARG_DEVICE: {
    Py_ssize_t n;
    const char *s = PyUnicode_Check(payload) ? PyUnicode_AsUTF8AndSize(payload, &n) : NULL;
    if (!s) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "arg %zd: expected str, got %s", i, Py_TYPE(payload)->tp_name);
      return -1;
    }
    a->ar_len = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    a->u.ar_str = s; /* borrowed from payload, which the caller's args keep alive */
    return 0;
  }
  default:
    PyErr_Format(PyExc_ValueError, "arg %zd: unknown tag %d", i, tag);
    return -1;
  }
}

static PyObject *Graph_add_node(PyObject *o, PyObject *args, PyObject *kwds)
{
  static char *kwlist[] = {"op", "args", "outputs", "target", "or_fallback", NULL};
  GraphObject *self = (GraphObject *)o;
  const char *opname, *target = NULL, *or_fallback = NULL;
  PyObject *pyargs, *pyouts, *fargs = NULL, *fouts = NULL, *res = NULL;
  tn_arg cargs[TN_MAX_ARGS];
  void *store[TN_MAX_ARGS] = {0};
  tn_meta *metas = NULL;
  tn_sint **dims = NULL;
  int32_t *ovals = NULL;
  Py_ssize_t nargs = 0, nout = 0;

  if (!PyArg_ParseTupleAndKeywords(args, kwds, "sOO|zz:add_node", kwlist, &opname, &pyargs, &pyouts, &target,
                                   &or_fallback))
    return NULL;
  int op = tn_op_find(opname);
  if (op < 0)
    return PyErr_Format(PyExc_ValueError, "unknown op %s (not in the op table; use 'fallback' with a target)", opname);
  if (!(fargs = PySequence_Fast(pyargs, "args must be a sequence")) ||
      !(fouts = PySequence_Fast(pyouts, "outputs must be a sequence")))
    goto done;
  nargs = PySequence_Fast_GET_SIZE(fargs);
  nout = PySequence_Fast_GET_SIZE(fouts);
  if (nargs > TN_MAX_ARGS) {
    PyErr_Format(PyExc_ValueError, "%zd arguments exceed the limit %d", nargs, TN_MAX_ARGS);
    goto done;
  }
  if (nout > TN_MAX_OUTPUTS) {
    PyErr_Format(PyExc_ValueError, "%zd outputs exceed the limit %d", nout, TN_MAX_OUTPUTS);
    goto done;
  }
  for (Py_ssize_t i = 0; i < nargs; i++)
    if (parse_arg(PySequence_Fast_GET_ITEM(fargs, i), &cargs[i], &store[i], i) < 0)
      goto done;
  metas = PyMem_Calloc((size_t)(nout ? nout : 1), sizeof *metas);
  dims = PyMem_Calloc((size_t)(nout ? 2 * nout : 1), sizeof *dims);
  ovals = PyMem_Calloc((size_t)(nout ? nout : 1), sizeof *ovals);
  if (!metas || !dims || !ovals) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t k = 0; k < nout; k++) {
    PyObject *t = PySequence_Fast_GET_ITEM(fouts, k);
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) {
      PyErr_Format(PyExc_TypeError, "output %zd: expected (dtype, sizes, strides)", k);
      goto done;
    }
    if (parse_meta(PyTuple_GET_ITEM(t, 0), PyTuple_GET_ITEM(t, 1), PyTuple_GET_ITEM(t, 2), &metas[k],
                   &dims[2 * k], &dims[2 * k + 1]) < 0)
      goto done;
  }
  char why[256];
  if (or_fallback && op != TN_OP_fallback && !target &&
      tn_graph_check_node(self->gr, op, cargs, (uint32_t)nargs, metas, (uint32_t)nout, why, sizeof why) != TN_OK) {
    op = TN_OP_fallback;  /* the op's signature does not take these arguments: PyTorch runs it */
    target = or_fallback;
  }
  int rc = tn_graph_add_node(self->gr, op, target, cargs, (uint32_t)nargs, metas, (uint32_t)nout, ovals);
  if (rc != TN_OK) {
    graph_raise(self, rc);
    goto done;
  }
  PyObject *ids = tn_py_ids_list(ovals, (uint32_t)nout);
  res = ids ? PyList_AsTuple(ids) : NULL;
  Py_XDECREF(ids);
done:
  for (Py_ssize_t i = 0; i < TN_MAX_ARGS; i++)
    PyMem_Free(store[i]);
  for (Py_ssize_t k = 0; dims && k < 2 * nout; k++)
    PyMem_Free(dims[k]);
  PyMem_Free(dims);
  PyMem_Free(metas);
  PyMem_Free(ovals);
  Py_XDECREF(fargs);
  Py_XDECREF(fouts);
  return res;
}

static PyObject *Graph_set_outputs(PyObject *o, PyObject *seq)
{
  GraphObject *self = (GraphObject *)o;
  PyObject *fast = PySequence_Fast(seq, "outputs must be a sequence of value ids");
  if (!fast)
    return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  int32_t *ids = PyMem_Calloc((size_t)(n ? n : 1), sizeof *ids);
  PyObject *res = NULL;
  if (!ids) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
    if (v == -1 && PyErr_Occurred())
      goto done;
    ids[i] = v < INT32_MIN || v > INT32_MAX ? -1 : (int32_t)v;
  }
  int rc = tn_graph_set_outputs(self->gr, ids, (uint32_t)n);
  if (rc != TN_OK) {
    graph_raise(self, rc);
    goto done;
  }
  res = Py_NewRef(Py_None);
done:
  PyMem_Free(ids);
  Py_DECREF(fast);
  return res;
}

static PyObject *Graph_encode(PyObject *o, PyObject *unused)
{
  GraphObject *self = (GraphObject *)o;
  const uint8_t *buf;
  size_t len;
  (void)unused;
  int rc = tn_graph_encode(self->gr, &buf, &len);
  return rc == TN_OK ? PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len) : graph_raise(self, rc);
}

static PyObject *Graph_key(PyObject *o, PyObject *args, PyObject *kwds)
{
  static char *kwlist[] = {"context", NULL};
  GraphObject *self = (GraphObject *)o;
  Py_buffer ctx = {0};
  uint8_t key[16];
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|y*:key", kwlist, &ctx))
    return NULL;
  int rc = tn_graph_key(self->gr, ctx.buf, ctx.buf ? (size_t)ctx.len : 0, key);
  if (ctx.buf)
    PyBuffer_Release(&ctx);
  return rc == TN_OK ? PyBytes_FromStringAndSize((const char *)key, 16) : graph_raise(self, rc);
}

static PyObject *Graph_canonical_ids(PyObject *o, PyObject *unused)
{
  GraphObject *self = (GraphObject *)o;
  const int32_t *order, *vmap;
  (void)unused;
  int rc = tn_graph_canonical(self->gr, &order, &vmap);
  if (rc != TN_OK)
    return graph_raise(self, rc);
  PyObject *a = tn_py_ids_list(order, tn_graph_num_nodes(self->gr));
  PyObject *b = a ? tn_py_ids_list(vmap, tn_graph_num_values(self->gr)) : NULL;
  if (!b) {
    Py_XDECREF(a);
    return NULL;
  }
  return Py_BuildValue("(NN)", a, b);
}

static PyObject *Graph_dump(PyObject *o, PyObject *unused)
{
  GraphObject *self = (GraphObject *)o;
  const char *text;
  (void)unused;
  int rc = tn_graph_dump(self->gr, &text);
  return rc == TN_OK ? PyUnicode_FromString(text) : graph_raise(self, rc);
}

static PyObject *Graph_reset(PyObject *o, PyObject *unused)
{
  GraphObject *self = (GraphObject *)o;
  (void)unused;
  int rc = tn_graph_reset(self->gr);
  if (rc != TN_OK)
    return graph_raise(self, rc);
  Py_RETURN_NONE;
}

static PyObject *Graph_get_counts(PyObject *o, void *which)
{
  tn_graph *g = ((GraphObject *)o)->gr;
  switch ((int)(intptr_t)which) {
  case 0: return PyLong_FromUnsignedLong(tn_graph_num_symbols(g));
  case 1: return PyLong_FromUnsignedLong(tn_graph_num_inputs(g));
  case 2: return PyLong_FromUnsignedLong(tn_graph_num_nodes(g));
  case 3: return PyLong_FromUnsignedLong(tn_graph_num_values(g));
  default: return PyUnicode_FromString(tn_graph_errmsg(g));
  }
}

static PyObject *Graph_node_op(PyObject *o, PyObject *arg)
{
  tn_graph *g = ((GraphObject *)o)->gr;
  long id = PyLong_AsLong(arg);
  if (id == -1 && PyErr_Occurred())
    return NULL;
  if (id < 0 || (unsigned long)id >= tn_graph_num_nodes(g))
    return PyErr_Format(PyExc_IndexError, "node_op: no node %ld", id);
  return PyUnicode_FromString(tn_op_name(tn_graph_node(g, (int32_t)id)->no_op));
}

static PyMethodDef Graph_methods[] = {
  {"add_symbol", Graph_add_symbol, METH_NOARGS, "add_symbol() -> id of a new size symbol."},
  {"add_input", (PyCFunction)(void (*)(void))Graph_add_input, METH_VARARGS | METH_KEYWORDS,
   "add_input(kind, dtype, sizes, strides, index=0, name=None) -> value id.\n"
   "kind: 'arg' (index = position, name = path), 'param' (name), 'const' (index)."},
  {"add_node", (PyCFunction)(void (*)(void))Graph_add_node, METH_VARARGS | METH_KEYWORDS,
   "add_node(op, args, outputs, target=None, or_fallback=None) -> tuple of output value ids.\n"
   "args: [(ARG_* tag, payload)], in schema order; outputs: [(dtype, sizes, strides)].\n"
   "or_fallback: a qualified name; when op's signature rejects args, the node is added as a\n"
   "fallback node of that target instead of failing (see node_op)."},
  {"node_op", Graph_node_op, METH_O, "node_op(node id) -> the node's op name ('fallback' for fallback nodes)."},
  {"set_outputs", Graph_set_outputs, METH_O, "set_outputs(ids): the graph's results."},
  {"encode", Graph_encode, METH_NOARGS, "Canonical encoding (bytes)."},
  {"key", (PyCFunction)(void (*)(void))Graph_key, METH_VARARGS | METH_KEYWORDS,
   "key(context=b'') -> 16-byte XXH3-128 of format version, encoding and context."},
  {"dump", Graph_dump, METH_NOARGS, "Readable listing."},
  {"canonical_ids", Graph_canonical_ids, METH_NOARGS,
   "(node_order, value_map): canonical position -> node id, value id -> canonical value id."},
  {"reset", Graph_reset, METH_NOARGS, "Empty the graph and clear an error."},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef Graph_getset[] = {
  {"num_symbols", Graph_get_counts, NULL, NULL, (void *)0},
  {"num_inputs", Graph_get_counts, NULL, NULL, (void *)1},
  {"num_nodes", Graph_get_counts, NULL, NULL, (void *)2},
  {"num_values", Graph_get_counts, NULL, NULL, (void *)3},
  {"error", Graph_get_counts, NULL, "message of the error that poisoned the graph, or ''", (void *)4},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Graph_slots[] = {
  {Py_tp_new, Graph_new},
  {Py_tp_dealloc, Graph_dealloc},
  {Py_tp_methods, Graph_methods},
  {Py_tp_getset, Graph_getset},
  {Py_tp_doc, "Graph(): a graph IR under construction (see csrc/graph/graph.h)."},
  {0, NULL},
};

static PyType_Spec Graph_spec = {"torchneuron_jit._C.Graph", sizeof(GraphObject), 0, Py_TPFLAGS_DEFAULT,
                                 Graph_slots};

PyObject *tn_py_ids_list(const int32_t *ids, uint32_t n)
{
  PyObject *l = PyList_New(n);
  for (uint32_t i = 0; l && i < n; i++) {
    PyObject *v = PyLong_FromLong(ids[i]);
    if (!v) {
      Py_CLEAR(l);
      break;
    }
    PyList_SET_ITEM(l, i, v);
  }
  return l;
}

tn_graph *tn_py_graph_get(PyObject *o)
{
  if (!PyObject_TypeCheck(o, Graph_Type)) {
    PyErr_Format(PyExc_TypeError, "expected a torchneuron_jit._C.Graph, got %s", Py_TYPE(o)->tp_name);
    return NULL;
  }
  return ((GraphObject *)o)->gr;
}

/* -- Module functions -------------------------------------------------------------- */

static PyObject *py_decode_graph(PyObject *self, PyObject *arg)
{
  Py_buffer buf;
  char err[TN_ERRMSG_LEN];
  tn_graph *g;
  (void)self;
  if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0)
    return NULL;
  int rc = tn_graph_decode(buf.buf, (size_t)buf.len, &g, err, sizeof err);
  PyBuffer_Release(&buf);
  if (rc == TN_ENOMEM)
    return PyErr_NoMemory();
  if (rc != TN_OK)
    return PyErr_Format(tn_py_GraphError, "cannot decode graph (%s): %s", tn_strerror(rc), err);
  return Graph_wrap(Graph_Type, g);
}

static PyObject *py_op_names(PyObject *self, PyObject *unused)
{
  (void)self;
  (void)unused;
  PyObject *t = PyTuple_New(tn_op_count());
  for (int i = 0; t && i < tn_op_count(); i++) {
    PyObject *s = PyUnicode_FromString(tn_op_name(i));
    if (!s) {
      Py_CLEAR(t);
      break;
    }
    PyTuple_SET_ITEM(t, i, s);
  }
  return t;
}

static PyObject *py_op_signature(PyObject *self, PyObject *arg)
{
  (void)self;
  const char *name = PyUnicode_AsUTF8(arg);
  if (!name)
    return NULL;
  int op = tn_op_find(name);
  if (op < 0)
    return PyErr_Format(PyExc_KeyError, "%s", name);
  return Py_BuildValue("(si)", tn_op_signature(op), tn_op_outputs(op));
}

static PyObject *py_graphs_abandoned(PyObject *self, PyObject *unused)
{
  (void)self;
  (void)unused;
  return PyLong_FromUnsignedLongLong(tn_graph_abandoned());
}

/* content_key(data) -> 16-byte XXH3-128 of data (canonical byte order),
** the key of cache records that are not graphs. */
static PyObject *py_content_key(PyObject *self, PyObject *arg)
{
  (void)self;
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
    return NULL;
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(view.buf, (size_t)view.len));
  PyBuffer_Release(&view);
  return PyBytes_FromStringAndSize((const char *)c.digest, sizeof c.digest);
}

PyMethodDef tn_py_graph_methods[] = {
  {"content_key", py_content_key, METH_O,
   "content_key(bytes) -> 16-byte XXH3-128 of the bytes: the key of cache records that are not graphs."},
  {"decode_graph", py_decode_graph, METH_O, "decode_graph(bytes) -> Graph; raises GraphError."},
  {"op_names", py_op_names, METH_NOARGS, "Qualified names of the ops in the op table."},
  {"op_signature", py_op_signature, METH_O, "op_signature(name) -> (signature letters, outputs)."},
  {"graphs_abandoned", py_graphs_abandoned, METH_NOARGS,
   "Graphs freed off their owner thread (their heap leaked); should stay 0."},
  {NULL, NULL, 0, NULL},
};

int tn_py_graph_init(PyObject *m)
{
  Sym_Type = (PyTypeObject *)PyType_FromSpec(&Sym_spec);
  Graph_Type = (PyTypeObject *)PyType_FromSpec(&Graph_spec);
  if (!Sym_Type || !Graph_Type || PyModule_AddObjectRef(m, "Sym", (PyObject *)Sym_Type) < 0 ||
      PyModule_AddObjectRef(m, "Graph", (PyObject *)Graph_Type) < 0)
    return -1;
  static const struct { const char *name; int value; } consts[] = {
    {"ARG_NONE", TN_ARG_NONE}, {"ARG_TENSOR", TN_ARG_TENSOR}, {"ARG_TENSOR_LIST", TN_ARG_TENSOR_LIST},
    {"ARG_OPT_TENSOR_LIST", TN_ARG_OPT_TENSOR_LIST},
    {"ARG_INT", TN_ARG_INT}, {"ARG_FLOAT", TN_ARG_FLOAT}, {"ARG_BOOL", TN_ARG_BOOL},
    {"ARG_SYM", TN_ARG_SYM}, {"ARG_INT_LIST", TN_ARG_INT_LIST}, {"ARG_STRING", TN_ARG_STRING},
    {"ARG_DTYPE", TN_ARG_DTYPE}, {"ARG_LAYOUT", TN_ARG_LAYOUT}, {"ARG_DEVICE", TN_ARG_DEVICE},
    {"ARG_MEMFMT", TN_ARG_MEMFMT}, {"GRAPH_FORMAT_VERSION", TN_GRAPH_FORMAT_VERSION},
    {"MAX_RANK", TN_MAX_RANK},
  };
  for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
    if (PyModule_AddIntConstant(m, consts[i].name, consts[i].value) < 0)
      return -1;
  return 0;
}
