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
 *   - "start" (every shell of the job is running, so everything before it is
 *     committed) or a fatal exception.
 *
 * Where it reads.  The watch goes to the shell's own broker, whose job-info
 * and KVS serve every shell of its node.  But a broker other than rank 0 can
 * miss a commit (flux-core 0.88): its KVS sets up a namespace on the first
 * request for it (kvs.getroot upstream) and subscribes to the namespace's
 * setroot events only once that answer is in, so a commit published between
 * the two is never applied there, and that broker serves the older root to
 * every reader until the next commit in the namespace.  A job shell is often
 * that first request on its node, right as the job-manager commits the batch
 * holding prolog-finish; on a quiet instance no next commit comes, and the
 * shell waited for ever (the job eventlog on rank 0 held prolog-finish and
 * start; `flux kvs version` on the shell's broker stayed one behind rank 0's).
 * So when the watch has not shown this shell's start RANK0_AFTER seconds into
 * the wait, and every NOTICE_INTERVAL after, the plugin also reads the whole
 * eventlog from rank 0 (job-info.lookup there), whose KVS makes the commits,
 * and goes on when that shows the start.  A healthy instance never gets there:
 * rank 0 is not asked by the shells of a job that start normally.
 *
 * How it waits.  flux-core offers a shell plugin no asynchronous way to hold
 * task start, so the wait is synchronous, but it never runs on the shell's own
 * handle: a synchronous wait there (flux_future_wait_for) runs a temporary
 * reactor on a clone of the handle that reads every message meant for the
 * shell, and a wait that times out leaves them on the clone, which drops them
 * when it is destroyed.  Instead the plugin opens a private connection to the
 * shell's broker (FLUX_URI, the URI the shell itself connected to) with a
 * private reactor, watches the eventlog there with a continuation and bounds it
 * with a timer.  Closing the connection ends the watch in job-info, so nothing
 * needs cancelling and nothing is left behind on the shell's handle.
 *
 * The bound is the shell option dws.env-timeout (-o dws.env-timeout=FSD),
 * DEFAULT_BOUND when unset and at most MAX_BOUND: below job-exec's start barrier
 * (30 minutes by default), so on a multi-node job the shell that cannot start
 * says why before the barrier drains its node, and on a single-node job, which
 * has no barrier, the wait still ends.  It does not depend on the job's own
 * timeouts: the shell starts only after PreRun is ready, so what it waits for was
 * posted before it started, and the wait measures Flux's commit and watch
 * latency, never DWS's.
 *
 * What it waits for is seen at the time, not only after: shell log messages
 * logged during shell.init reach the job's output only once the shell's reactor
 * runs (after shell.start), so the notices RANK0_AFTER seconds into the wait and
 * every NOTICE_INTERVAL after it, and the line saying the start was read from
 * rank 0, go to the broker log (flux dmesg, on the private connection) and to
 * the shell's stderr (job-exec records it in the exec eventlog as a "log"
 * event, and flux job attach prints it).
 *
 * Only jobs with attributes.system.dw do anything: the check is a lookup in
 * the jobspec the shell already holds, so other jobs pay nothing.
 *
 * Failure policy: a #DW job never runs without its DWS environment.  A
 * dws-environment event that is malformed, a #DW job without the event, an
 * eventlog that cannot be read and a wait that reaches its bound all fail shell
 * init with one line naming the fault (for the bound, the last event seen),
 * which is also the job's exception note, so no task starts.
 */
#define FLUX_SHELL_PLUGIN_NAME "dws-env"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jansson.h>
#include <flux/core.h>
#include <flux/shell.h>

#define ENV_EVENT "dws-environment"
#define DWS_ACTION "dws"     /* the jobtap plugin's dependency and prolog name */
#define OPTION "dws"         /* shell option: -o dws.env-timeout=FSD */
#define TIMEOUT_KEY "env-timeout"

/* Seconds the wait lasts when dws.env-timeout is not set. */
static const double DEFAULT_BOUND = 600.;
/* The largest bound dws.env-timeout may set: 5 minutes below job-exec's default
 * start barrier timeout (exec.barrier-timeout, 30 minutes). */
static const double MAX_BOUND = 1500.;
/* Seconds into the wait of the first "still waiting" notice and read from rank
 * 0, and between the later ones: a healthy instance shows the shell its start in
 * milliseconds. */
static const double RANK0_AFTER = 5.;
static const double NOTICE_INTERVAL = 60.;

/* What the eventlog has shown so far. */
struct scan {
    bool held;            /* "dependency-add" dws seen: the dws jobtap plugin holds the job */
    bool allocated;       /* "alloc" seen */
    bool prolog_done;     /* "prolog-finish" of the dws prolog seen */
    bool ended;           /* "start" or a fatal exception seen */
    int count;            /* events read */
    char last[64];        /* name of the last event read ("" before the first) */
    json_t *env_event;    /* the last dws-environment event (a reference) */
};

/* One wait for the eventlog, on its own connection and reactor. */
struct wait {
    flux_t *h;
    flux_reactor_t *r;
    flux_future_t *watch;     /* the eventlog, from this shell's broker */
    flux_future_t *lookup;    /* the eventlog, from rank 0 (while one is asked for) */
    flux_watcher_t *timer;    /* the bound */
    flux_watcher_t *notice;   /* "still waiting" notices and reads from rank 0 */
    flux_jobid_t id;
    const char *job;          /* the job ID in f58, for notices */
    int shell_rank;
    double bound;
    double started;           /* monotonic seconds */
    bool timed_out;
    bool from_rank0;          /* the scan that completed was read from rank 0 */
    char error[256];          /* why the eventlog could not be read ("" if it could) */
    struct scan scan;         /* what the watch has shown */
    struct scan rank0;        /* what rank 0 showed at the last read */
};

/* True once every event posted before this shell's start request is in view. */
static bool scan_complete (const struct scan *scan)
{
    if (scan->ended || scan->prolog_done)
        return true;
    return scan->allocated && !scan->held;
}

/* The event that completes the scan, as far as the events read so far tell. */
static const char *scan_awaited (const struct scan *scan)
{
    if (scan->held)
        return "prolog-finish of the dws prolog";
    return "alloc, or prolog-finish of the dws prolog";
}

static const char *scan_last (const struct scan *scan)
{
    return scan->last[0] ? scan->last : "none";
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
    scan->count++;
    snprintf (scan->last, sizeof (scan->last), "%s", name);
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
    else if (!strcmp (name, ENV_EVENT)) {
        json_decref (scan->env_event);
        scan->env_event = json_incref (event);
    }
    json_decref (event);
}

static double monotime (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A duration as people write it: "90s", "10m", "1.5s". */
static const char *duration (double seconds, char *buf, size_t size)
{
    if (seconds >= 60. && seconds == 60. * (long)(seconds / 60.))
        snprintf (buf, size, "%gm", seconds / 60.);
    else
        snprintf (buf, size, "%gs", seconds);
    return buf;
}

/* Parse a Flux Standard Duration ("30", "30s", "500ms", "10m", "1h", "1d") or a
 * JSON number of seconds.  Returns 0 with *seconds > 0, or -1. */
static int parse_duration (json_t *value, double *seconds)
{
    static const struct {
        const char *suffix;
        double scale;
    } units[] = {
        { "", 1. }, { "s", 1. }, { "ms", 1e-3 }, { "m", 60. }, { "h", 3600. }, { "d", 86400. },
    };
    const char *s;
    char *end;
    double n;

    if (json_is_number (value)) {
        n = json_number_value (value);
        goto check;
    }
    if (!(s = json_string_value (value)) || !*s)
        return -1;
    errno = 0;
    n = strtod (s, &end);
    if (errno != 0 || end == s)
        return -1;
    for (size_t i = 0; i < sizeof (units) / sizeof (units[0]); i++) {
        if (!strcmp (end, units[i].suffix)) {
            n *= units[i].scale;
            goto check;
        }
    }
    return -1;
check:
    if (!isfinite (n) || n <= 0.)
        return -1;
    *seconds = n;
    return 0;
}

/* The wait's bound from -o dws.env-timeout.  Returns 0, or -1 with why it is
 * invalid in error. */
static int read_bound (flux_shell_t *shell, double *bound, char *error, size_t size)
{
    json_t *value = NULL;
    char *text = NULL;
    char max[32];

    *bound = DEFAULT_BOUND;
    if (flux_shell_getopt_unpack (shell, OPTION, "{s?o}", TIMEOUT_KEY, &value) < 0) {
        snprintf (error,
                  size,
                  "shell option %s is not a set of settings such as %s.%s=10m",
                  OPTION,
                  OPTION,
                  TIMEOUT_KEY);
        return -1;
    }
    if (!value)
        return 0;
    if (parse_duration (value, bound) < 0) {
        text = json_dumps (value, JSON_ENCODE_ANY | JSON_COMPACT);
        snprintf (error,
                  size,
                  "shell option %s.%s=%s is not a duration such as 10m",
                  OPTION,
                  TIMEOUT_KEY,
                  text ? text : "?");
        free (text);
        return -1;
    }
    if (*bound > MAX_BOUND) {
        shell_warn ("shell option %s.%s is longer than %s, below the start barrier:"
                    " using %s",
                    OPTION,
                    TIMEOUT_KEY,
                    duration (MAX_BOUND, max, sizeof (max)),
                    max);
        *bound = MAX_BOUND;
    }
    return 0;
}

/* Say now what the wait is waiting for: in the broker log (flux dmesg) and, with
 * to_stderr, on the shell's stderr (job-exec records it in the exec eventlog and
 * flux job attach prints it), both seen while the shell waits. */
static void notify (struct wait *w, int level, bool to_stderr, const char *fmt, ...)
{
    char buf[512];
    va_list ap;

    va_start (ap, fmt);
    vsnprintf (buf, sizeof (buf), fmt, ap);
    va_end (ap);
    if (w->h)
        flux_log (w->h, level, "job %s (shell rank %d): %s", w->job, w->shell_rank, buf);
    if (to_stderr) {
        fprintf (stderr, "%s: %s\n", FLUX_SHELL_PLUGIN_NAME, buf);
        fflush (stderr);
    }
}

static void watch_cb (flux_future_t *f, void *arg)
{
    struct wait *w = arg;
    const char *line;

    if (flux_job_event_watch_get (f, &line) < 0) {
        if (errno == ENODATA) /* the job is inactive: its whole eventlog was read */
            w->scan.ended = true;
        else {
            const char *why = flux_future_error_string (f);
            snprintf (w->error, sizeof (w->error), "%s", why ? why : strerror (errno));
        }
        flux_reactor_stop (w->r);
        return;
    }
    scan_event (&w->scan, line);
    flux_future_reset (f);
    if (scan_complete (&w->scan))
        flux_reactor_stop (w->r);
}

static void timer_cb (flux_reactor_t *r, flux_watcher_t *watcher, int revents, void *arg)
{
    struct wait *w = arg;

    w->timed_out = true;
    flux_reactor_stop (r);
}

static void scan_clear (struct scan *scan)
{
    json_decref (scan->env_event);
    memset (scan, 0, sizeof (*scan));
}

/* The last event seen, from the view that got furthest. */
static const char *wait_last (const struct wait *w)
{
    return scan_last (w->rank0.count > w->scan.count ? &w->rank0 : &w->scan);
}

static void lookup_cb (flux_future_t *f, void *arg)
{
    struct wait *w = arg;
    const char *eventlog;
    char *copy = NULL;
    char *line, *saveptr = NULL;
    char waited[32];

    scan_clear (&w->rank0);
    if (flux_rpc_get_unpack (f, "{s:s}", "eventlog", &eventlog) < 0
        || !(copy = strdup (eventlog))) {
        const char *why = flux_future_error_string (f);
        notify (w,
                LOG_WARNING,
                false,
                "cannot read the job eventlog from rank 0: %s",
                why ? why : strerror (errno));
        goto done;
    }
    for (line = strtok_r (copy, "\n", &saveptr); line; line = strtok_r (NULL, "\n", &saveptr))
        scan_event (&w->rank0, line);
    if (scan_complete (&w->rank0)) {
        notify (w,
                LOG_WARNING,
                true,
                "read the job eventlog from rank 0 after %s: it shows %s there, but this"
                " node's broker still shows it only up to %s",
                duration ((long)(monotime () - w->started + .5), waited, sizeof (waited)),
                scan_awaited (&w->scan),
                scan_last (&w->scan));
        w->from_rank0 = true;
        flux_reactor_stop (w->r);
    }
done:
    free (copy);
    flux_future_destroy (f);
    w->lookup = NULL;
}

/* Ask rank 0 for the whole eventlog, unless a read is under way. */
static void lookup_rank0 (struct wait *w)
{
    if (w->lookup)
        return;
    if (!(w->lookup = flux_rpc_pack (w->h,
                                     "job-info.lookup",
                                     0,
                                     0,
                                     "{s:I s:[s] s:i}",
                                     "id", (json_int_t)w->id,
                                     "keys", "eventlog",
                                     "flags", 0))
        || flux_future_then (w->lookup, -1., lookup_cb, w) < 0) {
        notify (w,
                LOG_WARNING,
                false,
                "cannot ask rank 0 for the job eventlog: %s",
                strerror (errno));
        flux_future_destroy (w->lookup);
        w->lookup = NULL;
    }
}

static void notice_cb (flux_reactor_t *r, flux_watcher_t *watcher, int revents, void *arg)
{
    struct wait *w = arg;
    char waited[32], bound[32];

    notify (w,
            LOG_WARNING,
            true,
            "still waiting after %s for the job eventlog to show %s (last event seen: %s);"
            " reading it from rank 0 too; giving up after %s",
            duration ((long)(monotime () - w->started + .5), waited, sizeof (waited)),
            scan_awaited (&w->scan),
            wait_last (w),
            duration (w->bound, bound, sizeof (bound)));
    lookup_rank0 (w);
}

static void wait_fini (struct wait *w)
{
    /* No cancel: closing the connection ends the watch in job-info. */
    flux_future_destroy (w->watch);
    flux_future_destroy (w->lookup);
    flux_watcher_destroy (w->timer);
    flux_watcher_destroy (w->notice);
    flux_close (w->h);
    flux_reactor_destroy (w->r);
}

/* Read the job eventlog up to the point that started this shell, on a private
 * connection, for at most w->bound seconds.  Returns 0 when the eventlog was
 * read that far; -1 with w->error set or w->timed_out true otherwise.  Either
 * way w->scan holds what was read. */
static int wait_run (struct wait *w)
{
    if (!(w->r = flux_reactor_create (0))) {
        snprintf (w->error, sizeof (w->error), "cannot create a reactor: %s", strerror (errno));
        goto error;
    }
    if (!(w->h = flux_open (NULL, 0))) {
        snprintf (w->error,
                  sizeof (w->error),
                  "cannot connect to the broker (%s): %s",
                  getenv ("FLUX_URI") ? getenv ("FLUX_URI") : "default URI",
                  strerror (errno));
        goto error;
    }
    flux_log_set_appname (w->h, FLUX_SHELL_PLUGIN_NAME);
    if (flux_set_reactor (w->h, w->r) < 0
        || !(w->watch = flux_job_event_watch (w->h, w->id, "eventlog", 0))
        || flux_future_then (w->watch, -1., watch_cb, w) < 0
        || !(w->timer = flux_timer_watcher_create (w->r, w->bound, 0., timer_cb, w))) {
        snprintf (w->error, sizeof (w->error), "cannot watch it: %s", strerror (errno));
        goto error;
    }
    flux_watcher_start (w->timer);
    if (RANK0_AFTER < w->bound) {
        if (!(w->notice = flux_timer_watcher_create (w->r,
                                                     RANK0_AFTER,
                                                     NOTICE_INTERVAL,
                                                     notice_cb,
                                                     w))) {
            snprintf (w->error, sizeof (w->error), "cannot set a timer: %s", strerror (errno));
            goto error;
        }
        flux_watcher_start (w->notice);
    }
    w->started = monotime ();
    if (flux_reactor_run (w->r, 0) < 0) {
        snprintf (w->error, sizeof (w->error), "its reactor failed: %s", strerror (errno));
        goto error;
    }
    if (w->from_rank0) {
        scan_clear (&w->scan);
        w->scan = w->rank0; /* the reference to its env_event moves with it */
        memset (&w->rank0, 0, sizeof (w->rank0));
        return 0;
    }
    if (w->timed_out || w->error[0])
        goto error;
    if (!scan_complete (&w->scan)) {
        snprintf (w->error, sizeof (w->error), "the watch ended early");
        goto error;
    }
    return 0;
error:
    return -1;
}

/* Fail shell init with one line: logged, and the job's exception note.  The
 * exception is raised here so that the note is this line, not "shell_init". */
static int fail (const char *fmt, ...)
{
    char buf[512];
    va_list ap;

    va_start (ap, fmt);
    vsnprintf (buf, sizeof (buf), fmt, ap);
    va_end (ap);
    shell_log_error ("%s", buf);
    flux_shell_raise ("exec", 0, "%s: %s", FLUX_SHELL_PLUGIN_NAME, buf);
    return -1;
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
        return fail ("%s event is malformed: context.env %s; the job cannot get"
                     " its DWS environment",
                     ENV_EVENT,
                     env ? "is not an object" : "is missing");
    }
    json_object_foreach (env, name, value) {
        if (!*name || strchr (name, '=')) {
            return fail ("%s event is malformed: invalid variable name \"%s\";"
                         " the job cannot get its DWS environment",
                         ENV_EVENT,
                         name);
        }
        if (!json_is_string (value)) {
            return fail ("%s event is malformed: env.%s is not a string;"
                         " the job cannot get its DWS environment",
                         ENV_EVENT,
                         name);
        }
    }
    json_object_foreach (env, name, value) {
        if (flux_shell_setenvf (shell, 1, name, "%s", json_string_value (value)) < 0)
            return fail ("cannot set %s in the job environment: %s", name, strerror (errno));
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
    char f58[32];
    char bound[32];
    char error[256];
    struct wait w = { 0 };
    int rc = -1;

    if (!shell)
        return -1;
    if (flux_shell_info_unpack (shell,
                                "{s:I s:i s:{s?{s?{s?o}}}}",
                                "jobid", &id,
                                "rank", &w.shell_rank,
                                "jobspec",
                                  "attributes",
                                    "system",
                                      "dw", &dw) < 0)
        return fail ("cannot read the job's jobspec from shell info");
    if (!dw)
        return 0; /* not a #DW job */
    if (read_bound (shell, &w.bound, error, sizeof (error)) < 0)
        return fail ("%s", error);
    if (flux_job_id_encode ((flux_jobid_t)id, "f58", f58, sizeof (f58)) < 0)
        snprintf (f58, sizeof (f58), "%ju", (uintmax_t)id);
    w.id = (flux_jobid_t)id;
    w.job = f58;
    duration (w.bound, bound, sizeof (bound));

    shell_debug ("reading the job eventlog for the %s event (at most %s)", ENV_EVENT, bound);
    if (wait_run (&w) < 0) {
        if (w.timed_out) {
            notify (&w, /* the failure below is the job's output and exception */
                    LOG_ERR,
                    false,
                    "gave up after %s: the job eventlog did not show %s"
                    " (last event seen: %s)",
                    bound,
                    scan_awaited (&w.scan),
                    wait_last (&w));
            rc = fail ("the job eventlog did not show %s within %s (-o %s.%s);"
                       " last event seen: %s",
                       scan_awaited (&w.scan),
                       bound,
                       OPTION,
                       TIMEOUT_KEY,
                       wait_last (&w));
        }
        else
            rc = fail ("cannot read the job eventlog: %s (last event seen: %s)",
                       w.error,
                       wait_last (&w));
    }
    else if (!w.scan.env_event) {
        rc = fail ("#DW job has no %s event: its tasks do not start without"
                   " their DWS environment",
                   ENV_EVENT);
    }
    else
        rc = apply_env_event (shell, w.scan.env_event);
    wait_fini (&w);
    scan_clear (&w.scan);
    scan_clear (&w.rank0);
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
