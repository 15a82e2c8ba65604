/************************************************************\
 * This file is part of flux-dws, the Flux adapter for HPE DWS.
 * For details, see doc/protocol.rst and doc/architecture.rst.
 *
 * SPDX-License-Identifier: LGPL-3.0-only
\************************************************************/

/* dws-jobtap.h - internal interfaces of the dws jobtap plugin (dws-jobtap.so).
 *
 * The plugin is built from several sources linked into one shared object.  They are
 * layers, listed here from the bottom up: a file may call the files listed before it,
 * never one listed after it, so the calls between files go one way
 * (tests/test_jobtap_layers.py holds this, and the layer each file names at its top):
 *
 *    1 util.c        RPC errors, f58 job IDs, durations (FSD), submit-time checks
 *    2 rabbits.c     R and JGF: the hosts and rabbits a job was allocated
 *    3 persistent.c  the persistent storage snapshot; job.validate's check
 *    4 records.c     the record protocol: job records, watch streams
 *    5 job.c         struct dwsjob from the eventlog; rebuilding it after a load
 *    6 holds.c       the holds: dependency, prolog, epilog, storage gate; service-wait
 *    7 service.c     the service: presence, standbys; watch, list, heartbeat
 *    8 methods.c     release, prolog/epilog-finish, raise, post, memo
 *    9 save.c        the save method (the job's KVS directory)
 *   10 dispatch.c    job-manager.dws.* requests: owner check, method table, queue
 *   11 dws-jobtap.c  flux_plugin_init(), the job callbacks and [dws] config
 *
 * The declarations below follow the same order.  Nothing here is exported from the
 * shared object but flux_plugin_init().
 */

#ifndef _DWS_JOBTAP_H
#define _DWS_JOBTAP_H

#include <stdbool.h>
#include <stddef.h>
#include <jansson.h>
#include <flux/core.h>
#include <flux/jobtap.h>

#pragma GCC visibility push(hidden)

#define PLUGIN_NAME "dws"
#define AUX_KEY "dws::job"
#define RECONCILE_TOPIC "dws.reconcile"
#define EVENT_PREFIX "dws-"
#define WAITING_REASON "flux-dws service is not running"
#define STORAGE_REASON "flux-dws service has not yet held again the storage of jobs" \
                       " released early"
#define SERVICE_WAIT_STEP "submit the job again once the service is back"
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
 * At most MAX_QUEUED wait (the owner's service sends a handful); more get EAGAIN.
 */
#define MAX_QUEUED 1024
#define MAX_QUEUED_TEXT "1024"
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
    json_t *attributes;   // {dw, dw_timeout, dw_failure_tolerance, dw_release}
    json_t *hosts;        // expanded R execution.nodelist, [] until allocated
    json_t *rabbits;      // rabbit -> [hosts] from R's scheduling JGF, {} if none
    json_t *ssd;          // the job's ssd vertex paths in that JGF, [] if none
    flux_future_t *R_f;   // KVS lookup of the job's whole R (the job-manager's is redacted)
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
    bool storage_told;    // dws-waiting (STORAGE_REASON) was posted: kept from the
                          // scheduler until the service holds released storage again

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
    int nqueued;                // requests in queued (at most MAX_QUEUED)
    struct pending_save *saves; // save requests waiting for their commit
    json_t *persistent;         // storage name -> entry, from the service (or NULL)
    char *persistent_unknown;   // the words for a name not in it (@NAME@ marks the name)
    bool rabbit_scheduling;     // [dws] rabbit-scheduling: Fluxion schedules ssd parts
    bool storage_held;          // the service said so (storage-held) since the load
    bool order_warned;          // logged that a later plugin gave a kept job a priority
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

/* 1 util.c */
int fail (struct rpc_error *err, int errnum, const char *fmt, ...)
    __attribute__ ((format (printf, 3, 4)));
const char *f58 (flux_jobid_t id, char *buf, size_t size);
bool streq (const char *a, const char *b);
double reactor_now (struct plugin_ctx *ctx);
double parse_fsd (json_t *o);
void format_fsd (double seconds, char *buf, size_t size);
const char *shallow_check (json_t *system, char *buf, size_t size);
json_t *args_system (flux_plugin_arg_t *args);
bool is_dw_system (json_t *system);

/* 2 rabbits.c */
json_t *hosts_from_R (json_t *R);
json_t *rabbits_from_R (json_t *R);
json_t *ssd_from_R (json_t *R);

/* 3 persistent.c */
int persistent_method (struct plugin_ctx *ctx,
                       const flux_msg_t *msg,
                       const char *method,
                       json_t *payload,
                       json_t **response,
                       struct rpc_error *err);
void persistent_forget (struct plugin_ctx *ctx);
const char *persistent_check (struct plugin_ctx *ctx,
                              json_t *system,
                              json_int_t userid,
                              char *buf,
                              size_t size);

/* 4 records.c */
void watcher_destroy (struct watcher *w);
bool service_connected (struct plugin_ctx *ctx);
void watcher_end (struct plugin_ctx *ctx,
                  struct watcher *target,
                  int errnum,
                  const char *text);
void flush_dirty (struct plugin_ctx *ctx);
void schedule_soon (struct plugin_ctx *ctx);
void job_changed (struct dwsjob *st);
json_t *all_records (struct plugin_ctx *ctx);
int watcher_start (struct plugin_ctx *ctx, struct watcher *w);

/* 5 job.c */
void update_from_args (struct dwsjob *st, flux_plugin_arg_t *args);
void apply_entry (struct dwsjob *st, json_t *entry);
void dwsjob_detach (struct dwsjob *st);
void dwsjob_destroy (struct dwsjob *st);
struct dwsjob *dwsjob_create (struct plugin_ctx *ctx,
                              flux_jobid_t id,
                              json_int_t userid,
                              double t_submit,
                              json_t *system);
struct dwsjob *current_job (flux_plugin_t *p);
void start_rebuild (struct dwsjob *st);

/* 6 holds.c */
void cancel_wait (struct dwsjob *st);
void start_wait (struct dwsjob *st);
void tell_waiting (struct dwsjob *st);
void hold_in_depend (struct dwsjob *st);
void start_prolog (struct dwsjob *st);
void note_shells_gone (struct dwsjob *st);
void start_epilog (struct dwsjob *st);
bool storage_gate_closed (struct plugin_ctx *ctx);
int keep_from_scheduler (struct dwsjob *st, flux_plugin_arg_t *args);
int storage_held_method (struct plugin_ctx *ctx,
                         const flux_msg_t *msg,
                         const char *method,
                         json_t *payload,
                         json_t **response,
                         struct rpc_error *err);
int reconcile_cb (flux_plugin_t *p,
                  const char *topic,
                  flux_plugin_arg_t *args,
                  void *arg);

/* 7 service.c */
void service_alive (struct plugin_ctx *ctx);
void presence_expired (flux_reactor_t *r,
                       flux_watcher_t *w,
                       int revents,
                       void *arg);
int watch_method (struct plugin_ctx *ctx,
                  const flux_msg_t *msg,
                  const char *method,
                  json_t *payload,
                  json_t **response,
                  struct rpc_error *err);
int list_method (struct plugin_ctx *ctx,
                 const flux_msg_t *msg,
                 const char *method,
                 json_t *payload,
                 json_t **response,
                 struct rpc_error *err);
int heartbeat_method (struct plugin_ctx *ctx,
                      const flux_msg_t *msg,
                      const char *method,
                      json_t *payload,
                      json_t **response,
                      struct rpc_error *err);

/* 8 methods.c */
int lookup_dw_job (struct plugin_ctx *ctx,
                   const char *method,
                   json_t *payload,
                   struct dwsjob *ghost,
                   struct dwsjob **stp,
                   struct rpc_error *err);
int release_method (struct plugin_ctx *ctx,
                    const flux_msg_t *msg,
                    const char *method,
                    json_t *payload,
                    json_t **response,
                    struct rpc_error *err);
int prolog_finish_method (struct plugin_ctx *ctx,
                          const flux_msg_t *msg,
                          const char *method,
                          json_t *payload,
                          json_t **response,
                          struct rpc_error *err);
int epilog_finish_method (struct plugin_ctx *ctx,
                          const flux_msg_t *msg,
                          const char *method,
                          json_t *payload,
                          json_t **response,
                          struct rpc_error *err);
int raise_method (struct plugin_ctx *ctx,
                  const flux_msg_t *msg,
                  const char *method,
                  json_t *payload,
                  json_t **response,
                  struct rpc_error *err);
int post_method (struct plugin_ctx *ctx,
                 const flux_msg_t *msg,
                 const char *method,
                 json_t *payload,
                 json_t **response,
                 struct rpc_error *err);
int memo_method (struct plugin_ctx *ctx,
                 const flux_msg_t *msg,
                 const char *method,
                 json_t *payload,
                 json_t **response,
                 struct rpc_error *err);

/* 9 save.c */
void save_destroy (struct pending_save *ps);
int save_method (struct plugin_ctx *ctx,
                 const flux_msg_t *msg,
                 const char *method,
                 json_t *payload,
                 json_t **response,
                 struct rpc_error *err);

/* 10 dispatch.c */
void soon_cb (flux_reactor_t *r, flux_watcher_t *w, int revents, void *arg);
void request_cb (flux_t *h,
                 flux_msg_handler_t *mh,
                 const flux_msg_t *msg,
                 void *arg);

/* 11 dws-jobtap.c: only flux_plugin_init(), which the job-manager finds by name */

#pragma GCC visibility pop

#endif /* !_DWS_JOBTAP_H */

// vi:ts=4 sw=4 expandtab
