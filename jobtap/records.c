/************************************************************\
 * This file is part of flux-dws, the Flux adapter for HPE DWS.
 * For details, see doc/protocol.rst and doc/architecture.rst.
 *
 * SPDX-License-Identifier: LGPL-3.0-only
\************************************************************/

/* records.c - the record protocol: job records (doc/protocol.rst, Job records)
 * and the watch streams that get them, each sent only the records that changed.
 *
 * Layer 4 of 11 (dws-jobtap.h): may call layers 1-3 only; calls util.c.
 */

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "dws-jobtap.h"

/* The phase a job's record says (doc/protocol.rst, Job records).
 */
static const char *job_phase (struct dwsjob *st)
{
    if (st->state == FLUX_JOB_STATE_INACTIVE)
        return "gone";
    if (st->prologs > 0)
        return "prolog";
    /* A job that ran is held from CLEANUP on (its epilog starts at "finish"), but it is
     * in phase epilog, where the service tears its storage down, only once its shells
     * are gone: at "release", or when it started in an earlier instance.
     */
    if (st->state == FLUX_JOB_STATE_CLEANUP
        && (st->epilog_started || st->epilog_requested)
        && (!st->started || st->released || st->shells_gone))
        return "epilog";
    if (st->started)
        return "run";
    if (st->state == FLUX_JOB_STATE_RUN)  // once the dws prolog finished, the tasks are starting
        return st->prolog_started ? "run" : "prolog";
    if (st->state == FLUX_JOB_STATE_DEPEND && st->dep_held)
        return "depend";
    return "sched";
}

/* The job as the plugin describes it to watchers (doc/protocol.rst, Job records).
 * Deep copies, so a record already sent never changes under a watcher.
 */
static json_t *job_record (struct dwsjob *st)
{
    return json_pack ("{s:I s:I s:f s:s s:o s:o s:o s:o s:o s:b s:o s:o}",
                      "id", (json_int_t)st->id,
                      "userid", st->userid,
                      "t_submit", st->t_submit,
                      "phase", job_phase (st),
                      "attributes", json_deep_copy (st->attributes),
                      "hosts", json_deep_copy (st->hosts),
                      "rabbits", json_deep_copy (st->rabbits),
                      "ssd", json_deep_copy (st->ssd),
                      "resources", json_deep_copy (st->resources),
                      "started", st->started,
                      "exception", st->exception ? json_deep_copy (st->exception)
                                                 : json_null (),
                      "dws", json_deep_copy (st->dws));
}

void watcher_destroy (struct watcher *w)
{
    if (w) {
        flux_msg_decref (w->msg);
        json_decref (w->sent);
        json_decref (w->who);
        json_decref (w->report);
        free (w);
    }
}

/* Whether a service watches (the active one: standbys are not in ctx->watchers).
 */
bool service_connected (struct plugin_ctx *ctx)
{
    for (struct watcher *w = ctx->watchers; w; w = w->next) {
        if (w->service)
            return true;
    }
    return false;
}

/* End a watch stream with an error response and forget it.
 */
void watcher_end (struct plugin_ctx *ctx,
                  struct watcher *target,
                  int errnum,
                  const char *text)
{
    struct watcher **link = &ctx->watchers;

    while (*link && *link != target)
        link = &(*link)->next;
    if (!*link) {
        link = &ctx->standbys;
        while (*link && *link != target)
            link = &(*link)->next;
    }
    if (*link)
        *link = target->next;
    if (flux_respond_error (ctx->h, target->msg, errnum, text) < 0)
        flux_log_error (ctx->h, "dws: ending a watch stream");
    watcher_destroy (target);
}

static int id_compare (const void *a, const void *b)
{
    json_int_t x = *(const json_int_t *)a;
    json_int_t y = *(const json_int_t *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

/* Send each watcher the records that changed since it last heard of them (from
 * soon_cb, on the reactor loop after job_changed).
 */
void flush_dirty (struct plugin_ctx *ctx)
{
    size_t n = json_object_size (ctx->dirty);
    json_int_t *ids;
    const char *key;
    json_t *value;
    size_t i = 0;

    if (n == 0)
        return;
    if (!(ids = calloc (n, sizeof (*ids)))) {
        flux_log_error (ctx->h, "dws: flushing job records");
        return;
    }
    json_object_foreach (ctx->dirty, key, value)
        ids[i++] = strtoll (key, NULL, 10);
    qsort (ids, n, sizeof (*ids), id_compare);

    for (struct watcher *w = ctx->watchers; w; w = w->next) {
        json_t *changed = json_array ();
        for (i = 0; i < n && changed; i++) {
            char idstr[32];
            snprintf (idstr, sizeof (idstr), "%lld", (long long)ids[i]);
            json_t *record = json_object_get (ctx->dirty, idstr);
            json_t *last = json_object_get (w->sent, idstr);
            const char *phase = json_string_value (json_object_get (record, "phase"));
            bool gone = streq (phase, "gone");
            if ((last && json_equal (record, last)) || (!last && gone))
                continue;
            json_array_append (changed, record);
            if (gone)
                json_object_del (w->sent, idstr);
            else
                json_object_set (w->sent, idstr, record);
        }
        if (json_array_size (changed) > 0
            && flux_respond_pack (ctx->h, w->msg, "{s:b s:O}",
                                  "snapshot", 0, "jobs", changed) < 0)
            flux_log_error (ctx->h, "dws: sending job records to a watcher");
        json_decref (changed);
    }
    free (ids);
    json_object_clear (ctx->dirty);
}

void schedule_soon (struct plugin_ctx *ctx)
{
    if (ctx->soon && !ctx->destroying && !flux_watcher_is_active (ctx->soon)) {
        flux_timer_watcher_reset (ctx->soon, 0., 0.);
        flux_watcher_start (ctx->soon);
    }
}

/* The job's record changed: watchers hear of it on the next reactor loop.
 */
void job_changed (struct dwsjob *st)
{
    struct plugin_ctx *ctx = st->ctx;
    char idstr[32];
    json_t *record;

    if (!ctx->watchers || st->rebuild_f || st->state == FLUX_JOB_STATE_NEW)
        return;
    snprintf (idstr, sizeof (idstr), "%ju", (uintmax_t)st->id);
    if (!(record = job_record (st))
        || json_object_set_new (ctx->dirty, idstr, record) < 0) {
        flux_log_error (ctx->h, "dws: recording a job change");
        return;
    }
    schedule_soon (ctx);
}

/* Every held job's record, in job id order (the snapshot).
 */
json_t *all_records (struct plugin_ctx *ctx)
{
    json_t *records = json_array ();

    for (struct dwsjob *st = ctx->jobs; st && records; st = st->next) {
        if (st->state == FLUX_JOB_STATE_NEW || st->state == FLUX_JOB_STATE_INACTIVE)
            continue;
        json_array_append_new (records, job_record (st));
    }
    return records;
}

/* Start ``w``'s stream with the snapshot and add it to the watchers (a service's becomes
 * the active one: service.c's start_watch).  On failure ``w`` is destroyed.
 */
int watcher_start (struct plugin_ctx *ctx, struct watcher *w)
{
    json_t *records;
    size_t index;
    json_t *record;

    if (!(records = all_records (ctx))) {
        flux_log (ctx->h, LOG_ERR, "dws: watch: out of memory");
        watcher_destroy (w);
        return -1;
    }
    json_array_foreach (records, index, record) {
        char idstr[32];
        json_int_t id = json_integer_value (json_object_get (record, "id"));
        snprintf (idstr, sizeof (idstr), "%lld", (long long)id);
        json_object_set (w->sent, idstr, record);
    }
    if (flux_respond_pack (ctx->h, w->msg, "{s:b s:o}",
                           "snapshot", 1, "jobs", records) < 0) {
        flux_log_error (ctx->h, "dws: responding to watch");
        watcher_destroy (w);
        return -1;
    }
    w->next = ctx->watchers;
    ctx->watchers = w;
    return 0;
}

// vi:ts=4 sw=4 expandtab
