/************************************************************\
 * This file is part of flux-dws, the Flux adapter for HPE DWS.
 * For details, see doc/protocol.rst and doc/architecture.rst.
 *
 * SPDX-License-Identifier: LGPL-3.0-only
\************************************************************/

/* save.c - the save method: a JSON value under the job's own KVS directory
 * (keys dws.*), answered once the commit is done.
 *
 * Layer 9 of 11 (dws-jobtap.h): may call layers 1-8 only; calls util.c and methods.c.
 */

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dws-jobtap.h"

/* "dws." followed by dot-separated words of letters, digits, '_' and '-'.
 */
static bool valid_save_key (const char *s)
{
    size_t len = s ? strlen (s) : 0;
    bool empty = true;

    if (len <= 4 || len > SAVE_KEY_MAX || strncmp (s, "dws.", 4) != 0)
        return false;
    for (const char *p = s + 4; *p; p++) {
        if (*p == '.') {
            if (empty)
                return false;
            empty = true;
        }
        else if (isalnum ((unsigned char)*p) || *p == '_' || *p == '-')
            empty = false;
        else
            return false;
    }
    return !empty;
}

void save_destroy (struct pending_save *ps)
{
    if (ps) {
        int saved_errno = errno;
        flux_future_destroy (ps->f);
        flux_msg_decref (ps->msg);
        free (ps);
        errno = saved_errno;
    }
}

static void save_unlink (struct plugin_ctx *ctx, struct pending_save *ps)
{
    struct pending_save **pp = &ctx->saves;
    while (*pp && *pp != ps)
        pp = &(*pp)->next;
    if (*pp)
        *pp = ps->next;
}

static void save_continuation (flux_future_t *f, void *arg)
{
    struct pending_save *ps = arg;
    struct plugin_ctx *ctx = ps->ctx;

    if (flux_future_get (f, NULL) < 0) {
        if (flux_respond_error (ctx->h, ps->msg, errno, "job-manager.dws.save: KVS commit"
                                " failed") < 0)
            flux_log_error (ctx->h, "dws: responding to save");
    }
    else if (flux_respond (ctx->h, ps->msg, "{}") < 0)
        flux_log_error (ctx->h, "dws: responding to save");
    save_unlink (ctx, ps);
    save_destroy (ps);
}

/* Write a JSON value under the job's own KVS directory (keys dws.*), answering once the
 * commit is done.  The directory is the one job-info serves to the job's owner and the
 * instance owner only.
 */
int save_method (struct plugin_ctx *ctx,
                 const flux_msg_t *msg,
                 const char *method,
                 json_t *payload,
                 json_t **response,
                 struct rpc_error *err)
{
    struct dwsjob ghost, *st = NULL;
    char idbuf[32];
    json_t *key = json_object_get (payload, "key");
    json_t *value = json_object_get (payload, "value");
    char path[SAVE_KEY_MAX + 64];
    flux_kvs_txn_t *txn = NULL;
    struct pending_save *ps = NULL;
    char *text = NULL;
    int e;

    if (lookup_dw_job (ctx, method, payload, &ghost, &st, err) < 0)
        return -1;
    if (!json_is_string (key))
        return fail (err, EINVAL,
                     "job-manager.dws.save: key must be dws.<name>[.<name>...]");
    if (!valid_save_key (json_string_value (key)))
        return fail (err, EINVAL,
                     "job-manager.dws.save: key %.140s must be dws.<name>[.<name>...]",
                     json_string_value (key));
    if (!json_is_object (value))
        return fail (err, EPROTO, "job-manager.dws.save: value must be an object");
    /* dws.release.* is written after an early release, when the job is inactive already:
     * how its DataOut and Teardown ended (doc/guide/admin.rst, "Early release"). */
    if (st->state == FLUX_JOB_STATE_INACTIVE
        && strncmp (json_string_value (key), "dws.release.", 12) != 0)
        return fail (err, ENOENT, "job %s is not held by the dws plugin",
                     f58 (st->id, idbuf, sizeof (idbuf)));
    if (!(text = json_dumps (value, JSON_COMPACT)))
        return fail (err, ENOMEM, "job-manager.dws.save: out of memory");
    if (strlen (text) > SAVE_VALUE_MAX) {
        free (text);
        return fail (err, E2BIG, "job %s: %s is larger than 64MiB",
                     f58 (st->id, idbuf, sizeof (idbuf)),
                     json_string_value (key));
    }
    if (flux_job_kvs_key (path, sizeof (path), st->id, json_string_value (key)) < 0
        || !(txn = flux_kvs_txn_create ())
        || flux_kvs_txn_put (txn, 0, path, text) < 0
        || !(ps = calloc (1, sizeof (*ps)))
        || !(ps->f = flux_kvs_commit (ctx->h, NULL, 0, txn))
        || flux_future_then (ps->f, -1., save_continuation, ps) < 0)
        goto error;
    ps->ctx = ctx;
    ps->msg = flux_msg_incref (msg);
    ps->next = ctx->saves;
    ctx->saves = ps;
    flux_kvs_txn_destroy (txn);
    free (text);
    *response = NULL;  // answered when the commit is
    return 0;
error:
    e = errno;
    save_destroy (ps);
    flux_kvs_txn_destroy (txn);
    free (text);
    return fail (err, e, "job %s: saving %s failed: %s",
                 f58 (st->id, idbuf, sizeof (idbuf)),
                 json_string_value (key), strerror (e));
}

// vi:ts=4 sw=4 expandtab
