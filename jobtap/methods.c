/************************************************************\
 * This file is part of flux-dws, the Flux adapter for HPE DWS.
 * For details, see doc/protocol.rst and doc/architecture.rst.
 *
 * SPDX-License-Identifier: LGPL-3.0-only
\************************************************************/

/* methods.c - the per-job job-manager.dws.* methods: release, prolog-finish,
 * epilog-finish, raise, post and memo, and lookup_dw_job, which finds the job a request
 * names (save.c's too).
 *
 * Layer 8 of 11 (dws-jobtap.h): may call layers 1-7 only; calls util.c.
 */

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dws-jobtap.h"

/* The #DW job the request names, inactive ones too (*stp is then a stand-in in
 * state INACTIVE); ENOENT for any other.
 */
int lookup_dw_job (struct plugin_ctx *ctx,
                   const char *method,
                   json_t *payload,
                   struct dwsjob *ghost,
                   struct dwsjob **stp,
                   struct rpc_error *err)
{
    json_t *o = json_object_get (payload, "id");
    json_int_t id;
    struct dwsjob *st = NULL;
    flux_plugin_arg_t *args;
    char idbuf[32];

    if (!json_is_integer (o))
        return fail (err, EPROTO, "job-manager.dws.%s: id must be a job ID", method);
    id = json_integer_value (o);
    if (id >= 0 && (st = flux_jobtap_job_aux_get (ctx->p, id, AUX_KEY))) {
        *stp = st;
        return 0;
    }
    if (id >= 0 && (args = flux_jobtap_job_lookup (ctx->p, id))) {
        int state = FLUX_JOB_STATE_NEW;
        bool dw = is_dw_system (args_system (args));
        (void)flux_plugin_arg_unpack (args, FLUX_PLUGIN_ARG_IN, "{s:i}", "state", &state);
        flux_plugin_arg_destroy (args);
        if (dw && state == FLUX_JOB_STATE_INACTIVE) {
            memset (ghost, 0, sizeof (*ghost));
            ghost->ctx = ctx;
            ghost->id = id;
            ghost->state = FLUX_JOB_STATE_INACTIVE;
            *stp = ghost;
            return 0;
        }
    }
    if (id < 0)
        snprintf (idbuf, sizeof (idbuf), "%lld", (long long)id);
    else
        f58 (id, idbuf, sizeof (idbuf));
    return fail (err, ENOENT, "job %s is not held by the dws plugin", idbuf);
}

int release_method (struct plugin_ctx *ctx,
                    const flux_msg_t *msg,
                    const char *method,
                    json_t *payload,
                    json_t **response,
                    struct rpc_error *err)
{
    struct dwsjob ghost, *st = NULL;
    char idbuf[32];
    json_t *update = json_object_get (payload, "update");
    const char *key;
    json_t *value;

    if (lookup_dw_job (ctx, method, payload, &ghost, &st, err) < 0)
        return -1;
    bool ok = !update || json_is_object (update);
    if (ok && update) {
        json_object_foreach (update, key, value) {
            if (strncmp (key, "attributes.", strlen ("attributes.")) != 0
                && !streq (key, "resources"))
                ok = false;
        }
    }
    if (!ok)
        return fail (err, EPROTO,
                     "job-manager.dws.release: update must map attributes.* keys"
                     " (or resources) to values");
    if (st->state != FLUX_JOB_STATE_DEPEND || !st->dep_held)
        return fail (err, EINVAL, "job %s is not waiting for its workflow",
                     f58 (st->id, idbuf, sizeof (idbuf)));
    if (update && json_object_size (update) > 0
        && flux_jobtap_jobspec_update_id_pack (ctx->p, st->id, "O", update) < 0)
        return fail (err, errno, "job %s: jobspec update failed: %s",
                     f58 (st->id, idbuf, sizeof (idbuf)), strerror (errno));
    if (flux_jobtap_dependency_remove (ctx->p, st->id, PLUGIN_NAME) < 0)
        return fail (err, errno, "job %s: removing the dws dependency failed: %s",
                     f58 (st->id, idbuf, sizeof (idbuf)), strerror (errno));
    *response = json_object ();
    return 0;
}

int prolog_finish_method (struct plugin_ctx *ctx,
                          const flux_msg_t *msg,
                          const char *method,
                          json_t *payload,
                          json_t **response,
                          struct rpc_error *err)
{
    struct dwsjob ghost, *st = NULL;
    char idbuf[32];
    json_t *success = json_object_get (payload, "success");
    json_t *env = json_object_get (payload, "env");
    flux_jobid_t id;
    const char *key;
    json_t *value;

    if (lookup_dw_job (ctx, method, payload, &ghost, &st, err) < 0)
        return -1;
    if (!json_is_boolean (success))
        return fail (err, EPROTO,
                     "job-manager.dws.prolog-finish: success must be a boolean");
    bool ok = !env || json_is_object (env);
    if (ok && env) {
        json_object_foreach (env, key, value) {
            if (!json_is_string (value))
                ok = false;
        }
    }
    if (!ok)
        return fail (err, EPROTO,
                     "job-manager.dws.prolog-finish: env must map names to strings");
    if (!st->prolog_active)
        return fail (err, EINVAL, "job %s has no active dws prolog",
                     f58 (st->id, idbuf, sizeof (idbuf)));
    id = st->id;  // st may be freed by the events below
    if (json_is_true (success)
        && flux_jobtap_event_post_pack (ctx->p, id, "dws-environment", "{s:o}",
                                        "env", env ? json_incref (env)
                                                   : json_object ()) < 0)
        return fail (err, errno, "job %s: posting dws-environment failed: %s",
                     f58 (id, idbuf, sizeof (idbuf)), strerror (errno));
    if (flux_jobtap_prolog_finish (ctx->p, id, PLUGIN_NAME,
                                   json_is_true (success) ? 0 : 1) < 0)
        return fail (err, errno, "job %s: finishing the dws prolog failed: %s",
                     f58 (id, idbuf, sizeof (idbuf)), strerror (errno));
    *response = json_object ();
    return 0;
}

int epilog_finish_method (struct plugin_ctx *ctx,
                          const flux_msg_t *msg,
                          const char *method,
                          json_t *payload,
                          json_t **response,
                          struct rpc_error *err)
{
    struct dwsjob ghost, *st = NULL;
    char idbuf[32];
    flux_jobid_t id;

    if (lookup_dw_job (ctx, method, payload, &ghost, &st, err) < 0)
        return -1;
    if (!st->epilog_active)
        return fail (err, EINVAL, "job %s has no active dws epilog",
                     f58 (st->id, idbuf, sizeof (idbuf)));
    if (st->started && !st->released && !st->shells_gone)
        return fail (err, EINVAL, "job %s is still running its tasks",
                     f58 (st->id, idbuf, sizeof (idbuf)));
    id = st->id;
    if (flux_jobtap_epilog_finish (ctx->p, id, PLUGIN_NAME, 0) < 0)
        return fail (err, errno, "job %s: finishing the dws epilog failed: %s",
                     f58 (id, idbuf, sizeof (idbuf)), strerror (errno));
    *response = json_object ();
    return 0;
}

int raise_method (struct plugin_ctx *ctx,
                  const flux_msg_t *msg,
                  const char *method,
                  json_t *payload,
                  json_t **response,
                  struct rpc_error *err)
{
    struct dwsjob ghost, *st = NULL;
    char idbuf[32];
    json_t *type = json_object_get (payload, "type");
    json_t *severity = json_object_get (payload, "severity");
    json_t *note = json_object_get (payload, "note");
    const char *s;
    int sev = 0;

    if (lookup_dw_job (ctx, method, payload, &ghost, &st, err) < 0)
        return -1;
    bool one_word = json_is_string (type) && json_string_length (type) > 0;
    for (s = json_string_value (type); one_word && *s; s++) {
        if (isspace ((unsigned char)*s))
            one_word = false;
    }
    if (!one_word)
        return fail (err, EPROTO, "job-manager.dws.raise: type must be one word");
    if (severity) {
        if (!json_is_integer (severity)
            || json_integer_value (severity) < 0
            || json_integer_value (severity) > 7)
            sev = -1;
        else
            sev = json_integer_value (severity);
    }
    if (sev < 0 || (note && !json_is_string (note)))
        return fail (err, EPROTO,
                     "job-manager.dws.raise: severity must be 0-7 and note a string");
    if (st->state == FLUX_JOB_STATE_INACTIVE)
        return fail (err, EINVAL, "job %s is inactive",
                     f58 (st->id, idbuf, sizeof (idbuf)));
    if (sev == 0 && st->exception)
        return fail (err, EINVAL, "job %s already has a fatal %s exception",
                     f58 (st->id, idbuf, sizeof (idbuf)),
                     json_string_value (json_object_get (st->exception, "type")));
    if (flux_jobtap_raise_exception (ctx->p, st->id, json_string_value (type), sev,
                                     "%s", note ? json_string_value (note) : "") < 0)
        return fail (err, errno, "job %s: raising the exception failed: %s",
                     f58 (st->id, idbuf, sizeof (idbuf)), strerror (errno));
    /* flux-core decides a job's result at "finish": a fatal exception raised later (a PostRun
     * or DataOut failure, in the epilog) leaves `flux jobs` saying COMPLETED.  The memo
     * "dws" = {result, reason} says FAILED where `flux jobs -o '{user.dws.result}'` looks.
     */
    if (sev == 0
        && flux_jobtap_event_post_pack (ctx->p, st->id, "memo", "{s:{s:s s:s}}",
                                        "dws", "result", "FAILED", "reason",
                                        note ? json_string_value (note) : "") < 0)
        flux_log_error (ctx->h, "dws: job %s: posting the dws result memo",
                        f58 (st->id, idbuf, sizeof (idbuf)));
    *response = json_object ();
    return 0;
}

int post_method (struct plugin_ctx *ctx,
                 const flux_msg_t *msg,
                 const char *method,
                 json_t *payload,
                 json_t **response,
                 struct rpc_error *err)
{
    struct dwsjob ghost, *st = NULL;
    char idbuf[32];
    json_t *name = json_object_get (payload, "name");
    json_t *context = json_object_get (payload, "context");
    const char *s = json_string_value (name);

    if (lookup_dw_job (ctx, method, payload, &ghost, &st, err) < 0)
        return -1;
    if (!s
        || strncmp (s, EVENT_PREFIX, strlen (EVENT_PREFIX)) != 0
        || streq (s, EVENT_PREFIX)) {
        if (!s)
            return fail (err, EINVAL,
                         "job-manager.dws.post: name must be " EVENT_PREFIX "<name>");
        return fail (err, EINVAL,
                     "job-manager.dws.post: event name %.64s must be " EVENT_PREFIX "<name>",
                     s);
    }
    if (context && !json_is_object (context))
        return fail (err, EPROTO, "job-manager.dws.post: context must be an object");
    if (st->state == FLUX_JOB_STATE_INACTIVE)
        return fail (err, ENOENT, "job %s is not held by the dws plugin",
                     f58 (st->id, idbuf, sizeof (idbuf)));
    if (flux_jobtap_event_post_pack (ctx->p, st->id, s, "o",
                                     context ? json_incref (context)
                                             : json_object ()) < 0)
        return fail (err, errno, "job %s: posting %s failed: %s",
                     f58 (st->id, idbuf, sizeof (idbuf)), s, strerror (errno));
    *response = json_object ();
    return 0;
}

/* Set user annotations on the job (a "memo" event, as `flux job memo` does): the rabbits
 * the job got, which the service reads from the job's full R (jobtap's R has no
 * scheduling key).  {"id", "memo": {...}}.
 */
int memo_method (struct plugin_ctx *ctx,
                 const flux_msg_t *msg,
                 const char *method,
                 json_t *payload,
                 json_t **response,
                 struct rpc_error *err)
{
    struct dwsjob ghost, *st = NULL;
    char idbuf[32];
    json_t *memo = json_object_get (payload, "memo");

    if (lookup_dw_job (ctx, method, payload, &ghost, &st, err) < 0)
        return -1;
    if (!json_is_object (memo) || json_object_size (memo) == 0)
        return fail (err, EPROTO, "job-manager.dws.memo: memo must be a non-empty object");
    if (st->state == FLUX_JOB_STATE_INACTIVE)
        return fail (err, ENOENT, "job %s is not held by the dws plugin",
                     f58 (st->id, idbuf, sizeof (idbuf)));
    if (flux_jobtap_event_post_pack (ctx->p, st->id, "memo", "O", memo) < 0)
        return fail (err, errno, "job %s: posting the memo failed: %s",
                     f58 (st->id, idbuf, sizeof (idbuf)), strerror (errno));
    *response = json_object ();
    return 0;
}

// vi:ts=4 sw=4 expandtab
