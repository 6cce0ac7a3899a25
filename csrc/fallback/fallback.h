/*
** Fallback: what runs through PyTorch, and the one place that decides
** "our failure: this graph runs eagerly".
**
** Steps a plan does not lower are TN_STEP_ATEN steps: the executor calls
** the op's own callable with the plan's prebuilt operands, whatever its
** schema (lists of optional tensors, SymInts, keyword-only arguments).
**
** When a compiled graph's run fails, its eager original runs on the same
** inputs, and tn_fallback_settle decides: if eager succeeds the failure was
** ours, and the graph runs eagerly from then on (one warning naming the
** cause); if eager fails too, the error is the user's: eager's exception
** propagates, as eager would raise it, and the compiled graph stays. Both
** front doors (torch.compile's back end and jit) run their graphs through
** it.
*/
#ifndef TN_FALLBACK_H
#define TN_FALLBACK_H

#include <stdint.h>

#include "../tn_common.h"

typedef struct tn_fallback {
  int fb_eager;                /* 1: ours failed once; eager from now on */
  uint64_t fb_user_errors;     /* compiled runs that failed as eager did */
  char fb_cause[TN_ERRMSG_LEN];
} tn_fallback;

/* Where a graph's calls go: TN_FALLBACK_COMPILED or TN_FALLBACK_EAGER. */
#define TN_FALLBACK_COMPILED 0
#define TN_FALLBACK_EAGER    1
int tn_fallback_route(const tn_fallback *fb);

/* After a compiled run failed with cause (our exception, in words) and the
** eager original ran on the same inputs (eager_ok: it returned): returns 1
** when the failure was ours (the graph is eager from now on, fb_cause
** keeps the cause: warn once with it), 0 when it was the user's. */
int tn_fallback_settle(tn_fallback *fb, int eager_ok, const char *cause);

#endif /* TN_FALLBACK_H */
