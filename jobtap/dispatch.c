/************************************************************\
 * This file is part of flux-dws, the Flux adapter for HPE DWS.
 * For details, see doc/protocol.rst and doc/architecture.rst.
 *
 * SPDX-License-Identifier: LGPL-3.0-only
\************************************************************/

/* dispatch.c - job-manager.dws.* requests: the owner check, the method table, and
 * the queue where requests wait while job state is rebuilt (answered by soon_cb).
 *
 * Layer 10 of 11 (dws-jobtap.h): may call layers 1-9 only; calls util.c, persistent.c,
 * records.c, holds.c, service.c, methods.c and save.c.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dws-jobtap.h"

static const struct {
    const char *name;
    method_f fn;
} methods[] = {
    { "watch", watch_method },
    { "list", list_method },
    { "release", release_method },
    { "prolog-finish", prolog_finish_method },
    { "epilog-finish", epilog_finish_method },
    { "raise", raise_method },
    { "post", post_method },
    { "memo", memo_method },
    { "heartbeat", heartbeat_method },
    { "save", save_method },
    { "persistent", persistent_method },
    { "storage-held", storage_held_method },
};

/* Whether the request comes from the instance owner (every method is the owner's).
 */
static bool is_owner (const flux_msg_t *msg)
{
    struct flux_msg_cred cred;

    return flux_msg_get_cred (msg, &cred) == 0 && (cred.rolemask & FLUX_ROLE_OWNER);
}

/* Answer one job-manager.dws.<method> request.
 */
static void dispatch (struct plugin_ctx *ctx, const flux_msg_t *msg)
{
    const char *topic = NULL;
    const char *payload_str = NULL;
    const char *method;
    json_t *payload = NULL;
    json_t *response = NULL;
    struct rpc_error err = { 0 };
    method_f fn = NULL;

    if (flux_request_decode (msg, &topic, &payload_str) < 0) {
        fail (&err, errno, "job-manager.dws: malformed request");
        goto error;
    }
    method = topic + strlen (ctx->prefix);
    /* The role first: a guest's payload is never parsed (nor its method looked up). */
    if (!is_owner (msg)) {
        fail (&err, EPERM,
              "job-manager.dws.%s: only the instance owner may use this method",
              method);
        goto error;
    }
    if (!payload_str
        || !(payload = json_loads (payload_str, 0, NULL))
        || !json_is_object (payload)) {
        fail (&err, EPROTO, "request payload must be a JSON object");
        goto error;
    }
    for (size_t i = 0; i < sizeof (methods) / sizeof (methods[0]); i++) {
        if (streq (methods[i].name, method))
            fn = methods[i].fn;
    }
    if (!fn) {
        fail (&err, ENOSYS, "job-manager.dws.%s: no such method", method);
        goto error;
    }
    if (fn (ctx, msg, method, payload, &response, &err) < 0)
        goto error;
    if (response && flux_respond_pack (ctx->h, msg, "O", response) < 0)
        flux_log_error (ctx->h, "dws: responding to %s", topic);
    json_decref (response);
    json_decref (payload);
    return;
error:
    if (flux_respond_error (ctx->h, msg, err.errnum ? err.errnum : EINVAL, err.text) < 0)
        flux_log_error (ctx->h, "dws: responding to %s", topic ? topic : "a request");
    json_decref (payload);
}

/* The deferred work (schedule_soon), on the next reactor loop: the requests that waited
 * for the rebuild, in order, then the records that changed since the last loop.
 */
void soon_cb (flux_reactor_t *r, flux_watcher_t *w, int revents, void *arg)
{
    struct plugin_ctx *ctx = arg;

    while (ctx->rebuilding == 0 && ctx->queued) {
        struct queued_msg *q = ctx->queued;
        ctx->queued = q->next;
        if (!ctx->queued)
            ctx->queued_tail = &ctx->queued;
        ctx->nqueued--;
        dispatch (ctx, q->msg);
        flux_msg_decref (q->msg);
        free (q);
    }
    flush_dirty (ctx);
}

void request_cb (flux_t *h,
                 flux_msg_handler_t *mh,
                 const flux_msg_t *msg,
                 void *arg)
{
    struct plugin_ctx *ctx = arg;

    if (!is_owner (msg)) {  // refused at once, never queued: guests cannot fill the queue
        dispatch (ctx, msg);
        return;
    }
    if (ctx->rebuilding > 0 || ctx->queued) {
        struct queued_msg *q;
        if (ctx->nqueued >= MAX_QUEUED) {
            if (flux_respond_error (h, msg, EAGAIN,
                                    "job-manager.dws: the plugin is rebuilding job state"
                                    " and already holds " MAX_QUEUED_TEXT
                                    " requests; try again") < 0)
                flux_log_error (h, "dws: responding to a request");
            return;
        }
        if (!(q = calloc (1, sizeof (*q)))) {
            if (flux_respond_error (h, msg, ENOMEM, NULL) < 0)
                flux_log_error (h, "dws: responding to a request");
            return;
        }
        q->msg = flux_msg_incref (msg);
        *ctx->queued_tail = q;
        ctx->queued_tail = &q->next;
        ctx->nqueued++;
        if (ctx->rebuilding == 0)
            schedule_soon (ctx);
        return;
    }
    dispatch (ctx, msg);
}

// vi:ts=4 sw=4 expandtab
