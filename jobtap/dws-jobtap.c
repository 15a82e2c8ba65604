/************************************************************\
 * This file is part of flux-dws, the Flux adapter for HPE DWS.
 * For details, see doc/protocol.rst and doc/architecture.rst.
 *
 * SPDX-License-Identifier: LGPL-3.0-only
\************************************************************/

/* dws-jobtap.c - the dws jobtap plugin: hold #DW jobs for the flux-dws service.
 *
 * The plugin holds each job whose jobspec has attributes.system.dw at three points:
 * the dependency "dws" (DEPEND), the prolog action "dws" and the epilog action "dws".
 * It never talks to Kubernetes and decides nothing: it describes the jobs it holds as
 * job records and does what the flux-dws service asks over job-manager.dws.* requests.
 * doc/protocol.rst is the contract; flux_dws/testing/fakeflux/plugin.py is the same
 * plugin in Python, and these files follow it call for call.
 *
 * Everything the plugin knows about a job is derived from the job's eventlog, so a
 * plugin that is removed and loaded again (or a restarted job-manager) rebuilds its
 * state by reading each held job's eventlog (job-manager.getattr) before it answers
 * any request.
 *
 * Jobtap plugins never see client disconnects, so the service proves it is alive with
 * a heartbeat request every [dws] heartbeat (the service reads the same key); after
 * three heartbeats without a heartbeat or a watch request, the service counts as gone:
 * its watcher is dropped, every job held in DEPEND that has not been told since the
 * service left gets dws-waiting (and its service-wait timer), and so does every job
 * entering DEPEND until a service watches again.  One service is active at a time: a
 * service watch arriving while one is active waits as a standby and gets the snapshot
 * when the active one is gone (three silent heartbeats, or at once when its process on
 * this host no longer exists).
 *
 * Use:    flux jobtap load /path/to/dws-jobtap.so   (it takes no options)
 *         or [job-manager] plugins = [ { load = "dws-jobtap.so" } ]
 * Remove: flux jobtap remove dws-jobtap.so   (jobtap names plugins by file name)
 * Config: [dws] service-wait = "1h"   (how long a #DW job may wait for the service
 *         before it gets a dws exception; unset: forever)
 *         [dws] heartbeat = "10s"     (the service's heartbeat period; finite, > 0)
 *
 * Layer 11 of 11 (dws-jobtap.h), the top: may call any layer; calls util.c,
 * persistent.c, records.c, job.c, holds.c, service.c, save.c and dispatch.c.
 */

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dws-jobtap.h"

static int validate_cb (flux_plugin_t *p,
                        const char *topic,
                        flux_plugin_arg_t *args,
                        void *arg)
{
    struct plugin_ctx *ctx = arg;
    char buf[600];
    json_t *system = args_system (args);
    json_int_t userid = -1;
    const char *problem = shallow_check (system, buf, sizeof (buf));

    if (!problem
        && flux_plugin_arg_unpack (args, FLUX_PLUGIN_ARG_IN, "{s:I}", "userid", &userid) == 0)
        problem = persistent_check (ctx, system, userid, buf, sizeof (buf));

    if (problem)
        return flux_jobtap_reject_job (p, args, "%s", problem);
    return 0;
}

/* job.new: a new job, or (state past NEW) a job active when the plugin was loaded or
 * the job-manager restarted.
 */
static int new_cb (flux_plugin_t *p,
                   const char *topic,
                   flux_plugin_arg_t *args,
                   void *arg)
{
    struct plugin_ctx *ctx = arg;
    json_t *system = args_system (args);
    json_int_t id;
    json_int_t userid;
    double t_submit;
    int state;
    struct dwsjob *st;

    if (!is_dw_system (system))
        return 0;
    if (flux_plugin_arg_unpack (args, FLUX_PLUGIN_ARG_IN,
                                "{s:I s:I s:f s:i}",
                                "id", &id,
                                "userid", &userid,
                                "t_submit", &t_submit,
                                "state", &state) < 0) {
        flux_log (ctx->h, LOG_ERR, "dws: job.new: %s", flux_plugin_arg_strerror (args));
        return -1;
    }
    if (!(st = dwsjob_create (ctx, id, userid, t_submit, system))
        || flux_jobtap_job_aux_set (p, FLUX_JOBTAP_CURRENT_JOB, AUX_KEY, st,
                                    (flux_free_f)dwsjob_destroy) < 0) {
        dwsjob_destroy (st);
        flux_log_error (ctx->h, "dws: job.new");
        return -1;
    }
    update_from_args (st, args);
    if (flux_jobtap_job_subscribe (p, FLUX_JOBTAP_CURRENT_JOB) < 0)
        flux_log_error (ctx->h, "dws: job.new: subscribing to job events");
    if (state != FLUX_JOB_STATE_NEW)
        start_rebuild (st);
    return 0;
}

static int state_cb (flux_plugin_t *p,
                     const char *topic,
                     flux_plugin_arg_t *args,
                     void *arg)
{
    struct dwsjob *st = current_job (p);

    if (!st)
        return 0;
    update_from_args (st, args);
    switch (st->state) {
        case FLUX_JOB_STATE_DEPEND:
            if (!st->rebuild_f)  // replayed on load: reconcile_cb decides
                hold_in_depend (st);
            break;
        case FLUX_JOB_STATE_PRIORITY:
        case FLUX_JOB_STATE_SCHED:  // SCHED: a later plugin gave it a priority anyway
            if (storage_gate_closed (st->ctx))
                (void)keep_from_scheduler (st, args);
            break;
        case FLUX_JOB_STATE_RUN:
            start_prolog (st);
            break;
        case FLUX_JOB_STATE_CLEANUP:
            cancel_wait (st);
            if (st->rebuild_f) {
                /* History still unread: what is known since load, plus the
                 * job-manager's own account of whether the tasks started. */
                json_t *end = NULL;
                const char *name = NULL;
                (void)flux_plugin_arg_unpack (args, FLUX_PLUGIN_ARG_IN,
                                              "{s?o}", "end_event", &end);
                (void)json_unpack (end, "{s:s}", "name", &name);
                if (streq (name, "finish")
                    || flux_jobtap_job_event_posted (p, st->id, "start") == 1)
                    st->started = true;
            }
            /* Hold the job from here whatever follows (a release may never come):
             * job_phase() says "epilog" only once its shells are gone. */
            note_shells_gone (st);
            if (st->prologs == 0 && !st->prolog_requested)
                start_epilog (st);
            break;
        case FLUX_JOB_STATE_INACTIVE:
            cancel_wait (st);
            break;
        default:
            break;
    }
    job_changed (st);
    return 0;
}

/* job.priority.get (flux_jobtap_reprioritize_all, by any plugin): a #DW job is kept from
 * the scheduler while the storage gate is closed (holds.c).
 */
static int priority_get_cb (flux_plugin_t *p,
                            const char *topic,
                            flux_plugin_arg_t *args,
                            void *arg)
{
    struct dwsjob *st = current_job (p);

    if (!st || !storage_gate_closed (st->ctx))
        return 0;
    update_from_args (st, args);
    if (st->state != FLUX_JOB_STATE_PRIORITY && st->state != FLUX_JOB_STATE_SCHED)
        return 0;
    return keep_from_scheduler (st, args);
}

static int event_cb (flux_plugin_t *p,
                     const char *topic,
                     flux_plugin_arg_t *args,
                     void *arg)
{
    struct dwsjob *st = current_job (p);
    json_t *entry = NULL;
    const char *name = NULL;

    if (!st)
        return 0;
    update_from_args (st, args);
    if (flux_plugin_arg_unpack (args, FLUX_PLUGIN_ARG_IN, "{s:o}", "entry", &entry) < 0
        || json_unpack (entry, "{s:s}", "name", &name) < 0)
        return 0;
    if (st->seen)
        json_array_append (st->seen, entry);
    apply_entry (st, entry);

    if (streq (name, "release") && st->released)
        start_epilog (st);  // the tasks are gone: storage may be torn down
    else if (streq (name, "prolog-finish")
             && st->state == FLUX_JOB_STATE_CLEANUP
             && !st->started)
        start_epilog (st);  // exception during the prolog: the job never ran
    job_changed (st);
    return 0;
}

/* [dws] from the instance config, on load and on every flux config reload; a bad value
 * fails the load or the reload with a message naming the key.  The plugin itself takes
 * no options: [dws] is the one place these are set, for the plugin and the service.
 */
static int conf_update_cb (flux_plugin_t *p,
                           const char *topic,
                           flux_plugin_arg_t *args,
                           void *arg)
{
    struct plugin_ctx *ctx = arg;
    json_t *conf = NULL;
    json_t *dws, *value;
    double service_wait = INFINITY;
    double heartbeat = DEFAULT_HEARTBEAT;
    const char *plugin_conf;

    if (flux_plugin_arg_unpack (args, FLUX_PLUGIN_ARG_IN, "{s?o}", "conf", &conf) < 0)
        return flux_jobtap_error (p, args, "dws: %s", flux_plugin_arg_strerror (args));
    dws = json_object_get (conf, "dws");
    if (dws && !json_is_object (dws))
        return flux_jobtap_error (p, args, "dws: [dws] must be a table");
    if ((value = json_object_get (dws, "service-wait"))) {
        if ((service_wait = parse_fsd (value)) < 0)
            return flux_jobtap_error (p, args,
                                      "dws: [dws] service-wait must be a duration"
                                      " (e.g. 30s, 5m, 1.5h, 2d or inf)");
    }
    if ((value = json_object_get (dws, "heartbeat"))) {
        heartbeat = parse_fsd (value);
        if (!(heartbeat > 0) || isinf (heartbeat))
            return flux_jobtap_error (p, args,
                                      "dws: [dws] heartbeat must be a finite duration"
                                      " greater than 0 (e.g. 10s)");
    }
    if ((plugin_conf = flux_plugin_get_conf (p))) {
        json_t *o = json_loads (plugin_conf, 0, NULL);
        const char *key = NULL;
        json_t *v;
        json_object_foreach (o, key, v)
            break;
        if (key) {
            int rc = flux_jobtap_error (p, args,
                                        "dws: unknown plugin option %s: the plugin takes"
                                        " none (set [dws] heartbeat and service-wait in"
                                        " the instance config)", key);
            json_decref (o);
            return rc;
        }
        json_decref (o);
    }
    if ((value = json_object_get (dws, "rabbit-scheduling")) && !json_is_boolean (value))
        return flux_jobtap_error (p, args,
                                  "dws: [dws] rabbit-scheduling must be true or false");
    ctx->rabbit_scheduling = json_is_true (value);
    ctx->service_wait = service_wait;
    if (heartbeat != ctx->heartbeat) {
        ctx->heartbeat = heartbeat;
        if (flux_watcher_is_active (ctx->presence))
            service_alive (ctx);  // the new period counts from now
    }
    return 0;
}

/* The plugin is being unloaded (flux jobtap remove, job-manager shutdown): end every
 * stream and pending request, so no client waits for an answer that never comes.
 */
static void ctx_destroy (struct plugin_ctx *ctx)
{
    if (ctx) {
        int saved_errno = errno;
        ctx->destroying = true;
        while (ctx->watchers)
            watcher_end (ctx, ctx->watchers, ENOSYS, "job-manager.dws: plugin unloaded");
        while (ctx->standbys)
            watcher_end (ctx, ctx->standbys, ENOSYS, "job-manager.dws: plugin unloaded");
        while (ctx->saves) {
            struct pending_save *ps = ctx->saves;
            ctx->saves = ps->next;
            if (flux_respond_error (ctx->h, ps->msg, ENOSYS,
                                    "job-manager.dws: plugin unloaded") < 0)
                flux_log_error (ctx->h, "dws: responding to a pending save");
            save_destroy (ps);
        }
        while (ctx->queued) {
            struct queued_msg *q = ctx->queued;
            ctx->queued = q->next;
            if (flux_respond_error (ctx->h, q->msg, ENOSYS,
                                    "job-manager.dws: plugin unloaded") < 0)
                flux_log_error (ctx->h, "dws: responding to a queued request");
            flux_msg_decref (q->msg);
            free (q);
        }
        /* Job aux items are gone already after flux jobtap remove (jobtap finalizes
         * them first), not at job-manager shutdown: free them now. */
        while (ctx->jobs) {
            struct dwsjob *st = ctx->jobs;
            (void)flux_jobtap_job_aux_delete_value (ctx->p, st->id, st);
            if (ctx->jobs == st)
                dwsjob_detach (st);  // left to the job, which never calls back
        }
        flux_watcher_destroy (ctx->soon);
        flux_watcher_destroy (ctx->presence);
        json_decref (ctx->dirty);
        persistent_forget (ctx);
        free (ctx);
        errno = saved_errno;
    }
}

static const struct flux_plugin_handler tab[] = {
    { "job.validate", validate_cb, NULL },
    { "job.new", new_cb, NULL },
    { "job.state.*", state_cb, NULL },
    { "job.event.*", event_cb, NULL },
    { "job.priority.get", priority_get_cb, NULL },
    { "conf.update", conf_update_cb, NULL },
    { RECONCILE_TOPIC, reconcile_cb, NULL },
    { 0 },
};

int flux_plugin_init (flux_plugin_t *p)
{
    struct plugin_ctx *ctx;
    flux_t *h = flux_jobtap_get_flux (p);
    flux_reactor_t *r;

    if (!h || !(r = flux_get_reactor (h)))
        return -1;
    if (flux_plugin_set_name (p, PLUGIN_NAME) < 0)
        return -1;
    if (!(ctx = calloc (1, sizeof (*ctx))))
        return -1;
    ctx->p = p;
    ctx->h = h;
    ctx->service_wait = INFINITY;
    ctx->heartbeat = DEFAULT_HEARTBEAT;
    ctx->queued_tail = &ctx->queued;
    {
        const char *start = flux_attr_get (h, "broker.starttime");
        ctx->broker_start = start ? strtod (start, NULL) : 0.;
    }
    snprintf (ctx->prefix, sizeof (ctx->prefix), "job-manager.%s.", PLUGIN_NAME);
    if (!(ctx->dirty = json_object ())
        || !(ctx->soon = flux_timer_watcher_create (r, 0., 0., soon_cb, ctx))
        || !(ctx->presence = flux_timer_watcher_create (r, 0., 0., presence_expired,
                                                        ctx))
        || flux_plugin_aux_set (p, NULL, ctx, (flux_free_f)ctx_destroy) < 0) {
        ctx_destroy (ctx);
        return -1;
    }
    for (int i = 0; tab[i].topic; i++) {
        if (flux_plugin_add_handler (p, tab[i].topic, tab[i].cb, ctx) < 0)
            return -1;
    }
    /* One handler for every method, so unknown methods and strangers get the
     * protocol's errors (the owner check is in dispatch()). */
    if (flux_jobtap_service_register_ex (p, "*", FLUX_ROLE_USER, request_cb, ctx) < 0)
        return -1;
    /* A service that never watches after the load counts as gone too, so jobs the
     * plugin finds in DEPEND (rebuilt from their eventlogs) are told. */
    service_alive (ctx);
    return 0;
}

// vi:ts=4 sw=4 expandtab
