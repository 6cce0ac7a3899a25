/*
** What the Python bindings (*_py.c, module.c) share. Only these files
** include Python.h; the modules they wrap are plain C.
*/
#ifndef TN_PY_H
#define TN_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* torchneuron_jit._C.GraphError (ValueError) and CacheError (OSError);
** CacheError instances carry .code, the TN_E* value. Owned by the module. */
extern PyObject *tn_py_GraphError;
extern PyObject *tn_py_CacheError;

/* torchneuron_jit._C.NoMemory (RuntimeError): a kernel was given a tensor
** without memory (FakeTensorMode's); a plan runs that call eagerly, and
** stays compiled for real tensors. Owned by the module. */
extern PyObject *tn_py_NoMemory;

/* Adds the Graph and Sym types and the graph functions to module m. */
int tn_py_graph_init(PyObject *m);

/* Adds the Cache type to module m. */
int tn_py_cache_init(PyObject *m);

/* Adds the Kernel type to module m. */
int tn_py_kernel_init(PyObject *m);

/* Adds the Plan type (a compiled graph run by the executor) to module m. */
int tn_py_plan_init(PyObject *m);

/* Functions of each binding, appended to the module's method table. */
extern PyMethodDef tn_py_graph_methods[];
extern PyMethodDef tn_py_fuse_methods[];
extern PyMethodDef tn_py_kernel_methods[];
extern PyMethodDef tn_py_gemm_methods[];
extern PyMethodDef tn_py_tier2_methods[];

/* A new list of the n ints ids, or NULL with an exception set. */
PyObject *tn_py_ids_list(const int32_t *ids, uint32_t n);

/* The graph inside a _C.Graph, or NULL with TypeError set. */
struct tn_graph;
struct tn_graph *tn_py_graph_get(PyObject *o);

#endif /* TN_PY_H */
