/*
** The Python side of tier 2 (tier2.h): compiling a tier-2 source with the
** GIL released, the ISA kernels are compiled for, and the hook kernels
** call when they are due for tier 2 (kernel_internal.h). The policy (when,
** where, cached how) is torchneuron_jit/_tier2.py's.
*/
#include "../tn_py.h"

#include <stdlib.h>

#include "kernel_internal.h"
#include "runtime.h"
#include "tier2.h"

PyObject *tn_py_tier2_hook;

static PyObject *py_tier2_compile(PyObject *self, PyObject *args)
{
  (void)self;
  const char *cc, *src;
  PyObject *flags_arg, *fast = NULL, *res = NULL;
  const char *flags[40];
  uint8_t *so = NULL;
  size_t len = 0;
  char err[1024];
  int rc, idle = 0;
  if (!PyArg_ParseTuple(args, "sOs|p:tier2_compile", &cc, &flags_arg, &src, &idle))
    return NULL;
  if (!(fast = PySequence_Fast(flags_arg, "flags must be a sequence of str")))
    return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  if (n > 32) {
    PyErr_SetString(PyExc_ValueError, "at most 32 compiler flags");
    goto done;
  }
  for (Py_ssize_t i = 0; i < n; i++)
    if (!(flags[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i))))
      goto done;
  /* the strings stay alive in fast (and src, cc in args) while the compiler runs */
  Py_BEGIN_ALLOW_THREADS
  rc = tn_tier2_compile(cc, flags, (size_t)n, src, idle, &so, &len, err, sizeof err);
  Py_END_ALLOW_THREADS
  if (rc != TN_OK) {
    if (rc == TN_ENOMEM)
      PyErr_NoMemory();
    else
      PyErr_Format(PyExc_RuntimeError, "%s", err);
    goto done;
  }
  res = PyBytes_FromStringAndSize((const char *)so, (Py_ssize_t)len);
done:
  free(so);
  Py_XDECREF(fast);
  return res;
}

static PyObject *py_tier2_version(PyObject *self, PyObject *arg)
{
  (void)self;
  const char *cc = PyUnicode_AsUTF8(arg);
  char line[512], err[512];
  int rc;
  if (!cc)
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = tn_tier2_version(cc, line, sizeof line, err, sizeof err);
  Py_END_ALLOW_THREADS
  if (rc != TN_OK)
    return PyErr_Format(PyExc_RuntimeError, "%s", err);
  return PyUnicode_FromString(line);
}

static PyObject *py_cpu_isa(PyObject *self, PyObject *unused)
{
  (void)self;
  (void)unused;
  int isa = tn_rt_isa();
  return PyUnicode_FromString(isa == TN_RT_ISA_AVX512 ? "avx512" : isa == TN_RT_ISA_AVX2 ? "avx2" : "default");
}

static PyObject *py_set_tier2_hook(PyObject *self, PyObject *fn)
{
  (void)self;
  if (fn != Py_None && !PyCallable_Check(fn))
    return PyErr_Format(PyExc_TypeError, "the tier-2 hook must be callable or None, not %T", fn);
  Py_XSETREF(tn_py_tier2_hook, Py_NewRef(fn));
  Py_RETURN_NONE;
}

PyMethodDef tn_py_tier2_methods[] = {
  {"tier2_compile", py_tier2_compile, METH_VARARGS,
   "tier2_compile(cc, flags, source, idle=False) -> bytes: the shared object cc makes of source (GIL released "
   "while it runs; idle: the compiler in the idle scheduling class); RuntimeError with the compiler's first "
   "messages when it fails."},
  {"tier2_version", py_tier2_version, METH_O,
   "tier2_version(cc) -> the first line `cc --version` prints (GIL released; a spawn, not a fork); RuntimeError "
   "when it cannot run or fails."},
  {"cpu_isa", py_cpu_isa, METH_NOARGS,
   "The vector ISA kernels use: 'avx512', 'avx2' or 'default' (the CPU's widest, narrowed to config.cpu_isa)."},
  {"set_tier2_hook", py_set_tier2_hook, METH_O,
   "set_tier2_hook(fn): fn(kernel) is called when a kernel with a tier 2 has been launched "
   "config.tier2_after_calls times (None: never)."},
  {NULL, NULL, 0, NULL},
};
