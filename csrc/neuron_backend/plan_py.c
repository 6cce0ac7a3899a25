/*
** torchneuron_jit._C.Plan: a compiled graph as the executor runs it.
**
** Plan(ninputs, constants, steps, outputs, eager, warn, source=None, bare=False):
**   constants  the plan's constant table: callables (kernels, ATen ops'
**              callables, ours), and every argument that is not a slot
**   steps      [(kind, callable, item, operands, nkw, kwnames)], operands
**              [(0, slot) | (1, constant) | (2, [(0|1, index), ...])]
**   outputs    [(0, slot) | (1, constant)]
**   eager      the graph's eager original, called with the inputs
**   warn       warn(message): the one warning of our failure
**   bare       the graph returns its one output itself (as eager does), not in a tuple
** Plan.from_bytes(data, constants, eager, warn, source=None) makes one from
** plan.encode()'s binary form (plan.h) and a constant table.
** Called with one list of inputs (aot_autograd's boxed convention; also
** jit's), it returns a tuple of the outputs; plan.call(*inputs) likewise.
** A failure of a step goes through csrc/fallback: eager decides whose it
** was (fallback.h).
*/
#include "../tn_py.h"

#include <string.h>

#include "../fallback/fallback.h"
#include "../tn_stats.h"
#include "../tn_yield.h"
#include "executor.h"
#include "plan.h"

typedef struct {
  PyObject_HEAD
  vectorcallfunc pl_vectorcall;
  tn_plan *pl_plan;
  PyObject *pl_consts;    /* tuple */
  PyObject *pl_eager;
  PyObject *pl_warn;
  PyObject *pl_source;    /* the fused FX graph it was built from, for reports; or None */
  PyObject *pl_form;      /* what the back end keeps to store the plan (its portable constants), or None */
  PyObject *pl_weakrefs;  /* explain() of the Dynamo door holds its plans weakly */
  uint64_t pl_runs;       /* calls, counted with the GIL held (explain()'s hits) */
  int pl_bare;            /* the graph returns its one output itself, not in a tuple */
  tn_fallback pl_fb;
} PlanObject;

/* -- The executor's operations on Python objects --------------------------- */

static void *op_constant(void *ctx, uint32_t i)
{
  return PyTuple_GET_ITEM(((PlanObject *)ctx)->pl_consts, i);
}

static void *op_call(void *ctx, const tn_step *st, void *const *args, uint32_t nargs)
{
  PlanObject *p = ctx;
  PyObject *callable = PyTuple_GET_ITEM(p->pl_consts, st->st_callable);
  PyObject *kwnames = st->st_nkw ? PyTuple_GET_ITEM(p->pl_consts, st->st_kwnames) : NULL;
  return PyObject_Vectorcall(callable, (PyObject *const *)args, nargs - st->st_nkw, kwnames);
}

static void *op_item(void *ctx, void *v, uint32_t i)
{
  (void)ctx;
  PyObject *o = v;
  if (PyTuple_CheckExact(o) && i < (uint32_t)PyTuple_GET_SIZE(o))
    return Py_NewRef(PyTuple_GET_ITEM(o, i));
  return PySequence_GetItem(o, (Py_ssize_t)i);
}

static void *op_list(void *ctx, void *const *items, uint32_t n)
{
  (void)ctx;
  PyObject *l = PyList_New(n);
  for (uint32_t e = 0; l && e < n; e++)
    PyList_SET_ITEM(l, e, Py_NewRef((PyObject *)items[e]));
  return l;
}

static void op_hold(void *ctx, void *v)
{
  (void)ctx;
  Py_INCREF((PyObject *)v);
}

static void op_release(void *ctx, void *v)
{
  (void)ctx;
  Py_DECREF((PyObject *)v);
}

/* -- Running --------------------------------------------------------------- */

/* Our exception, in words ("RuntimeError: a kernel failed"). */
static void describe(PyObject *exc, char *out, size_t len)
{
  PyObject *s = exc ? PyObject_Str(exc) : NULL;
  const char *text = s ? PyUnicode_AsUTF8(s) : NULL;
  snprintf(out, len, "%s: %s", exc ? Py_TYPE(exc)->tp_name : "error", text ? text : "?");
  if (!text)
    PyErr_Clear();
  Py_XDECREF(s);
}

static PyObject *plan_run(PlanObject *p, PyObject *const *inputs, Py_ssize_t n)
{
  uint32_t nout = tn_plan_num_outputs(p->pl_plan), failed = 0;
  p->pl_runs++;
  if (tn_fallback_route(&p->pl_fb) == TN_FALLBACK_EAGER)
    return PyObject_Vectorcall(p->pl_eager, inputs, (size_t)n, NULL);
  if ((uint32_t)n != tn_plan_num_inputs(p->pl_plan))
    return PyErr_Format(PyExc_TypeError, "compiled graph takes %u inputs, got %zd",
                        tn_plan_num_inputs(p->pl_plan), n);
  PyObject *res = PyTuple_New(nout);
  if (!res)
    return NULL;
  tn_exec_ops ops = {p, op_constant, op_call, op_item, op_list, op_hold, op_release};
  void *outs_stack[64], **outs = nout <= 64 ? outs_stack : PyMem_Malloc(nout * sizeof *outs);
  if (!outs) {
    Py_DECREF(res);
    return PyErr_NoMemory();
  }
  tn_yield_call_begin();  /* a served call: background builds and compilers give way (tn_yield.h) */
  int rc = tn_exec_run(p->pl_plan, &ops, (void *const *)inputs, outs, &failed);
  tn_yield_call_end();
  if (rc == TN_OK)
    for (uint32_t i = 0; i < nout; i++)
      PyTuple_SET_ITEM(res, i, (PyObject *)outs[i]);
  if (outs != outs_stack)
    PyMem_Free(outs);
  if (rc == TN_OK && p->pl_bare) {
    PyObject *only = Py_NewRef(PyTuple_GET_ITEM(res, 0));
    Py_DECREF(res);
    return only;
  }
  if (rc == TN_OK)
    return res;
  Py_DECREF(res);
  if (rc == TN_ENOMEM && !PyErr_Occurred())
    PyErr_NoMemory();
  if (!PyErr_Occurred() || !PyErr_ExceptionMatches(PyExc_Exception))
    return NULL;  /* KeyboardInterrupt and the like stop the call */
  if (PyErr_ExceptionMatches(tn_py_NoMemory)) { /* fake tensors (shape inference): PyTorch's ops answer this call */
    PyErr_Clear();
    return PyObject_Vectorcall(p->pl_eager, inputs, (size_t)n, NULL);
  }
  /* a step failed: the eager original on the same inputs decides whose failure it was */
  PyObject *type, *ours, *tb;
  char cause[TN_ERRMSG_LEN];
  PyErr_Fetch(&type, &ours, &tb);
  PyErr_NormalizeException(&type, &ours, &tb);
  describe(ours, cause, sizeof cause);
  Py_XDECREF(type);
  Py_XDECREF(ours);
  Py_XDECREF(tb);
  PyObject *eager = PyObject_Vectorcall(p->pl_eager, inputs, (size_t)n, NULL);
  if (!tn_fallback_settle(&p->pl_fb, eager != NULL, cause))
    return NULL;  /* the user's error: eager's exception propagates */
  tn_stat_add(TN_STAT_eager_fallbacks, 1);
  PyObject *msg = PyUnicode_FromFormat("a compiled graph failed at run time (step %u), running it eagerly "
                                       "from now on (%s)", failed, p->pl_fb.fb_cause);
  PyObject *w = msg ? PyObject_CallOneArg(p->pl_warn, msg) : NULL;
  Py_XDECREF(msg);
  if (!w) {  /* warnings as errors: the warning is the call's outcome */
    Py_DECREF(eager);
    return NULL;
  }
  Py_DECREF(w);
  return eager;
}

static PyObject *Plan_vectorcall(PyObject *o, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (n != 1 || (kwnames && PyTuple_GET_SIZE(kwnames)) || !PyList_Check(args[0]))
    return PyErr_Format(PyExc_TypeError, "a compiled graph takes one list of inputs (call(*inputs) takes them "
                        "one by one)");
  PyObject *list = Py_NewRef(args[0]);  /* the list may change while the plan runs */
  PyObject *fast = PySequence_Fast(list, "inputs");
  Py_DECREF(list);
  if (!fast)
    return NULL;
  PyObject *res = plan_run((PlanObject *)o, PySequence_Fast_ITEMS(fast), PySequence_Fast_GET_SIZE(fast));
  Py_DECREF(fast);
  return res;
}

static PyObject *Plan_call_method(PyObject *o, PyObject *const *args, Py_ssize_t n)
{
  return plan_run((PlanObject *)o, args, n);
}

/* -- Construction ------------------------------------------------------------ */

static int parse_operand(PyObject *item, tn_operand *out, int allow_list, const char *where)
{
  long kind, index;
  if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
    PyErr_Format(PyExc_TypeError, "%s: an operand is a (kind, index) pair", where);
    return -1;
  }
  kind = PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
  if (kind == -1 && PyErr_Occurred())
    return -1;
  if (kind == TN_OPND_LIST) {
    if (!allow_list) {
      PyErr_Format(PyExc_ValueError, "%s: a list where a slot or constant must be", where);
      return -1;
    }
    out->od_kind = TN_OPND_LIST;
    return 0;  /* the caller parses the elements */
  }
  index = PyLong_AsLong(PyTuple_GET_ITEM(item, 1));
  if (index == -1 && PyErr_Occurred())
    return -1;
  if ((kind != TN_OPND_SLOT && kind != TN_OPND_CONST) || index < 0 || index > UINT32_MAX) {
    PyErr_Format(PyExc_ValueError, "%s: bad operand (%ld, %ld)", where, kind, index);
    return -1;
  }
  out->od_kind = (uint32_t)kind;
  out->od_index = (uint32_t)index;
  out->od_len = 0;
  return 0;
}

static int plan_raise(tn_plan *plan, int rc)
{
  if (rc == TN_ENOMEM)
    PyErr_NoMemory();
  else
    PyErr_Format(PyExc_ValueError, "plan: %s", tn_plan_errmsg(plan));
  return -1;
}

/* Adds one step, parsed from (kind, callable, item, operands, nkw, kwnames). */
static int add_step(tn_plan *plan, PyObject *spec, Py_ssize_t k)
{
  int kind;
  unsigned int callable, item, nkw, kwnames;
  PyObject *operands, *fast = NULL;
  tn_operand args[TN_PLAN_MAX_ARGS];
  tn_operand *items = NULL;
  uint32_t nitems = 0, cap = 0, out;
  char where[64];
  int rc = -1;

  snprintf(where, sizeof where, "step %zd", k);
  if (!PyArg_ParseTuple(spec, "iIIOII", &kind, &callable, &item, &operands, &nkw, &kwnames))
    return -1;
  if (!(fast = PySequence_Fast(operands, "operands must be a sequence")))
    return -1;
  Py_ssize_t nargs = PySequence_Fast_GET_SIZE(fast);
  if (nargs > TN_PLAN_MAX_ARGS) {
    PyErr_Format(PyExc_ValueError, "%s: %zd operands exceed %d", where, nargs, TN_PLAN_MAX_ARGS);
    goto done;
  }
  for (Py_ssize_t i = 0; i < nargs; i++) {
    PyObject *o = PySequence_Fast_GET_ITEM(fast, i);
    if (parse_operand(o, &args[i], 1, where) < 0)
      goto done;
    if (args[i].od_kind != TN_OPND_LIST)
      continue;
    PyObject *elems = PySequence_Fast(PyTuple_GET_ITEM(o, 1), "a list operand holds a sequence");
    if (!elems)
      goto done;
    Py_ssize_t ne = PySequence_Fast_GET_SIZE(elems);
    if (nitems + (uint64_t)ne > cap) {
      uint32_t ncap = (uint32_t)(nitems + ne + 16);
      tn_operand *grown = PyMem_Realloc(items, ncap * sizeof *items);
      if (!grown) {
        Py_DECREF(elems);
        PyErr_NoMemory();
        goto done;
      }
      items = grown;
      cap = ncap;
    }
    args[i].od_index = nitems;
    args[i].od_len = (uint32_t)ne;
    for (Py_ssize_t e = 0; e < ne; e++)
      if (parse_operand(PySequence_Fast_GET_ITEM(elems, e), &items[nitems++], 0, where) < 0) {
        Py_DECREF(elems);
        goto done;
      }
    Py_DECREF(elems);
  }
  int prc = tn_plan_add_step(plan, kind, callable, item, args, (uint32_t)nargs, nkw, kwnames, items, nitems, &out);
  if (prc != TN_OK) {
    plan_raise(plan, prc);
    goto done;
  }
  rc = 0;
done:
  PyMem_Free(items);
  Py_XDECREF(fast);
  return rc;
}

/* A Plan object owning finished plan *plan (taken: *plan is NULL afterwards
** on success; on failure the caller still frees it). */
static PyObject *plan_wrap(PyTypeObject *type, tn_plan **plan, PyObject *consts, PyObject *eager, PyObject *warn,
                           PyObject *source, int bare)
{
  PlanObject *self = (PlanObject *)type->tp_alloc(type, 0);
  if (!self)
    return NULL;
  self->pl_vectorcall = Plan_vectorcall;
  self->pl_plan = *plan;
  self->pl_consts = Py_NewRef(consts);
  self->pl_eager = Py_NewRef(eager);
  self->pl_warn = Py_NewRef(warn);
  self->pl_source = Py_NewRef(source);
  self->pl_form = Py_NewRef(Py_None);
  self->pl_bare = bare;
  memset(&self->pl_fb, 0, sizeof self->pl_fb);
  *plan = NULL;
  return (PyObject *)self;
}

static int plan_args_ok(PyObject *consts, PyObject *eager, PyObject *warn)
{
  if (PyTuple_Check(consts) && PyCallable_Check(eager) && PyCallable_Check(warn))
    return 1;
  PyErr_Format(PyExc_TypeError, "Plan: constants must be a tuple, eager and warn callables");
  return 0;
}

static PyObject *Plan_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
  static char *kwlist[] = {"ninputs", "constants", "steps", "outputs", "eager", "warn", "source", "bare", NULL};
  unsigned int ninputs;
  int bare = 0;
  PyObject *consts, *steps, *outputs, *eager, *warn, *source = Py_None, *fsteps = NULL, *fouts = NULL;
  tn_plan *plan = NULL;
  tn_operand outs_stack[64], *outs = outs_stack;
  PyObject *self = NULL;

  if (!PyArg_ParseTupleAndKeywords(args, kwds, "IOOOOO|Op:Plan", kwlist, &ninputs, &consts, &steps, &outputs,
                                   &eager, &warn, &source, &bare))
    return NULL;
  if (!plan_args_ok(consts, eager, warn))
    return NULL;
  int rc = tn_plan_new(ninputs, (uint32_t)PyTuple_GET_SIZE(consts), &plan);
  if (rc != TN_OK)
    return rc == TN_ENOMEM ? PyErr_NoMemory() : PyErr_Format(PyExc_ValueError, "Plan: too many inputs");
  if (!(fsteps = PySequence_Fast(steps, "steps must be a sequence")) ||
      !(fouts = PySequence_Fast(outputs, "outputs must be a sequence")))
    goto fail;
  for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(fsteps); k++)
    if (add_step(plan, PySequence_Fast_GET_ITEM(fsteps, k), k) < 0)
      goto fail;
  Py_ssize_t nout = PySequence_Fast_GET_SIZE(fouts);
  if (nout > 64 && !(outs = PyMem_Malloc((size_t)nout * sizeof *outs))) {
    PyErr_NoMemory();
    goto fail;
  }
  for (Py_ssize_t i = 0; i < nout; i++)
    if (parse_operand(PySequence_Fast_GET_ITEM(fouts, i), &outs[i], 0, "output") < 0)
      goto fail;
  if (bare && nout != 1) {
    PyErr_Format(PyExc_ValueError, "Plan: bare takes exactly one output, not %zd", nout);
    goto fail;
  }
  rc = tn_plan_finish(plan, outs, (uint32_t)nout);
  if (rc != TN_OK) {
    plan_raise(plan, rc);
    goto fail;
  }
  self = plan_wrap(type, &plan, consts, eager, warn, source, bare);
fail:
  if (outs != outs_stack)
    PyMem_Free(outs);
  Py_XDECREF(fsteps);
  Py_XDECREF(fouts);
  tn_plan_free(plan);
  return self;
}

/* -- The binary form ---------------------------------------------------------- */

#define PLAN_FLAG_BARE 1u

static PyObject *Plan_encode(PyObject *o, PyObject *unused)
{
  PlanObject *p = (PlanObject *)o;
  uint8_t *buf;
  size_t len;
  (void)unused;
  int rc = tn_plan_encode(p->pl_plan, p->pl_bare ? PLAN_FLAG_BARE : 0, &buf, &len);
  if (rc != TN_OK)
    return rc == TN_ENOMEM ? PyErr_NoMemory() : PyErr_Format(PyExc_ValueError, "plan: %s", tn_strerror(rc));
  PyObject *res = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
  free(buf);
  return res;
}

static PyObject *Plan_from_bytes(PyObject *cls, PyObject *args, PyObject *kwds)
{
  static char *kwlist[] = {"data", "constants", "eager", "warn", "source", NULL};
  Py_buffer data;
  PyObject *consts, *eager, *warn, *source = Py_None, *self = NULL;
  tn_plan *plan = NULL;
  uint32_t flags = 0;
  char err[TN_ERRMSG_LEN];

  if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*OOO|O:from_bytes", kwlist, &data, &consts, &eager, &warn,
                                   &source))
    return NULL;
  if (!plan_args_ok(consts, eager, warn))
    goto done;
  int rc = tn_plan_decode(data.buf, (size_t)data.len, (uint32_t)PyTuple_GET_SIZE(consts), &plan, &flags, err,
                          sizeof err);
  if (rc == TN_ENOMEM) {
    PyErr_NoMemory();
    goto done;
  }
  if (rc != TN_OK) {
    PyErr_Format(PyExc_ValueError, "%s (%s)", err, tn_strerror(rc));
    goto done;
  }
  if ((flags & ~PLAN_FLAG_BARE) || ((flags & PLAN_FLAG_BARE) && tn_plan_num_outputs(plan) != 1)) {
    PyErr_Format(PyExc_ValueError, "plan: flags %u do not fit a plan of %u outputs", flags,
                 tn_plan_num_outputs(plan));
    goto done;
  }
  self = plan_wrap((PyTypeObject *)cls, &plan, consts, eager, warn, source, (flags & PLAN_FLAG_BARE) != 0);
done:
  tn_plan_free(plan);
  PyBuffer_Release(&data);
  return self;
}

static int Plan_traverse(PyObject *o, visitproc visit, void *arg)
{
  PlanObject *p = (PlanObject *)o;
  Py_VISIT(p->pl_consts);
  Py_VISIT(p->pl_eager);
  Py_VISIT(p->pl_warn);
  Py_VISIT(p->pl_source);
  Py_VISIT(p->pl_form);
  return 0;
}

static int Plan_clear(PyObject *o)
{
  PlanObject *p = (PlanObject *)o;
  Py_CLEAR(p->pl_consts);
  Py_CLEAR(p->pl_eager);
  Py_CLEAR(p->pl_warn);
  Py_CLEAR(p->pl_source);
  Py_CLEAR(p->pl_form);
  return 0;
}

static void Plan_dealloc(PyObject *o)
{
  PyObject_GC_UnTrack(o);
  if (((PlanObject *)o)->pl_weakrefs)
    PyObject_ClearWeakRefs(o);
  Plan_clear(o);
  tn_plan_free(((PlanObject *)o)->pl_plan);
  Py_TYPE(o)->tp_free(o);
}

/* -- Introspection ---------------------------------------------------------- */

static PyObject *Plan_dump(PyObject *o, PyObject *unused)
{
  const char *text;
  (void)unused;
  if (tn_plan_dump(((PlanObject *)o)->pl_plan, &text) != TN_OK)
    return PyErr_NoMemory();
  return PyUnicode_FromString(text);
}

static PyObject *Plan_steps(PyObject *o, PyObject *unused)
{
  PlanObject *p = (PlanObject *)o;
  (void)unused;
  uint32_t n = tn_plan_num_steps(p->pl_plan);
  PyObject *l = PyList_New(n);
  for (uint32_t k = 0; l && k < n; k++) {
    const tn_step *st = tn_plan_step(p->pl_plan, k);
    PyObject *callable = st->st_kind == TN_STEP_ITEM ? Py_None : PyTuple_GET_ITEM(p->pl_consts, st->st_callable);
    PyObject *t = Py_BuildValue("(sO)", tn_plan_kind_name(st->st_kind), callable);
    if (!t) {
      Py_CLEAR(l);
      break;
    }
    PyList_SET_ITEM(l, k, t);
  }
  return l;
}

static PyObject *Plan_get(PyObject *o, void *which)
{
  PlanObject *p = (PlanObject *)o;
  switch ((int)(intptr_t)which) {
  case 0: Py_RETURN_TRUE;  /* _boxed_call: aot_autograd passes one list */
  case 1: return PyBool_FromLong(tn_fallback_route(&p->pl_fb) == TN_FALLBACK_EAGER);
  case 2: return Py_NewRef(p->pl_source);
  case 3: return Py_NewRef(p->pl_eager);
  case 4: return PyLong_FromUnsignedLong(tn_plan_peak_live(p->pl_plan));
  case 6: return PyLong_FromUnsignedLongLong(p->pl_runs);
  default: return Py_NewRef(p->pl_consts);
  }
}

static int Plan_set_form(PyObject *o, PyObject *value, void *c)
{
  (void)c;
  Py_XSETREF(((PlanObject *)o)->pl_form, Py_NewRef(value ? value : Py_None));
  return 0;
}

static PyObject *Plan_get_form(PyObject *o, void *c)
{
  (void)c;
  return Py_NewRef(((PlanObject *)o)->pl_form);
}

static PyMethodDef Plan_methods[] = {
  {"call", (PyCFunction)(void (*)(void))Plan_call_method, METH_FASTCALL,
   "call(*inputs) -> tuple of outputs (the plan called with its inputs one by one)."},
  {"dump", Plan_dump, METH_NOARGS, "The steps, one line each, with the slots each frees."},
  {"steps", Plan_steps, METH_NOARGS, "[(kind, callable)] per step (callable None for items)."},
  {"encode", Plan_encode, METH_NOARGS, "The plan's binary form (plan.h), its constant table left out."},
  {"from_bytes", (PyCFunction)(void (*)(void))Plan_from_bytes, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
   "from_bytes(data, constants, eager, warn, source=None): the plan of encode()'s bytes over the constant "
   "table given (ValueError naming the fault when the bytes are damaged or do not fit the table)."},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef Plan_getset[] = {
  {"_boxed_call", Plan_get, NULL, "True: called with one list of inputs", (void *)0},
  {"is_eager", Plan_get, NULL, "whether our failure sent this graph to eager for good", (void *)1},
  {"source", Plan_get, NULL, "the fused FX graph the plan was built from (reports only)", (void *)2},
  {"eager", Plan_get, NULL, "what runs the graph eagerly (its graph module's forward)", (void *)3},
  {"peak_live", Plan_get, NULL, "most slots alive at once", (void *)4},
  {"constants", Plan_get, NULL, "the constant table", (void *)5},
  {"runs", Plan_get, NULL, "how many times the plan was called", (void *)6},
  {"form", Plan_get_form, Plan_set_form, "what the back end keeps to store the plan, or None", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PlanType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "torchneuron_jit._C.Plan",
  .tp_basicsize = sizeof(PlanObject),
  .tp_dealloc = Plan_dealloc,
  .tp_vectorcall_offset = offsetof(PlanObject, pl_vectorcall),
  .tp_weaklistoffset = offsetof(PlanObject, pl_weakrefs),
  .tp_call = PyVectorcall_Call,
  .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
  .tp_doc = "A compiled graph: its plan, run by the executor in C (see plan_py.c).",
  .tp_traverse = Plan_traverse,
  .tp_clear = Plan_clear,
  .tp_methods = Plan_methods,
  .tp_getset = Plan_getset,
  .tp_new = Plan_new,
};

int tn_py_plan_init(PyObject *m)
{
  if (PyType_Ready(&PlanType) < 0 || PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0)
    return -1;
  static const struct { const char *name; int value; } consts[] = {
    {"STEP_KERNEL", TN_STEP_KERNEL}, {"STEP_ATEN", TN_STEP_ATEN}, {"STEP_CALL", TN_STEP_CALL},
    {"STEP_ITEM", TN_STEP_ITEM}, {"OPND_SLOT", TN_OPND_SLOT}, {"OPND_CONST", TN_OPND_CONST},
    {"OPND_LIST", TN_OPND_LIST},
  };
  for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
    if (PyModule_AddIntConstant(m, consts[i].name, consts[i].value) < 0)
      return -1;
  return 0;
}
