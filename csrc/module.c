/*
** torchneuron_jit._C: module init, the tunables table and libtcc set-up.
*/
#include "tn_py.h"
#include "tracer/tracer.h"

#include <string.h>

#include "neuron_backend/tcc.h"
#include "tn_common.h"
#include "tn_config.h"
#include "tn_stats.h"

PyObject *tn_py_GraphError;
PyObject *tn_py_NoMemory;
PyObject *tn_py_CacheError;

/* -- Config ---------------------------------------------------------------- */

static int config_lookup(PyObject *name)
{
  const char *s = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
  int id = s ? tn_config_find(s) : -1;
  if (id < 0 && !PyErr_Occurred())
    PyErr_Format(PyExc_AttributeError, "torchneuron_jit.config has no setting %R", name);
  return id;
}

static PyObject *config_value(int id)
{
  switch (tn_config_type(id)) {
  case TN_CFG_BOOL: return PyBool_FromLong((long)tn_config_int(id));
  case TN_CFG_STR: return PyUnicode_FromString(tn_config_str(id));
  case TN_CFG_CHOICE: {
    char name[64];
    return PyUnicode_FromString(tn_config_choice(id, tn_config_int(id), name, sizeof name) ? name : "");
  }
  default: return PyLong_FromLongLong((long long)tn_config_int(id));
  }
}

static PyObject *py_config_get(PyObject *self, PyObject *name)
{
  (void)self;
  int id = config_lookup(name);
  return id < 0 ? NULL : config_value(id);
}

static PyObject *py_config_set(PyObject *self, PyObject *args)
{
  PyObject *name, *value;
  char err[TN_ERRMSG_LEN];
  int rc;
  (void)self;
  if (!PyArg_ParseTuple(args, "OO:config_set", &name, &value))
    return NULL;
  int id = config_lookup(name);
  if (id < 0)
    return NULL;
  int type = tn_config_type(id);
  if (type == TN_CFG_CHOICE && PyBool_Check(value)) { /* a choice of on|off|...: True is on, False off */
    rc = tn_config_set_text(id, value == Py_True ? "on" : "off", err, sizeof err);
  } else if (type == TN_CFG_STR || type == TN_CFG_CHOICE) {
    if (!PyUnicode_Check(value))
      return PyErr_Format(PyExc_TypeError, "config %s: expected str, got %s",
                          tn_config_name(id), Py_TYPE(value)->tp_name);
    const char *s = PyUnicode_AsUTF8(value);
    if (!s)
      return NULL;
    rc = tn_config_set_text(id, s, err, sizeof err);
  } else if (PyUnicode_Check(value)) {
    const char *s = PyUnicode_AsUTF8(value);
    if (!s)
      return NULL;
    rc = tn_config_set_text(id, s, err, sizeof err);
  } else if (PyLong_Check(value)) {
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow)
      return PyErr_Format(PyExc_OverflowError, "config %s: value out of range", tn_config_name(id));
    if (v == -1 && PyErr_Occurred())
      return NULL;
    rc = tn_config_set_int(id, v, err, sizeof err);
  } else {
    return PyErr_Format(PyExc_TypeError, "config %s: expected %s, got %s", tn_config_name(id),
                        type == TN_CFG_BOOL ? "bool" : "int", Py_TYPE(value)->tp_name);
  }
  if (rc == TN_ENOMEM)
    return PyErr_NoMemory();
  if (rc != TN_OK) {
    PyErr_SetString(PyExc_ValueError, err);
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyObject *py_config_table(PyObject *self, PyObject *unused)
{
  static const char *const types[] = {"bool", "int", "bytes", "str", "choice"};
  char def[128];
  (void)self;
  (void)unused;
  PyObject *list = PyList_New(0);
  for (int id = 0; list && id < TN_CFG__COUNT; id++) {
    tn_config_default_text(id, def, sizeof def);
    PyObject *row = Py_BuildValue("(ssss)", tn_config_name(id), types[tn_config_type(id)],
                                  def, tn_config_doc(id));
    if (!row || PyList_Append(list, row) < 0)
      Py_CLEAR(list);
    Py_XDECREF(row);
  }
  return list;
}

static PyObject *py_config_reset(PyObject *self, PyObject *unused)
{
  (void)self;
  (void)unused;
  tn_config_init();
  PyObject *errors = PyList_New(0);
  const char *e;
  for (int i = 0; errors && (e = tn_config_env_error(i)) != NULL; i++) {
    PyObject *s = PyUnicode_FromString(e);
    if (!s || PyList_Append(errors, s) < 0)
      Py_CLEAR(errors);
    Py_XDECREF(s);
  }
  return errors;
}

/* -- libtcc ---------------------------------------------------------------- */

static PyObject *py_tcc_init(PyObject *self, PyObject *args)
{
  const char *libdir;
  char err[TN_ERRMSG_LEN * 2];
  int rc;
  (void)self;
  if (!PyArg_ParseTuple(args, "s:tcc_init", &libdir))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = tn_tcc_init(libdir, err, sizeof err);
  Py_END_ALLOW_THREADS
  if (rc != TN_OK) {
    PyErr_SetString(PyExc_RuntimeError, err);
    return NULL;
  }
  Py_RETURN_NONE;
}

/* Compiles src, calls its `double f(double)` and `unsigned long long g(double)`
** on x; proves the unit links libtcc1.a (g needs __fixunsdfdi). Test aid. */
static PyObject *py_tcc_selftest(PyObject *self, PyObject *args)
{
  const char *src;
  double x;
  char err[TN_ERRMSG_LEN * 2];
  tn_tcc_unit *u = NULL;
  int rc;
  (void)self;
  if (!PyArg_ParseTuple(args, "sd:tcc_selftest", &src, &x))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = tn_tcc_compile(src, NULL, 0, &u, err, sizeof err);
  Py_END_ALLOW_THREADS
  if (rc != TN_OK) {
    PyErr_SetString(PyExc_RuntimeError, err);
    return NULL;
  }
  double (*f)(double) = (double (*)(double))tn_tcc_get(u, "f");
  unsigned long long (*g)(double) = (unsigned long long (*)(double))tn_tcc_get(u, "g");
  PyObject *res = NULL;
  if (!f || !g)
    PyErr_SetString(PyExc_RuntimeError, "unit lacks f or g");
  else
    res = Py_BuildValue("(dK)", f(x), g(x));
  tn_tcc_free(u);
  return res;
}

/* -- Counters ------------------------------------------------------------- */

static PyObject *py_stats(PyObject *self, PyObject *unused)
{
  (void)self;
  (void)unused;
  PyObject *d = PyDict_New();
  for (int i = 0; d && i < TN_STAT__COUNT; i++) {
    PyObject *v = PyLong_FromUnsignedLongLong(tn_stat_get(i));
    if (!v || PyDict_SetItemString(d, tn_stat_name(i), v) < 0)
      Py_CLEAR(d);
    Py_XDECREF(v);
  }
  return d;
}

static PyObject *py_stat_add(PyObject *self, PyObject *args)
{
  const char *name;
  unsigned long long n = 1;
  (void)self;
  if (!PyArg_ParseTuple(args, "s|K:stat_add", &name, &n))
    return NULL;
  for (int i = 0; i < TN_STAT__COUNT; i++)
    if (strcmp(tn_stat_name(i), name) == 0) {
      tn_stat_add(i, n);
      Py_RETURN_NONE;
    }
  return PyErr_Format(PyExc_KeyError, "no counter %s", name);
}

static PyObject *py_stats_reset(PyObject *self, PyObject *unused)
{
  (void)self;
  (void)unused;
  tn_stats_reset();
  Py_RETURN_NONE;
}

static PyObject *py_strerror(PyObject *self, PyObject *arg)
{
  (void)self;
  long rc = PyLong_AsLong(arg);
  if (rc == -1 && PyErr_Occurred())
    return NULL;
  return PyUnicode_FromString(tn_strerror((int)rc));
}

/* -- Module ---------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
  {"config_get", py_config_get, METH_O, "config_get(name) -> value of a tunable."},
  {"config_set", py_config_set, METH_VARARGS, "config_set(name, value): set a tunable (int, bool or text)."},
  {"config_table", py_config_table, METH_NOARGS, "[(name, type, default, doc)] of every tunable."},
  {"config_reset", py_config_reset, METH_NOARGS,
   "Reset tunables to defaults and TORCHNEURON_* variables; returns the variables that did not parse."},
  {"tcc_init", py_tcc_init, METH_VARARGS, "tcc_init(libdir): locate libtcc1.a and run the warm-up compile."},
  {"tcc_selftest", py_tcc_selftest, METH_VARARGS, "tcc_selftest(src, x) -> (f(x), g(x)); test aid."},
  {"strerror", py_strerror, METH_O, "strerror(code) -> text of a TN_E* code."},
  {"stats", py_stats, METH_NOARGS, "Process-wide counters (csrc/tn_stats.h) as a dict."},
  {"stat_add", py_stat_add, METH_VARARGS, "stat_add(name, n=1): bump a counter."},
  {"stats_reset", py_stats_reset, METH_NOARGS, "Set every counter to 0."},
  {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
  PyModuleDef_HEAD_INIT, "torchneuron_jit._C",
  "C core of torchneuron_jit: graph IR, compile cache, libtcc.", -1, module_methods,
  NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__C(void)
{
  PyObject *m = PyModule_Create(&module_def);
  if (!m)
    return NULL;
  tn_config_init();
  tn_py_GraphError = PyErr_NewExceptionWithDoc(
      "torchneuron_jit._C.GraphError", "A graph the builder or decoder rejected.", PyExc_ValueError, NULL);
  tn_py_CacheError = PyErr_NewExceptionWithDoc(
      "torchneuron_jit._C.CacheError", "A failure of the persistent cache; .code is the TN_E* value.",
      PyExc_OSError, NULL);
  tn_py_NoMemory = PyErr_NewExceptionWithDoc(
      "torchneuron_jit._C.NoMemory", "A kernel was given a tensor without memory (a fake tensor).",
      PyExc_RuntimeError, NULL);
  if (!tn_py_GraphError || !tn_py_CacheError || !tn_py_NoMemory ||
      PyModule_AddObjectRef(m, "GraphError", tn_py_GraphError) < 0 ||
      PyModule_AddObjectRef(m, "NoMemory", tn_py_NoMemory) < 0 ||
      PyModule_AddObjectRef(m, "CacheError", tn_py_CacheError) < 0 ||
      PyModule_AddFunctions(m, tn_py_graph_methods) < 0 ||
      PyModule_AddFunctions(m, tn_py_fuse_methods) < 0 ||
      PyModule_AddFunctions(m, tn_py_kernel_methods) < 0 ||
      PyModule_AddFunctions(m, tn_py_gemm_methods) < 0 ||
      PyModule_AddFunctions(m, tn_py_tier2_methods) < 0 ||
      PyModule_AddFunctions(m, tn_py_tracer_methods) < 0 ||
      PyModule_AddFunctions(m, tn_py_yield_methods) < 0 ||
      tn_py_graph_init(m) < 0 || tn_py_cache_init(m) < 0 || tn_py_kernel_init(m) < 0 || tn_py_plan_init(m) < 0 ||
      tn_py_tracer_init(m) < 0)
    goto error;
#define TN_ERR_CONST(name, num, text) \
  if (PyModule_AddIntConstant(m, #name + 3, num) < 0) goto error;
  TN_ERRORS(TN_ERR_CONST)
#undef TN_ERR_CONST
  return m;
error:
  Py_DECREF(m);
  return NULL;
}
