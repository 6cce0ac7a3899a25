/*
** The executor (executor.h): one loop over a plan's steps.
*/
#include "executor.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* Slots on the stack up to this many; a larger plan allocates its table. */
#define EXEC_STACK_SLOTS 256

/* The value of operand o, borrowed (a slot's or a constant's); lists are
** made by the caller. */
static void *operand_value(const tn_exec_ops *ops, void **slots, const tn_operand *o)
{
  if (o->od_kind == TN_OPND_SLOT) {
    assert(slots[o->od_index]);  /* written before, not yet released (the plan's liveness) */
    return slots[o->od_index];
  }
  assert(o->od_kind == TN_OPND_CONST);
  return ops->eo_constant(ops->eo_ctx, o->od_index);
}

/* Runs step st, storing its result in its slot. TN_OK or TN_ECOMPILE. */
static int run_step(const tn_plan *p, const tn_exec_ops *ops, void **slots, const tn_step *st)
{
  void *args[TN_PLAN_MAX_ARGS];
  uint32_t made = 0;  /* lists made for this call: args[] entries to release */
  uint32_t made_at[TN_PLAN_MAX_ARGS];
  void *out = NULL;
  int rc = TN_OK;

  if (st->st_kind == TN_STEP_ITEM) {
    void *tuple = operand_value(ops, slots, tn_plan_operand(p, st->st_first));
    out = ops->eo_item(ops->eo_ctx, tuple, st->st_item);
  } else {
    for (uint32_t i = 0; i < st->st_nargs && rc == TN_OK; i++) {
      const tn_operand *o = tn_plan_operand(p, st->st_first + i);
      if (o->od_kind != TN_OPND_LIST) {
        args[i] = operand_value(ops, slots, o);
        continue;
      }
      void *items_stack[64], **items = o->od_len <= 64 ? items_stack : malloc(o->od_len * sizeof *items);
      if (!items) {
        rc = TN_ENOMEM;
        break;
      }
      for (uint32_t e = 0; e < o->od_len; e++)
        items[e] = operand_value(ops, slots, tn_plan_operand(p, o->od_index + e));
      args[i] = ops->eo_list(ops->eo_ctx, items, o->od_len);
      if (items != items_stack)
        free(items);
      if (!args[i])
        rc = TN_ECOMPILE;
      else
        made_at[made++] = i;
    }
    if (rc == TN_OK)
      out = ops->eo_call(ops->eo_ctx, st, args, st->st_nargs);
    for (uint32_t m = 0; m < made; m++)
      ops->eo_release(ops->eo_ctx, args[made_at[m]]);
  }
  if (rc == TN_OK && !out)
    rc = TN_ECOMPILE;
  if (rc != TN_OK)
    return rc;
  slots[st->st_out] = out;
  const uint32_t *rel = tn_plan_releases(p, st);
  for (uint32_t r = 0; r < st->st_nrel; r++) {
    assert(slots[rel[r]]);
    ops->eo_release(ops->eo_ctx, slots[rel[r]]);
    slots[rel[r]] = NULL;
  }
  return TN_OK;
}

int tn_exec_run(const tn_plan *p, const tn_exec_ops *ops, void *const *inputs, void **outputs,
                uint32_t *failed_step)
{
  void *stack[EXEC_STACK_SLOTS];
  uint32_t nslots = tn_plan_num_slots(p), nin = tn_plan_num_inputs(p), nout = tn_plan_num_outputs(p);
  void **slots = stack;
  uint32_t k = 0;
  int rc = TN_OK;

  if (!tn_plan_finished(p))
    return TN_EINVAL;
  if (nslots > EXEC_STACK_SLOTS && !(slots = calloc(nslots, sizeof *slots)))
    return TN_ENOMEM;
  if (slots == stack)
    memset(stack, 0, sizeof stack);
  for (uint32_t i = 0; i < nin; i++) {
    ops->eo_hold(ops->eo_ctx, inputs[i]);
    slots[i] = inputs[i];
  }
  for (; k < tn_plan_num_steps(p) && rc == TN_OK; k++)
    rc = run_step(p, ops, slots, tn_plan_step(p, k));
  for (uint32_t i = 0; rc == TN_OK && i < nout; i++) {
    const tn_operand *o = tn_plan_output(p, i);
    outputs[i] = operand_value(ops, slots, o);
    ops->eo_hold(ops->eo_ctx, outputs[i]);
  }
  if (rc != TN_OK && failed_step)
    *failed_step = k - 1;
  for (uint32_t s = 0; s < nslots; s++)  /* the outputs' slots, and everything a failure left */
    if (slots[s])
      ops->eo_release(ops->eo_ctx, slots[s]);
  if (slots != stack)
    free(slots);
  return rc;
}
