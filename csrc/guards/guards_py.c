/*
** Guard sets (guards.h): building the flat program from its spec and
** running it against a call's arguments.
*/
#include "guards.h"

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* -- The program ------------------------------------------------------------ */

enum {
  G_ARG, G_ITEM, G_KEY, G_CONST, G_CELL, G_ATTRS, G_FUNC,     /* loads */
  G_TYPE, G_IS, G_EQ, G_LEN, G_TENSOR, G_DICT, G_CALL, G_ISWEAK, G_SIZES, G_SAME, G_PLAIN, G_DISTINCT,
  G_ORDER, G_BARE, /* checks */
  G_NOP,   /* neither */
  G__COUNT
};

/* The fields of a function, or of a functools.partial, a "func" load reads (guards.h). */
enum {
  FUNC_CODE, FUNC_DEFAULTS, FUNC_KWDEFAULTS, FUNC_CLOSURE, /* of a function */
  FUNC_PARTIAL_FUNC, FUNC_PARTIAL_ARGS, FUNC_PARTIAL_KEYWORDS, /* of a partial */
  FUNC__COUNT
};
static const char *const func_fields[FUNC__COUNT] = {"code", "defaults", "kwdefaults", "closure",
                                                     "partial_func", "partial_args", "partial_keywords"};

static const char *const g_names[G__COUNT] = {
  "arg", "item", "key", "const", "cell", "attrs", "func", "type", "is", "eq", "len", "tensor", "dict", "call", "isweak", "sizes",
  "same", "plain", "distinct", "order", "bare", "nop",
};

/* A "sizes" program (guards.h): postfix over int64, one opcode per item,
** CONST and DIM followed by their operands. */
enum {
  GS_CONST, GS_DIM, GS_ADD, GS_MUL, GS_FLOORDIV, GS_MOD, GS_EQ, GS_NE, GS_LT, GS_LE, GS_AND, GS_OR, GS_NOT,
  GS_MAX, GS_MIN, GS_NEG, GS_INT, GS_TRUNCMUL, GS__COUNT
};
#define GS_STACK 32   /* deepest stack a program may need */
#define G_ANY_SIZE INT64_MIN  /* a tensor guard's size or stride that any value passes */

typedef struct tn_ginst {
  int gi_op;
  Py_ssize_t gi_slot;     /* the slot an instruction reads (ITEM, KEY, checks) */
  Py_ssize_t gi_n;        /* ARG / ITEM index, LEN count, TENSOR rank, DICT entries */
  PyObject *gi_obj;       /* KEY key, CONST / IS / EQ object, TYPE type, TENSOR dtype, DICT keys, CALL fn,
                             ISWEAK weak reference, LEN a dict's keys in order (or NULL) */
  PyObject *gi_obj2;      /* TENSOR requires_grad (a bool), DICT values, CALL result */
  int64_t *gi_ints;       /* TENSOR sizes then strides; SIZES the program */
  int gi_dense;           /* TENSOR: strides are the row-major ones of its sizes (strides None) */
  int gi_sized;           /* DICT: nothing but the keys */
  uint64_t gi_version;    /* DICT: version tag of the dict when last found right (0: never) */
} tn_ginst;

struct tn_gset {
  Py_ssize_t gs_n;
  tn_ginst *gs_inst;
  Py_ssize_t gs_refs;     /* its owner's and each check's hold (tn_guards_hold): freed at 0 */
};

static PyObject *s_dtype, *s_shape, *s_stride, *s_requires_grad, *s_is_cpu, *s_is_conj, *s_is_neg;
static PyObject *torch_marks; /* the attributes torch sets on a tensor: _spec.TORCH_MARKS, a frozenset */
static PyObject *s_partial_fields[3]; /* "func", "args", "keywords" */
static PyTypeObject *partial_type;   /* functools.partial */

static int strings_init(void)
{
  if (s_dtype)
    return 0;
  if (!torch_marks) { /* first: a failed import leaves nothing else set, and the next build tries again */
    PyObject *spec = PyImport_ImportModule("torchneuron_jit._spec");
    PyObject *marks = spec ? PyObject_GetAttrString(spec, "TORCH_MARKS") : NULL;
    Py_XDECREF(spec);
    if (marks && !PyFrozenSet_Check(marks)) {
      PyErr_SetString(PyExc_TypeError, "_spec.TORCH_MARKS is not a frozenset");
      Py_CLEAR(marks);
    }
    if (!marks)
      return -1;
    torch_marks = marks; /* kept */
  }
  PyObject *functools = PyImport_ImportModule("functools");
  partial_type = functools ? (PyTypeObject *)PyObject_GetAttrString(functools, "partial") : NULL; /* kept */
  Py_XDECREF(functools);
  if (!partial_type || !PyType_Check(partial_type))
    return -1;
  s_partial_fields[0] = PyUnicode_InternFromString("func");
  s_partial_fields[1] = PyUnicode_InternFromString("args");
  s_partial_fields[2] = PyUnicode_InternFromString("keywords");
  if (!s_partial_fields[0] || !s_partial_fields[1] || !s_partial_fields[2])
    return -1;
  s_dtype = PyUnicode_InternFromString("dtype");
  s_shape = PyUnicode_InternFromString("shape");
  s_stride = PyUnicode_InternFromString("stride");
  s_requires_grad = PyUnicode_InternFromString("requires_grad");
  s_is_cpu = PyUnicode_InternFromString("is_cpu");
  s_is_conj = PyUnicode_InternFromString("is_conj");
  s_is_neg = PyUnicode_InternFromString("is_neg");
  return s_dtype && s_shape && s_stride && s_requires_grad && s_is_cpu && s_is_conj && s_is_neg ? 0 : -1;
}

static PyObject *g_absent;
static PyObject *g_any;
static PyObject *value_types; /* tn_guards_set_value_types's tuple */

int tn_guards_set_value_types(PyObject *types)
{
  if (!PyTuple_Check(types)) {
    PyErr_Format(PyExc_TypeError, "value types must be a tuple of types, not %s", Py_TYPE(types)->tp_name);
    return -1;
  }
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(types); k++)
    if (!PyType_Check(PyTuple_GET_ITEM(types, k))) {
      PyErr_Format(PyExc_TypeError, "value types must be types, not %s",
                   Py_TYPE(PyTuple_GET_ITEM(types, k))->tp_name);
      return -1;
    }
  Py_XSETREF(value_types, Py_NewRef(types));
  return 0;
}

/* Whether a dict guard compares v by type and value. */
static int by_value(PyObject *v)
{
  if (PyLong_CheckExact(v) || PyFloat_CheckExact(v) || PyUnicode_CheckExact(v))
    return 1;
  for (Py_ssize_t k = 0; value_types && k < PyTuple_GET_SIZE(value_types); k++)
    if ((PyObject *)Py_TYPE(v) == PyTuple_GET_ITEM(value_types, k))
      return 1;
  return 0;
}

PyObject *tn_guard_absent(void)
{
  if (!g_absent)
    g_absent = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  return g_absent;
}

PyObject *tn_guard_any(void)
{
  if (!g_any)
    g_any = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  return g_any;
}

void tn_guards_hold(tn_gset *gs)
{
  assert(gs && gs->gs_refs > 0);
  gs->gs_refs++;
}

void tn_guards_free(tn_gset *gs)
{
  if (!gs)
    return;
  assert(gs->gs_refs > 0);
  if (--gs->gs_refs > 0)
    return;
  for (Py_ssize_t i = 0; i < gs->gs_n; i++) {
    Py_XDECREF(gs->gs_inst[i].gi_obj);
    Py_XDECREF(gs->gs_inst[i].gi_obj2);
    PyMem_Free(gs->gs_inst[i].gi_ints);
  }
  PyMem_Free(gs->gs_inst);
  PyMem_Free(gs);
}

int tn_guards_traverse(tn_gset *gs, visitproc visit, void *arg)
{
  for (Py_ssize_t i = 0; gs && i < gs->gs_n; i++) {
    Py_VISIT(gs->gs_inst[i].gi_obj);
    Py_VISIT(gs->gs_inst[i].gi_obj2);
  }
  return 0;
}

Py_ssize_t tn_guards_nslots(const tn_gset *gs)
{
  return gs->gs_n;
}

int tn_guards_dead(const tn_gset *gs)
{
  for (Py_ssize_t i = 0; i < gs->gs_n; i++)
    if (gs->gs_inst[i].gi_op == G_ISWEAK && PyWeakref_GET_OBJECT(gs->gs_inst[i].gi_obj) == Py_None)
      return 1;
  return 0;
}

/* -- Building ----------------------------------------------------------------- */

static int bad(Py_ssize_t i, const char *why)
{
  PyErr_Format(PyExc_ValueError, "guard spec entry %zd: %s", i, why);
  return -1;
}

/* Reads the slot operand of entry i of prog: an earlier load (a check
** leaves no value in its slot). */
static int slot_arg(PyObject *t, Py_ssize_t pos, const tn_ginst *prog, Py_ssize_t i, Py_ssize_t *out)
{
  Py_ssize_t s = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, pos));
  if (s == -1 && PyErr_Occurred())
    return -1;
  if (s < 0 || s >= i || prog[s].gi_op > G_FUNC)
    return bad(i, "a slot operand must name an earlier load (arg, item, key, const, cell, attrs, func)");
  *out = s;
  return 0;
}

/* Reads tuple o of n ints into out; with any set, None items read as
** G_ANY_SIZE. */
static int int_tuple(PyObject *o, Py_ssize_t n, int64_t *out, Py_ssize_t i, int any)
{
  if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != n)
    return bad(i, "sizes and strides must be tuples of the rank's length");
  for (Py_ssize_t k = 0; k < n; k++) {
    if (any && PyTuple_GET_ITEM(o, k) == Py_None) {
      out[k] = G_ANY_SIZE;
      continue;
    }
    out[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(o, k));
    if (out[k] == -1 && PyErr_Occurred())
      return -1;
  }
  return 0;
}

/* Reads tuple p of ints into g's own gi_ints (gi_n of them). 0, or -1
** with an exception set. */
static int own_ints(tn_ginst *g, PyObject *p, Py_ssize_t i)
{
  g->gi_n = PyTuple_GET_SIZE(p);
  if (!(g->gi_ints = PyMem_Malloc(sizeof(int64_t) * (size_t)(g->gi_n + 1)))) {
    PyErr_NoMemory();
    return -1;
  }
  return int_tuple(p, g->gi_n, g->gi_ints, i, 0);
}

/* Reads a "sizes" program (a tuple of ints) into g, checking that each
** DIM names an earlier tensor check's slot and dimension, each INT an
** earlier check's slot whose type is int, that each operator has its
** operands, and that one value is left. */
static int build_sizes(const tn_ginst *prog, tn_ginst *g, PyObject *p, Py_ssize_t i)
{
  if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) == 0)
    return bad(i, "sizes needs a program (a non-empty tuple of ints)");
  if (own_ints(g, p, i) < 0)
    return -1;
  int depth = 0;
  for (Py_ssize_t k = 0; k < g->gi_n; k++) {
    int64_t op = g->gi_ints[k];
    if (op < 0 || op >= GS__COUNT)
      return bad(i, "sizes: unknown operator");
    if (op == GS_CONST) {
      if (++k >= g->gi_n)
        return bad(i, "sizes: CONST needs its value");
      depth++;
    } else if (op == GS_DIM) {
      if (k + 2 >= g->gi_n)
        return bad(i, "sizes: DIM needs a slot and a dimension");
      int64_t s = g->gi_ints[k + 1], d = g->gi_ints[k + 2];
      int found = 0;
      for (Py_ssize_t j = 0; j < i && !found; j++)
        found = prog[j].gi_op == G_TENSOR && prog[j].gi_slot == s && d >= 0 && d < prog[j].gi_n;
      if (!found)
        return bad(i, "sizes: DIM must name a slot and dimension an earlier tensor guard checks");
      k += 2;
      depth++;
    } else if (op == GS_INT) {
      if (k + 1 >= g->gi_n)
        return bad(i, "sizes: INT needs a slot");
      int64_t s = g->gi_ints[++k];
      int found = 0;
      for (Py_ssize_t j = 0; j < i && !found; j++)
        found = prog[j].gi_op == G_TYPE && prog[j].gi_slot == s && prog[j].gi_obj == (PyObject *)&PyLong_Type;
      if (!found)
        return bad(i, "sizes: INT must name a slot an earlier type guard checks to be an int");
      depth++;
    } else if (op == GS_TRUNCMUL) {
      if (++k >= g->gi_n)
        return bad(i, "sizes: TRUNCMUL needs its factor");
      if (depth < 1)
        return bad(i, "sizes: an operator lacks its operand");
    } else if (op == GS_NOT || op == GS_NEG) {
      if (depth < 1)
        return bad(i, "sizes: an operator lacks its operand");
    } else {
      if (depth < 2)
        return bad(i, "sizes: an operator lacks its operands");
      depth--;
    }
    if (depth > GS_STACK)
      return bad(i, "sizes: the program is too deep");
  }
  return depth == 1 ? 0 : bad(i, "sizes: the program must leave one value");
}

/* Reads a "distinct" guard's slots (a tuple of at least two earlier
** loads) into g. */
static int build_distinct(const tn_ginst *prog, tn_ginst *g, PyObject *p, Py_ssize_t i)
{
  if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) < 2)
    return bad(i, "distinct needs a tuple of two or more slots");
  if (own_ints(g, p, i) < 0)
    return -1;
  for (Py_ssize_t k = 0; k < g->gi_n; k++)
    if (g->gi_ints[k] < 0 || g->gi_ints[k] >= i || prog[g->gi_ints[k]].gi_op > G_FUNC)
      return bad(i, "distinct: each slot must name an earlier load (arg, item, key, const, cell, attrs, func)");
  return 0;
}

static int build_one(tn_ginst *prog, PyObject *t, Py_ssize_t i)
{
  tn_ginst *g = &prog[i];
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(t, 0)) ||
      (PyTuple_GET_SIZE(t) < 2 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(t, 0), "nop") != 0))
    return bad(i, "not a tuple (name, operands...)");
  const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, 0));
  Py_ssize_t n = PyTuple_GET_SIZE(t);
  int op = -1;
  for (int k = 0; k < G__COUNT; k++)
    if (name && strcmp(name, g_names[k]) == 0)
      op = k;
  static const Py_ssize_t arity[G__COUNT] = {2, 3, 3, 2, 2, 2, 3, 3, 3, 3, 3, 6, 5, 3, 3, 2, 3, 2, 2, 3, 2, 1};
  if (op < 0)
    return bad(i, "unknown instruction");
  if (n != arity[op] && !(op == G_LEN && n == 4)) /* a dict's length may come with its keys, in order */
    return bad(i, "wrong number of operands");
  g->gi_op = op;
  g->gi_slot = -1;
  switch (op) {
  case G_NOP:
    return 0;
  case G_ARG:
    g->gi_n = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 1));
    if (g->gi_n < 0)
      return PyErr_Occurred() ? -1 : bad(i, "negative argument index");
    return 0;
  case G_CONST:
    g->gi_obj = Py_NewRef(PyTuple_GET_ITEM(t, 1));
    return 0;
  case G_CALL:
    g->gi_obj = Py_NewRef(PyTuple_GET_ITEM(t, 1));
    g->gi_obj2 = Py_NewRef(PyTuple_GET_ITEM(t, 2));
    return PyCallable_Check(g->gi_obj) ? 0 : bad(i, "call needs a callable");
  case G_SIZES:
    return build_sizes(prog, g, PyTuple_GET_ITEM(t, 1), i);
  case G_DISTINCT:
    return build_distinct(prog, g, PyTuple_GET_ITEM(t, 1), i);
  default:
    break;
  }
  if (slot_arg(t, 1, prog, i, &g->gi_slot) < 0)
    return -1;
  if (op == G_CELL || op == G_ATTRS || op == G_PLAIN || op == G_BARE)
    return 0;
  PyObject *a = PyTuple_GET_ITEM(t, 2);
  switch (op) {
  case G_FUNC:
    for (g->gi_n = 0; g->gi_n < FUNC__COUNT; g->gi_n++)
      if (PyUnicode_Check(a) && PyUnicode_CompareWithASCIIString(a, func_fields[g->gi_n]) == 0)
        return 0;
    return bad(i, "func reads code, defaults, kwdefaults, closure, partial_func, partial_args or partial_keywords");
  case G_ITEM:
  case G_LEN:
    g->gi_n = PyLong_AsSsize_t(a);
    if (g->gi_n < 0)
      return PyErr_Occurred() ? -1 : bad(i, "negative index or length");
    if (n == 4 && !(g->gi_obj = PySequence_Tuple(PyTuple_GET_ITEM(t, 3))))
      return -1;
    if (g->gi_obj && PyTuple_GET_SIZE(g->gi_obj) != g->gi_n)
      return bad(i, "len: the keys are not as many as the length");
    return 0;
  case G_SAME:
    return slot_arg(t, 2, prog, i, &g->gi_n);
  case G_ISWEAK:
    if (!PyWeakref_CheckRef(a))
      return bad(i, "isweak needs a weak reference");
    g->gi_obj = Py_NewRef(a);
    return 0;
  case G_TYPE:
    if (!PyType_Check(a))
      return bad(i, "type needs a type");
    /* fall through */
  case G_KEY:
  case G_IS:
  case G_EQ:
    g->gi_obj = Py_NewRef(a);
    return 0;
  case G_ORDER: {
    if (!PyTuple_Check(a) || PyTuple_GET_SIZE(a) > 64)
      return bad(i, "order needs a tuple of the dimensions, outermost first");
    if (own_ints(g, a, i) < 0)
      return -1;
    uint64_t seen = 0;
    for (Py_ssize_t k = 0; k < g->gi_n; k++) {
      if (g->gi_ints[k] < 0 || g->gi_ints[k] >= g->gi_n || (seen >> g->gi_ints[k] & 1))
        return bad(i, "order needs a permutation of the dimensions");
      seen |= (uint64_t)1 << g->gi_ints[k];
    }
    return 0;
  }
  case G_TENSOR: {
    PyObject *sizes = PyTuple_GET_ITEM(t, 3), *strides = PyTuple_GET_ITEM(t, 4);
    PyObject *rg = PyTuple_GET_ITEM(t, 5);
    if (!PyTuple_Check(sizes) || !PyBool_Check(rg))
      return bad(i, "tensor needs (slot, dtype, sizes, strides, requires_grad)");
    g->gi_n = PyTuple_GET_SIZE(sizes);
    g->gi_obj = Py_NewRef(a);
    g->gi_obj2 = Py_NewRef(rg);
    g->gi_dense = strides == Py_None;
    if (!(g->gi_ints = PyMem_Malloc(sizeof(int64_t) * (size_t)(2 * g->gi_n + 1)))) {
      PyErr_NoMemory();
      return -1;
    }
    if (int_tuple(sizes, g->gi_n, g->gi_ints, i, 1) < 0)
      return -1;
    return g->gi_dense ? 0 : int_tuple(strides, g->gi_n, g->gi_ints + g->gi_n, i, 1);
  }
  case G_DICT: {
    PyObject *vals = PyTuple_GET_ITEM(t, 3);
    if (!PyTuple_Check(a) || !PyTuple_Check(vals) || PyTuple_GET_SIZE(a) != PyTuple_GET_SIZE(vals))
      return bad(i, "dict needs (slot, keys, values, sized) with as many keys as values");
    g->gi_n = PyTuple_GET_SIZE(a);
    g->gi_obj = Py_NewRef(a);
    g->gi_obj2 = Py_NewRef(vals);
    g->gi_sized = PyObject_IsTrue(PyTuple_GET_ITEM(t, 4));
    return g->gi_sized < 0 ? -1 : 0;
  }
  }
  return bad(i, "unhandled instruction");
}

tn_gset *tn_guards_build(PyObject *spec)
{
  tn_gset *gs = NULL;
  if (strings_init() < 0)
    return NULL;
  if (!PyList_Check(spec)) {
    PyErr_SetString(PyExc_TypeError, "a guard spec is a list of tuples");
    return NULL;
  }
  Py_ssize_t n = PyList_GET_SIZE(spec);
  if (!(gs = PyMem_Calloc(1, sizeof *gs)) || !(gs->gs_inst = PyMem_Calloc((size_t)(n ? n : 1), sizeof(tn_ginst)))) {
    PyMem_Free(gs);
    PyErr_NoMemory();
    return NULL;
  }
  gs->gs_n = n;
  gs->gs_refs = 1;
  for (Py_ssize_t i = 0; i < n; i++) {
    if (build_one(gs->gs_inst, PyList_GET_ITEM(spec, i), i) < 0) {
      tn_guards_free(gs);
      return NULL;
    }
  }
  return gs;
}

/* -- Running ----------------------------------------------------------------- */

/* Two floats the same guarded value: equal and of one sign (-0.0 is not
** 0.0: x / z differs), or both NaN (_spec.same_value's rule). */
static int same_double(double a, double b)
{
  return (a == b && signbit(a) == signbit(b)) || (a != a && b != b);
}

/* A guarded value's equality: same type, then ==; floats and complex
** numbers by same_double. 1 equal, 0 not, -1 error. */
static int same_value(PyObject *v, PyObject *want)
{
  if (v == want)
    return 1;
  if (Py_TYPE(v) != Py_TYPE(want))
    return 0;
  if (PyFloat_Check(v)) /* of one type: a float, or a subclass's (numpy's float64) */
    return same_double(PyFloat_AS_DOUBLE(v), PyFloat_AS_DOUBLE(want));
  if (PyComplex_CheckExact(v)) {
    Py_complex a = PyComplex_AsCComplex(v), b = PyComplex_AsCComplex(want);
    return same_double(a.real, b.real) && same_double(a.imag, b.imag);
  }
  return PyObject_RichCompareBool(v, want, Py_EQ);
}

/* 1 when tuple o holds n ints equal to want's (G_ANY_SIZE: any int), 0
** when not; the values go to got when it is not NULL. */
static int ints_equal(PyObject *o, const int64_t *want, Py_ssize_t n, int64_t *got)
{
  if (!o || !PyTuple_Check(o) || PyTuple_GET_SIZE(o) != n)
    return 0;
  for (Py_ssize_t k = 0; k < n; k++) {
    PyObject *x = PyTuple_GET_ITEM(o, k);
    if (!PyLong_CheckExact(x))
      return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
    if (overflow || (want[k] != G_ANY_SIZE && v != want[k]))
      return 0;
    if (got)
      got[k] = v;
  }
  return 1;
}

/* 1 when attribute name of v is want (by identity), 0 when not, -1 on error. */
static int attr_is(PyObject *v, PyObject *name, PyObject *want)
{
  PyObject *o = PyObject_GetAttr(v, name);
  if (!o)
    return -1;
  int ok = o == want;
  Py_DECREF(o);
  return ok;
}

/* 1 when tuple attribute name of v (called, when call is set) holds the n
** ints want, 0 when not, -1 on error. */
static int attr_ints(PyObject *v, PyObject *name, int call, const int64_t *want, Py_ssize_t n, int64_t *got)
{
  PyObject *o = call ? PyObject_CallMethodNoArgs(v, name) : PyObject_GetAttr(v, name);
  if (!o)
    return -1;
  int ok = ints_equal(o, want, n, got);
  Py_DECREF(o);
  return ok;
}

/* The row-major strides of the n sizes (a size 0 or 1 counts as 1, as
** torch.empty's strides do). */
static void dense_strides(const int64_t *sizes, Py_ssize_t n, int64_t *out)
{
  int64_t s = 1;
  for (Py_ssize_t k = n - 1; k >= 0; k--) {
    out[k] = s;
    s *= sizes[k] > 1 ? sizes[k] : 1;
  }
}

/* 1 when v.stride() equals want in every dimension whose size (sizes) is
** more than 1 and whose want is not G_ANY_SIZE, 0 when not, -1 on error. */
static int strides_ok(PyObject *v, const int64_t *sizes, const int64_t *want, Py_ssize_t n)
{
  PyObject *o = PyObject_CallMethodNoArgs(v, s_stride);
  if (!o)
    return -1;
  int ok = PyTuple_Check(o) && PyTuple_GET_SIZE(o) == n;
  for (Py_ssize_t k = 0; ok && k < n; k++) {
    PyObject *x = PyTuple_GET_ITEM(o, k);
    int overflow;
    long long st = PyLong_CheckExact(x) ? PyLong_AsLongLongAndOverflow(x, &overflow) : (overflow = 1, 0);
    ok = !overflow && (sizes[k] <= 1 || want[k] == G_ANY_SIZE || st == want[k]);
  }
  Py_DECREF(o);
  return ok;
}

/* ok, a tensor check's result, with the errors of reading an object that
** is no tensor, or a tensor whose sizes cannot be read (a nested tensor's
** shape raises RuntimeError), made a failed check (0); other errors are
** real (-1). */
static int read_miss(int ok)
{
  if (ok < 0 && (PyErr_ExceptionMatches(PyExc_AttributeError) || PyErr_ExceptionMatches(PyExc_TypeError) ||
                 PyErr_ExceptionMatches(PyExc_RuntimeError))) {
    PyErr_Clear();
    ok = 0;
  }
  return ok;
}

/* 1 when tensor v matches g, 0 when not, -1 on error. Reads through the
** tensor's Python attributes (we do not link libtorch); the cheap
** identities first. */
static int tensor_ok(PyObject *v, const tn_ginst *g)
{
  int ok = attr_is(v, s_dtype, g->gi_obj);
  if (ok == 1)
    ok = attr_is(v, s_is_cpu, Py_True);
  if (ok == 1)
    ok = attr_is(v, s_requires_grad, g->gi_obj2);
  /* the sizes read, then row-major strides of them (a dynamic size), or the exact ones as held */
  int64_t small[16], *sizes = g->gi_n <= 8 ? small : PyMem_Malloc(sizeof(int64_t) * (size_t)(2 * g->gi_n));
  if (!sizes) {
    PyErr_NoMemory();
    return -1;
  }
  if (ok == 1)
    ok = attr_ints(v, s_shape, 0, g->gi_ints, g->gi_n, sizes);
  if (ok == 1 && g->gi_dense)
    dense_strides(sizes, g->gi_n, sizes + g->gi_n);
  if (ok == 1)
    ok = strides_ok(v, sizes, g->gi_dense ? sizes + g->gi_n : g->gi_ints + g->gi_n, g->gi_n);
  if (sizes != small)
    PyMem_Free(sizes);
  return read_miss(ok);
}

/* The instance dict of v (its __dict__ as object's own attribute access
** keeps it: made from inline values if need be), borrowed: v holds it.
** NULL, with no exception set, when v has none or it cannot be made. No
** Python code runs. */
static PyObject *instance_dict(PyObject *v)
{
  PyObject **p = _PyObject_GetDictPtr(v);
  if (!p) {
    PyErr_Clear();
    return NULL;
  }
  if (!*p) {
    /* no attribute set yet: an empty dict of its own, as obj.__dict__ makes */
    if (!(*p = PyDict_New()))
      PyErr_Clear();
  }
  return *p && PyDict_Check(*p) ? *p : NULL;
}

/* Field k (FUNC_*) of function f, borrowed; None where it has none (no
** defaults, no closure). */
static PyObject *function_field(PyObject *f, Py_ssize_t k)
{
  PyObject *o = k == FUNC_CODE ? PyFunction_GET_CODE(f)
    : k == FUNC_DEFAULTS ? PyFunction_GET_DEFAULTS(f)
    : k == FUNC_KWDEFAULTS ? PyFunction_GET_KW_DEFAULTS(f) : PyFunction_GET_CLOSURE(f);
  return o ? o : Py_None;
}

/* Field k (FUNC_PARTIAL_*) of functools.partial p (its exact type: no
** descriptor of a subclass runs), borrowed (p holds it: its fields are
** read-only); NULL with an exception set on error. */
static PyObject *partial_field(PyObject *p, Py_ssize_t k)
{
  PyObject *o = PyObject_GetAttr(p, s_partial_fields[k - FUNC_PARTIAL_FUNC]);
  Py_XDECREF(o);
  return o;
}

/* 1 when tensor v is marked neither conjugate nor negative (a lazy view
** such as z.conj() or its .imag, whose values are not its memory), 0 when
** it is, -1 on error. */
static int plain_ok(PyObject *v)
{
  PyObject *names[2] = {s_is_conj, s_is_neg};
  for (int k = 0; k < 2; k++) {
    PyObject *o = PyObject_CallMethodNoArgs(v, names[k]);
    if (!o)
      return -1;
    int marked = o == Py_True;
    Py_DECREF(o);
    if (marked)
      return 0;
  }
  return 1;
}

/* 1 when tensor v holds no Python attributes (x.scale = 2.0 by the
** caller) but torch's marks (torch_marks), 0 when it does, -1 on error.
** The dict is read where the object keeps it: none is made. */
static int bare_ok(PyObject *v)
{
  PyObject **dp = _PyObject_GetDictPtr(v);
  if (!dp || !*dp)
    return 1;
  PyObject *key, *val;
  Py_ssize_t pos = 0;
  while (PyDict_Next(*dp, &pos, &key, &val)) {
    int r = PySet_Contains(torch_marks, key);
    if (r != 1)
      return r;
  }
  return 1;
}

/* 1 when tensor v has g's rank and its dimensions of size more than 1
** and a stride other than 0 have strides that do not grow in the order g
** lists them (outermost first), 0 when not, -1 on error. A dimension of
** stride 0 (expanded) passes only the row-major order: eager's results
** keep such a dimension in its place (TensorIterator finds no order for
** it), which another order would not. */
static int order_ok(PyObject *v, const tn_ginst *g)
{
  int64_t small[3 * 8], *buf = g->gi_n <= 8 ? small : PyMem_Malloc(sizeof(int64_t) * (size_t)(3 * g->gi_n + 1));
  if (!buf) {
    PyErr_NoMemory();
    return -1;
  }
  int64_t *any = buf, *sizes = buf + g->gi_n, *strides = buf + 2 * g->gi_n, prev = INT64_MAX;
  int row_major = 1;
  for (Py_ssize_t k = 0; k < g->gi_n; k++) {
    any[k] = G_ANY_SIZE;
    row_major &= g->gi_ints[k] == k;
  }
  int ok = attr_ints(v, s_shape, 0, any, g->gi_n, sizes);
  if (ok == 1)
    ok = attr_ints(v, s_stride, 1, any, g->gi_n, strides);
  for (Py_ssize_t k = 0; ok == 1 && k < g->gi_n; k++) {
    int64_t d = g->gi_ints[k];
    if (sizes[d] <= 1)
      continue;
    if (strides[d] == 0) {
      ok = row_major;
      continue;
    }
    ok = strides[d] <= prev;
    prev = strides[d];
  }
  if (buf != small)
    PyMem_Free(buf);
  return read_miss(ok);
}

/* 1 when dict d (as many entries as keys) has keys in that order, 0 when
** not, -1 on error: code that iterates it sees that order. */
static int keys_in_order(PyObject *d, PyObject *keys)
{
  Py_ssize_t pos = 0;
  PyObject *at, *v;
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keys); k++) {
    if (!PyDict_Next(d, &pos, &at, &v))
      return 0;
    PyObject *key = PyTuple_GET_ITEM(keys, k);
    int same = at == key ? 1 : same_value(at, key);
    if (same <= 0)
      return same;
  }
  return 1;
}

/* 1 when dict d holds g's entries (and, if sized, no more, in g's order:
** code that iterates it sees that order), 0 when not, -1 on error. A dict
** whose version tag is unchanged since it was last found right is right. */
static int dict_ok(PyObject *d, tn_ginst *g)
{
  if (!PyDict_Check(d))
    return 0;
  _Pragma("GCC diagnostic push")
  _Pragma("GCC diagnostic ignored \"-Wdeprecated-declarations\"")
  uint64_t version = ((PyDictObject *)d)->ma_version_tag;
  _Pragma("GCC diagnostic pop")
  if (g->gi_version && version == g->gi_version)
    return 1;
  if (g->gi_sized) {
    if (PyDict_GET_SIZE(d) != g->gi_n)
      return 0;
    int r = keys_in_order(d, g->gi_obj);
    if (r <= 0)
      return r;
  }
  for (Py_ssize_t k = 0; k < g->gi_n; k++) {
    PyObject *v = PyDict_GetItemWithError(d, PyTuple_GET_ITEM(g->gi_obj, k));
    PyObject *want = PyTuple_GET_ITEM(g->gi_obj2, k);
    if (want == g_absent) { /* the key must not be there */
      if (v)
        return 0;
      if (PyErr_Occurred())
        return -1;
      continue;
    }
    if (!v)
      return PyErr_Occurred() ? -1 : 0;
    if (want == g_any) /* there, whatever it holds */
      continue;
    int r = v == want ? 1 : by_value(want) ? same_value(v, want) : 0;
    if (r <= 0)
      return r;
  }
  g->gi_version = version;
  return 1;
}

/* Size d of tensor v (a tensor guard passed on it), or -1 when it cannot
** be read (an exception set). */
static int64_t tensor_size(PyObject *v, int64_t d)
{
  PyObject *shape = PyObject_GetAttr(v, s_shape);
  int64_t n = -1;
  if (shape && PyTuple_Check(shape) && d < PyTuple_GET_SIZE(shape))
    n = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
  else if (shape)
    PyErr_SetString(PyExc_RuntimeError, "a sizes guard read a dimension its tensor does not have");
  Py_XDECREF(shape);
  return n;
}

/* Runs a "sizes" program: 1 when it leaves a value other than 0, 0 when
** it leaves 0 (a division or modulo by 0 is 0: the guard fails), -1 on
** error. Integer division and modulo are Python's (floor). */
static int sizes_ok(const tn_ginst *g, PyObject *const *slots)
{
  int64_t st[GS_STACK + 1];
  int sp = 0;
  const int64_t *p = g->gi_ints;
  for (Py_ssize_t k = 0; k < g->gi_n; k++) {
    int64_t op = p[k], a, b;
    if (op == GS_CONST) {
      st[sp++] = p[++k];
      continue;
    }
    if (op == GS_DIM) {
      int64_t v = tensor_size(slots[p[k + 1]], p[k + 2]);
      if (v < 0)
        return -1;
      st[sp++] = v;
      k += 2;
      continue;
    }
    if (op == GS_INT) { /* an int (its type guard passed) that does not fit int64 fails the guard */
      int overflow;
      long long v = PyLong_AsLongLongAndOverflow(slots[p[++k]], &overflow);
      if (v == -1 && PyErr_Occurred())
        return -1;
      if (overflow)
        return 0;
      st[sp++] = v;
      continue;
    }
    if (op == GS_TRUNCMUL) { /* Python's int(float(a) * c): past int64 (or not finite) the guard fails */
      double c, v;
      int64_t bits = p[++k];
      memcpy(&c, &bits, sizeof c);
      v = (double)st[sp - 1] * c;
      if (!(v > -9223372036854775808.0 && v < 9223372036854775808.0))
        return 0;
      st[sp - 1] = (int64_t)v;
      continue;
    }
    if (op == GS_NOT || op == GS_NEG) {
      st[sp - 1] = op == GS_NOT ? !st[sp - 1] : -st[sp - 1];
      continue;
    }
    b = st[--sp];
    a = st[sp - 1];
    switch (op) {
    case GS_ADD: a += b; break;
    case GS_MUL: a *= b; break;
    case GS_FLOORDIV:
    case GS_MOD: {
      if (b == 0)
        return 0;
      int64_t q = a / b, r = a % b;
      if (r != 0 && ((r < 0) != (b < 0))) {
        q--;
        r += b;
      }
      a = op == GS_MOD ? r : q;
      break;
    }
    case GS_EQ: a = a == b; break;
    case GS_NE: a = a != b; break;
    case GS_LT: a = a < b; break;
    case GS_LE: a = a <= b; break;
    case GS_AND: a = a && b; break;
    case GS_OR: a = a || b; break;
    case GS_MAX: a = a > b ? a : b; break;
    case GS_MIN: a = a < b ? a : b; break;
    default: assert(0);
    }
    st[sp - 1] = a;
  }
  assert(sp == 1);
  return st[0] != 0;
}

static int pointer_order(const void *a, const void *b)
{
  uintptr_t x = (uintptr_t)*(PyObject *const *)a, y = (uintptr_t)*(PyObject *const *)b;
  return (x > y) - (x < y);
}

/* 1 when the objects the slots of a "distinct" guard loaded are n
** different objects, 0 when two are one, -1 (MemoryError) when a long
** list could not be sorted. */
static int distinct_ok(const tn_ginst *g, PyObject *const *slots)
{
  enum { PAIRWISE = 32 };  /* up to this many, every pair is compared; past it, a sorted copy */
  if (g->gi_n <= PAIRWISE) {
    for (Py_ssize_t a = 1; a < g->gi_n; a++)
      for (Py_ssize_t b = 0; b < a; b++)
        if (slots[g->gi_ints[a]] == slots[g->gi_ints[b]])
          return 0;
    return 1;
  }
  PyObject **sorted = PyMem_Malloc(sizeof(PyObject *) * (size_t)g->gi_n);
  if (!sorted) {
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t k = 0; k < g->gi_n; k++)
    sorted[k] = slots[g->gi_ints[k]];
  qsort(sorted, (size_t)g->gi_n, sizeof *sorted, pointer_order);
  int r = 1;
  for (Py_ssize_t k = 1; k < g->gi_n && r; k++)
    r = sorted[k] != sorted[k - 1];
  PyMem_Free(sorted);
  return r;
}

Py_ssize_t tn_guards_check(tn_gset *gs, PyObject *const *args, Py_ssize_t nargs, PyObject **slots)
{
  for (Py_ssize_t i = 0; i < gs->gs_n; i++) {
    tn_ginst *g = &gs->gs_inst[i];
    PyObject *v = g->gi_slot >= 0 ? slots[g->gi_slot] : NULL;
    int r = 1;
    slots[i] = NULL;
    switch (g->gi_op) {
    case G_NOP:
      break;
    case G_ARG:
      r = g->gi_n < nargs && args[g->gi_n];
      slots[i] = r ? args[g->gi_n] : NULL;
      break;
    case G_ITEM:
      if (PyTuple_Check(v) && g->gi_n < PyTuple_GET_SIZE(v))
        slots[i] = PyTuple_GET_ITEM(v, g->gi_n);
      else if (PyList_Check(v) && g->gi_n < PyList_GET_SIZE(v))
        slots[i] = PyList_GET_ITEM(v, g->gi_n);
      r = slots[i] != NULL;
      break;
    case G_KEY:
      if (PyDict_Check(v)) {
        slots[i] = PyDict_GetItemWithError(v, g->gi_obj);
        r = slots[i] != NULL ? 1 : PyErr_Occurred() ? -1 : 0;
      } else {
        r = 0;
      }
      break;
    case G_CONST:
      slots[i] = g->gi_obj;
      break;
    case G_CELL:
      slots[i] = PyCell_Check(v) ? PyCell_GET(v) : NULL;
      r = slots[i] != NULL;
      break;
    case G_ATTRS:
      slots[i] = instance_dict(v);
      r = slots[i] != NULL;
      break;
    case G_FUNC:
      if (g->gi_n >= FUNC_PARTIAL_FUNC)
        slots[i] = Py_TYPE(v) == partial_type ? partial_field(v, g->gi_n) : NULL;
      else
        slots[i] = PyFunction_Check(v) ? function_field(v, g->gi_n) : NULL;
      r = slots[i] != NULL ? 1 : PyErr_Occurred() ? -1 : 0;
      break;
    case G_TYPE:
      r = (PyObject *)Py_TYPE(v) == g->gi_obj;
      break;
    case G_IS:
      r = v == g->gi_obj;
      break;
    case G_SAME:
      r = v == slots[g->gi_n];
      break;
    case G_ISWEAK: {
      PyObject *o = PyWeakref_GET_OBJECT(g->gi_obj);
      r = o != Py_None && o == v;
      break;
    }
    case G_EQ:
      r = same_value(v, g->gi_obj);
      break;
    case G_LEN:
      r = PyTuple_Check(v) ? PyTuple_GET_SIZE(v) == g->gi_n
        : PyList_Check(v) ? PyList_GET_SIZE(v) == g->gi_n
        : PyDict_Check(v) ? PyDict_GET_SIZE(v) == g->gi_n : 0;
      if (r == 1 && g->gi_obj)
        r = keys_in_order(v, g->gi_obj);
      break;
    case G_TENSOR:
      r = tensor_ok(v, g);
      break;
    case G_DICT:
      r = dict_ok(v, g);
      break;
    case G_SIZES:
      r = sizes_ok(g, slots);
      break;
    case G_PLAIN:
      r = plain_ok(v);
      break;
    case G_BARE:
      r = bare_ok(v);
      break;
    case G_ORDER:
      r = order_ok(v, g);
      break;
    case G_DISTINCT:
      r = distinct_ok(g, slots);
      break;
    case G_CALL: {
      /* the same object, or an equal one of its type: torch.initial_seed() makes a new int each time */
      PyObject *res = PyObject_CallNoArgs(g->gi_obj);
      r = !res ? -1 : res == g->gi_obj2 ? 1 : Py_TYPE(res) != Py_TYPE(g->gi_obj2) ? 0 :
          PyObject_RichCompareBool(res, g->gi_obj2, Py_EQ);
      Py_XDECREF(res);
      break;
    }
    }
    if (r < 0)
      return -2;
    if (r == 0)
      return i;
  }
  return -1;
}

/* -- Python: _C.GuardSet, for tests and the explainer -------------------------- */

typedef struct {
  PyObject_HEAD
  tn_gset *gs;
} GuardSetObject;

static void GuardSet_dealloc(PyObject *o)
{
  tn_guards_free(((GuardSetObject *)o)->gs);
  Py_TYPE(o)->tp_free(o);
}

static PyObject *GuardSet_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
  PyObject *spec;
  static char *kwlist[] = {"spec", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!:GuardSet", kwlist, &PyList_Type, &spec))
    return NULL;
  GuardSetObject *self = (GuardSetObject *)type->tp_alloc(type, 0);
  if (self && !(self->gs = tn_guards_build(spec)))
    Py_CLEAR(self);
  return (PyObject *)self;
}

/* check(args) -> -1 when every guard passes, else the index of the first that fails */
static PyObject *GuardSet_check(PyObject *o, PyObject *args)
{
  tn_gset *gs = ((GuardSetObject *)o)->gs;
  if (!PyTuple_Check(args))
    return NULL;
  PyObject **slots = PyMem_Calloc((size_t)(gs->gs_n ? gs->gs_n : 1), sizeof(PyObject *));
  if (!slots)
    return PyErr_NoMemory();
  Py_ssize_t r = tn_guards_check(gs, &PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args), slots);
  PyMem_Free(slots);
  return r == -2 ? NULL : PyLong_FromSsize_t(r);
}


static PyMethodDef GuardSet_methods[] = {
  {"check", GuardSet_check, METH_VARARGS,
   "check(*args) -> -1 when every guard passes on args, else the index of the first that fails"},
  {NULL, NULL, 0, NULL},
};

PyTypeObject tn_py_GuardSetType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "torchneuron_jit._C.GuardSet",
  .tp_basicsize = sizeof(GuardSetObject),
  .tp_dealloc = GuardSet_dealloc,
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "GuardSet(spec): a guard program (csrc/guards/guards.h) built from its spec",
  .tp_methods = GuardSet_methods,
  .tp_new = GuardSet_new,
};
