/*
** The tunables table (see tn_config.h) and tn_strerror.
*/
#include "tn_config.h"
#include "tn_common.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* -- Error texts -------------------------------------------------------- */

const char *tn_strerror(int rc)
{
  switch (rc) {
  case TN_OK: return "success";
#define TN_ERR_CASE(name, num, text) case name: return text;
  TN_ERRORS(TN_ERR_CASE)
#undef TN_ERR_CASE
  default: return "unknown error";
  }
}

/* -- The table ---------------------------------------------------------- */

typedef struct tn_config_entry {
  const char *ce_name;
  int ce_type;
  int64_t ce_idef;
  const char *ce_sdef;
  const char *ce_doc;
} tn_config_entry;

static const tn_config_entry config_defs[TN_CFG__COUNT] = {
#define TN_CFG_ROW(name, type, idef, sdef, doc) {#name, type, idef, sdef, doc},
  TN_CONFIG_DEF(TN_CFG_ROW)
#undef TN_CFG_ROW
};

static int64_t config_ival[TN_CFG__COUNT];
static char *config_sval[TN_CFG__COUNT];

#define CONFIG_MAX_ENV_ERRORS TN_CFG__COUNT
static char config_env_errors[CONFIG_MAX_ENV_ERRORS][2 * TN_ERRMSG_LEN];
static int config_n_env_errors;

/* -- Parsing ------------------------------------------------------------ */

static int config_parse_bool(const char *t, int64_t *out)
{
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off"};
  for (size_t i = 0; i < 4; i++) {
    if (strcasecmp(t, yes[i]) == 0) { *out = 1; return TN_OK; }
    if (strcasecmp(t, no[i]) == 0) { *out = 0; return TN_OK; }
  }
  return TN_EINVAL;
}

static int config_parse_int(const char *t, int bytes, int64_t *out)
{
  char *end = NULL;
  errno = 0;
  long long v = strtoll(t, &end, 10);
  if (end == t || errno == ERANGE)
    return TN_EINVAL;
  int shift = 0;
  while (isspace((unsigned char)*end))
    end++;
  if (bytes && *end) {
    switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case 'T': shift = 40; break;
    default: return TN_EINVAL;
    }
    end++;
    /* 2G, 2GB, 2Gi and 2GiB all mean 2 * 2^30 */
    if (toupper((unsigned char)*end) == 'I')
      end++;
    if (toupper((unsigned char)*end) == 'B')
      end++;
  }
  while (isspace((unsigned char)*end))
    end++;
  if (*end)
    return TN_EINVAL;
  if (bytes && v < 0)
    return TN_EINVAL;
  if (shift && v > (INT64_MAX >> shift))
    return TN_EINVAL;
  *out = (int64_t)v << shift;
  return TN_OK;
}

/* The index of choice t (case-insensitive) of CHOICE entry id, or -1. */
static int64_t config_choice_index(int id, const char *t)
{
  char name[64];
  for (int64_t i = 0; tn_config_choice(id, i, name, sizeof name); i++)
    if (strcasecmp(name, t) == 0)
      return i;
  return -1;
}

static const char *config_expected(int type)
{
  switch (type) {
  case TN_CFG_BOOL: return "a boolean (1, 0, true, false, yes, no, on, off)";
  case TN_CFG_INT: return "an integer";
  case TN_CFG_BYTES: return "a size in bytes >= 0, optionally with a K, M, G or T suffix";
  case TN_CFG_CHOICE: return "one of";
  default: return "text";
  }
}

/* The range "lo.." or "lo..hi" of INT entry id: whether value lies in it.
** *lo and *hi get its ends (INT64_MIN, INT64_MAX where it names none). */
static int config_in_range(int id, int64_t value, int64_t *lo, int64_t *hi)
{
  const char *r = config_defs[id].ce_sdef;
  *lo = INT64_MIN;
  *hi = INT64_MAX;
  if (r) {
    char *end;
    const char *dots = strstr(r, "..");
    assert(dots);
    if (dots != r)
      *lo = strtoll(r, &end, 10);
    if (dots[2])
      *hi = strtoll(dots + 2, &end, 10);
  }
  return value >= *lo && value <= *hi;
}

/* -- Public API --------------------------------------------------------- */

int tn_config_find(const char *name)
{
  for (int i = 0; i < TN_CFG__COUNT; i++)
    if (strcmp(config_defs[i].ce_name, name) == 0)
      return i;
  return -1;
}

const char *tn_config_name(int id) { return config_defs[id].ce_name; }
int tn_config_type(int id) { return config_defs[id].ce_type; }
const char *tn_config_doc(int id) { return config_defs[id].ce_doc; }

int64_t tn_config_int(int id)
{
  return __atomic_load_n(&config_ival[id], __ATOMIC_RELAXED);
}

const char *tn_config_str(int id)
{
  return config_sval[id] ? config_sval[id] : "";
}

const char *tn_config_choice(int id, int64_t i, char *buf, size_t len)
{
  const char *p = config_defs[id].ce_sdef;
  assert(config_defs[id].ce_type == TN_CFG_CHOICE && len > 0);
  buf[0] = 0;
  for (; p && i > 0; i--) {
    p = strchr(p, '|');
    p = p ? p + 1 : NULL;
  }
  if (!p || i < 0)
    return NULL;
  size_t n = strcspn(p, "|");
  snprintf(buf, len, "%.*s", (int)n, p);
  return buf;
}

int tn_config_set_int(int id, int64_t value, char *err, size_t errlen)
{
  int type = config_defs[id].ce_type;
  char name[64];
  if (type == TN_CFG_CHOICE && !tn_config_choice(id, value, name, sizeof name)) {
    snprintf(err, errlen, "config %s: expected one of %s, got %" PRId64,
             config_defs[id].ce_name, config_defs[id].ce_sdef, value);
    return TN_EINVAL;
  }
  if (type == TN_CFG_STR || (type == TN_CFG_BOOL && value != 0 && value != 1) ||
      (type == TN_CFG_BYTES && value < 0)) {
    snprintf(err, errlen, "config %s: expected %s, got %" PRId64,
             config_defs[id].ce_name, config_expected(type), value);
    return TN_EINVAL;
  }
  int64_t lo, hi;
  if (type == TN_CFG_INT && !config_in_range(id, value, &lo, &hi)) {
    if (hi == INT64_MAX)
      snprintf(err, errlen, "config %s: expected an integer >= %" PRId64 ", got %" PRId64,
               config_defs[id].ce_name, lo, value);
    else
      snprintf(err, errlen, "config %s: expected an integer from %" PRId64 " to %" PRId64 ", got %" PRId64,
               config_defs[id].ce_name, lo, hi, value);
    return TN_EINVAL;
  }
  __atomic_store_n(&config_ival[id], value, __ATOMIC_RELAXED);
  return TN_OK;
}

int tn_config_set_text(int id, const char *text, char *err, size_t errlen)
{
  int type = config_defs[id].ce_type;
  int64_t v = 0;
  int rc;

  if (type == TN_CFG_STR) {
    char *copy = strdup(text);
    if (!copy)
      return TN_ENOMEM;
    free(config_sval[id]);
    config_sval[id] = copy;
    return TN_OK;
  }
  while (isspace((unsigned char)*text))
    text++;
  if (type == TN_CFG_CHOICE) {
    int64_t b;
    v = config_choice_index(id, text);
    /* a choice of on|off takes any boolean's text for them (TORCHNEURON_ROW_FUSION=1 as when it was one) */
    if (v < 0 && config_choice_index(id, "on") >= 0 && config_choice_index(id, "off") >= 0 &&
        config_parse_bool(text, &b) == TN_OK)
      v = config_choice_index(id, b ? "on" : "off");
    rc = v < 0 ? TN_EINVAL : TN_OK;
  } else {
    rc = type == TN_CFG_BOOL ? config_parse_bool(text, &v)
                             : config_parse_int(text, type == TN_CFG_BYTES, &v);
  }
  if (rc != TN_OK) {
    snprintf(err, errlen, "config %s: expected %s%s%s, got '%s'", config_defs[id].ce_name,
             config_expected(type), type == TN_CFG_CHOICE ? " " : "",
             type == TN_CFG_CHOICE ? config_defs[id].ce_sdef : "", text);
    return rc;
  }
  return tn_config_set_int(id, v, err, errlen);
}

void tn_config_default_text(int id, char *buf, size_t len)
{
  const tn_config_entry *e = &config_defs[id];
  if (e->ce_type == TN_CFG_STR)
    snprintf(buf, len, "%s", e->ce_sdef ? e->ce_sdef : "");
  else if (e->ce_type == TN_CFG_CHOICE)
    tn_config_choice(id, e->ce_idef, buf, len);
  else
    snprintf(buf, len, "%" PRId64, e->ce_idef);
}

void tn_config_init(void)
{
  char env_name[96];
  char err[TN_ERRMSG_LEN];

  config_n_env_errors = 0;
  for (int i = 0; i < TN_CFG__COUNT; i++) {
    const tn_config_entry *e = &config_defs[i];
    config_ival[i] = e->ce_idef;
    free(config_sval[i]);
    config_sval[i] = NULL;
    if (e->ce_type == TN_CFG_STR && e->ce_sdef)
      config_sval[i] = strdup(e->ce_sdef);

    size_t n = (size_t)snprintf(env_name, sizeof env_name, "TORCHNEURON_%s", e->ce_name);
    for (size_t k = 0; k < n && k < sizeof env_name; k++)
      env_name[k] = (char)toupper((unsigned char)env_name[k]);
    const char *text = getenv(env_name);
    if (!text)
      continue;
    if (tn_config_set_text(i, text, err, sizeof err) != TN_OK &&
        config_n_env_errors < CONFIG_MAX_ENV_ERRORS) {
      char def[64];
      tn_config_default_text(i, def, sizeof def);
      snprintf(config_env_errors[config_n_env_errors++], sizeof config_env_errors[0],
               "%s: %s; using the default %s", env_name, err, def);
    }
  }
}

const char *tn_config_env_error(int n)
{
  return n >= 0 && n < config_n_env_errors ? config_env_errors[n] : NULL;
}
