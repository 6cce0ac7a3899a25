/*
** Guard sets: the facts a traced entry depends on, as a flat program of
** loads and checks evaluated in C against a frame's arguments.
**
** A program is built once from a spec (a list of tuples, written by
** torchneuron_jit/_jit.py) and run on every call. Each instruction either
** loads a value into its own slot (an argument, an item of a list or tuple
** slot, a dict entry, a constant the set holds) or checks a slot. Loads are
** borrowed references, valid while the arguments are: nothing here runs
** Python code that could free them, except the equality of two primitive
** values. Evaluation stops at the first instruction that fails and returns
** its index, which _jit.py turns into words ("x: size[1] 128 -> 130").
**
** Instructions, as spec tuples:
**   ("arg", i)                     load argument i (frame local i)
**   ("item", s, i)                 load item i of slot s; fails unless s is a list or tuple longer than i
**   ("key", s, key)                load s[key]; fails unless s is a dict holding key
**   ("const", obj)                 load obj (held by the set)
**   ("cell", s)                    load the contents of cell slot s; fails when empty
**   ("attrs", s)                   load the instance dict of slot s (its __dict__);
**                                  fails when it has none
**   ("func", s, field)             load field "code", "defaults", "kwdefaults" or
**                                  "closure" of Python function slot s (None where
**                                  it has none); fails unless s is a function;
**                                  "partial_func", "partial_args" or
**                                  "partial_keywords": the func, args or keywords
**                                  of slot s, a functools.partial (exactly)
**   ("type", s, type)              Py_TYPE(slot s) is type, exactly
**   ("is", s, obj)                 slot s is obj
**   ("same", s, t)                 slot s is the object slot t loaded (the
**                                  same tensor passed as two arguments)
**   ("isweak", s, ref)             slot s is the object weak reference ref
**                                  points to (a module: the set does not keep
**                                  it alive, and is dead once it is gone)
**   ("eq", s, value)               slot s has value's type and equals it
**   ("len", s, n)                  slot s (a list, tuple or dict) has n items
**   ("tensor", s, dtype, sizes, strides, requires_grad)
**                                  slot s is a CPU tensor of that dtype, sizes
**                                  and strides (tuples of ints) and requires_grad;
**                                  a size None passes any size (a dynamic
**                                  dimension), and strides None are the
**                                  row-major strides of the tensor's sizes
**                                  (a slice of a fixed buffer keeps its strides
**                                  as its sizes change); a stride None passes
**                                  any stride (an input the variant copies
**                                  dense before its graph runs); the stride
**                                  of a dimension of size 0 or 1 is not compared
**                                  (no element is read through it: x[:, :L]
**                                  .contiguous() of a batch of one keeps it)
**   ("dict", s, keys, values, sized)
**                                  dict slot s maps each key to its value (compared
**                                  by identity, or equality for primitives) and, when
**                                  sized, holds nothing else; a value that is
**                                  tn_guard_absent (_C.GUARD_ABSENT) means the key is
**                                  not there (a builtin the code reads that no global
**                                  shadows); one that is tn_guard_any (_C.GUARD_ANY)
**                                  means the key is there, with any value (a module's
**                                  attribute no code of the trace names). The dict's
**                                  version tag is remembered on
**                                  success, so a dict nobody wrote since is checked in
**                                  O(1).
**   ("call", fn, result)           fn() is result, or equals it with its type (torch.is_grad_enabled,
**                                  torch.get_num_threads)
**   ("distinct", (s, t, ...))      the slots hold different objects (argument
**                                  objects a call sets attributes on: one
**                                  passed twice reads what the other set)
**   ("order", s, dims)             tensor slot s, of len(dims) dimensions, has
**                                  strides that do not grow along dims (outermost
**                                  first) in each dimension of size more than 1
**                                  and stride other than 0 (one of stride 0 passes
**                                  only the row-major order): the layout order of a
**                                  tensor the variant copies dense (a slice of a
**                                  row-major buffer, a transpose), as eager's
**                                  results follow it
**   ("nop",)                       nothing (a guard relaxed after it was made: what a
**                                  module's attribute no code of the trace names holds);
**                                  it loads no slot, and no instruction may read it
**   ("plain", s)                   tensor slot s is marked neither conjugate nor
**                                  negative (z.conj(), z.conj().imag: lazy views
**                                  whose values are not their memory)
**   ("bare", s)                    tensor slot s holds no Python attributes
**                                  (x.scale = 2.0, which the code may read) but
**                                  torch's marks (_spec.TORCH_MARKS)
**   ("sizes", prog)                a relation of dynamic sizes holds (s1 >= 2,
**                                  s1 == s2): prog is a postfix program over
**                                  int64 (a tuple of ints), each item an
**                                  opcode: 0 CONST c, 1 DIM s d (size d of
**                                  the tensor an earlier tensor guard checks
**                                  at slot s), then 2 ADD, 3 MUL, 4 FLOORDIV,
**                                  5 MOD (floor, as Python's; by 0 fails),
**                                  6 EQ, 7 NE, 8 LT, 9 LE, 10 AND, 11 OR,
**                                  12 NOT, 13 MAX, 14 MIN, 15 NEG, 16 INT s
**                                  (the int at slot s, which an earlier
**                                  ("type", s, int) guard checks; one that
**                                  does not fit int64 fails the guard), 17
**                                  TRUNCMUL c (c: a double's bits as int64;
**                                  the value becomes Python's int(float(v) *
**                                  c), as a scale factor makes a size; past
**                                  int64 the guard fails); it
**                                  passes when it leaves a value other than 0
*/
#ifndef TN_GUARDS_H
#define TN_GUARDS_H

#include "../tn_py.h"

typedef struct tn_gset tn_gset;

/* Builds a guard set from spec (a list of tuples, above). On error returns
** NULL with ValueError (naming the instruction) or MemoryError set. */
tn_gset *tn_guards_build(PyObject *spec);

/* The marker of a dict guard's value for "key absent": an object of its
** own, made once (the tracer module exposes it as _C.GUARD_ABSENT). NULL
** with an exception set when it cannot be made. Borrowed. */
PyObject *tn_guard_absent(void);

/* The marker of a dict guard's value for "key present, any value", made
** as tn_guard_absent's (_C.GUARD_ANY). Borrowed. */
PyObject *tn_guard_any(void);

/* Sets the types (a tuple of types, kept) whose values a "dict" guard
** compares by type and value, as exact ints, floats and strings, rather
** than by identity: numpy's scalars (_spec.NUMPY_SCALARS), a new object
** of which a notebook's cell makes each time it runs. 0, or -1 with
** TypeError set. */
int tn_guards_set_value_types(PyObject *types);

/* Drops one hold of gs (its owner's, or a tn_guards_hold's); the last
** frees gs and the references it holds. NULL is fine. With the GIL. */
void tn_guards_free(tn_gset *gs);

/* One hold more of gs, which a tn_guards_free drops: a check that may run
** Python (a G_CALL guard, an __eq__) holds its guard set, which another
** thread may replace meanwhile. With the GIL. */
void tn_guards_hold(tn_gset *gs);

/* Runs gs on the nargs arguments args (borrowed). Returns -1 when every
** check passes, with slots (tn_guards_nslots(gs) entries) holding the
** loaded values, borrowed; otherwise the index of the first instruction
** that fails. -2 with an exception set when a comparison raised. */
Py_ssize_t tn_guards_check(tn_gset *gs, PyObject *const *args, Py_ssize_t nargs, PyObject **slots);

/* Visits every object gs holds (for its owner's tp_traverse). */
int tn_guards_traverse(tn_gset *gs, visitproc visit, void *arg);

/* 1 when an "isweak" guard of gs lost its object: gs can never pass. */
int tn_guards_dead(const tn_gset *gs);

/* Number of instructions (and slots) of gs. */
Py_ssize_t tn_guards_nslots(const tn_gset *gs);

#endif /* TN_GUARDS_H */
