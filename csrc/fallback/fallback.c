/*
** Fallback (fallback.h): the decision after a compiled run failed.
*/
#include "fallback.h"

#include <assert.h>
#include <stdio.h>

int tn_fallback_route(const tn_fallback *fb)
{
  return fb->fb_eager ? TN_FALLBACK_EAGER : TN_FALLBACK_COMPILED;
}

int tn_fallback_settle(tn_fallback *fb, int eager_ok, const char *cause)
{
  assert(!fb->fb_eager);  /* a graph routed to eager has no compiled run to fail */
  if (!eager_ok) {
    fb->fb_user_errors++;
    return 0;
  }
  fb->fb_eager = 1;
  snprintf(fb->fb_cause, sizeof fb->fb_cause, "%s", cause ? cause : "unknown cause");
  return 1;
}
