/*
** The compiled-graph plan (plan.h): builder, liveness, listing.
*/
#include "plan.h"

#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tn_plan {
  uint32_t pl_ninputs;
  uint32_t pl_nconsts;
  uint32_t pl_nslots;       /* ninputs + steps */
  tn_step *pl_steps;
  uint32_t pl_nsteps, pl_capsteps;
  tn_operand *pl_pool;      /* every step's operands and list elements */
  uint32_t pl_npool, pl_cappool;
  tn_operand *pl_outs;
  uint32_t pl_nouts;
  uint32_t *pl_rel;         /* release lists of the steps, in step order */
  uint32_t pl_peak;
  int pl_finished;
  int pl_rc;                /* the error that poisoned it, or TN_OK */
  char pl_err[TN_ERRMSG_LEN];
  char *pl_dump;
};

/* -- Errors ------------------------------------------------------------- */

static int plan_fail(tn_plan *p, int rc, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->pl_err, sizeof p->pl_err, fmt, ap);
  va_end(ap);
  p->pl_rc = rc;
  return rc;
}

const char *tn_plan_errmsg(const tn_plan *p)
{
  return p->pl_rc == TN_OK ? "" : p->pl_err;
}

static int grow(void **buf, uint32_t *cap, uint32_t need, size_t elem)
{
  if (need <= *cap)
    return TN_OK;
  uint32_t n = *cap ? *cap : 16;
  while (n < need)
    n *= 2;
  void *b = realloc(*buf, (size_t)n * elem);
  if (!b)
    return TN_ENOMEM;
  *buf = b;
  *cap = n;
  return TN_OK;
}

/* -- Lifetime ----------------------------------------------------------- */

int tn_plan_new(uint32_t ninputs, uint32_t nconsts, tn_plan **out)
{
  *out = NULL;
  if (ninputs > TN_PLAN_MAX_SLOTS)
    return TN_EINVAL;
  tn_plan *p = calloc(1, sizeof *p);
  if (!p)
    return TN_ENOMEM;
  p->pl_ninputs = ninputs;
  p->pl_nslots = ninputs;
  p->pl_nconsts = nconsts;
  *out = p;
  return TN_OK;
}

void tn_plan_free(tn_plan *p)
{
  if (!p)
    return;
  free(p->pl_steps);
  free(p->pl_pool);
  free(p->pl_outs);
  free(p->pl_rel);
  free(p->pl_dump);
  free(p);
}

/* -- Builder ------------------------------------------------------------ */

/* Whether operand o (a slot or constant: in_list; else any kind) names
** something that exists; msg says what does not. */
static int operand_ok(const tn_plan *p, const tn_operand *o, int in_list, uint32_t nlist, char *msg, size_t len)
{
  switch (o->od_kind) {
  case TN_OPND_SLOT:
    if (o->od_index >= p->pl_nslots) {
      snprintf(msg, len, "slot %%%" PRIu32 " is not written before it", o->od_index);
      return 0;
    }
    return 1;
  case TN_OPND_CONST:
    if (o->od_index >= p->pl_nconsts) {
      snprintf(msg, len, "constant %" PRIu32 " is not in the table of %" PRIu32, o->od_index, p->pl_nconsts);
      return 0;
    }
    return 1;
  case TN_OPND_LIST:
    if (in_list) {
      snprintf(msg, len, "a list inside a list");
      return 0;
    }
    if (o->od_len > TN_PLAN_MAX_LIST || o->od_index > nlist || o->od_len > nlist - o->od_index) {
      snprintf(msg, len, "list of %" PRIu32 " elements from %" PRIu32 " runs past the %" PRIu32 " given",
               o->od_len, o->od_index, nlist);
      return 0;
    }
    return 1;
  default:
    snprintf(msg, len, "unknown operand kind %" PRIu32, o->od_kind);
    return 0;
  }
}

int tn_plan_add_step(tn_plan *p, int kind, uint32_t callable, uint32_t item,
                     const tn_operand *args, uint32_t nargs, uint32_t nkw, uint32_t kwnames,
                     const tn_operand *list_items, uint32_t nlist_items, uint32_t *out_slot)
{
  char msg[200];
  uint32_t id = p->pl_nsteps;
  int rc = p->pl_rc != TN_OK ? TN_EPOISONED : TN_OK;

  if (rc != TN_OK)
    return rc;
  if (p->pl_finished)
    return plan_fail(p, TN_EINVAL, "step %" PRIu32 ": the plan is finished", id);
  if (kind < 0 || kind >= TN_STEP__COUNT)
    return plan_fail(p, TN_EINVAL, "step %" PRIu32 ": unknown kind %d", id, kind);
  if (nargs > TN_PLAN_MAX_ARGS || nkw > nargs || (nargs && !args) || (nlist_items && !list_items))
    return plan_fail(p, TN_EINVAL, "step %" PRIu32 ": bad operand counts (%" PRIu32 ", %" PRIu32 " by keyword)",
                     id, nargs, nkw);
  if (p->pl_nslots >= TN_PLAN_MAX_SLOTS)
    return plan_fail(p, TN_EINVAL, "step %" PRIu32 ": too many slots", id);
  if (kind == TN_STEP_ITEM) {
    if (nargs != 1 || nkw || args[0].od_kind != TN_OPND_SLOT)
      return plan_fail(p, TN_EINVAL, "step %" PRIu32 " (item): takes one slot", id);
  } else if (callable >= p->pl_nconsts || (nkw && kwnames >= p->pl_nconsts)) {
    return plan_fail(p, TN_EINVAL, "step %" PRIu32 ": callable or keyword names not in the constant table", id);
  }
  for (uint32_t i = 0; i < nargs; i++)
    if (!operand_ok(p, &args[i], 0, nlist_items, msg, sizeof msg))
      return plan_fail(p, TN_EINVAL, "step %" PRIu32 " operand %" PRIu32 ": %s", id, i, msg);
  for (uint32_t i = 0; i < nlist_items; i++)
    if (!operand_ok(p, &list_items[i], 1, 0, msg, sizeof msg))
      return plan_fail(p, TN_EINVAL, "step %" PRIu32 " list element %" PRIu32 ": %s", id, i, msg);

  uint64_t need = (uint64_t)p->pl_npool + nargs + nlist_items;
  if (need > UINT32_MAX / 2)
    return plan_fail(p, TN_EINVAL, "step %" PRIu32 ": too many operands", id);
  if (grow((void **)&p->pl_steps, &p->pl_capsteps, id + 1, sizeof *p->pl_steps) != TN_OK ||
      grow((void **)&p->pl_pool, &p->pl_cappool, (uint32_t)need, sizeof *p->pl_pool) != TN_OK)
    return plan_fail(p, TN_ENOMEM, "step %" PRIu32 ": out of memory", id);
  uint32_t first = p->pl_npool, lists = first + nargs;
  for (uint32_t i = 0; i < nargs; i++) {
    tn_operand o = args[i];
    if (o.od_kind == TN_OPND_LIST)
      o.od_index += lists;  /* into the pool */
    p->pl_pool[first + i] = o;
  }
  if (nlist_items)
    memcpy(&p->pl_pool[lists], list_items, (size_t)nlist_items * sizeof *list_items);
  p->pl_npool = (uint32_t)need;
  tn_step *st = &p->pl_steps[id];
  memset(st, 0, sizeof *st);
  st->st_kind = kind;
  st->st_callable = kind == TN_STEP_ITEM ? 0 : callable;
  st->st_item = kind == TN_STEP_ITEM ? item : 0;
  st->st_first = first;
  st->st_nargs = nargs;
  st->st_nkw = nkw;
  st->st_kwnames = nkw ? kwnames : 0;
  st->st_out = p->pl_nslots++;
  p->pl_nsteps++;
  *out_slot = st->st_out;
  return TN_OK;
}

/* Calls f(slot, arg) for each slot step st reads (list elements included). */
static void each_read(const tn_plan *p, const tn_step *st, void (*f)(uint32_t, void *), void *arg)
{
  for (uint32_t i = 0; i < st->st_nargs; i++) {
    const tn_operand *o = &p->pl_pool[st->st_first + i];
    if (o->od_kind == TN_OPND_SLOT)
      f(o->od_index, arg);
    for (uint32_t e = 0; o->od_kind == TN_OPND_LIST && e < o->od_len; e++)
      if (p->pl_pool[o->od_index + e].od_kind == TN_OPND_SLOT)
        f(p->pl_pool[o->od_index + e].od_index, arg);
  }
}

typedef struct last_use {
  int64_t *lu_last;   /* per slot: the last step reading it; -1 none; INT64_MAX an output */
  int64_t lu_step;
} last_use;

static void note_read(uint32_t slot, void *arg)
{
  last_use *u = arg;
  if (u->lu_last[slot] != INT64_MAX && u->lu_last[slot] < u->lu_step)
    u->lu_last[slot] = u->lu_step;
}

int tn_plan_finish(tn_plan *p, const tn_operand *outs, uint32_t nouts)
{
  char msg[200];
  int rc = p->pl_rc != TN_OK ? TN_EPOISONED : TN_OK;
  int64_t *last = NULL;
  uint32_t *count = NULL;

  if (rc != TN_OK)
    return rc;
  if (p->pl_finished)
    return plan_fail(p, TN_EINVAL, "finish: the plan is finished already");
  if (nouts && !outs)
    return plan_fail(p, TN_EINVAL, "finish: NULL outputs");
  for (uint32_t i = 0; i < nouts; i++) {
    if (outs[i].od_kind == TN_OPND_LIST || !operand_ok(p, &outs[i], 1, 0, msg, sizeof msg))
      return plan_fail(p, TN_EINVAL, "output %" PRIu32 ": %s", i,
                       outs[i].od_kind == TN_OPND_LIST ? "a list" : msg);
  }
  p->pl_outs = malloc((size_t)(nouts ? nouts : 1) * sizeof *p->pl_outs);
  last = malloc((size_t)(p->pl_nslots ? p->pl_nslots : 1) * sizeof *last);
  count = calloc((size_t)p->pl_nsteps + 1, sizeof *count);
  if (!p->pl_outs || !last || !count) {
    rc = plan_fail(p, TN_ENOMEM, "finish: out of memory");
    goto done;
  }
  if (nouts)
    memcpy(p->pl_outs, outs, (size_t)nouts * sizeof *outs);
  p->pl_nouts = nouts;
  for (uint32_t s = 0; s < p->pl_nslots; s++)
    last[s] = -1;
  for (uint32_t i = 0; i < nouts; i++)
    if (outs[i].od_kind == TN_OPND_SLOT)
      last[outs[i].od_index] = INT64_MAX;  /* returned: never released early */
  last_use u = {last, 0};
  for (uint32_t k = 0; k < p->pl_nsteps; k++) {
    u.lu_step = k;
    each_read(p, &p->pl_steps[k], note_read, &u);
  }
  /* a step's slot nobody reads dies right after that step; an input nobody
  ** reads is held until the run ends, with the outputs */
  uint32_t total = 0;
  for (uint32_t s = 0; s < p->pl_nslots; s++) {
    if (last[s] == INT64_MAX)
      continue;
    int64_t at = last[s];
    if (at < 0)
      at = s < p->pl_ninputs ? -1 : (int64_t)(s - p->pl_ninputs);
    if (at >= 0) {
      count[at]++;
      total++;
    }
    last[s] = at;
  }
  p->pl_rel = malloc((size_t)(total ? total : 1) * sizeof *p->pl_rel);
  if (!p->pl_rel) {
    rc = plan_fail(p, TN_ENOMEM, "finish: out of memory");
    goto done;
  }
  uint32_t at = 0;
  for (uint32_t k = 0; k < p->pl_nsteps; k++) {
    p->pl_steps[k].st_rel_first = at;
    p->pl_steps[k].st_nrel = 0;
    at += count[k];
  }
  assert(at == total);
  for (uint32_t s = 0; s < p->pl_nslots; s++) {
    if (last[s] < 0 || last[s] == INT64_MAX)
      continue;
    tn_step *st = &p->pl_steps[last[s]];
    p->pl_rel[st->st_rel_first + st->st_nrel++] = s;
  }
  /* the peak of live slots: every input from the start (until its last
  ** reader, or the end), each step's slot from its step until its release */
  uint32_t live = p->pl_ninputs, peak = live;
  for (uint32_t k = 0; k < p->pl_nsteps; k++) {
    live++;
    if (live > peak)
      peak = live;
    live -= p->pl_steps[k].st_nrel;
  }
  p->pl_peak = peak;
  p->pl_finished = 1;
done:
  free(last);
  free(count);
  return rc;
}

/* -- Accessors ---------------------------------------------------------- */

uint32_t tn_plan_num_inputs(const tn_plan *p) { return p->pl_ninputs; }
uint32_t tn_plan_num_slots(const tn_plan *p) { return p->pl_nslots; }
uint32_t tn_plan_num_steps(const tn_plan *p) { return p->pl_nsteps; }
uint32_t tn_plan_num_consts(const tn_plan *p) { return p->pl_nconsts; }
uint32_t tn_plan_num_outputs(const tn_plan *p) { return p->pl_nouts; }
int tn_plan_finished(const tn_plan *p) { return p->pl_finished; }
uint32_t tn_plan_peak_live(const tn_plan *p) { return p->pl_peak; }

const tn_step *tn_plan_step(const tn_plan *p, uint32_t i)
{
  assert(i < p->pl_nsteps);
  return &p->pl_steps[i];
}

const tn_operand *tn_plan_operand(const tn_plan *p, uint32_t i)
{
  assert(i < p->pl_npool);
  return &p->pl_pool[i];
}

const tn_operand *tn_plan_output(const tn_plan *p, uint32_t i)
{
  assert(i < p->pl_nouts);
  return &p->pl_outs[i];
}

const uint32_t *tn_plan_releases(const tn_plan *p, const tn_step *st)
{
  assert(p->pl_finished);
  return p->pl_rel + st->st_rel_first;
}

const char *tn_plan_kind_name(int kind)
{
  static const char *const names[TN_STEP__COUNT] = {"kernel", "aten", "call", "item"};
  return kind >= 0 && kind < TN_STEP__COUNT ? names[kind] : "unknown";
}

/* -- Binary form -------------------------------------------------------- */

static const uint8_t plan_magic[4] = {'T', 'N', 'P', 'L'};

typedef struct enc_buf {
  uint8_t *eb_data;
  uint32_t eb_len, eb_cap;
  int eb_rc;
} enc_buf;

static void enc_u32(enc_buf *b, uint32_t v)
{
  if (b->eb_rc == TN_OK && (b->eb_len > UINT32_MAX / 2 ||
                            grow((void **)&b->eb_data, &b->eb_cap, b->eb_len + 4, 1) != TN_OK))
    b->eb_rc = TN_ENOMEM;
  if (b->eb_rc != TN_OK)
    return;
  for (int i = 0; i < 4; i++)
    b->eb_data[b->eb_len++] = (uint8_t)(v >> (8 * i));
}

int tn_plan_encode(const tn_plan *p, uint32_t flags, uint8_t **buf, size_t *len)
{
  enc_buf b = {0};
  *buf = NULL;
  *len = 0;
  if (!p->pl_finished)
    return TN_EINVAL;
  enc_u32(&b, (uint32_t)plan_magic[0] | (uint32_t)plan_magic[1] << 8 | (uint32_t)plan_magic[2] << 16 |
                  (uint32_t)plan_magic[3] << 24);
  enc_u32(&b, TN_PLAN_FORMAT_VERSION);
  enc_u32(&b, flags);
  enc_u32(&b, p->pl_ninputs);
  enc_u32(&b, p->pl_nconsts);
  enc_u32(&b, p->pl_nsteps);
  enc_u32(&b, p->pl_nouts);
  for (uint32_t k = 0; k < p->pl_nsteps; k++) {
    const tn_step *st = &p->pl_steps[k];
    uint32_t lists = st->st_first + st->st_nargs, nlist = 0;
    for (uint32_t i = 0; i < st->st_nargs; i++)
      if (p->pl_pool[st->st_first + i].od_kind == TN_OPND_LIST)
        nlist += p->pl_pool[st->st_first + i].od_len;
    enc_u32(&b, (uint32_t)st->st_kind);
    enc_u32(&b, st->st_callable);
    enc_u32(&b, st->st_item);
    enc_u32(&b, st->st_nargs);
    enc_u32(&b, st->st_nkw);
    enc_u32(&b, st->st_kwnames);
    enc_u32(&b, nlist);
    for (uint32_t i = 0; i < st->st_nargs; i++) {
      const tn_operand *o = &p->pl_pool[st->st_first + i];
      /* a step's lists follow its operands in the pool, in operand order */
      assert(o->od_kind != TN_OPND_LIST || (o->od_index >= lists && o->od_index - lists + o->od_len <= nlist));
      enc_u32(&b, o->od_kind);
      enc_u32(&b, o->od_kind == TN_OPND_LIST ? o->od_index - lists : o->od_index);
      enc_u32(&b, o->od_len);
    }
    for (uint32_t e = 0; e < nlist; e++) {
      enc_u32(&b, p->pl_pool[lists + e].od_kind);
      enc_u32(&b, p->pl_pool[lists + e].od_index);
    }
  }
  for (uint32_t i = 0; i < p->pl_nouts; i++) {
    enc_u32(&b, p->pl_outs[i].od_kind);
    enc_u32(&b, p->pl_outs[i].od_index);
  }
  if (b.eb_rc != TN_OK) {
    free(b.eb_data);
    return b.eb_rc;
  }
  *buf = b.eb_data;
  *len = b.eb_len;
  return TN_OK;
}

typedef struct dec_buf {
  const uint8_t *db_at;
  size_t db_left;
} dec_buf;

static int dec_u32(dec_buf *d, uint32_t *v)
{
  if (d->db_left < 4)
    return 0;
  *v = (uint32_t)d->db_at[0] | (uint32_t)d->db_at[1] << 8 | (uint32_t)d->db_at[2] << 16 |
       (uint32_t)d->db_at[3] << 24;
  d->db_at += 4;
  d->db_left -= 4;
  return 1;
}

static int dec_fail(int rc, char *err, size_t errlen, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen)
    vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return rc;
}

/* Reads n operands (with their len when with_len) into out. */
static int dec_operands(dec_buf *d, tn_operand *out, uint32_t n, int with_len)
{
  for (uint32_t i = 0; i < n; i++) {
    out[i].od_len = 0;
    if (!dec_u32(d, &out[i].od_kind) || !dec_u32(d, &out[i].od_index) || (with_len && !dec_u32(d, &out[i].od_len)))
      return 0;
  }
  return 1;
}

int tn_plan_decode(const uint8_t *buf, size_t len, uint32_t nconsts, tn_plan **out, uint32_t *flags,
                   char *err, size_t errlen)
{
  dec_buf d = {buf, len};
  uint32_t magic, version, ninputs, nc, nsteps, nouts;
  tn_operand args[TN_PLAN_MAX_ARGS], *items = NULL, *outs = NULL;
  uint32_t capitems = 0;
  tn_plan *p = NULL;
  int rc = TN_OK;

  *out = NULL;
  if (err && errlen)
    err[0] = 0;
  if (!dec_u32(&d, &magic) || !dec_u32(&d, &version))
    return dec_fail(TN_ETRUNC, err, errlen, "plan: %zu bytes, shorter than its header", len);
  if (memcmp(buf, plan_magic, 4) != 0)
    return dec_fail(TN_ECORRUPT, err, errlen, "plan: not a plan's binary form");
  if (version != TN_PLAN_FORMAT_VERSION)
    return dec_fail(TN_EVERSION, err, errlen, "plan: format version %" PRIu32 ", this build reads %d",
                    version, TN_PLAN_FORMAT_VERSION);
  if (!dec_u32(&d, flags) || !dec_u32(&d, &ninputs) || !dec_u32(&d, &nc) || !dec_u32(&d, &nsteps) ||
      !dec_u32(&d, &nouts))
    return dec_fail(TN_ETRUNC, err, errlen, "plan: truncated header");
  if (nc != nconsts)
    return dec_fail(TN_ECORRUPT, err, errlen, "plan: made for %" PRIu32 " constants, given %" PRIu32, nc, nconsts);
  /* every step takes 28 bytes at least, every output 8: counts the bytes cannot hold are corrupt */
  if (nsteps > d.db_left / 28 || nouts > d.db_left / 8)
    return dec_fail(TN_ECORRUPT, err, errlen, "plan: %" PRIu32 " steps and %" PRIu32 " outputs in %zu bytes",
                    nsteps, nouts, d.db_left);
  rc = tn_plan_new(ninputs, nconsts, &p);
  if (rc != TN_OK) {
    rc = dec_fail(rc, err, errlen, "plan: %" PRIu32 " inputs", ninputs);
    goto done;
  }
  for (uint32_t k = 0; k < nsteps; k++) {
    uint32_t kind, callable, item, nargs, nkw, kwnames, nlist, slot;
    if (!dec_u32(&d, &kind) || !dec_u32(&d, &callable) || !dec_u32(&d, &item) || !dec_u32(&d, &nargs) ||
        !dec_u32(&d, &nkw) || !dec_u32(&d, &kwnames) || !dec_u32(&d, &nlist)) {
      rc = dec_fail(TN_ETRUNC, err, errlen, "plan: truncated at step %" PRIu32, k);
      goto done;
    }
    if (nargs > TN_PLAN_MAX_ARGS || kind > INT32_MAX || nlist > d.db_left / 8) {
      rc = dec_fail(TN_ECORRUPT, err, errlen, "plan: step %" PRIu32 ": %" PRIu32 " operands, %" PRIu32
                    " list elements", k, nargs, nlist);
      goto done;
    }
    if (nlist > capitems) {
      tn_operand *grown = realloc(items, (size_t)nlist * sizeof *items);
      if (!grown) {
        rc = dec_fail(TN_ENOMEM, err, errlen, "plan: out of memory");
        goto done;
      }
      items = grown;
      capitems = nlist;
    }
    if (!dec_operands(&d, args, nargs, 1) || !dec_operands(&d, items, nlist, 0)) {
      rc = dec_fail(TN_ETRUNC, err, errlen, "plan: truncated at step %" PRIu32 "'s operands", k);
      goto done;
    }
    rc = tn_plan_add_step(p, (int)kind, callable, item, args, nargs, nkw, kwnames, items, nlist, &slot);
    if (rc != TN_OK) {
      rc = dec_fail(rc, err, errlen, "plan: %s", tn_plan_errmsg(p));
      goto done;
    }
  }
  outs = malloc((size_t)(nouts ? nouts : 1) * sizeof *outs);
  if (!outs) {
    rc = dec_fail(TN_ENOMEM, err, errlen, "plan: out of memory");
    goto done;
  }
  if (!dec_operands(&d, outs, nouts, 0)) {
    rc = dec_fail(TN_ETRUNC, err, errlen, "plan: truncated outputs");
    goto done;
  }
  if (d.db_left) {
    rc = dec_fail(TN_ECORRUPT, err, errlen, "plan: %zu bytes after its end", d.db_left);
    goto done;
  }
  rc = tn_plan_finish(p, outs, nouts);
  if (rc != TN_OK) {
    rc = dec_fail(rc, err, errlen, "plan: %s", tn_plan_errmsg(p));
    goto done;
  }
  *out = p;
  p = NULL;
done:
  free(items);
  free(outs);
  tn_plan_free(p);
  return rc;
}

/* -- Listing ------------------------------------------------------------ */

typedef struct dump_buf {
  char *db_text;
  size_t db_len, db_cap;
  int db_oom;
} dump_buf;

static void put(dump_buf *b, const char *fmt, ...)
{
  va_list ap;
  for (int tries = 0; tries < 2 && !b->db_oom; tries++) {
    size_t room = b->db_cap - b->db_len;
    va_start(ap, fmt);
    int n = vsnprintf(b->db_text ? b->db_text + b->db_len : NULL, b->db_text ? room : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->db_oom = 1;
      return;
    }
    if ((size_t)n < room) {
      b->db_len += (size_t)n;
      return;
    }
    size_t cap = b->db_cap ? b->db_cap : 256;
    while (cap < b->db_len + (size_t)n + 1)
      cap *= 2;
    char *t = realloc(b->db_text, cap);
    if (!t) {
      b->db_oom = 1;
      return;
    }
    b->db_text = t;
    b->db_cap = cap;
  }
}

static void put_operand(dump_buf *b, const tn_plan *p, const tn_operand *o)
{
  if (o->od_kind == TN_OPND_SLOT)
    put(b, "%%%" PRIu32, o->od_index);
  else if (o->od_kind == TN_OPND_CONST)
    put(b, "c%" PRIu32, o->od_index);
  else {
    put(b, "[");
    for (uint32_t e = 0; e < o->od_len; e++) {
      put(b, e ? ", " : "");
      put_operand(b, p, &p->pl_pool[o->od_index + e]);
    }
    put(b, "]");
  }
}

int tn_plan_dump(tn_plan *p, const char **text)
{
  dump_buf b = {0};
  put(&b, "plan: %" PRIu32 " inputs, %" PRIu32 " steps, %" PRIu32 " constants, at most %" PRIu32 " slots live\n",
      p->pl_ninputs, p->pl_nsteps, p->pl_nconsts, p->pl_peak);
  for (uint32_t k = 0; k < p->pl_nsteps; k++) {
    const tn_step *st = &p->pl_steps[k];
    if (st->st_kind == TN_STEP_ITEM) {
      put(&b, "%%%" PRIu32 " = %%%" PRIu32 "[%" PRIu32 "]", st->st_out, p->pl_pool[st->st_first].od_index,
          st->st_item);
    } else {
      put(&b, "%%%" PRIu32 " = %s c%" PRIu32 "(", st->st_out, tn_plan_kind_name(st->st_kind), st->st_callable);
      for (uint32_t i = 0; i < st->st_nargs; i++) {
        put(&b, i ? ", " : "");
        if (i >= st->st_nargs - st->st_nkw)
          put(&b, "kw%" PRIu32 "=", i - (st->st_nargs - st->st_nkw));
        put_operand(&b, p, &p->pl_pool[st->st_first + i]);
      }
      put(&b, ")");
    }
    if (p->pl_finished && st->st_nrel) {
      put(&b, " ; frees");
      for (uint32_t r = 0; r < st->st_nrel; r++)
        put(&b, " %%%" PRIu32, p->pl_rel[st->st_rel_first + r]);
    }
    put(&b, "\n");
  }
  put(&b, "return (");
  for (uint32_t i = 0; i < p->pl_nouts; i++) {
    put(&b, i ? ", " : "");
    put_operand(&b, p, &p->pl_outs[i]);
  }
  put(&b, ")\n");
  if (b.db_oom) {
    free(b.db_text);
    return TN_ENOMEM;
  }
  free(p->pl_dump);
  p->pl_dump = b.db_text;
  *text = p->pl_dump;
  return TN_OK;
}
