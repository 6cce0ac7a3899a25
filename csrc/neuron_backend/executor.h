/*
** The executor: runs a finished plan (plan.h) on a call's inputs. It is
** plain C over opaque values: the caller's tn_exec_ops say how to call a
** step's callable, take a tuple's item, make a list, and hold and release a
** value (the Python binding does each with the CPython API; the Check
** suite with counters). The executor owns one reference per live slot and
** drops it right after the slot's last reader (the plan's liveness).
*/
#ifndef TN_EXECUTOR_H
#define TN_EXECUTOR_H

#include "plan.h"

typedef struct tn_exec_ops {
  void *eo_ctx;
  /* The value of constant i (borrowed: the caller's table holds it). */
  void *(*eo_constant)(void *ctx, uint32_t i);
  /* Calls step st's callable on args[0..nargs) (the last st_nkw by
  ** keyword, named by constant st_kwnames): a new reference, or NULL with
  ** the caller's error set. */
  void *(*eo_call)(void *ctx, const tn_step *st, void *const *args, uint32_t nargs);
  /* Item i of value v (a new reference), or NULL with the error set. */
  void *(*eo_item)(void *ctx, void *v, uint32_t i);
  /* A new list of items[0..n) (borrowed), or NULL with the error set. */
  void *(*eo_list)(void *ctx, void *const *items, uint32_t n);
  void (*eo_hold)(void *ctx, void *v);
  void (*eo_release)(void *ctx, void *v);
} tn_exec_ops;

/* Runs plan p: inputs[0..num_inputs) are borrowed; on TN_OK, outputs[0..
** num_outputs) hold new references. On failure every reference the run
** took is released, outputs hold nothing, *failed_step (may be NULL) is
** the step that failed (its error is the caller's, set by the op that
** failed) and the result is TN_ECOMPILE (a step failed), TN_ENOMEM or
** TN_EINVAL (an unfinished plan). Any thread; runs may overlap. */
int tn_exec_run(const tn_plan *p, const tn_exec_ops *ops, void *const *inputs, void **outputs,
                uint32_t *failed_step);

#endif /* TN_EXECUTOR_H */
