/************************************************************\
 * This file is part of flux-dws, the Flux adapter for HPE DWS.
 * For details, see doc/protocol.rst and doc/architecture.rst.
 *
 * SPDX-License-Identifier: LGPL-3.0-only
\************************************************************/

/* dws-env: give every task of a #DW job the environment of its DWS workflow.
 *
 * When the workflow's PreRun is ready, the dws jobtap plugin posts a
 * `dws-environment` event {"env": {NAME: VALUE, ...}} on the job and then
 * finishes its prolog (doc/protocol.rst).  In shell.init this plugin reads the
 * job's eventlog and puts the LAST dws-environment event's variables into the
 * job environment, before any task exists, so every task sees them at start.
 *
 * Why a watch and not a single lookup: the job-manager sends the exec start
 * request as soon as it processes the prolog-finish event, but commits eventlog
 * entries to the KVS in a delayed batch, so the shell often starts before the
 * dws-environment event (posted just before prolog-finish) is readable.  The
 * eventlog is committed in order, so the plugin reads it until it shows the
 * point that let this shell start:
 *   - "prolog-finish" of the dws prolog, for a job the dws jobtap plugin holds
 *     (it added the "dws" dependency, long before "alloc");
 *   - "alloc", for a #DW job no dws jobtap plugin holds (a test, or a
 *     misconfigured instance): its dws-environment, if any, came earlier;
 *   - "start" (a shell restarted with running tasks) or a fatal exception.
 * The watch is bounded by the job's own PreRun deadline, as the service recorded
 * it in the job's last dws-state event for PreRun ({"state": "PreRun",
 * "deadline": EPOCH}), plus DEADLINE_GRACE for the service to fail the job: a
 * big job whose eventlog is slow to commit is not cut off by a fixed limit.
 * Until that event is in view (or when PreRun has no timeout) the watch has no
 * limit of its own, and says every NOTICE_INTERVAL that it is still waiting; a
 * fatal exception (the job's time limit, a cancel, the service failing the
 * job) ends it.
 *
 * Only jobs with attributes.system.dw do anything: the check is a lookup in
 * the jobspec the shell already holds, so other jobs pay nothing.
 *
 * Failure policy: a #DW job never runs without its DWS environment.  A
 * dws-environment event that is malformed, a #DW job without the event, and an
 * eventlog that cannot be read all fail shell init with one line naming the
 * fault, so no task starts.
 */
#define FLUX_SHELL_PLUGIN_NAME "dws-env"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <jansson.h>
#include <flux/core.h>
#include <flux/shell.h>

#define ENV_EVENT "dws-environment"
#define DWS_ACTION "dws" /* the jobtap plugin's dependency and prolog name */

/* Seconds past the job's PreRun deadline to wait for the eventlog to reach the
 * point that started this shell (the service fails the job at the deadline). */
static const double DEADLINE_GRACE = 60.;
/* Seconds between "still waiting" notices while no deadline bounds the wait. */
static const double NOTICE_INTERVAL = 60.;
/* Seconds to wait for the end of the watch stream after cancelling it. */
static const double CANCEL_TIMEOUT = 5.;

/* What the eventlog has shown so far. */
struct scan {
    bool held;            /* "dependency-add" dws seen: the dws jobtap plugin holds the job */
    bool allocated;       /* "alloc" seen */
    bool prolog_done;     /* "prolog-finish" of the dws prolog seen */
    bool ended;           /* "start" (reattach) or a fatal exception seen */
    double prerun_deadline; /* epoch seconds from dws-state PreRun; 0: none (yet) */
    json_t *env_event;    /* the last dws-environment event (a reference) */
};

/* True once every event posted before this shell's start request is in view. */
static bool scan_complete (const struct scan *scan)
{
    if (scan->ended || scan->prolog_done)
        return true;
    return scan->allocated && !scan->held;
}

static bool is_dws_action (json_t *event)
{
    const char *description = NULL;

    (void)json_unpack (event, "{s:{s:s}}", "context", "description", &description);
    return description && !strcmp (description, DWS_ACTION);
}

static void scan_event (struct scan *scan, const char *line)
{
    json_t *event;
    const char *name;
    int severity = -1;

    if (!(event = json_loads (line, 0, NULL))
        || json_unpack (event, "{s:s}", "name", &name) < 0) {
        shell_warn ("skipping an unreadable job eventlog entry");
        json_decref (event);
        return;
    }
    shell_trace ("job eventlog: %s", name);
    if (!strcmp (name, "alloc"))
        scan->allocated = true;
    else if (!strcmp (name, "dependency-add") && is_dws_action (event))
        scan->held = true;
    else if (!strcmp (name, "prolog-finish") && is_dws_action (event))
        scan->prolog_done = true;
    else if (!strcmp (name, "start"))
        scan->ended = true;
    else if (!strcmp (name, "exception")) {
        (void)json_unpack (event, "{s:{s:i}}", "context", "severity", &severity);
        if (severity == 0)
            scan->ended = true;
    }
    else if (!strcmp (name, "dws-state")) {
        const char *state = NULL;
        double deadline = 0.;
        (void)json_unpack (event,
                           "{s:{s:s s?F}}",
                           "context",
                           "state", &state,
                           "deadline", &deadline);
        if (state && !strcmp (state, "PreRun"))
            scan->prerun_deadline = deadline > 0. ? deadline : 0.;
    }
    else if (!strcmp (name, ENV_EVENT)) {
        json_decref (scan->env_event);
        scan->env_event = json_incref (event);
    }
    json_decref (event);
}

/* Wall-clock seconds since the epoch: the service's deadlines are absolute. */
static double now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* End the watch so no response arrives after the future is gone. */
static void watch_destroy (flux_future_t *f)
{
    const char *line;

    if (flux_job_event_watch_cancel (f) == 0) {
        for (;;) {
            flux_future_reset (f);
            if (flux_future_wait_for (f, CANCEL_TIMEOUT) < 0
                || flux_job_event_watch_get (f, &line) < 0)
                break;
        }
    }
    flux_future_destroy (f);
}

/* Read the job eventlog up to the point that started this shell.
 * Returns 0 once it has, or -1 (logged) when it cannot be read or the wait ran
 * DEADLINE_GRACE past the job's PreRun deadline; either way scan holds what was read.
 */
static int scan_eventlog (flux_shell_t *shell, flux_jobid_t id, struct scan *scan)
{
    flux_t *h = flux_shell_get_flux (shell);
    flux_future_t *f;
    const char *line;
    double started = now ();
    double waited = 0.;
    int rc = 0;

    if (!(f = flux_job_event_watch (h, id, "eventlog", 0))) {
        shell_log_error ("cannot watch the job eventlog: %s", strerror (errno));
        return -1;
    }
    while (!scan_complete (scan)) {
        double wait = NOTICE_INTERVAL;
        if (scan->prerun_deadline > 0.) {
            double left = scan->prerun_deadline + DEADLINE_GRACE - now ();
            if (left <= 0.) {
                shell_log_error ("job eventlog did not reach this shell's start %.0fs"
                                 " past the job's PreRun deadline",
                                 DEADLINE_GRACE);
                rc = -1;
                break;
            }
            if (left < wait)
                wait = left;
        }
        if (flux_future_wait_for (f, wait) < 0) {
            waited = now () - started;
            if (scan->prerun_deadline <= 0.)
                shell_warn ("still waiting for the %s event after %.0fs", ENV_EVENT, waited);
            continue;
        }
        if (flux_job_event_watch_get (f, &line) < 0) {
            if (errno != ENODATA) {
                const char *why = flux_future_error_string (f);
                shell_log_error ("cannot read the job eventlog: %s",
                                 why ? why : strerror (errno));
                rc = -1;
            }
            break;
        }
        scan_event (scan, line);
        flux_future_reset (f);
    }
    watch_destroy (f);
    return rc;
}

/* Check the event's env, then set every variable (none unless all are valid). */
static int apply_env_event (flux_shell_t *shell, json_t *event)
{
    json_t *env = NULL;
    json_t *value;
    const char *name;
    int count = 0;

    (void)json_unpack (event, "{s?{s?o}}", "context", "env", &env);
    if (!json_is_object (env)) {
        shell_log_error ("%s event is malformed: context.env %s; the job cannot get"
                         " its DWS environment",
                         ENV_EVENT,
                         env ? "is not an object" : "is missing");
        return -1;
    }
    json_object_foreach (env, name, value) {
        if (!*name || strchr (name, '=')) {
            shell_log_error ("%s event is malformed: invalid variable name \"%s\";"
                             " the job cannot get its DWS environment",
                             ENV_EVENT,
                             name);
            return -1;
        }
        if (!json_is_string (value)) {
            shell_log_error ("%s event is malformed: env.%s is not a string;"
                             " the job cannot get its DWS environment",
                             ENV_EVENT,
                             name);
            return -1;
        }
    }
    json_object_foreach (env, name, value) {
        if (flux_shell_setenvf (shell, 1, name, "%s", json_string_value (value)) < 0) {
            shell_log_error ("cannot set %s in the job environment: %s",
                             name,
                             strerror (errno));
            return -1;
        }
        count++;
    }
    shell_debug ("set %d DWS variable%s from the %s event",
                 count,
                 count == 1 ? "" : "s",
                 ENV_EVENT);
    return 0;
}

static int dws_env_init (flux_plugin_t *p,
                         const char *topic,
                         flux_plugin_arg_t *args,
                         void *data)
{
    flux_shell_t *shell = flux_plugin_get_shell (p);
    json_int_t id;
    json_t *dw = NULL;
    struct scan scan = { 0 };
    int rc = 0;

    if (!shell)
        return -1;
    if (flux_shell_info_unpack (shell,
                                "{s:I s:{s?{s?{s?o}}}}",
                                "jobid", &id,
                                "jobspec",
                                  "attributes",
                                    "system",
                                      "dw", &dw) < 0) {
        shell_log_error ("cannot read the job's jobspec from shell info");
        return -1;
    }
    if (!dw)
        return 0; /* not a #DW job */

    if (scan_eventlog (shell, (flux_jobid_t)id, &scan) < 0) /* logged */
        rc = -1;
    else if (!scan.env_event) {
        shell_log_error ("#DW job has no %s event: its tasks do not start without"
                         " their DWS environment",
                         ENV_EVENT);
        rc = -1;
    }
    else
        rc = apply_env_event (shell, scan.env_event);
    json_decref (scan.env_event);
    return rc;
}

int flux_plugin_init (flux_plugin_t *p)
{
    if (flux_plugin_set_name (p, FLUX_SHELL_PLUGIN_NAME) < 0
        || flux_plugin_add_handler (p, "shell.init", dws_env_init, NULL) < 0)
        return -1;
    return 0;
}

/*
 * vi:tabstop=4 shiftwidth=4 expandtab
 */
