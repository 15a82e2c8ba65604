/************************************************************\
 * This file is part of flux-dws, the Flux adapter for HPE DWS.
 * For details, see doc/protocol.rst and doc/architecture.rst.
 *
 * SPDX-License-Identifier: LGPL-3.0-only
\************************************************************/

/* holds.c - where the plugin holds #DW jobs: the dependency dws (DEPEND), the
 * prolog and epilog actions dws, the storage gate (PRIORITY, see keep_from_scheduler),
 * and the [dws] service-wait bound while no service runs.
 *
 * Layer 6 of 11 (dws-jobtap.h): may call layers 1-5 only; calls util.c, records.c and
 * job.c.
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

    bool kept = st->storage_told && storage_gate_closed (ctx)
                && (st->state == FLUX_JOB_STATE_PRIORITY
                    || st->state == FLUX_JOB_STATE_SCHED);

    cancel_wait (st);
    if (!kept && (st->state != FLUX_JOB_STATE_DEPEND || service_connected (ctx)))
        return;
    format_fsd (ctx->service_wait, wait, sizeof (wait));
    /* The one form of every failure note (flux_dws/core/messages.py): <State> failed: ... */
    if (kept)
        snprintf (note, sizeof (note),
                  "Setup failed: %s after waiting %s ([dws] service-wait): not scheduled; "
                  SERVICE_WAIT_STEP,
                  STORAGE_REASON, wait);
    else
        snprintf (note, sizeof (note),
                  "Proposal failed: %s after waiting %s ([dws] service-wait): storage not"
                  " set up; " SERVICE_WAIT_STEP,
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
                                           "Proposal failed: could not hold the job"
                                           " for its workflow: %s", strerror (errno));
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

/* The storage gate.  With [dws] rabbit-scheduling, a job released early (doc/guide/
 * admin.rst, "Early release") leaves its ssd parts marked down in Fluxion until its
 * Teardown is done; Fluxion forgets that when the instance restarts, and only the service
 * (from the workflows' marks) can mark them down again.  So from the plugin's load until
 * the service says it has (storage-held), no #DW job goes to the scheduler: every job
 * that reaches PRIORITY (a job in SCHED at a restart goes back to PRIORITY, see flux-core's
 * restart.c) is given no priority (FLUX_JOBTAP_PRIORITY_UNAVAIL) and stays there; the
 * service's storage-held reprioritizes them all.  Only #DW jobs ask for ssd.
 *
 * flux-core gives each plugin's job.state.priority and job.priority.get the same output
 * arguments, in load order, so the last plugin to set a priority wins: this one must be
 * loaded after any priority plugin (mf_priority).  If one loaded later gives a kept job a
 * priority anyway, the job's job.state.sched callback sets priority 0 (no alloc request is
 * made for it, flux-core's alloc.c) and the error is logged, once.
 */
bool storage_gate_closed (struct plugin_ctx *ctx)
{
    return ctx->rabbit_scheduling && !ctx->storage_held;
}

int keep_from_scheduler (struct dwsjob *st, flux_plugin_arg_t *args)
{
    struct plugin_ctx *ctx = st->ctx;
    char idbuf[32];
    int rc;

    f58 (st->id, idbuf, sizeof (idbuf));
    if (st->state == FLUX_JOB_STATE_SCHED) {
        if (!ctx->order_warned) {
            flux_log (ctx->h, LOG_ERR,
                      "dws: job %s reached SCHED before the flux-dws service held the"
                      " storage of jobs released early: a plugin loaded after"
                      " dws-jobtap.so gave it a priority (load dws-jobtap.so after every"
                      " priority plugin); held at priority 0 until the service does",
                      idbuf);
            ctx->order_warned = true;
        }
        rc = flux_plugin_arg_pack (args, FLUX_PLUGIN_ARG_OUT, "{s:I}",
                                   "priority", (json_int_t)FLUX_JOB_PRIORITY_MIN);
    }
    else
        rc = flux_jobtap_priority_unavail (ctx->p, args);
    if (rc < 0) {
        flux_log (ctx->h, LOG_ERR, "dws: job %s: keeping it from the scheduler: %s",
                  idbuf, flux_plugin_arg_strerror (args));
        return -1;
    }
    if (!st->storage_told) {
        flux_log (ctx->h, LOG_INFO,
                  "dws: job %s: kept from the scheduler until the flux-dws service has"
                  " held the storage of jobs released early", idbuf);
        if (flux_jobtap_event_post_pack (ctx->p, st->id, "dws-waiting",
                                         "{s:s}", "reason", STORAGE_REASON) < 0)
            flux_log_error (ctx->h, "dws: job %s: posting dws-waiting", idbuf);
        st->storage_told = true;
    }
    start_wait (st);
    return 0;
}

/* storage-held: the service has held down again every ssd part a job released early still
 * holds (after its first list of the workflows): the kept jobs go on to the scheduler.
 */
int storage_held_method (struct plugin_ctx *ctx,
                         const flux_msg_t *msg,
                         const char *method,
                         json_t *payload,
                         json_t **response,
                         struct rpc_error *err)
{
    if (!ctx->storage_held) {
        int kept = 0;
        ctx->storage_held = true;
        for (struct dwsjob *st = ctx->jobs; st; st = st->next) {
            if (st->storage_told && st->state != FLUX_JOB_STATE_DEPEND) {
                cancel_wait (st);
                kept++;
            }
        }
        if (ctx->rabbit_scheduling)
            flux_log (ctx->h, LOG_INFO,
                      "dws: the flux-dws service holds the storage of jobs released"
                      " early: %d #DW job(s) go on to the scheduler", kept);
        if (kept > 0 && flux_jobtap_reprioritize_all (ctx->p) < 0)
            return fail (err, errno, "job-manager.dws.storage-held: reprioritizing: %s",
                         strerror (errno));
    }
    *response = json_object ();
    return 0;
}
