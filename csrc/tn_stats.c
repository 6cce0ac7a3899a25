/*
** Process-wide counters (see tn_stats.h).
*/
#include "tn_stats.h"

static uint64_t stats[TN_STAT__COUNT];

static const char *const stat_names[TN_STAT__COUNT] = {
#define TN_STAT_NAME(name, doc) #name,
  TN_STATS_DEF(TN_STAT_NAME)
#undef TN_STAT_NAME
};

static const char *const stat_docs[TN_STAT__COUNT] = {
#define TN_STAT_DOC(name, doc) doc,
  TN_STATS_DEF(TN_STAT_DOC)
#undef TN_STAT_DOC
};

void tn_stat_add(int id, uint64_t n) { __atomic_add_fetch(&stats[id], n, __ATOMIC_RELAXED); }
uint64_t tn_stat_get(int id) { return __atomic_load_n(&stats[id], __ATOMIC_RELAXED); }
const char *tn_stat_name(int id) { return stat_names[id]; }
const char *tn_stat_doc(int id) { return stat_docs[id]; }

void tn_stats_reset(void)
{
  for (int i = 0; i < TN_STAT__COUNT; i++)
    __atomic_store_n(&stats[i], 0, __ATOMIC_RELAXED);
}
