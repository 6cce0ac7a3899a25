/*
** The tracer's module functions and init (tracer.h); the frame hook, the
** registry and the types are in hook_py.c, entries_py.c,
** jitfunction_py.c and runner_py.c (tracer_internal.h).
*/
#include "tracer_internal.h"

/* -- Module functions ------------------------------------------------------------ */

static PyObject *code_of(PyObject *arg)
{
  if (PyCode_Check(arg))
    return arg;
  if (PyFunction_Check(arg))
    return PyFunction_GET_CODE(arg);
  PyErr_Format(PyExc_TypeError, "expected a function or code object, not %s", Py_TYPE(arg)->tp_name);
  return NULL;
}

/* jit_disable(fn_or_code, on=True): never trace it (torchneuron_jit.disable) */
static PyObject *py_jit_disable(PyObject *self, PyObject *args)
{
  PyObject *arg;
  int on = 1;
  (void)self;
  if (!PyArg_ParseTuple(args, "O|p:jit_disable", &arg, &on))
    return NULL;
  PyObject *code = code_of(arg);
  tn_codestate *cs = code ? tn_codestate_get(code, 1) : NULL;
  if (!cs)
    return NULL;
  cs->cs_disabled = on;
  Py_RETURN_NONE;
}

/* jit_disabled(fn_or_code) -> whether jit_disable marked it */
static PyObject *py_jit_disabled(PyObject *self, PyObject *arg)
{
  (void)self;
  PyObject *code = code_of(arg);
  if (!code)
    return NULL;
  tn_codestate *cs = tn_codestate_get(code, 0);
  if (!cs && PyErr_Occurred())
    return NULL;
  return PyBool_FromLong(cs && cs->cs_disabled);
}

/* jit_tracing() -> whether this thread is tracing a jit call */
static PyObject *py_jit_tracing(PyObject *self, PyObject *unused)
{
  (void)self;
  (void)unused;
  return PyBool_FromLong(tn_hook_tracing > 0);
}

/* run_untraced(fn, *args) -> fn(*args), with jitted functions run as plain
** Python while it runs, as during a trace (a symbolic retrace of a traced
** call must not reach their entries with fake tensors) */
static PyObject *py_run_untraced(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
  (void)self;
  if (nargs < 1) {
    PyErr_SetString(PyExc_TypeError, "run_untraced needs a callable");
    return NULL;
  }
  tn_hook_tracing++;
  PyObject *res = PyObject_Vectorcall(args[0], args + 1, (size_t)(nargs - 1), NULL);
  tn_hook_tracing--;
  return res;
}

/* class_dict(type) -> the dict behind type.__dict__ (a mappingproxy), for
** a guard to snapshot: only read, never written */
static PyObject *py_class_dict(PyObject *self, PyObject *arg)
{
  (void)self;
  if (!PyType_Check(arg) || !((PyTypeObject *)arg)->tp_dict) {
    PyErr_Format(PyExc_TypeError, "class_dict needs a ready type, not %s", Py_TYPE(arg)->tp_name);
    return NULL;
  }
  return Py_NewRef(((PyTypeObject *)arg)->tp_dict);
}

static PyObject *py_guard_value_types(PyObject *self, PyObject *arg)
{
  (void)self;
  if (tn_guards_set_value_types(arg) < 0)
    return NULL;
  Py_RETURN_NONE;
}

PyMethodDef tn_py_tracer_methods[] = {
  {"guard_value_types", py_guard_value_types, METH_O,
   "guard_value_types(types): the types a dict guard compares by value (numpy's scalars), besides int, float, str"},
  {"class_dict", py_class_dict, METH_O, "class_dict(type) -> the dict behind type.__dict__, for a guard to snapshot"},
  {"jit_disable", py_jit_disable, METH_VARARGS, "jit_disable(fn_or_code, on=True): never trace it"},
  {"jit_disabled", py_jit_disabled, METH_O, "jit_disabled(fn_or_code) -> whether jit_disable marked it"},
  {"run_untraced", (PyCFunction)(void (*)(void))py_run_untraced, METH_FASTCALL,
   "run_untraced(fn, *args) -> fn(*args), with jitted functions run as plain Python meanwhile"},
  {"jit_tracing", py_jit_tracing, METH_NOARGS, "whether this thread is tracing a jit call"},
  {"build_fork_wanted", tn_py_build_fork_wanted, METH_O,
   "build_fork_wanted(on): the next outermost jitted call, on any thread, calls tracer.fork_build() first"},
  {NULL, NULL, 0, NULL},
};

extern PyTypeObject tn_py_GuardSetType;

int tn_py_tracer_init(PyObject *m)
{
  if (tn_codestate_init() < 0)
    return -1;
  if (PyType_Ready(&tn_py_JitFunctionType) < 0 || PyType_Ready(&tn_py_GuardSetType) < 0 ||
      PyType_Ready(&tn_py_ItemRunnerType) < 0)
    return -1;
  if (!(tn_hook_side_exit = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type)))
    return -1;
  if (PyModule_AddObjectRef(m, "JitFunction", (PyObject *)&tn_py_JitFunctionType) < 0 ||
      PyModule_AddObjectRef(m, "GuardSet", (PyObject *)&tn_py_GuardSetType) < 0 ||
      PyModule_AddObjectRef(m, "ItemRunner", (PyObject *)&tn_py_ItemRunnerType) < 0 ||
      PyModule_AddObjectRef(m, "SIDE_EXIT", tn_hook_side_exit) < 0 || !tn_guard_absent() ||
      PyModule_AddObjectRef(m, "GUARD_ABSENT", tn_guard_absent()) < 0 || !tn_guard_any() ||
      PyModule_AddObjectRef(m, "GUARD_ANY", tn_guard_any()) < 0 ||
      PyModule_AddIntConstant(m, "JIT_SUPPORTED", TN_JIT_SUPPORTED) < 0)
    return -1;
  return 0;
}

