/************************************************************\
 * This file is part of flux-dws, the Flux adapter for HPE DWS.
 * For details, see doc/protocol.rst and doc/architecture.rst.
 *
 * SPDX-License-Identifier: LGPL-3.0-only
\************************************************************/

/* holds.c - where the plugin holds #DW jobs: the dependency dws (DEPEND), the
 * prolog and epilog actions dws, and the [dws] service-wait bound while no service
 * runs.
 */

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dws-jobtap.h"

void cancel_wait (struct dwsjob *st)
{
    if (st->wait_timer) {
        flux_watcher_destroy (st->wait_timer);
        st->wait_timer = NULL;
    }
}

static void service_wait_over (flux_reactor_t *r,
                               flux_watcher_t *w,
                               int revents,
                               void *arg)
{
    struct dwsjob *st = arg;
    struct plugin_ctx *ctx = st->ctx;
    char wait[64], note[512], idbuf[32];

    cancel_wait (st);
    if (st->state != FLUX_JOB_STATE_DEPEND || service_connected (ctx))
        return;
    format_fsd (ctx->service_wait, wait, sizeof (wait));
    snprintf (note, sizeof (note),
              "%s after waiting %s ([dws] service-wait): storage not set up",
              WAITING_REASON, wait);
    flux_log (ctx->h, LOG_WARNING,
              "dws: job %s: %s; raising a dws exception",
              f58 (st->id, idbuf, sizeof (idbuf)), note);
    if (flux_jobtap_raise_exception (ctx->p, st->id, PLUGIN_NAME, 0, "%s", note) < 0)
        flux_log_error (ctx->h, "dws: job %s: raising the service-wait exception",
                        idbuf);
}

void start_wait (struct dwsjob *st)
{
    struct plugin_ctx *ctx = st->ctx;
    flux_reactor_t *r = flux_get_reactor (ctx->h);

    if (isinf (ctx->service_wait) || st->wait_timer)
        return;
    if (!(st->wait_timer = flux_timer_watcher_create (r, ctx->service_wait, 0.,
                                                      service_wait_over, st))) {
        flux_log_error (ctx->h, "dws: creating a service-wait timer");
        return;
    }
    flux_watcher_start (st->wait_timer);
}

/* Tell the job's user that no service is there to set up its storage, once per
 * absence of the service (a service watch clears waiting_told).
 */
void tell_waiting (struct dwsjob *st)
{
    struct plugin_ctx *ctx = st->ctx;
    char idbuf[32];

    if (st->waiting_told)
        return;
    if (flux_jobtap_event_post_pack (ctx->p, st->id, "dws-waiting",
                                     "{s:s}", "reason", WAITING_REASON) < 0) {
        flux_log_error (ctx->h, "dws: job %s: posting dws-waiting",
                        f58 (st->id, idbuf, sizeof (idbuf)));
        return;
    }
    st->waiting_told = true;
}

/* Add the dws dependency to the job being called back; tell the user when the
 * service is not there to release it.
 */
void hold_in_depend (struct dwsjob *st)
{
    struct plugin_ctx *ctx = st->ctx;
    char idbuf[32];

    if (flux_jobtap_dependency_add (ctx->p, st->id, PLUGIN_NAME) < 0
        && errno != EEXIST) {
        flux_log_error (ctx->h, "dws: job %s: adding the dws dependency",
                        f58 (st->id, idbuf, sizeof (idbuf)));
        (void)flux_jobtap_raise_exception (ctx->p, st->id, PLUGIN_NAME, 0,
                                           "dws: could not hold the job for its"
                                           " workflow: %s", strerror (errno));
        return;
    }
    if (service_connected (ctx))
        return;
    tell_waiting (st);
    start_wait (st);
}

void start_prolog (struct dwsjob *st)
{
    char idbuf[32];

    if (st->prolog_started || st->prolog_requested)
        return;
    if (flux_jobtap_prolog_start (st->ctx->p, PLUGIN_NAME) < 0) {
        flux_log_error (st->ctx->h, "dws: job %s: starting the dws prolog",
                        f58 (st->id, idbuf, sizeof (idbuf)));
        return;
    }
    st->prolog_requested = true;
}

/* A job that started before this broker did and was never released (cleanup off at
 * shutdown, then an exec exception on restart): its shells died with the old
 * instance, and no release will ever say so.
 */
void note_shells_gone (struct dwsjob *st)
{
    if (st->started && !st->released && st->t_start > 0.
        && st->t_start < st->ctx->broker_start)
        st->shells_gone = true;
}

void start_epilog (struct dwsjob *st)
{
    char idbuf[32];

    if (st->epilog_started || st->epilog_requested)
        return;
    if (flux_jobtap_epilog_start (st->ctx->p, PLUGIN_NAME) < 0) {
        flux_log_error (st->ctx->h, "dws: job %s: starting the dws epilog",
                        f58 (st->id, idbuf, sizeof (idbuf)));
        return;
    }
    st->epilog_requested = true;
}

/* After the eventlog was read: take whatever action the job's state calls for and
 * the plugin could not take while it was not loaded.  Runs as a jobtap call for the
 * job (flux_jobtap_call), since prolog/epilog actions need a current job.
 */
int reconcile_cb (flux_plugin_t *p,
                  const char *topic,
                  flux_plugin_arg_t *args,
                  void *arg)
{
    struct dwsjob *st = current_job (p);

    if (!st)
        return 0;
    switch (st->state) {
        case FLUX_JOB_STATE_DEPEND:
            if (!st->dep_used)
                hold_in_depend (st);  // held by something else while unloaded
            else if (st->dep_held && !service_connected (st->ctx))
                start_wait (st);
            break;
        case FLUX_JOB_STATE_RUN:
            if (!st->started && !st->prolog_started)
                start_prolog (st);
            break;
        case FLUX_JOB_STATE_CLEANUP:
            /* Started before this broker did and never released (cleanup off at
             * shutdown, exec exception): those shells died with the old instance. */
            note_shells_gone (st);
            if (st->prologs == 0)
                start_epilog (st);
            break;
        default:
            break;
    }
    return 0;
}

// vi:ts=4 sw=4 expandtab
