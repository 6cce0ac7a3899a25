/*
** The compiled-graph plan: what a compiled graph does, as data the executor
** (executor.h) runs. A plan has a buffer table of slots, the graph's inputs
** first (slots 0 .. ninputs-1), then one slot per step, written by that
** step; a list of steps; and the graph's outputs. A step calls one callable
** of the plan's constant table (a generated kernel, an ATen op through
** PyTorch, another call of ours: csrc/fallback runs the ATen ones) on
** operands, or takes one item of an earlier step's tuple result. Operands
** are slots, constants, or lists of those (a cat's parts, index's indices).
**
** The plan owns no values: constants are indices into a table its user
** keeps (the Python binding holds the objects), so this module is plain C.
** tn_plan_finish computes liveness: each slot is released right after the
** last step that reads it, so intermediates die as early as in eager.
**
** Builder calls that fail poison the plan (TN_EPOISONED afterwards) and
** keep their message (tn_plan_errmsg). A finished plan is read-only and
** may be run from any thread at once.
*/
#ifndef TN_PLAN_H
#define TN_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "../tn_common.h"

#define TN_PLAN_MAX_ARGS 64       /* operands of one step (a list counts once) */
#define TN_PLAN_MAX_LIST 4096     /* elements of one list operand */
#define TN_PLAN_MAX_SLOTS (1u << 20)

/* Step kinds: what the callable is (the executor calls them all alike;
** reports and the binding's fast paths go by kind). */
#define TN_STEP_KERNEL 0  /* a generated kernel */
#define TN_STEP_ATEN   1  /* an ATen op run through PyTorch (csrc/fallback) */
#define TN_STEP_CALL   2  /* another callable (oneDNN's linear, a cat's finish, size arithmetic) */
#define TN_STEP_ITEM   3  /* item st_item of the tuple in operand 0's slot */
#define TN_STEP__COUNT 4

/* Operand kinds. */
#define TN_OPND_SLOT  0  /* the value in slot od_index */
#define TN_OPND_CONST 1  /* constant od_index */
#define TN_OPND_LIST  2  /* a list of od_len operands (slots or constants) from od_index in the pool */

typedef struct tn_operand {
  uint32_t od_kind;
  uint32_t od_index;
  uint32_t od_len;
} tn_operand;

typedef struct tn_step {
  int st_kind;
  uint32_t st_callable;     /* constant index (not ITEM) */
  uint32_t st_item;         /* ITEM: the tuple index */
  uint32_t st_first;        /* first operand in the pool */
  uint32_t st_nargs;        /* operands, keyword ones last */
  uint32_t st_nkw;          /* how many of them go by keyword */
  uint32_t st_kwnames;      /* constant index of the keywords' names (when st_nkw) */
  uint32_t st_out;          /* the slot it writes: ninputs + its index */
  uint32_t st_rel_first;    /* slots to release after it (tn_plan_finish) */
  uint32_t st_nrel;
} tn_step;

typedef struct tn_plan tn_plan;

/* A plan for a graph of ninputs inputs whose constant table holds nconsts
** entries (indices the operands may name). TN_EINVAL, TN_ENOMEM. */
int tn_plan_new(uint32_t ninputs, uint32_t nconsts, tn_plan **out);

/* Frees p (NULL is fine). */
void tn_plan_free(tn_plan *p);

/* The message of the error that poisoned p, or "". */
const char *tn_plan_errmsg(const tn_plan *p);

/* Appends a step of kind calling constant `callable` (ignored for ITEM)
** on args[0..nargs), the last nkw by keyword, their names in constant
** kwnames; `item` is ITEM's tuple index. list_items holds the elements of
** the LIST operands, each LIST's od_index counting from 0 into it. Slots
** named must exist already (an input or an earlier step's); an ITEM's
** operand is one slot. The step's slot goes to *out_slot. TN_EINVAL
** (names the step and the fault), TN_EPOISONED, TN_ENOMEM. */
int tn_plan_add_step(tn_plan *p, int kind, uint32_t callable, uint32_t item,
                     const tn_operand *args, uint32_t nargs, uint32_t nkw, uint32_t kwnames,
                     const tn_operand *list_items, uint32_t nlist_items, uint32_t *out_slot);

/* Sets the outputs: slots or constants (no lists), a slot may repeat.
** Then computes liveness; the plan is read-only afterwards. TN_EINVAL,
** TN_EPOISONED, TN_ENOMEM. */
int tn_plan_finish(tn_plan *p, const tn_operand *outs, uint32_t nouts);

/* -- Accessors (a finished plan; any thread) ----------------------------- */

uint32_t tn_plan_num_inputs(const tn_plan *p);
uint32_t tn_plan_num_slots(const tn_plan *p);
uint32_t tn_plan_num_steps(const tn_plan *p);
uint32_t tn_plan_num_consts(const tn_plan *p);
uint32_t tn_plan_num_outputs(const tn_plan *p);
int tn_plan_finished(const tn_plan *p);
const tn_step *tn_plan_step(const tn_plan *p, uint32_t i);
const tn_operand *tn_plan_operand(const tn_plan *p, uint32_t i);  /* the pool: steps' operands, then lists' */
const tn_operand *tn_plan_output(const tn_plan *p, uint32_t i);
const uint32_t *tn_plan_releases(const tn_plan *p, const tn_step *st); /* st_nrel slots */
/* Most slots alive at once while the plan runs (inputs and outputs included). */
uint32_t tn_plan_peak_live(const tn_plan *p);

/* -- Binary form ------------------------------------------------------------
** What the cache stores: the plan's structure, versioned, without its
** constant table (the user encodes that) or liveness (recomputed). All
** integers little-endian u32:
**   "TNPL" version flags ninputs nconsts nsteps nouts
**   step*:    kind callable item nargs nkw kwnames nlist, operand[nargs], element[nlist]
**   operand:  kind index len (a LIST's index counts into its step's elements)
**   element, output: kind index */
#define TN_PLAN_FORMAT_VERSION 1

/* The binary form of finished plan p, with the caller's flags (kept, not
** read): *buf (malloc'd, the caller frees it) of *len bytes. TN_EINVAL
** (not finished), TN_ENOMEM. */
int tn_plan_encode(const tn_plan *p, uint32_t flags, uint8_t **buf, size_t *len);

/* A finished plan from tn_plan_encode's bytes for a constant table of
** nconsts entries, every step checked as tn_plan_add_step checks it and
** liveness recomputed; the flags go to *flags. Errors (message in err):
** TN_ETRUNC, TN_ECORRUPT (bad magic, counts, trailing bytes, another
** table size), TN_EVERSION, TN_EINVAL (a step the builder rejects),
** TN_ENOMEM. Never reads past len. */
int tn_plan_decode(const uint8_t *buf, size_t len, uint32_t nconsts, tn_plan **out, uint32_t *flags,
                   char *err, size_t errlen);

/* Name of a step kind ("kernel", "aten", "call", "item"). */
const char *tn_plan_kind_name(int kind);

/* Readable listing, one line per step: "%7 = aten c3(%2, c4) ; frees %2".
** *text is NUL-terminated and valid until the next dump or free. */
int tn_plan_dump(tn_plan *p, const char **text);

#endif /* TN_PLAN_H */
