/************************************************************\
 * This file is part of flux-dws, the Flux adapter for HPE DWS.
 * For details, see doc/protocol.rst and doc/architecture.rst.
 *
 * SPDX-License-Identifier: LGPL-3.0-only
\************************************************************/

/* util.c - small helpers of the dws jobtap plugin: RPC errors, f58 job IDs,
 * Flux Standard Durations (as flux_dws/base/fsd.py) and the submit-time checks.
 *
 * Layer 1 of 11 (dws-jobtap.h), the bottom: calls no other file.
 */

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dws-jobtap.h"

int fail (struct rpc_error *err, int errnum, const char *fmt, ...)
{
    va_list ap;
    va_start (ap, fmt);
    vsnprintf (err->text, sizeof (err->text), fmt, ap);
    va_end (ap);
    err->errnum = errnum;
    return -1;
}

/* The job ID as Flux shows it to people (f58), for log messages and error texts.
 * errno is left as it was, so callers may format it with strerror (errno).
 */
const char *f58 (flux_jobid_t id, char *buf, size_t size)
{
    int saved_errno = errno;

    if (flux_job_id_encode (id, "f58", buf, size) < 0)
        snprintf (buf, size, "%ju", (uintmax_t)id);
    errno = saved_errno;
    return buf;
}

bool streq (const char *a, const char *b)
{
    return a && b && strcmp (a, b) == 0;
}

double reactor_now (struct plugin_ctx *ctx)
{
    return flux_reactor_now (flux_get_reactor (ctx->h));
}

/* Seconds for a Flux Standard Duration ("30s", "5m", "1.5h", "2d", "500ms", a bare
 * number of seconds, "inf") or a non-negative JSON number; -1 when invalid.
 * Same rules as flux_dws/base/fsd.py parse_fsd().
 */
double parse_fsd (json_t *o)
{
    if (json_is_integer (o))
        return json_integer_value (o) < 0 ? -1. : (double)json_integer_value (o);
    if (json_is_real (o)) {
        double v = json_real_value (o);
        return (isnan (v) || v < 0) ? -1. : v;
    }
    if (!json_is_string (o))
        return -1.;

    const char *s = json_string_value (o);
    while (isspace ((unsigned char)*s))
        s++;
    size_t len = strlen (s);
    while (len > 0 && isspace ((unsigned char)s[len - 1]))
        len--;
    if ((len == 3 && strncasecmp (s, "inf", 3) == 0)
        || (len == 8 && strncasecmp (s, "infinity", 8) == 0))
        return INFINITY;

    size_t i = 0, digits = 0;
    while (i < len && isdigit ((unsigned char)s[i]))
        i++, digits++;
    if (i < len && s[i] == '.') {
        i++;
        while (i < len && isdigit ((unsigned char)s[i]))
            i++, digits++;
    }
    if (digits == 0)
        return -1.;
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1, exp_digits = 0;
        if (j < len && (s[j] == '+' || s[j] == '-'))
            j++;
        while (j < len && isdigit ((unsigned char)s[j]))
            j++, exp_digits++;
        if (exp_digits == 0)
            return -1.;
        i = j;
    }
    size_t numlen = i;
    const char *unit = s + i;
    size_t unitlen = len - i;
    double scale;
    if (unitlen == 0 || (unitlen == 1 && unit[0] == 's'))
        scale = 1.;
    else if (unitlen == 2 && strncmp (unit, "ms", 2) == 0)
        scale = 0.001;
    else if (unitlen == 1 && unit[0] == 'm')
        scale = 60.;
    else if (unitlen == 1 && unit[0] == 'h')
        scale = 3600.;
    else if (unitlen == 1 && unit[0] == 'd')
        scale = 86400.;
    else
        return -1.;

    char num[64];
    if (numlen >= sizeof (num))
        return -1.;
    memcpy (num, s, numlen);
    num[numlen] = '\0';
    double v = strtod (num, NULL) * scale;
    return (isnan (v) || v < 0) ? -1. : v;
}

/* The digits of x to the millisecond, without trailing zeros ("1.5", "90").
 */
static void fsd_number (double x, char *buf, size_t size)
{
    snprintf (buf, size, "%.3f", x);
    char *dot = strchr (buf, '.');
    if (dot) {
        char *end = buf + strlen (buf) - 1;
        while (end > dot && *end == '0')
            *end-- = '\0';
        if (end == dot)
            *end = '\0';
    }
}

/* The shortest exact FSD for seconds (flux_dws/base/fsd.py format_fsd()).
 */
void format_fsd (double seconds, char *buf, size_t size)
{
    static const struct { const char *unit; double size; } units[] = {
        { "d", 86400. }, { "h", 3600. }, { "m", 60. }, { "s", 1. },
    };
    char num[40];

    if (isinf (seconds)) {
        snprintf (buf, size, "inf");
        return;
    }
    for (size_t i = 0; i < sizeof (units) / sizeof (units[0]); i++) {
        double q = seconds / units[i].size;
        if (seconds >= units[i].size && round (q * 1000.) / 1000. == q) {
            fsd_number (q, num, sizeof (num));
            snprintf (buf, size, "%s%s", num, units[i].unit);
            return;
        }
    }
    if (seconds > 0 && seconds < 1) {
        fsd_number (seconds * 1000., num, sizeof (num));
        snprintf (buf, size, "%sms", num);
        return;
    }
    fsd_number (seconds, num, sizeof (num));
    snprintf (buf, size, "%ss", num);
}

/* Why attributes.system is refused, or NULL when its shape is fine (the same shallow
 * rules as flux_dws/testing/fakeflux/checks.py: the service validates directives).
 */
const char *shallow_check (json_t *system, char *buf, size_t size)
{
    json_t *dw, *timeout;

    if (!json_is_object (system))
        return NULL;
    dw = json_object_get (system, "dw");
    timeout = json_object_get (system, "dw_timeout");
    if (timeout && !dw) {
        snprintf (buf, size,
                  "attributes.system.dw_timeout requires attributes.system.dw");
        return buf;
    }
    if (dw) {
        bool ok = false;
        if (json_is_string (dw))
            ok = json_string_length (dw) > 0;
        else if (json_is_array (dw) && json_array_size (dw) > 0) {
            size_t index;
            json_t *entry;
            ok = true;
            json_array_foreach (dw, index, entry) {
                if (!json_is_string (entry))
                    ok = false;
            }
        }
        if (!ok) {
            snprintf (buf, size,
                      "attributes.system.dw must be a non-empty string"
                      " or list of strings");
            return buf;
        }
    }
    if (timeout) {
        const char *key;
        json_t *value;
        if (!json_is_object (timeout)) {
            snprintf (buf, size,
                      "attributes.system.dw_timeout must be a table"
                      " of state = duration");
            return buf;
        }
        json_object_foreach (timeout, key, value) {
            bool ok = json_is_string (value)
                      || (json_is_integer (value) && json_integer_value (value) >= 0)
                      || (json_is_real (value)
                          && isfinite (json_real_value (value))
                          && json_real_value (value) >= 0);
            if (!ok) {
                snprintf (buf, size,
                          "attributes.system.dw_timeout.%s must be a duration"
                          " string or a non-negative number",
                          key);
                return buf;
            }
        }
    }
    return NULL;
}

/* attributes.system of the job in args, or NULL.
 */
json_t *args_system (flux_plugin_arg_t *args)
{
    json_t *jobspec = NULL;
    json_t *attributes;

    if (flux_plugin_arg_unpack (args, FLUX_PLUGIN_ARG_IN,
                                "{s:o}", "jobspec", &jobspec) < 0
        || !(attributes = json_object_get (jobspec, "attributes")))
        return NULL;
    return json_object_get (attributes, "system");
}

bool is_dw_system (json_t *system)
{
    return json_is_object (system) && json_object_get (system, "dw") != NULL;
}

// vi:ts=4 sw=4 expandtab
