/************************************************************\
 * This file is part of flux-dws, the Flux adapter for HPE DWS.
 * For details, see doc/protocol.rst and doc/architecture.rst.
 *
 * SPDX-License-Identifier: LGPL-3.0-only
\************************************************************/

/* service.c - the flux-dws service as the plugin sees it: one active service
 * watch, standbys waiting to take over, and its presence (heartbeats); the watch, list
 * and heartbeat methods.
 *
 * Layer 7 of 11 (dws-jobtap.h): may call layers 1-6 only; calls util.c, persistent.c,
 * records.c and holds.c.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "dws-jobtap.h"

static bool promote_standby (struct plugin_ctx *ctx);

static struct watcher *active_service (struct plugin_ctx *ctx)
{
    struct watcher *w = ctx->watchers;
    while (w && !w->service)
        w = w->next;
    return w;
}

/* The request came from the client that opened ``w`` (same first route hop).
 */
static bool same_sender (struct watcher *w, const flux_msg_t *msg)
{
    const char *route = flux_msg_route_first (msg);
    return route && w->sender[0] && streq (route, w->sender);
}

/* The active service ran on this host and its process no longer exists: it is gone
 * for sure, without waiting for three heartbeats of silence.
 */
static bool service_process_gone (struct watcher *w)
{
    char host[256] = "";
    json_int_t pid = 0;
    const char *whost = NULL;

    if (!w->who
        || json_unpack (w->who, "{s:I s:s}", "pid", &pid, "host", &whost) < 0
        || pid <= 0
        || gethostname (host, sizeof (host) - 1) < 0
        || !streq (host, whost))
        return false;
    return kill ((pid_t)pid, 0) < 0 && errno == ESRCH;
}

/* How long the service may stay silent before it counts as gone.
 */
static double presence_timeout (struct plugin_ctx *ctx)
{
    return MISSED_HEARTBEATS * ctx->heartbeat;
}

/* The service showed it is alive (a heartbeat or a service watch): it has
 * presence_timeout() from now to show it again.
 */
void service_alive (struct plugin_ctx *ctx)
{
    if (!ctx->presence || ctx->destroying)
        return;
    flux_watcher_stop (ctx->presence);  // libev timers must be stopped to be reset
    flux_timer_watcher_reset (ctx->presence, presence_timeout (ctx), 0.);
    flux_watcher_start (ctx->presence);
}

/* A service watches: no job waits for it any more, and the next absence is news.
 */
static void service_back (struct plugin_ctx *ctx)
{
    for (struct dwsjob *st = ctx->jobs; st; st = st->next) {
        cancel_wait (st);
        st->waiting_told = false;
    }
}

/* Start ``w``'s stream (watcher_start); a service watcher becomes the active one.
 * On failure ``w`` is destroyed.
 */
static int start_watch (struct plugin_ctx *ctx, struct watcher *w)
{
    if (watcher_start (ctx, w) < 0)
        return -1;
    if (w->service) {
        w->last_heard = reactor_now (ctx);
        json_object_set_new (w->who, "since", json_real (w->last_heard));
        service_back (ctx);
        service_alive (ctx);
    }
    return 0;
}

/* The service is gone (silent for presence_timeout(), or never came since the plugin
 * loaded): drop its watcher, and give every job held in DEPEND what a job entering
 * DEPEND now gets, a dws-waiting event and its service-wait timer.  A job submitted
 * just before the service died saw the stale watcher and got neither.
 */
void presence_expired (flux_reactor_t *r,
                       flux_watcher_t *w,
                       int revents,
                       void *arg)
{
    struct plugin_ctx *ctx = arg;
    char timeout[64], text[256];
    struct watcher *sw = ctx->watchers;
    int told = 0;

    while (sw && !sw->service)
        sw = sw->next;
    format_fsd (presence_timeout (ctx), timeout, sizeof (timeout));
    if (sw) {
        snprintf (text, sizeof (text),
                  "job-manager.dws.watch: no heartbeat from the flux-dws service for %s:"
                  " it is treated as gone",
                  timeout);
        watcher_end (ctx, sw, ETIMEDOUT, text);
    }
    if (promote_standby (ctx))
        return;
    persistent_forget (ctx);  // stale now: jobs are checked at Proposal until it is back
    for (struct dwsjob *st = ctx->jobs; st; st = st->next) {
        if (st->state != FLUX_JOB_STATE_DEPEND || !st->dep_held || st->rebuild_f)
            continue;
        if (!st->waiting_told) {
            tell_waiting (st);
            told += st->waiting_told ? 1 : 0;
        }
        start_wait (st);
    }
    if (sw || told > 0)
        flux_log (ctx->h, LOG_WARNING,
                  "dws: no heartbeat or watch from the flux-dws service for %s"
                  " ([dws] heartbeat x%d): treating it as gone; %d #DW job(s) in DEPEND"
                  " got dws-waiting now, and jobs entering DEPEND get it until a"
                  " service watches again",
                  timeout, MISSED_HEARTBEATS, told);
}

static const char *who_text (json_t *who, char *buf, size_t size)
{
    json_int_t pid = 0;
    const char *host = NULL;

    (void)json_unpack (who, "{s?I s?s}", "pid", &pid, "host", &host);
    if (pid <= 0)
        snprintf (buf, size, "a service that gave no pid");
    else if (host)
        snprintf (buf, size, "pid %lld on %.64s", (long long)pid, host);
    else
        snprintf (buf, size, "pid %lld", (long long)pid);
    return buf;
}

/* The active service is gone: the first standby still heard from takes over.
 * Standbys silent for three heartbeats are dropped (their clients may be gone).
 */
static bool promote_standby (struct plugin_ctx *ctx)
{
    struct watcher *w;
    char who[128];

    while ((w = ctx->standbys)) {
        ctx->standbys = w->next;
        w->next = NULL;
        if (reactor_now (ctx) - w->last_heard > presence_timeout (ctx)) {
            if (flux_respond_error (ctx->h, w->msg, ETIMEDOUT,
                                    "job-manager.dws.watch: standby silent") < 0)
                flux_log_error (ctx->h, "dws: ending a standby watch");
            watcher_destroy (w);
            continue;
        }
        flux_log (ctx->h, LOG_WARNING,
                  "dws: the flux-dws service is gone; the standby (%s) takes over",
                  who_text (w->who, who, sizeof (who)));
        if (start_watch (ctx, w) == 0)
            return true;
    }
    return false;
}

/* The active service's process is gone (see service_process_gone): end its stream
 * and let a standby take over now.
 */
static void check_active (struct plugin_ctx *ctx)
{
    struct watcher *active = active_service (ctx);

    if (active && service_process_gone (active)) {
        watcher_end (ctx, active, ETIMEDOUT,
                     "job-manager.dws.watch: the flux-dws service process is gone");
        if (!promote_standby (ctx))
            service_alive (ctx);  // the presence timer tells DEPEND jobs if none comes
    }
}

int watch_method (struct plugin_ctx *ctx,
                  const flux_msg_t *msg,
                  const char *method,
                  json_t *payload,
                  json_t **response,
                  struct rpc_error *err)
{
    json_t *o = json_object_get (payload, "service");
    bool service = false;
    struct watcher *w;
    struct watcher *active;
    const char *route = flux_msg_route_first (msg);
    json_t *pid = json_object_get (payload, "pid");
    json_t *host = json_object_get (payload, "host");
    char who[128];

    if (!flux_msg_is_streaming (msg))
        return fail (err, EPROTO,
                     "job-manager.dws.watch: a streaming request is required");
    if (o && !json_is_boolean (o))
        return fail (err, EPROTO, "job-manager.dws.watch: service must be true or false");
    service = o && json_is_true (o);

    if (!(w = calloc (1, sizeof (*w)))
        || !(w->sent = json_object ())
        || !(w->who = json_object ())) {
        watcher_destroy (w);
        return fail (err, ENOMEM, "job-manager.dws.watch: out of memory");
    }
    w->msg = flux_msg_incref (msg);
    w->service = service;
    snprintf (w->sender, sizeof (w->sender), "%s", route ? route : "");
    if (json_is_integer (pid) && json_integer_value (pid) > 0)
        json_object_set (w->who, "pid", pid);
    if (json_is_string (host) && json_string_length (host) > 0
        && json_string_length (host) < 256)
        json_object_set (w->who, "host", host);
    *response = NULL;  // answered here; the stream stays open

    if (!service) {
        (void)start_watch (ctx, w);
        return 0;
    }
    check_active (ctx);
    if ((active = active_service (ctx)) && same_sender (active, msg))
        watcher_end (ctx, active, ECANCELED,
                     "job-manager.dws.watch: replaced by this client's new watch");
    else if (active) {
        /* One active service: this one waits as a standby, and takes over when the
         * active one is gone (three heartbeats of silence, or its process gone). */
        w->last_heard = reactor_now (ctx);
        struct watcher **tail = &ctx->standbys;
        while (*tail)
            tail = &(*tail)->next;
        *tail = w;
        if (flux_respond_pack (ctx->h, msg, "{s:b s:O}",
                               "standby", 1, "active", active->who) < 0)
            flux_log_error (ctx->h, "dws: responding to a standby watch");
        /* ... and the active one learns that a standby waits (no records). */
        if (flux_respond_pack (ctx->h, active->msg, "{s:b s:[] s:O}",
                               "snapshot", 0, "jobs", "standby_waiting", w->who) < 0)
            flux_log_error (ctx->h, "dws: telling the active service of a standby");
        flux_log (ctx->h, LOG_INFO,
                  "dws: a second flux-dws service (%s) waits as a standby",
                  who_text (w->who, who, sizeof (who)));
        return 0;
    }
    (void)start_watch (ctx, w);
    return 0;
}

int list_method (struct plugin_ctx *ctx,
                 const flux_msg_t *msg,
                 const char *method,
                 json_t *payload,
                 json_t **response,
                 struct rpc_error *err)
{
    json_t *records = all_records (ctx);
    struct watcher *active = active_service (ctx);
    json_t *described = NULL;
    int standbys = 0;

    for (struct watcher *w = ctx->standbys; w; w = w->next)
        standbys++;
    if (active
        && (!(described = json_deep_copy (active->who))
            || json_object_set_new (described, "heard",
                                    json_real (reactor_now (ctx) - active->last_heard)) < 0
            || json_object_set (described, "report",
                                active->report ? active->report : json_null ()) < 0)) {
        json_decref (described);
        json_decref (records);
        return fail (err, ENOMEM, "job-manager.dws.list: out of memory");
    }
    if (!records
        || !(*response = json_pack ("{s:o s:{s:o s:i s:o}}",
                                    "jobs", records,
                                    "service",
                                      "active", described ? described : json_null (),
                                      "standbys", standbys,
                                      "persistent",
                                      ctx->persistent
                                        ? json_integer (json_object_size (ctx->persistent))
                                        : json_null ())))
        return fail (err, ENOMEM, "job-manager.dws.list: out of memory");
    return 0;
}

int heartbeat_method (struct plugin_ctx *ctx,
                      const flux_msg_t *msg,
                      const char *method,
                      json_t *payload,
                      json_t **response,
                      struct rpc_error *err)
{
    struct watcher *active = active_service (ctx);
    json_t *report = json_object_get (payload, "report");

    if (active && (same_sender (active, msg) || !active->sender[0])) {
        service_alive (ctx);
        active->last_heard = reactor_now (ctx);
        if (json_is_object (report)) {
            json_decref (active->report);
            active->report = json_incref (report);
        }
    }
    else {
        for (struct watcher *w = ctx->standbys; w; w = w->next) {
            if (same_sender (w, msg))
                w->last_heard = reactor_now (ctx);
        }
        check_active (ctx);
    }
    *response = json_object ();
    return 0;
}

// vi:ts=4 sw=4 expandtab
