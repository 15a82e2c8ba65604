/* dws-jobtap.c - the dws jobtap plugin: hold #DW jobs for the flux-dws service.
 *
 * The plugin holds each job whose jobspec has attributes.system.dw at three points:
 * the dependency "dws" (DEPEND), the prolog action "dws" and the epilog action "dws".
 * It never talks to Kubernetes and decides nothing: it describes the jobs it holds as
 * job records and does what the flux-dws service asks over job-manager.dws.* requests.
 * doc/protocol.rst is the contract; flux_dws/testing/fakeflux/plugin.py is the same
 * plugin in Python, and this file follows it call for call.
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
 */

#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>
#include <flux/core.h>
#include <flux/jobtap.h>
#include <flux/hostlist.h>
#include <signal.h>
#include <unistd.h>

#define PLUGIN_NAME "dws"
#define AUX_KEY "dws::job"
#define RECONCILE_TOPIC "dws.reconcile"
#define EVENT_PREFIX "dws-"
#define WAITING_REASON "flux-dws service is not running"
#define DEFAULT_HEARTBEAT 10.    // [dws] heartbeat when unset, seconds
#define MISSED_HEARTBEATS 3       // silent this many heartbeats: the service is gone
#define SAVE_KEY_MAX 128          // longest key "save" writes under a job's directory
#define SAVE_VALUE_MAX (64 * 1024 * 1024) // largest value "save" writes, bytes of JSON

struct plugin_ctx;

/* A watch stream and the record it was last sent for each job (keyed by decimal id).
 */
struct watcher {
    const flux_msg_t *msg;
    bool service;
    json_t *sent;
    json_t *who;          // a service's {pid, host, since}, for a standby's logs
    char sender[64];      // the client's route (its heartbeats come from the same one)
    double last_heard;    // the last watch or heartbeat from this client (reactor time)
    json_t *report;       // the active service's last heartbeat report, for list
    struct watcher *next;
};

/* A request that arrived while job state was being rebuilt: answered afterwards.
 */
struct queued_msg {
    const flux_msg_t *msg;
    struct queued_msg *next;
};

/* What the plugin knows about one #DW job (the job's aux item AUX_KEY).
 */
struct dwsjob {
    struct plugin_ctx *ctx;
    flux_jobid_t id;
    json_int_t userid;
    double t_submit;
    flux_job_state_t state;
    json_t *attributes;   // {dw, dw_timeout, dw_failure_tolerance} as submitted
    json_t *hosts;        // expanded R execution.nodelist, [] until allocated
    json_t *rabbits;      // rabbit -> [hosts] from R's scheduling JGF, {} if none
    json_t *resources;    // jobspec resources, jobspec updates included
    json_t *dws;          // latest context of each dws-* event
    json_t *exception;    // first fatal exception {type, severity, note}, or NULL

    /* Derived from the eventlog, in eventlog order (apply_entry). */
    bool started;         // a "start" event was posted
    double t_start;       // ... at this time
    bool shells_gone;     // started in an earlier instance, never released: no shells
    bool released;        // a final "release" event was posted
    bool dep_used;        // dependency-add dws was ever posted
    bool dep_held;        // ... and not removed
    int prologs;          // prolog actions active (any plugin's)
    bool prolog_active;   // the dws prolog action is active
    bool prolog_started;  // ... was ever started
    bool epilog_active;   // the dws epilog action is active
    bool epilog_started;  // ... was ever started
    bool waiting_told;    // dws-waiting is the latest dws-* event: the user knows the
                          // service is gone (cleared when a service watches again)

    /* Requested in this callback chain, event not yet processed (events posted to
     * the job being called back are queued until the callback returns). */
    bool prolog_requested;
    bool epilog_requested;

    flux_watcher_t *wait_timer; // [dws] service-wait bound while waiting
    flux_future_t *rebuild_f;   // job-manager.getattr eventlog, while rebuilding
    json_t *seen;               // eventlog entries seen live while rebuilding

    struct dwsjob *prev;
    struct dwsjob *next;
};

/* A save request whose KVS commit has not been answered yet.
 */
struct pending_save {
    struct plugin_ctx *ctx;
    const flux_msg_t *msg;
    flux_future_t *f;
    struct pending_save *next;
};

struct plugin_ctx {
    flux_plugin_t *p;
    flux_t *h;
    char prefix[64];            // "job-manager.dws."
    double service_wait;        // [dws] service-wait, INFINITY when unset
    double heartbeat;           // [dws] heartbeat, seconds
    struct dwsjob *jobs;        // sorted by id
    struct watcher *watchers;
    struct watcher *standbys;   // service watches waiting for the active one to go
    double broker_start;        // broker.starttime: older "start" events had other shells
    json_t *dirty;              // id -> latest record, not yet sent to watchers
    flux_watcher_t *soon;       // runs deferred work on the next reactor loop
    flux_watcher_t *presence;   // deadline for the service's next sign of life
    int rebuilding;             // jobs whose eventlog is still being read
    struct queued_msg *queued;
    struct queued_msg **queued_tail;
    struct pending_save *saves; // save requests waiting for their commit
    bool destroying;
};

struct rpc_error {
    int errnum;
    char text[256];
};

typedef int (*method_f) (struct plugin_ctx *ctx,
                         const flux_msg_t *msg,
                         const char *method,
                         json_t *payload,
                         json_t **response,
                         struct rpc_error *err);

static void job_changed (struct dwsjob *st);
static void schedule_soon (struct plugin_ctx *ctx);
static void dispatch (struct plugin_ctx *ctx, const flux_msg_t *msg);

/* ------------------------------------------------------------------ small helpers */

static int fail (struct rpc_error *err, int errnum, const char *fmt, ...)
    __attribute__ ((format (printf, 3, 4)));

static int fail (struct rpc_error *err, int errnum, const char *fmt, ...)
{
    va_list ap;
    va_start (ap, fmt);
    vsnprintf (err->text, sizeof (err->text), fmt, ap);
    va_end (ap);
    err->errnum = errnum;
    return -1;
}

static const char *f58 (flux_jobid_t id, char *buf, size_t size)
{
    if (flux_job_id_encode (id, "f58", buf, size) < 0)
        snprintf (buf, size, "%ju", (uintmax_t)id);
    return buf;
}

static bool streq (const char *a, const char *b)
{
    return a && b && strcmp (a, b) == 0;
}

/* Python's repr() of a JSON value, as fakeflux's messages show it.
 */
static void py_repr (json_t *o, char *buf, size_t size)
{
    if (!o || json_is_null (o))
        snprintf (buf, size, "None");
    else if (json_is_true (o))
        snprintf (buf, size, "True");
    else if (json_is_false (o))
        snprintf (buf, size, "False");
    else if (json_is_string (o)) {
        const char *s = json_string_value (o);
        char quote = (strchr (s, '\'') && !strchr (s, '"')) ? '"' : '\'';
        size_t n = 0;
        if (size < 4) {
            buf[0] = '\0';
            return;
        }
        buf[n++] = quote;
        for (; *s && n + 3 < size; s++) {
            if (*s == quote || *s == '\\')
                buf[n++] = '\\';
            buf[n++] = *s;
        }
        buf[n++] = quote;
        buf[n] = '\0';
    }
    else {
        char *s = json_dumps (o, JSON_COMPACT | JSON_ENCODE_ANY);
        snprintf (buf, size, "%s", s ? s : "?");
        free (s);
    }
}

/* ------------------------------------------------------------------ durations (FSD) */

/* Seconds for a Flux Standard Duration ("30s", "5m", "1.5h", "2d", "500ms", a bare
 * number of seconds, "inf") or a non-negative JSON number; -1 when invalid.
 * Same rules as flux_dws/base/fsd.py parse_fsd().
 */
static double parse_fsd (json_t *o)
{
    if (json_is_integer (o))
        return json_integer_value (o) < 0 ? -1. : (double)json_integer_value (o);
    if (json_is_real (o)) {
        double v = json_real_value (o);
        return (isnan (v) || v < 0) ? -1. : v;
    }
    if (!json_is_string (o))
        return -1.;

    const char *s = json_string_value (o);
    while (isspace ((unsigned char)*s))
        s++;
    size_t len = strlen (s);
    while (len > 0 && isspace ((unsigned char)s[len - 1]))
        len--;
    if ((len == 3 && strncasecmp (s, "inf", 3) == 0)
        || (len == 8 && strncasecmp (s, "infinity", 8) == 0))
        return INFINITY;

    size_t i = 0, digits = 0;
    while (i < len && isdigit ((unsigned char)s[i]))
        i++, digits++;
    if (i < len && s[i] == '.') {
        i++;
        while (i < len && isdigit ((unsigned char)s[i]))
            i++, digits++;
    }
    if (digits == 0)
        return -1.;
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1, exp_digits = 0;
        if (j < len && (s[j] == '+' || s[j] == '-'))
            j++;
        while (j < len && isdigit ((unsigned char)s[j]))
            j++, exp_digits++;
        if (exp_digits == 0)
            return -1.;
        i = j;
    }
    size_t numlen = i;
    const char *unit = s + i;
    size_t unitlen = len - i;
    double scale;
    if (unitlen == 0 || (unitlen == 1 && unit[0] == 's'))
        scale = 1.;
    else if (unitlen == 2 && strncmp (unit, "ms", 2) == 0)
        scale = 0.001;
    else if (unitlen == 1 && unit[0] == 'm')
        scale = 60.;
    else if (unitlen == 1 && unit[0] == 'h')
        scale = 3600.;
    else if (unitlen == 1 && unit[0] == 'd')
        scale = 86400.;
    else
        return -1.;

    char num[64];
    if (numlen >= sizeof (num))
        return -1.;
    memcpy (num, s, numlen);
    num[numlen] = '\0';
    double v = strtod (num, NULL) * scale;
    return (isnan (v) || v < 0) ? -1. : v;
}

/* The digits of x to the millisecond, without trailing zeros ("1.5", "90").
 */
static void fsd_number (double x, char *buf, size_t size)
{
    snprintf (buf, size, "%.3f", x);
    char *dot = strchr (buf, '.');
    if (dot) {
        char *end = buf + strlen (buf) - 1;
        while (end > dot && *end == '0')
            *end-- = '\0';
        if (end == dot)
            *end = '\0';
    }
}

/* The shortest exact FSD for seconds (flux_dws/base/fsd.py format_fsd()).
 */
static void format_fsd (double seconds, char *buf, size_t size)
{
    static const struct { const char *unit; double size; } units[] = {
        { "d", 86400. }, { "h", 3600. }, { "m", 60. }, { "s", 1. },
    };
    char num[40];

    if (isinf (seconds)) {
        snprintf (buf, size, "inf");
        return;
    }
    for (size_t i = 0; i < sizeof (units) / sizeof (units[0]); i++) {
        double q = seconds / units[i].size;
        if (seconds >= units[i].size && round (q * 1000.) / 1000. == q) {
            fsd_number (q, num, sizeof (num));
            snprintf (buf, size, "%s%s", num, units[i].unit);
            return;
        }
    }
    if (seconds > 0 && seconds < 1) {
        fsd_number (seconds * 1000., num, sizeof (num));
        snprintf (buf, size, "%sms", num);
        return;
    }
    fsd_number (seconds, num, sizeof (num));
    snprintf (buf, size, "%ss", num);
}

/* ------------------------------------------------------------------ submit-time checks */

/* Why attributes.system is refused, or NULL when its shape is fine (the same shallow
 * rules as flux_dws/testing/fakeflux/checks.py: the service validates directives).
 */
static const char *shallow_check (json_t *system, char *buf, size_t size)
{
    json_t *dw, *timeout;

    if (!json_is_object (system))
        return NULL;
    dw = json_object_get (system, "dw");
    timeout = json_object_get (system, "dw_timeout");
    if (timeout && !dw) {
        snprintf (buf, size,
                  "attributes.system.dw_timeout requires attributes.system.dw");
        return buf;
    }
    if (dw) {
        bool ok = false;
        if (json_is_string (dw))
            ok = json_string_length (dw) > 0;
        else if (json_is_array (dw) && json_array_size (dw) > 0) {
            size_t index;
            json_t *entry;
            ok = true;
            json_array_foreach (dw, index, entry) {
                if (!json_is_string (entry))
                    ok = false;
            }
        }
        if (!ok) {
            snprintf (buf, size,
                      "attributes.system.dw must be a non-empty string"
                      " or list of strings");
            return buf;
        }
    }
    if (timeout) {
        const char *key;
        json_t *value;
        if (!json_is_object (timeout)) {
            snprintf (buf, size,
                      "attributes.system.dw_timeout must be a table"
                      " of state = duration");
            return buf;
        }
        json_object_foreach (timeout, key, value) {
            bool ok = json_is_string (value)
                      || (json_is_integer (value) && json_integer_value (value) >= 0)
                      || (json_is_real (value)
                          && isfinite (json_real_value (value))
                          && json_real_value (value) >= 0);
            if (!ok) {
                snprintf (buf, size,
                          "attributes.system.dw_timeout.%s must be a duration"
                          " string or a non-negative number",
                          key);
                return buf;
            }
        }
    }
    return NULL;
}

/* attributes.system of the job in args, or NULL.
 */
static json_t *args_system (flux_plugin_arg_t *args)
{
    json_t *jobspec = NULL;
    json_t *attributes;

    if (flux_plugin_arg_unpack (args, FLUX_PLUGIN_ARG_IN,
                                "{s:o}", "jobspec", &jobspec) < 0
        || !(attributes = json_object_get (jobspec, "attributes")))
        return NULL;
    return json_object_get (attributes, "system");
}

static bool is_dw_system (json_t *system)
{
    return json_is_object (system) && json_object_get (system, "dw") != NULL;
}

/* ------------------------------------------------------------------ job state */

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
    return json_pack ("{s:I s:I s:f s:s s:o s:o s:o s:o s:b s:o s:o}",
                      "id", (json_int_t)st->id,
                      "userid", st->userid,
                      "t_submit", st->t_submit,
                      "phase", job_phase (st),
                      "attributes", json_deep_copy (st->attributes),
                      "hosts", json_deep_copy (st->hosts),
                      "rabbits", json_deep_copy (st->rabbits),
                      "resources", json_deep_copy (st->resources),
                      "started", st->started,
                      "exception", st->exception ? json_deep_copy (st->exception)
                                                 : json_null (),
                      "dws", json_deep_copy (st->dws));
}

/* Expand R's execution.nodelist (RFC 29 hostlists) into host names.
 */
static json_t *hosts_from_R (json_t *R)
{
    json_t *execution = json_object_get (R, "execution");
    json_t *nodelist = json_object_get (execution, "nodelist");
    json_t *hosts = json_array ();
    struct hostlist *hl;
    size_t index;
    json_t *entry;
    const char *host;

    if (!hosts || !json_is_array (nodelist) || !(hl = hostlist_create ()))
        return hosts;
    json_array_foreach (nodelist, index, entry) {
        if (json_is_string (entry))
            (void)hostlist_append (hl, json_string_value (entry));
    }
    for (host = hostlist_first (hl); host; host = hostlist_next (hl))
        json_array_append_new (hosts, json_string (host));
    hostlist_destroy (hl);
    return hosts;
}

/* The parent path of a JGF vertex ("/cluster0/rabbit-1/node3" -> "/cluster0/rabbit-1"),
 * or NULL.  The caller frees it.
 */
static char *vertex_parent (json_t *vertex, const char **type, const char **name)
{
    const char *path = NULL;
    const char *slash;

    *type = *name = NULL;
    if (json_unpack (vertex, "{s:{s:s s?s s:{s:s}}}",
                     "metadata", "type", type, "name", name,
                     "paths", "containment", &path) < 0
        || !(slash = strrchr (path, '/')))
        return NULL;
    return strndup (path, slash - path);
}

/* Rabbit -> the job's hosts under it, from the JGF Fluxion put into R: a rabbit is the
 * parent of an "ssd" vertex, and a node under the same parent is served by it
 * (doc/protocol.rst; flux_dws/core/rabbits.py reads the same rule).  {} without ssd.
 */
static json_t *rabbits_from_R (json_t *R)
{
    json_t *vertices = NULL;
    json_t *parents = json_object ();   // parent path of each ssd -> true
    json_t *rabbits = json_object ();
    json_t *vertex;
    size_t index;
    const char *type, *name;
    char *parent;

    if (!parents || !rabbits
        || json_unpack (R, "{s:{s:{s:o}}}", "scheduling", "graph", "nodes", &vertices) < 0
        || !json_is_array (vertices))
        goto done;
    json_array_foreach (vertices, index, vertex) {
        if ((parent = vertex_parent (vertex, &type, &name))) {
            if (streq (type, "ssd"))
                json_object_set_new (parents, parent, json_true ());
            free (parent);
        }
    }
    json_array_foreach (vertices, index, vertex) {
        if (!(parent = vertex_parent (vertex, &type, &name)))
            continue;
        if (streq (type, "node") && name && json_object_get (parents, parent)) {
            const char *rabbit = strrchr (parent, '/') + 1;
            json_t *hosts = json_object_get (rabbits, rabbit);
            if (!hosts) {
                hosts = json_array ();
                json_object_set_new (rabbits, rabbit, hosts);
            }
            json_array_append_new (hosts, json_string (name));
        }
        free (parent);
    }
done:
    json_decref (parents);
    return rabbits ? rabbits : json_object ();
}

/* Refresh what the callback args say now: the job's state and, once allocated, hosts.
 */
static void update_from_args (struct dwsjob *st, flux_plugin_arg_t *args)
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
static void apply_entry (struct dwsjob *st, json_t *entry)
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

static void cancel_wait (struct dwsjob *st)
{
    if (st->wait_timer) {
        flux_watcher_destroy (st->wait_timer);
        st->wait_timer = NULL;
    }
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
static void dwsjob_detach (struct dwsjob *st)
{
    struct plugin_ctx *ctx = st->ctx;

    if (!ctx)
        return;
    if (st->rebuild_f)
        rebuild_done (st);
    cancel_wait (st);
    if (st->prev)
        st->prev->next = st->next;
    else if (ctx->jobs == st)
        ctx->jobs = st->next;
    if (st->next)
        st->next->prev = st->prev;
    st->prev = st->next = NULL;
    st->ctx = NULL;
}

static void dwsjob_destroy (struct dwsjob *st)
{
    if (st) {
        int saved_errno = errno;
        dwsjob_detach (st);
        json_decref (st->attributes);
        json_decref (st->hosts);
        json_decref (st->rabbits);
        json_decref (st->resources);
        json_decref (st->dws);
        json_decref (st->exception);
        free (st);
        errno = saved_errno;
    }
}

static struct dwsjob *dwsjob_create (struct plugin_ctx *ctx,
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

static struct dwsjob *current_job (flux_plugin_t *p)
{
    return flux_jobtap_job_aux_get (p, FLUX_JOBTAP_CURRENT_JOB, AUX_KEY);
}

/* ------------------------------------------------------------------ watchers */

static bool service_connected (struct plugin_ctx *ctx)
{
    for (struct watcher *w = ctx->watchers; w; w = w->next) {
        if (w->service)
            return true;
    }
    return false;
}

static void watcher_destroy (struct watcher *w)
{
    if (w) {
        flux_msg_decref (w->msg);
        json_decref (w->sent);
        json_decref (w->who);
        json_decref (w->report);
        free (w);
    }
}

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

static double reactor_now (struct plugin_ctx *ctx)
{
    return flux_reactor_now (flux_get_reactor (ctx->h));
}

/* End a watch stream with an error response and forget it.
 */
static void watcher_end (struct plugin_ctx *ctx,
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

/* Send each watcher the records that changed since it last heard of them.
 */
static void flush_dirty (struct plugin_ctx *ctx)
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

static void soon_cb (flux_reactor_t *r, flux_watcher_t *w, int revents, void *arg)
{
    struct plugin_ctx *ctx = arg;

    while (ctx->rebuilding == 0 && ctx->queued) {
        struct queued_msg *q = ctx->queued;
        ctx->queued = q->next;
        if (!ctx->queued)
            ctx->queued_tail = &ctx->queued;
        dispatch (ctx, q->msg);
        flux_msg_decref (q->msg);
        free (q);
    }
    flush_dirty (ctx);
}

static void schedule_soon (struct plugin_ctx *ctx)
{
    if (ctx->soon && !ctx->destroying && !flux_watcher_is_active (ctx->soon)) {
        flux_timer_watcher_reset (ctx->soon, 0., 0.);
        flux_watcher_start (ctx->soon);
    }
}

/* The job's record changed: watchers hear of it on the next reactor loop.
 */
static void job_changed (struct dwsjob *st)
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
static json_t *all_records (struct plugin_ctx *ctx)
{
    json_t *records = json_array ();

    for (struct dwsjob *st = ctx->jobs; st && records; st = st->next) {
        if (st->state == FLUX_JOB_STATE_NEW || st->state == FLUX_JOB_STATE_INACTIVE)
            continue;
        json_array_append_new (records, job_record (st));
    }
    return records;
}

/* ------------------------------------------------------------------ service presence */

/* How long the service may stay silent before it counts as gone.
 */
static double presence_timeout (struct plugin_ctx *ctx)
{
    return MISSED_HEARTBEATS * ctx->heartbeat;
}

/* The service showed it is alive (a heartbeat or a service watch): it has
 * presence_timeout() from now to show it again.
 */
static void service_alive (struct plugin_ctx *ctx)
{
    if (!ctx->presence || ctx->destroying)
        return;
    flux_watcher_stop (ctx->presence);  // libev timers must be stopped to be reset
    flux_timer_watcher_reset (ctx->presence, presence_timeout (ctx), 0.);
    flux_watcher_start (ctx->presence);
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

static void start_wait (struct dwsjob *st)
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

/* A service watches: no job waits for it any more, and the next absence is news.
 */
static void service_back (struct plugin_ctx *ctx)
{
    for (struct dwsjob *st = ctx->jobs; st; st = st->next) {
        cancel_wait (st);
        st->waiting_told = false;
    }
}

/* Tell the job's user that no service is there to set up its storage, once per
 * absence of the service (a service watch clears waiting_told).
 */
static void tell_waiting (struct dwsjob *st)
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

/* The service is gone (silent for presence_timeout(), or never came since the plugin
 * loaded): drop its watcher, and give every job held in DEPEND what a job entering
 * DEPEND now gets, a dws-waiting event and its service-wait timer.  A job submitted
 * just before the service died saw the stale watcher and got neither.
 */
static bool promote_standby (struct plugin_ctx *ctx);

static void presence_expired (flux_reactor_t *r,
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

/* ------------------------------------------------------------------ holding jobs */

/* Add the dws dependency to the job being called back; tell the user when the
 * service is not there to release it.
 */
static void hold_in_depend (struct dwsjob *st)
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

static void start_prolog (struct dwsjob *st)
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
static void note_shells_gone (struct dwsjob *st)
{
    if (st->started && !st->released && st->t_start > 0.
        && st->t_start < st->ctx->broker_start)
        st->shells_gone = true;
}

static void start_epilog (struct dwsjob *st)
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

/* ------------------------------------------------------------------ rebuilding state */

/* After the eventlog was read: take whatever action the job's state calls for and
 * the plugin could not take while it was not loaded.  Runs as a jobtap call for the
 * job (flux_jobtap_call), since prolog/epilog actions need a current job.
 */
static int reconcile_cb (flux_plugin_t *p,
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
static void start_rebuild (struct dwsjob *st)
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

/* ------------------------------------------------------------------ job callbacks */

static int validate_cb (flux_plugin_t *p,
                        const char *topic,
                        flux_plugin_arg_t *args,
                        void *arg)
{
    char buf[256];
    const char *problem = shallow_check (args_system (args), buf, sizeof (buf));

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
    ctx->service_wait = service_wait;
    if (heartbeat != ctx->heartbeat) {
        ctx->heartbeat = heartbeat;
        if (flux_watcher_is_active (ctx->presence))
            service_alive (ctx);  // the new period counts from now
    }
    return 0;
}

/* ------------------------------------------------------------------ methods */

/* The #DW job the request names, inactive ones too (*stp is then a stand-in in
 * state INACTIVE); ENOENT for any other.
 */
static int lookup_dw_job (struct plugin_ctx *ctx,
                          const char *method,
                          json_t *payload,
                          struct dwsjob *ghost,
                          struct dwsjob **stp,
                          struct rpc_error *err)
{
    json_t *o = json_object_get (payload, "id");
    json_int_t id;
    struct dwsjob *st = NULL;
    flux_plugin_arg_t *args;

    if (!json_is_integer (o))
        return fail (err, EPROTO, "job-manager.dws.%s: id must be a job ID", method);
    id = json_integer_value (o);
    if (id >= 0 && (st = flux_jobtap_job_aux_get (ctx->p, id, AUX_KEY))) {
        *stp = st;
        return 0;
    }
    if (id >= 0 && (args = flux_jobtap_job_lookup (ctx->p, id))) {
        int state = FLUX_JOB_STATE_NEW;
        bool dw = is_dw_system (args_system (args));
        (void)flux_plugin_arg_unpack (args, FLUX_PLUGIN_ARG_IN, "{s:i}", "state", &state);
        flux_plugin_arg_destroy (args);
        if (dw && state == FLUX_JOB_STATE_INACTIVE) {
            memset (ghost, 0, sizeof (*ghost));
            ghost->ctx = ctx;
            ghost->id = id;
            ghost->state = FLUX_JOB_STATE_INACTIVE;
            *stp = ghost;
            return 0;
        }
    }
    return fail (err, ENOENT, "job %lld is not held by the dws plugin", (long long)id);
}

/* Start ``w``'s stream with the snapshot; a service watcher becomes the active one.
 * On failure ``w`` is destroyed.
 */
static int watcher_start (struct plugin_ctx *ctx, struct watcher *w)
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
    if (w->service) {
        w->last_heard = reactor_now (ctx);
        json_object_set_new (w->who, "since", json_real (w->last_heard));
        service_back (ctx);
        service_alive (ctx);
    }
    w->next = ctx->watchers;
    ctx->watchers = w;
    return 0;
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
        if (watcher_start (ctx, w) == 0)
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

static int watch_method (struct plugin_ctx *ctx,
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
        (void)watcher_start (ctx, w);
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
    (void)watcher_start (ctx, w);
    return 0;
}

static int list_method (struct plugin_ctx *ctx,
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
        || !(*response = json_pack ("{s:o s:{s:o s:i}}",
                                    "jobs", records,
                                    "service",
                                      "active", described ? described : json_null (),
                                      "standbys", standbys)))
        return fail (err, ENOMEM, "job-manager.dws.list: out of memory");
    return 0;
}

static int release_method (struct plugin_ctx *ctx,
                           const flux_msg_t *msg,
                           const char *method,
                           json_t *payload,
                           json_t **response,
                           struct rpc_error *err)
{
    struct dwsjob ghost, *st = NULL;
    json_t *update = json_object_get (payload, "update");
    const char *key;
    json_t *value;

    if (lookup_dw_job (ctx, method, payload, &ghost, &st, err) < 0)
        return -1;
    bool ok = !update || json_is_object (update);
    if (ok && update) {
        json_object_foreach (update, key, value) {
            if (strncmp (key, "attributes.", strlen ("attributes.")) != 0
                && !streq (key, "resources"))
                ok = false;
        }
    }
    if (!ok)
        return fail (err, EPROTO,
                     "job-manager.dws.release: update must map attributes.* keys"
                     " (or resources) to values");
    if (st->state != FLUX_JOB_STATE_DEPEND || !st->dep_held)
        return fail (err, EINVAL, "job %ju is not waiting for its workflow",
                     (uintmax_t)st->id);
    if (update && json_object_size (update) > 0
        && flux_jobtap_jobspec_update_id_pack (ctx->p, st->id, "O", update) < 0)
        return fail (err, errno, "job %ju: jobspec update failed: %s",
                     (uintmax_t)st->id, strerror (errno));
    if (flux_jobtap_dependency_remove (ctx->p, st->id, PLUGIN_NAME) < 0)
        return fail (err, errno, "job %ju: removing the dws dependency failed: %s",
                     (uintmax_t)st->id, strerror (errno));
    *response = json_object ();
    return 0;
}

static int prolog_finish_method (struct plugin_ctx *ctx,
                                 const flux_msg_t *msg,
                                 const char *method,
                                 json_t *payload,
                                 json_t **response,
                                 struct rpc_error *err)
{
    struct dwsjob ghost, *st = NULL;
    json_t *success = json_object_get (payload, "success");
    json_t *env = json_object_get (payload, "env");
    flux_jobid_t id;
    const char *key;
    json_t *value;

    if (lookup_dw_job (ctx, method, payload, &ghost, &st, err) < 0)
        return -1;
    if (!json_is_boolean (success))
        return fail (err, EPROTO,
                     "job-manager.dws.prolog-finish: success must be a boolean");
    bool ok = !env || json_is_object (env);
    if (ok && env) {
        json_object_foreach (env, key, value) {
            if (!json_is_string (value))
                ok = false;
        }
    }
    if (!ok)
        return fail (err, EPROTO,
                     "job-manager.dws.prolog-finish: env must map names to strings");
    if (!st->prolog_active)
        return fail (err, EINVAL, "job %ju has no active dws prolog", (uintmax_t)st->id);
    id = st->id;  // st may be freed by the events below
    if (json_is_true (success)
        && flux_jobtap_event_post_pack (ctx->p, id, "dws-environment", "{s:o}",
                                        "env", env ? json_incref (env)
                                                   : json_object ()) < 0)
        return fail (err, errno, "job %ju: posting dws-environment failed: %s",
                     (uintmax_t)id, strerror (errno));
    if (flux_jobtap_prolog_finish (ctx->p, id, PLUGIN_NAME,
                                   json_is_true (success) ? 0 : 1) < 0)
        return fail (err, errno, "job %ju: finishing the dws prolog failed: %s",
                     (uintmax_t)id, strerror (errno));
    *response = json_object ();
    return 0;
}

static int epilog_finish_method (struct plugin_ctx *ctx,
                                 const flux_msg_t *msg,
                                 const char *method,
                                 json_t *payload,
                                 json_t **response,
                                 struct rpc_error *err)
{
    struct dwsjob ghost, *st = NULL;
    flux_jobid_t id;

    if (lookup_dw_job (ctx, method, payload, &ghost, &st, err) < 0)
        return -1;
    if (!st->epilog_active)
        return fail (err, EINVAL, "job %ju has no active dws epilog", (uintmax_t)st->id);
    if (st->started && !st->released && !st->shells_gone)
        return fail (err, EINVAL, "job %ju is still running its tasks", (uintmax_t)st->id);
    id = st->id;
    if (flux_jobtap_epilog_finish (ctx->p, id, PLUGIN_NAME, 0) < 0)
        return fail (err, errno, "job %ju: finishing the dws epilog failed: %s",
                     (uintmax_t)id, strerror (errno));
    *response = json_object ();
    return 0;
}

static int raise_method (struct plugin_ctx *ctx,
                         const flux_msg_t *msg,
                         const char *method,
                         json_t *payload,
                         json_t **response,
                         struct rpc_error *err)
{
    struct dwsjob ghost, *st = NULL;
    json_t *type = json_object_get (payload, "type");
    json_t *severity = json_object_get (payload, "severity");
    json_t *note = json_object_get (payload, "note");
    const char *s;
    int sev = 0;

    if (lookup_dw_job (ctx, method, payload, &ghost, &st, err) < 0)
        return -1;
    bool one_word = json_is_string (type) && json_string_length (type) > 0;
    for (s = json_string_value (type); one_word && *s; s++) {
        if (isspace ((unsigned char)*s))
            one_word = false;
    }
    if (!one_word)
        return fail (err, EPROTO, "job-manager.dws.raise: type must be one word");
    if (severity) {
        if (!json_is_integer (severity)
            || json_integer_value (severity) < 0
            || json_integer_value (severity) > 7)
            sev = -1;
        else
            sev = json_integer_value (severity);
    }
    if (sev < 0 || (note && !json_is_string (note)))
        return fail (err, EPROTO,
                     "job-manager.dws.raise: severity must be 0-7 and note a string");
    if (st->state == FLUX_JOB_STATE_INACTIVE)
        return fail (err, EINVAL, "job %ju is inactive", (uintmax_t)st->id);
    if (sev == 0 && st->exception)
        return fail (err, EINVAL, "job %ju already has a fatal %s exception",
                     (uintmax_t)st->id,
                     json_string_value (json_object_get (st->exception, "type")));
    if (flux_jobtap_raise_exception (ctx->p, st->id, json_string_value (type), sev,
                                     "%s", note ? json_string_value (note) : "") < 0)
        return fail (err, errno, "job %ju: raising the exception failed: %s",
                     (uintmax_t)st->id, strerror (errno));
    *response = json_object ();
    return 0;
}

static int post_method (struct plugin_ctx *ctx,
                        const flux_msg_t *msg,
                        const char *method,
                        json_t *payload,
                        json_t **response,
                        struct rpc_error *err)
{
    struct dwsjob ghost, *st = NULL;
    json_t *name = json_object_get (payload, "name");
    json_t *context = json_object_get (payload, "context");
    const char *s = json_string_value (name);

    if (lookup_dw_job (ctx, method, payload, &ghost, &st, err) < 0)
        return -1;
    if (!s
        || strncmp (s, EVENT_PREFIX, strlen (EVENT_PREFIX)) != 0
        || streq (s, EVENT_PREFIX)) {
        char repr[128];
        py_repr (name, repr, sizeof (repr));
        return fail (err, EINVAL, "event name %s must start with '%s'", repr, EVENT_PREFIX);
    }
    if (context && !json_is_object (context))
        return fail (err, EPROTO, "job-manager.dws.post: context must be an object");
    if (st->state == FLUX_JOB_STATE_INACTIVE)
        return fail (err, ENOENT, "job %ju is not held by the dws plugin",
                     (uintmax_t)st->id);
    if (flux_jobtap_event_post_pack (ctx->p, st->id, s, "o",
                                     context ? json_incref (context)
                                             : json_object ()) < 0)
        return fail (err, errno, "job %ju: posting %s failed: %s",
                     (uintmax_t)st->id, s, strerror (errno));
    *response = json_object ();
    return 0;
}

static int heartbeat_method (struct plugin_ctx *ctx,
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

static void save_destroy (struct pending_save *ps)
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
static int save_method (struct plugin_ctx *ctx,
                        const flux_msg_t *msg,
                        const char *method,
                        json_t *payload,
                        json_t **response,
                        struct rpc_error *err)
{
    struct dwsjob ghost, *st = NULL;
    json_t *key = json_object_get (payload, "key");
    json_t *value = json_object_get (payload, "value");
    char path[SAVE_KEY_MAX + 64];
    flux_kvs_txn_t *txn = NULL;
    struct pending_save *ps = NULL;
    char *text = NULL;
    int e;

    if (lookup_dw_job (ctx, method, payload, &ghost, &st, err) < 0)
        return -1;
    if (!json_is_string (key) || !valid_save_key (json_string_value (key))) {
        char repr[160];
        py_repr (key, repr, sizeof (repr));
        return fail (err, EINVAL, "key %s must be dws.<name>[.<name>...]", repr);
    }
    if (!json_is_object (value))
        return fail (err, EPROTO, "job-manager.dws.save: value must be an object");
    if (st->state == FLUX_JOB_STATE_INACTIVE)
        return fail (err, ENOENT, "job %ju is not held by the dws plugin", (uintmax_t)st->id);
    if (!(text = json_dumps (value, JSON_COMPACT)))
        return fail (err, ENOMEM, "job-manager.dws.save: out of memory");
    if (strlen (text) > SAVE_VALUE_MAX) {
        free (text);
        return fail (err, E2BIG, "job %ju: %s is larger than 64MiB", (uintmax_t)st->id,
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
    return fail (err, e, "job %ju: saving %s failed: %s", (uintmax_t)st->id,
                 json_string_value (key), strerror (e));
}

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
    { "heartbeat", heartbeat_method },
    { "save", save_method },
};

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
    struct flux_msg_cred cred;
    method_f fn = NULL;

    if (flux_request_decode (msg, &topic, &payload_str) < 0) {
        fail (&err, errno, "job-manager.dws: malformed request");
        goto error;
    }
    method = topic + strlen (ctx->prefix);
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
    if (flux_msg_get_cred (msg, &cred) < 0 || !(cred.rolemask & FLUX_ROLE_OWNER)) {
        fail (&err, EPERM,
              "job-manager.dws.%s: only the instance owner may use this method",
              method);
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

static void request_cb (flux_t *h,
                        flux_msg_handler_t *mh,
                        const flux_msg_t *msg,
                        void *arg)
{
    struct plugin_ctx *ctx = arg;

    if (ctx->rebuilding > 0 || ctx->queued) {
        struct queued_msg *q = calloc (1, sizeof (*q));
        if (!q) {
            if (flux_respond_error (h, msg, ENOMEM, NULL) < 0)
                flux_log_error (h, "dws: responding to a request");
            return;
        }
        q->msg = flux_msg_incref (msg);
        *ctx->queued_tail = q;
        ctx->queued_tail = &q->next;
        if (ctx->rebuilding == 0)
            schedule_soon (ctx);
        return;
    }
    dispatch (ctx, msg);
}

/* ------------------------------------------------------------------ plugin */

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
        free (ctx);
        errno = saved_errno;
    }
}

static const struct flux_plugin_handler tab[] = {
    { "job.validate", validate_cb, NULL },
    { "job.new", new_cb, NULL },
    { "job.state.*", state_cb, NULL },
    { "job.event.*", event_cb, NULL },
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
