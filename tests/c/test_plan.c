/*
** Check suite of the compiled-graph plan (plan.h), the executor
** (executor.h) and the fallback decision (fallback.h): builder validation,
** liveness, a run over counted mock values, every reference released after
** a failing step, lists, the binary form (round trip, damage refused), and
** whose failure a failing run was.
*/
#include <stdlib.h>
#include <string.h>

#include "fallback/fallback.h"
#include "neuron_backend/executor.h"
#include "neuron_backend/plan.h"
#include "tn_check.h"

/* -- Mock values: counted boxes of a number ---------------------------------- */

typedef struct box {
  int bx_refs;
  double bx_val;
  int bx_list;           /* a list: its items */
  struct box *bx_items[8];
  uint32_t bx_nitems;
} box;

#define MAX_BOXES 256
typedef struct mock {
  box mk_boxes[MAX_BOXES];
  int mk_nboxes;
  box mk_consts[8];
  int mk_fail_at;        /* the call number that fails, or -1 */
  int mk_calls;
  int mk_refs_at_last[4]; /* chain(): refs of x, y, %2 and the pair when its last step runs */
} mock;

static box *mk_new(mock *m, double v)
{
  ck_assert_int_lt(m->mk_nboxes, MAX_BOXES);
  box *b = &m->mk_boxes[m->mk_nboxes++];
  memset(b, 0, sizeof *b);
  b->bx_refs = 1;
  b->bx_val = v;
  return b;
}

static void *m_constant(void *ctx, uint32_t i)
{
  return &((mock *)ctx)->mk_consts[i];
}

/* Callable constant 0 adds its arguments (a list's items too), 1 negates
** its argument, 2 makes a pair (x, 2x). */
static void *m_call(void *ctx, const tn_step *st, void *const *args, uint32_t nargs)
{
  mock *m = ctx;
  if (m->mk_calls++ == m->mk_fail_at)
    return NULL;
  if (m->mk_calls == 4 && m->mk_nboxes >= 6)  /* chain()'s last step: boxes x, y, %2, %3, pair, ... */
    for (int i = 0; i < 4; i++)
      m->mk_refs_at_last[i] = m->mk_boxes[i == 3 ? 4 : i].bx_refs;
  double v = 0;
  for (uint32_t i = 0; i < nargs; i++) {
    box *b = args[i];
    ck_assert_int_gt(b->bx_refs, 0);  /* nothing it reads was released */
    if (b->bx_list)
      for (uint32_t e = 0; e < b->bx_nitems; e++)
        v += b->bx_items[e]->bx_val;
    else
      v += b->bx_val;
  }
  if (st->st_callable == 1)
    return mk_new(m, -v);
  if (st->st_callable == 2) {
    box *pair = mk_new(m, 0);
    pair->bx_list = 1;
    pair->bx_items[0] = mk_new(m, v);
    pair->bx_items[1] = mk_new(m, 2 * v);
    pair->bx_nitems = 2;
    return pair;
  }
  return mk_new(m, v);
}

static void m_hold(void *ctx, void *v)
{
  (void)ctx;
  ((box *)v)->bx_refs++;
}

static void m_release(void *ctx, void *v)
{
  box *b = v;
  (void)ctx;
  ck_assert_int_gt(b->bx_refs, 0);
  if (--b->bx_refs == 0 && b->bx_list)
    for (uint32_t e = 0; e < b->bx_nitems; e++)
      m_release(ctx, b->bx_items[e]);
}

static void *m_item(void *ctx, void *v, uint32_t i)
{
  box *b = v;
  ck_assert(b->bx_list && i < b->bx_nitems);
  m_hold(ctx, b->bx_items[i]);
  return b->bx_items[i];
}

static void *m_list(void *ctx, void *const *items, uint32_t n)
{
  mock *m = ctx;
  box *l = mk_new(m, 0);
  l->bx_list = 1;
  for (uint32_t e = 0; e < n; e++) {
    l->bx_items[e] = items[e];
    m_hold(ctx, items[e]);
  }
  l->bx_nitems = n;
  return l;
}

static tn_exec_ops mock_ops(mock *m)
{
  tn_exec_ops ops = {m, m_constant, m_call, m_item, m_list, m_hold, m_release};
  return ops;
}

static tn_operand S(uint32_t i) { tn_operand o = {TN_OPND_SLOT, i, 0}; return o; }
static tn_operand C(uint32_t i) { tn_operand o = {TN_OPND_CONST, i, 0}; return o; }

/* inputs x (0), y (1); %2 = x + y; %3 = -%2; %4 = pair(%3); %5 = %4[1];
** %6 = %5 + x + const 3 (10.0); returns (%6, %3) */
static tn_plan *chain(void)
{
  tn_plan *p;
  uint32_t s;
  ck_assert_int_eq(tn_plan_new(2, 4, &p), TN_OK);
  tn_operand a[3] = {S(0), S(1)};
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_KERNEL, 0, 0, a, 2, 0, 0, NULL, 0, &s), TN_OK);
  ck_assert_uint_eq(s, 2);
  a[0] = S(2);
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_ATEN, 1, 0, a, 1, 0, 0, NULL, 0, &s), TN_OK);
  a[0] = S(3);
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_CALL, 2, 0, a, 1, 0, 0, NULL, 0, &s), TN_OK);
  a[0] = S(4);
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_ITEM, 0, 1, a, 1, 0, 0, NULL, 0, &s), TN_OK);
  a[0] = S(5), a[1] = S(0), a[2] = C(3);
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_ATEN, 0, 0, a, 3, 0, 0, NULL, 0, &s), TN_OK);
  tn_operand outs[2] = {S(6), S(3)};
  ck_assert_int_eq(tn_plan_finish(p, outs, 2), TN_OK);
  return p;
}

/* -- Builder ------------------------------------------------------------------- */

START_TEST(test_builder_rejects_and_poisons)
{
  tn_plan *p;
  uint32_t s;
  ck_assert_int_eq(tn_plan_new(1, 2, &p), TN_OK);
  tn_operand later[1] = {S(1)};
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_ATEN, 0, 0, later, 1, 0, 0, NULL, 0, &s), TN_EINVAL);
  ck_assert_ptr_nonnull(strstr(tn_plan_errmsg(p), "slot %1 is not written before it"));
  tn_operand fine[1] = {S(0)};
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_ATEN, 0, 0, fine, 1, 0, 0, NULL, 0, &s), TN_EPOISONED);
  tn_plan_free(p);

  ck_assert_int_eq(tn_plan_new(1, 2, &p), TN_OK);
  tn_operand konst[1] = {C(2)};
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_ATEN, 0, 0, konst, 1, 0, 0, NULL, 0, &s), TN_EINVAL);
  ck_assert_ptr_nonnull(strstr(tn_plan_errmsg(p), "constant 2 is not in the table of 2"));
  tn_plan_free(p);

  ck_assert_int_eq(tn_plan_new(1, 2, &p), TN_OK);
  tn_operand lst[1] = {{TN_OPND_LIST, 0, 2}};
  tn_operand nested[2] = {S(0), {TN_OPND_LIST, 0, 1}};
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_ATEN, 0, 0, lst, 1, 0, 0, nested, 2, &s), TN_EINVAL);
  ck_assert_ptr_nonnull(strstr(tn_plan_errmsg(p), "a list inside a list"));
  tn_plan_free(p);

  ck_assert_int_eq(tn_plan_new(1, 2, &p), TN_OK);
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_ITEM, 0, 0, konst, 1, 0, 0, NULL, 0, &s), TN_EINVAL);
  tn_plan_free(p);

  ck_assert_int_eq(tn_plan_new(1, 2, &p), TN_OK);
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_ATEN, 0, 0, fine, 1, 1, 5, NULL, 0, &s), TN_EINVAL);  /* kwnames */
  tn_plan_free(p);

  /* an unfinished plan does not run */
  ck_assert_int_eq(tn_plan_new(1, 2, &p), TN_OK);
  mock m = {.mk_fail_at = -1};
  tn_exec_ops ops = mock_ops(&m);
  void *in[1] = {mk_new(&m, 1)}, *out[1];
  ck_assert_int_eq(tn_exec_run(p, &ops, in, out, NULL), TN_EINVAL);
  tn_plan_free(p);
}
END_TEST

START_TEST(test_liveness)
{
  tn_plan *p = chain();
  const char *text;
  /* %2 dies after %3 is made; %4 (the pair) after its item; x after the last step; y after the first */
  const tn_step *st0 = tn_plan_step(p, 0), *st2 = tn_plan_step(p, 2), *st3 = tn_plan_step(p, 3);
  ck_assert_uint_eq(st0->st_nrel, 1);
  ck_assert_uint_eq(tn_plan_releases(p, st0)[0], 1);
  ck_assert_uint_eq(st2->st_nrel, 0);  /* %3 is an output */
  ck_assert_uint_eq(st3->st_nrel, 1);
  ck_assert_uint_eq(tn_plan_releases(p, st3)[0], 4);
  ck_assert_uint_le(tn_plan_peak_live(p), 5);
  ck_assert_int_eq(tn_plan_dump(p, &text), TN_OK);
  ck_assert_ptr_nonnull(strstr(text, "%5 = %4[1] ; frees %4"));
  ck_assert_ptr_nonnull(strstr(text, "%2 = kernel c0(%0, %1) ; frees %1"));
  ck_assert_ptr_nonnull(strstr(text, "return (%6, %3)"));
  /* finished: no more steps */
  uint32_t s;
  tn_operand a[1] = {S(0)};
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_ATEN, 0, 0, a, 1, 0, 0, NULL, 0, &s), TN_EINVAL);
  tn_plan_free(p);
}
END_TEST

/* -- Executor ----------------------------------------------------------------- */

START_TEST(test_run_releases_all_but_the_outputs)
{
  tn_plan *p = chain();
  mock m = {.mk_fail_at = -1};
  m.mk_consts[3].bx_val = 10.0;
  m.mk_consts[3].bx_refs = 1;
  tn_exec_ops ops = mock_ops(&m);
  box *x = mk_new(&m, 1.5), *y = mk_new(&m, 2.5);
  void *in[2] = {x, y}, *out[2];
  uint32_t failed = 99;
  ck_assert_int_eq(tn_exec_run(p, &ops, in, out, &failed), TN_OK);
  ck_assert_uint_eq(failed, 99);
  /* %2 = 4, %3 = -4, pair (-4, -8), %5 = -8, %6 = -8 + 1.5 + 10 */
  ck_assert_double_eq(((box *)out[0])->bx_val, 3.5);
  ck_assert_double_eq(((box *)out[1])->bx_val, -4.0);
  ck_assert_int_eq(((box *)out[0])->bx_refs, 1);
  ck_assert_int_eq(((box *)out[1])->bx_refs, 1);
  ck_assert_int_eq(x->bx_refs, 1);
  ck_assert_int_eq(y->bx_refs, 1);
  ck_assert_int_eq(m.mk_consts[3].bx_refs, 1);  /* borrowed */
  /* released early, as the plan's liveness says: y after the first step, %2 after the second,
  ** the pair after its item; x, read by the last step, is still held */
  ck_assert_int_eq(m.mk_refs_at_last[0], 2);
  ck_assert_int_eq(m.mk_refs_at_last[1], 1);
  ck_assert_int_eq(m.mk_refs_at_last[2], 0);
  ck_assert_int_eq(m.mk_refs_at_last[3], 0);
  for (int i = 0; i < m.mk_nboxes; i++) {
    box *b = &m.mk_boxes[i];
    if (b != x && b != y && b != out[0] && b != out[1])
      ck_assert_msg(b->bx_refs == 0, "box %d still has %d references", i, b->bx_refs);
  }
  tn_plan_free(p);
}
END_TEST

START_TEST(test_failing_step_releases_everything)
{
  for (int at = 0; at < 4; at++) {  /* each call fails in turn */
    tn_plan *p = chain();
    mock m = {.mk_fail_at = at};
    m.mk_consts[3].bx_refs = 1;
    tn_exec_ops ops = mock_ops(&m);
    box *x = mk_new(&m, 1), *y = mk_new(&m, 2);
    void *in[2] = {x, y}, *out[2] = {NULL, NULL};
    uint32_t failed = 99;
    ck_assert_int_eq(tn_exec_run(p, &ops, in, out, &failed), TN_ECOMPILE);
    /* calls 0, 1, 2 are steps 0, 1, 2; call 3 is step 4 (step 3 is an item) */
    ck_assert_uint_eq(failed, at < 3 ? (uint32_t)at : 4u);
    ck_assert_ptr_null(out[0]);
    ck_assert_int_eq(x->bx_refs, 1);
    ck_assert_int_eq(y->bx_refs, 1);
    for (int i = 2; i < m.mk_nboxes; i++)
      ck_assert_msg(m.mk_boxes[i].bx_refs == 0, "fail at %d: box %d still has %d references", at, i,
                    m.mk_boxes[i].bx_refs);
    tn_plan_free(p);
  }
}
END_TEST

START_TEST(test_list_operands_and_keywords)
{
  /* %1 = add([x, c0, x], kw=x): a list made for the call and dropped after it */
  tn_plan *p;
  uint32_t s;
  ck_assert_int_eq(tn_plan_new(1, 3, &p), TN_OK);
  tn_operand elems[3] = {S(0), C(0), S(0)};
  tn_operand args[2] = {{TN_OPND_LIST, 0, 3}, S(0)};
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_ATEN, 2, 0, args, 2, 1, 1, elems, 3, &s), TN_OK);
  tn_operand item[1] = {S(1)};
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_ITEM, 0, 0, item, 1, 0, 0, NULL, 0, &s), TN_OK);
  tn_operand outs[2] = {S(2), C(0)};
  ck_assert_int_eq(tn_plan_finish(p, outs, 2), TN_OK);
  const char *text;
  ck_assert_int_eq(tn_plan_dump(p, &text), TN_OK);
  ck_assert_ptr_nonnull(strstr(text, "aten c2([%0, c0, %0], kw0=%0)"));
  mock m = {.mk_fail_at = -1};
  m.mk_consts[0].bx_val = 100;
  m.mk_consts[0].bx_refs = 1;
  tn_exec_ops ops = mock_ops(&m);
  box *x = mk_new(&m, 1);
  void *in[1] = {x}, *out[2];
  ck_assert_int_eq(tn_exec_run(p, &ops, in, out, NULL), TN_OK);
  ck_assert_double_eq(((box *)out[0])->bx_val, 103);  /* 1 + 100 + 1 + the keyword's 1 */
  ck_assert_ptr_eq(out[1], &m.mk_consts[0]);
  ck_assert_int_eq(m.mk_consts[0].bx_refs, 2);  /* an output: a new reference */
  ck_assert_int_eq(x->bx_refs, 1);
  m_release(&m, out[0]);
  m_release(&m, out[1]);
  for (int i = 1; i < m.mk_nboxes; i++)
    ck_assert_int_eq(m.mk_boxes[i].bx_refs, 0);
  tn_plan_free(p);
}
END_TEST

/* -- Binary form --------------------------------------------------------------- */

/* A plan with a list operand, keywords and an item: chain() plus a step
** %7 = c1([%6, c0, %3], kw0=%6). */
static tn_plan *listed(void)
{
  tn_plan *p;
  uint32_t s;
  ck_assert_int_eq(tn_plan_new(2, 4, &p), TN_OK);
  tn_operand a[3] = {S(0), S(1)};
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_KERNEL, 0, 0, a, 2, 0, 0, NULL, 0, &s), TN_OK);
  a[0] = S(2);
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_CALL, 2, 0, a, 1, 0, 0, NULL, 0, &s), TN_OK);
  a[0] = S(3);
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_ITEM, 0, 1, a, 1, 0, 0, NULL, 0, &s), TN_OK);
  tn_operand elems[3] = {S(4), C(0), S(2)};
  tn_operand args[2] = {{TN_OPND_LIST, 0, 3}, S(4)};
  ck_assert_int_eq(tn_plan_add_step(p, TN_STEP_ATEN, 1, 0, args, 2, 1, 3, elems, 3, &s), TN_OK);
  tn_operand outs[2] = {S(5), C(2)};
  ck_assert_int_eq(tn_plan_finish(p, outs, 2), TN_OK);
  return p;
}

START_TEST(test_binary_form_round_trip)
{
  tn_plan *p = listed(), *q = NULL;
  uint8_t *buf;
  size_t len;
  uint32_t flags = 0;
  char err[200];
  const char *text;
  ck_assert_int_eq(tn_plan_encode(p, 5, &buf, &len), TN_OK);
  ck_assert_int_eq(tn_plan_decode(buf, len, 4, &q, &flags, err, sizeof err), TN_OK);
  ck_assert_uint_eq(flags, 5);
  ck_assert_int_eq(tn_plan_dump(p, &text), TN_OK);
  char *want = strdup(text);
  ck_assert_int_eq(tn_plan_dump(q, &text), TN_OK);
  ck_assert_str_eq(text, want);  /* steps, operands, lists, keywords, outputs and releases alike */
  ck_assert_ptr_nonnull(strstr(text, "aten c1([%4, c0, %2], kw0=%4)"));
  ck_assert_uint_eq(tn_plan_peak_live(q), tn_plan_peak_live(p));
  /* and it runs as the original does */
  mock m = {.mk_fail_at = -1};
  tn_exec_ops ops = mock_ops(&m);
  box *x = mk_new(&m, 1), *y = mk_new(&m, 2);
  void *in[2] = {x, y}, *out[2];
  ck_assert_int_eq(tn_exec_run(q, &ops, in, out, NULL), TN_OK);
  m_release(&m, out[0]);
  m_release(&m, out[1]);
  ck_assert_int_eq(x->bx_refs, 1);
  ck_assert_int_eq(y->bx_refs, 1);
  /* an unfinished plan has no binary form */
  tn_plan *u;
  ck_assert_int_eq(tn_plan_new(1, 1, &u), TN_OK);
  uint8_t *none;
  size_t nlen;
  ck_assert_int_eq(tn_plan_encode(u, 0, &none, &nlen), TN_EINVAL);
  tn_plan_free(u);
  free(want);
  free(buf);
  tn_plan_free(p);
  tn_plan_free(q);
}
END_TEST

START_TEST(test_binary_form_rejects_damage)
{
  tn_plan *p = chain(), *q;
  uint8_t *buf;
  size_t len;
  uint32_t flags;
  char err[200];
  ck_assert_int_eq(tn_plan_encode(p, 0, &buf, &len), TN_OK);
  /* every truncation fails cleanly */
  for (size_t n = 0; n < len; n++) {
    int rc = tn_plan_decode(buf, n, 4, &q, &flags, err, sizeof err);
    ck_assert_msg(rc == TN_ETRUNC || rc == TN_ECORRUPT, "%zu bytes: %d", n, rc);
    ck_assert_ptr_null(q);
    ck_assert_str_ne(err, "");
  }
  /* a trailing byte, another table size, another version, another magic */
  uint8_t *longer = malloc(len + 1);
  memcpy(longer, buf, len);
  longer[len] = 0;
  ck_assert_int_eq(tn_plan_decode(longer, len + 1, 4, &q, &flags, err, sizeof err), TN_ECORRUPT);
  ck_assert_int_eq(tn_plan_decode(buf, len, 3, &q, &flags, err, sizeof err), TN_ECORRUPT);
  buf[4]++;
  ck_assert_int_eq(tn_plan_decode(buf, len, 4, &q, &flags, err, sizeof err), TN_EVERSION);
  buf[4]--;
  buf[0] = 'X';
  ck_assert_int_eq(tn_plan_decode(buf, len, 4, &q, &flags, err, sizeof err), TN_ECORRUPT);
  buf[0] = 'T';
  /* a slot read before it is written (step 0 reading %5): the builder's check names it */
  ck_assert_int_eq(buf[28 + 28], TN_OPND_SLOT);
  buf[28 + 28 + 4] = 5;
  ck_assert_int_eq(tn_plan_decode(buf, len, 4, &q, &flags, err, sizeof err), TN_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "step 0 operand 0: slot %5 is not written before it"));
  /* any byte changed: decoded or refused, never read out of bounds (the sanitizer build checks) */
  buf[28 + 28 + 4] = 0;
  for (size_t i = 0; i < len; i++)
    for (int bit = 0; bit < 8; bit++) {
      buf[i] ^= (uint8_t)(1 << bit);
      int rc = tn_plan_decode(buf, len, 4, &q, &flags, err, sizeof err);
      ck_assert(rc == TN_OK ? q != NULL : q == NULL);
      tn_plan_free(q);
      buf[i] ^= (uint8_t)(1 << bit);
    }
  free(longer);
  free(buf);
  tn_plan_free(p);
}
END_TEST

/* -- Fallback ------------------------------------------------------------------ */

START_TEST(test_fallback_settles_whose_failure)
{
  tn_fallback fb;
  memset(&fb, 0, sizeof fb);
  ck_assert_int_eq(tn_fallback_route(&fb), TN_FALLBACK_COMPILED);
  ck_assert_int_eq(tn_fallback_settle(&fb, 0, "TypeError: shapes"), 0);  /* eager failed too: the user's */
  ck_assert_int_eq(tn_fallback_route(&fb), TN_FALLBACK_COMPILED);
  ck_assert_uint_eq(fb.fb_user_errors, 1);
  ck_assert_int_eq(tn_fallback_settle(&fb, 1, "RuntimeError: kernel exploded"), 1);  /* eager ran: ours */
  ck_assert_int_eq(tn_fallback_route(&fb), TN_FALLBACK_EAGER);
  ck_assert_str_eq(fb.fb_cause, "RuntimeError: kernel exploded");
}
END_TEST

int main(void)
{
  Suite *s = suite_create("plan");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_builder_rejects_and_poisons);
  tcase_add_test(tc, test_liveness);
  tcase_add_test(tc, test_run_releases_all_but_the_outputs);
  tcase_add_test(tc, test_failing_step_releases_everything);
  tcase_add_test(tc, test_list_operands_and_keywords);
  tcase_add_test(tc, test_binary_form_round_trip);
  tcase_add_test(tc, test_binary_form_rejects_damage);
  tcase_add_test(tc, test_fallback_settles_whose_failure);
  suite_add_tcase(s, tc);
  return tn_check_run(s);
}
