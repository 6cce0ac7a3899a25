/*
** _C.DirectRunner (tracer.h): an entry's runner that calls its compiled
** graph directly.
*/
#include "tracer_internal.h"

/* An entry's runner for the common case, in C: it calls the compiled
** plan on the entry's inputs (plan.call) and returns item `index` of its
** result, skipping the Python runner (value checks, write-backs and result
** rebuilding it has none of). A failure is the plan's to settle (csrc/
** fallback: ours runs eagerly, the user's propagates), so whatever forward
** raises propagates. Other attributes are the Python runner's. */
typedef struct {
  PyObject_HEAD
  vectorcallfunc dr_vectorcall;
  PyObject *dr_forward;
  Py_ssize_t dr_index;
  PyObject *dr_runner;
} DirectRunnerObject;

static PyObject *DirectRunner_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
  DirectRunnerObject *dr = (DirectRunnerObject *)self;
  if (!dr->dr_forward)
    return PyErr_Format(PyExc_RuntimeError, "DirectRunner: called after it was cleared");
  PyObject *res, *forward = Py_NewRef(dr->dr_forward);
  PyObject *out = PyObject_Vectorcall(forward, args, PyVectorcall_NARGS(nargsf), kwnames);
  Py_DECREF(forward);
  if (!out)
    return NULL;
  if (PyTuple_Check(out) && dr->dr_index < PyTuple_GET_SIZE(out))
    res = Py_NewRef(PyTuple_GET_ITEM(out, dr->dr_index));
  else
    res = PySequence_GetItem(out, dr->dr_index);
  Py_DECREF(out);
  return res;
}

static PyObject *DirectRunner_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
  static char *kwlist[] = {"forward", "index", "runner", NULL};
  PyObject *forward, *runner;
  Py_ssize_t index;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnO:DirectRunner", kwlist, &forward, &index, &runner))
    return NULL;
  if (!PyCallable_Check(forward) || !PyCallable_Check(runner) || index < 0) {
    PyErr_SetString(PyExc_TypeError, "DirectRunner(forward, index, runner): two callables and an index >= 0");
    return NULL;
  }
  DirectRunnerObject *dr = (DirectRunnerObject *)type->tp_alloc(type, 0);
  if (!dr)
    return NULL;
  dr->dr_vectorcall = DirectRunner_vectorcall;
  dr->dr_forward = Py_NewRef(forward);
  dr->dr_index = index;
  dr->dr_runner = Py_NewRef(runner);
  return (PyObject *)dr;
}

static int DirectRunner_traverse(PyObject *o, visitproc visit, void *arg)
{
  Py_VISIT(((DirectRunnerObject *)o)->dr_forward);
  Py_VISIT(((DirectRunnerObject *)o)->dr_runner);
  return 0;
}

static int DirectRunner_clear(PyObject *o)
{
  Py_CLEAR(((DirectRunnerObject *)o)->dr_forward);
  Py_CLEAR(((DirectRunnerObject *)o)->dr_runner);
  return 0;
}

static void DirectRunner_dealloc(PyObject *o)
{
  PyObject_GC_UnTrack(o);
  DirectRunner_clear(o);
  Py_TYPE(o)->tp_free(o);
}

/* Attributes it has not are the Python runner's (record, compiled, ...). */
static PyObject *DirectRunner_getattro(PyObject *o, PyObject *name)
{
  PyObject *r = PyObject_GenericGetAttr(o, name);
  if (!r && PyErr_ExceptionMatches(PyExc_AttributeError) && ((DirectRunnerObject *)o)->dr_runner) {
    PyErr_Clear();
    r = PyObject_GetAttr(((DirectRunnerObject *)o)->dr_runner, name);
  }
  return r;
}

static int DirectRunner_setattro(PyObject *o, PyObject *name, PyObject *value)
{
  return PyObject_SetAttr(((DirectRunnerObject *)o)->dr_runner, name, value);
}

static PyObject *DirectRunner_get_runner(PyObject *o, void *c)
{
  (void)c;
  return Py_NewRef(((DirectRunnerObject *)o)->dr_runner);
}

static PyGetSetDef DirectRunner_getset[] = {
  {"runner", DirectRunner_get_runner, NULL, "the Python runner it stands for", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject tn_py_DirectRunnerType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "torchneuron_jit._C.DirectRunner",
  .tp_basicsize = sizeof(DirectRunnerObject),
  .tp_dealloc = DirectRunner_dealloc,
  .tp_vectorcall_offset = offsetof(DirectRunnerObject, dr_vectorcall),
  .tp_call = PyVectorcall_Call,
  .tp_getattro = DirectRunner_getattro,
  .tp_setattro = DirectRunner_setattro,
  .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
  .tp_doc = "DirectRunner(forward, index, runner): an entry's runner calling its compiled graph directly",
  .tp_traverse = DirectRunner_traverse,
  .tp_clear = DirectRunner_clear,
  .tp_getset = DirectRunner_getset,
  .tp_new = DirectRunner_new,
};
