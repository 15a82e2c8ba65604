/************************************************************\
 * This file is part of flux-dws, the Flux adapter for HPE DWS.
 * For details, see doc/protocol.rst and doc/architecture.rst.
 *
 * SPDX-License-Identifier: LGPL-3.0-only
\************************************************************/

/* job.c - what the plugin knows about one #DW job (struct dwsjob), derived from
 * the job's eventlog, and rebuilding it from the eventlog for a job the plugin did not
 * see enter its current state (plugin loaded again, job-manager restarted).
 *
 * Layer 5 of 11 (dws-jobtap.h): may call layers 1-4 only; calls util.c, rabbits.c and
 * records.c.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dws-jobtap.h"

/* The job-manager hands jobtap plugins R without its "scheduling" key (redacted), so the
 * rabbits and ssd vertices Fluxion wrote into the JGF are read from the job's R in the KVS.
 */
static void full_R_continuation (flux_future_t *f, void *arg)
{
    struct dwsjob *st = arg;
    const char *text = NULL;
    json_t *R;

    if (flux_kvs_lookup_get (f, &text) == 0 && text && (R = json_loads (text, 0, NULL))) {
        json_t *rabbits = rabbits_from_R (R);
        json_t *ssd = ssd_from_R (R);
        if (json_object_size (rabbits) > 0 || json_array_size (ssd) > 0) {
            json_decref (st->rabbits);
            st->rabbits = rabbits;
            json_decref (st->ssd);
            st->ssd = ssd;
            job_changed (st);
        }
        else {
            json_decref (rabbits);
            json_decref (ssd);
        }
        json_decref (R);
    }
    flux_future_destroy (f);
    st->R_f = NULL;
}

static void lookup_full_R (struct dwsjob *st)
{
    char key[128];

    if (st->R_f || !st->ctx || flux_job_kvs_key (key, sizeof (key), st->id, "R") < 0)
        return;
    if (!(st->R_f = flux_kvs_lookup (st->ctx->h, NULL, 0, key))
        || flux_future_then (st->R_f, -1., full_R_continuation, st) < 0) {
        flux_future_destroy (st->R_f);
        st->R_f = NULL;
    }
}

/* Refresh what the callback args say now: the job's state and, once allocated, hosts.
 */
void update_from_args (struct dwsjob *st, flux_plugin_arg_t *args)
{
    int state;
    json_t *R = NULL;
    json_t *jobspec = NULL;
    json_t *resources;

    if (flux_plugin_arg_unpack (args, FLUX_PLUGIN_ARG_IN,
                                "{s:i s?o s?o}", "state", &state, "R", &R,
                                "jobspec", &jobspec) == 0) {
        st->state = state;
        if (R && json_array_size (st->hosts) == 0) {
            json_t *hosts = hosts_from_R (R);
            if (hosts) {
                json_decref (st->hosts);
                st->hosts = hosts;
                json_decref (st->rabbits);
                st->rabbits = rabbits_from_R (R);
                json_decref (st->ssd);
                st->ssd = ssd_from_R (R);
                if (json_object_size (st->rabbits) == 0)
                    lookup_full_R (st);
            }
        }
        if (jobspec && (resources = json_object_get (jobspec, "resources"))
            && !json_equal (resources, st->resources)) {
            json_decref (st->resources);
            st->resources = json_deep_copy (resources);
        }
    }
}

static void reset_derived (struct dwsjob *st)
{
    json_object_clear (st->dws);
    json_decref (st->exception);
    st->exception = NULL;
    st->started = st->released = st->shells_gone = false;
    st->t_start = 0.;
    st->dep_used = st->dep_held = false;
    st->prologs = 0;
    st->prolog_active = st->prolog_started = false;
    st->epilog_active = st->epilog_started = false;
    st->prolog_requested = st->epilog_requested = false;
    st->waiting_told = false;
}

/* Fold one eventlog entry into what the plugin knows about the job.
 */
void apply_entry (struct dwsjob *st, json_t *entry)
{
    const char *name = NULL;
    json_t *context = NULL;
    const char *desc = NULL;
    bool ours;

    if (json_unpack (entry, "{s:s s?o}", "name", &name, "context", &context) < 0)
        return;
    if (context)
        (void)json_unpack (context, "{s?s}", "description", &desc);
    ours = streq (desc, PLUGIN_NAME);

    if (strncmp (name, EVENT_PREFIX, strlen (EVENT_PREFIX)) == 0) {
        json_object_set_new (st->dws, name,
                             context ? json_deep_copy (context) : json_object ());
        st->waiting_told = streq (name, "dws-waiting");
    }
    else if (streq (name, "exception")) {
        int severity = -1;
        const char *type = NULL, *note = "";
        if (!st->exception
            && json_unpack (context, "{s:i s:s s?s}",
                            "severity", &severity,
                            "type", &type,
                            "note", &note) == 0
            && severity == 0)
            st->exception = json_pack ("{s:s s:i s:s}",
                                       "type", type,
                                       "severity", severity,
                                       "note", note);
    }
    else if (streq (name, "start")) {
        st->started = true;
        (void)json_unpack (entry, "{s:F}", "timestamp", &st->t_start);
    }
    else if (streq (name, "release")) {
        int final = 0;
        if (json_unpack (context, "{s:b}", "final", &final) == 0 && final)
            st->released = true;
    }
    else if (streq (name, "dependency-add") && ours)
        st->dep_used = st->dep_held = true;
    else if (streq (name, "dependency-remove") && ours)
        st->dep_held = false;
    else if (streq (name, "prolog-start")) {
        st->prologs++;
        if (ours) {
            st->prolog_active = st->prolog_started = true;
            st->prolog_requested = false;
        }
    }
    else if (streq (name, "prolog-finish")) {
        if (st->prologs > 0)
            st->prologs--;
        if (ours)
            st->prolog_active = false;
    }
    else if (streq (name, "epilog-start") && ours) {
        st->epilog_active = st->epilog_started = true;
        st->epilog_requested = false;
    }
    else if (streq (name, "epilog-finish") && ours)
        st->epilog_active = false;
}

static void rebuild_done (struct dwsjob *st)
{
    struct plugin_ctx *ctx = st->ctx;

    flux_future_destroy (st->rebuild_f);
    st->rebuild_f = NULL;
    json_decref (st->seen);
    st->seen = NULL;
    if (--ctx->rebuilding == 0)
        schedule_soon (ctx);  // answer the requests that waited for the rebuild
}

/* Take the job out of the plugin's list; it no longer touches the plugin.
 */
void dwsjob_detach (struct dwsjob *st)
{
    struct plugin_ctx *ctx = st->ctx;

    if (!ctx)
        return;
    if (st->rebuild_f)
        rebuild_done (st);
    flux_watcher_destroy (st->wait_timer);  // the service-wait timer (holds.c), if any
    st->wait_timer = NULL;
    if (st->prev)
        st->prev->next = st->next;
    else if (ctx->jobs == st)
        ctx->jobs = st->next;
    if (st->next)
        st->next->prev = st->prev;
    st->prev = st->next = NULL;
    st->ctx = NULL;
}

void dwsjob_destroy (struct dwsjob *st)
{
    if (st) {
        int saved_errno = errno;
        dwsjob_detach (st);
        json_decref (st->attributes);
        json_decref (st->hosts);
        json_decref (st->rabbits);
        json_decref (st->ssd);
        flux_future_destroy (st->R_f);
        json_decref (st->resources);
        json_decref (st->dws);
        json_decref (st->exception);
        free (st);
        errno = saved_errno;
    }
}

struct dwsjob *dwsjob_create (struct plugin_ctx *ctx,
                              flux_jobid_t id,
                              json_int_t userid,
                              double t_submit,
                              json_t *system)
{
    struct dwsjob *st = calloc (1, sizeof (*st));
    struct dwsjob **link, *prev = NULL;
    json_t *value;

    if (!st)
        return NULL;
    st->ctx = ctx;
    st->id = id;
    st->userid = userid;
    st->t_submit = t_submit;
    st->state = FLUX_JOB_STATE_NEW;
    if (!(st->attributes = json_object ())
        || !(st->hosts = json_array ())
        || !(st->rabbits = json_object ())
        || !(st->ssd = json_array ())
        || !(st->resources = json_array ())
        || !(st->dws = json_object ())) {
        dwsjob_destroy (st);
        return NULL;
    }
    if ((value = json_object_get (system, "dw")))
        json_object_set_new (st->attributes, "dw", json_deep_copy (value));
    if ((value = json_object_get (system, "dw_timeout")))
        json_object_set_new (st->attributes, "dw_timeout", json_deep_copy (value));
    if ((value = json_object_get (system, "dw_failure_tolerance")))
        json_object_set_new (st->attributes,
                             "dw_failure_tolerance",
                             json_deep_copy (value));
    if ((value = json_object_get (system, "dw_release")))
        json_object_set_new (st->attributes, "dw_release", json_deep_copy (value));
    /* the job's own constraints, which [dws] soft-drain extends at the release */
    if ((value = json_object_get (system, "constraints")))
        json_object_set_new (st->attributes, "constraints", json_deep_copy (value));

    /* Keep ctx->jobs sorted by id, so snapshots list jobs in submit order. */
    link = &ctx->jobs;
    while (*link && (*link)->id < id) {
        prev = *link;
        link = &(*link)->next;
    }
    st->next = *link;
    st->prev = prev;
    if (*link)
        (*link)->prev = st;
    *link = st;
    return st;
}

struct dwsjob *current_job (flux_plugin_t *p)
{
    return flux_jobtap_job_aux_get (p, FLUX_JOBTAP_CURRENT_JOB, AUX_KEY);
}

/* The entries seen live while rebuilding that the eventlog read does not have yet.
 * Live entries are a contiguous run of the eventlog starting where the plugin
 * subscribed; find how many of them the read already contains.
 */
static size_t seen_overlap (json_t *eventlog, json_t *seen)
{
    size_t n = json_array_size (eventlog);
    size_t m = json_array_size (seen);
    size_t k = n > m ? n - m : 0;

    for (; k < n; k++) {
        size_t j;
        for (j = 0; k + j < n; j++) {
            if (!json_equal (json_array_get (eventlog, k + j), json_array_get (seen, j)))
                break;
        }
        if (k + j == n)
            return n - k;
    }
    return 0;
}

static void rebuild_continuation (flux_future_t *f, void *arg)
{
    struct dwsjob *st = arg;
    struct plugin_ctx *ctx = st->ctx;
    json_t *eventlog = NULL;
    char idbuf[32];
    size_t index;
    json_t *entry;

    reset_derived (st);
    if (flux_rpc_get_unpack (f, "{s:o}", "eventlog", &eventlog) < 0) {
        flux_log (ctx->h, LOG_ERR,
                  "dws: job %s: reading its eventlog to rebuild the plugin's state: %s;"
                  " its record shows only the events seen since the plugin loaded",
                  f58 (st->id, idbuf, sizeof (idbuf)),
                  future_strerror (f, errno));
        json_array_foreach (st->seen, index, entry)
            apply_entry (st, entry);
    }
    else {
        size_t overlap = seen_overlap (eventlog, st->seen);
        json_array_foreach (eventlog, index, entry)
            apply_entry (st, entry);
        json_array_foreach (st->seen, index, entry) {
            if (index >= overlap)
                apply_entry (st, entry);
        }
    }
    rebuild_done (st);

    flux_jobid_t id = st->id;
    flux_plugin_arg_t *args = flux_plugin_arg_create ();
    if (!args || flux_jobtap_call (ctx->p, id, RECONCILE_TOPIC, args) < 0)
        flux_log_error (ctx->h, "dws: job %s: reconciling after the rebuild",
                        f58 (id, idbuf, sizeof (idbuf)));
    flux_plugin_arg_destroy (args);
    /* reconcile_cb may have made the job inactive (and freed st): look it up */
    if ((st = flux_jobtap_job_aux_get (ctx->p, id, AUX_KEY)))
        job_changed (st);
}

/* A job the plugin did not see enter its current state: read its eventlog.
 * Until the answer comes (one round trip), requests wait in ctx->queued; a job that
 * changes state meanwhile is handled with what is known since the load, plus the
 * job-manager's own account of whether its tasks started.
 */
void start_rebuild (struct dwsjob *st)
{
    struct plugin_ctx *ctx = st->ctx;
    char idbuf[32];

    if (!(st->seen = json_array ())
        || !(st->rebuild_f = flux_rpc_pack (ctx->h, "job-manager.getattr",
                                            FLUX_NODEID_ANY, 0,
                                            "{s:I s:[s]}",
                                            "id", (json_int_t)st->id,
                                            "attrs", "eventlog"))
        || flux_future_then (st->rebuild_f, -1., rebuild_continuation, st) < 0) {
        flux_log_error (ctx->h, "dws: job %s: requesting its eventlog",
                        f58 (st->id, idbuf, sizeof (idbuf)));
        flux_future_destroy (st->rebuild_f);
        st->rebuild_f = NULL;
        json_decref (st->seen);
        st->seen = NULL;
        return;
    }
    ctx->rebuilding++;
}

// vi:ts=4 sw=4 expandtab
