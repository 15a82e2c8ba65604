/* SPDX-License-Identifier: LGPL-3.0-only */
/* stall-plugin.c - a test-only jobtap plugin that stalls the job-manager at a job's start.
 *
 * Loaded with fifo=PATH (flux jobtap load stall-plugin.so fifo=PATH), it stops the
 * job-manager's one thread in the first "start" event it sees, before that event is
 * committed, until a writer opens FIFO and closes it: meanwhile the job's shells run and
 * its eventlog grows no further, so an eventlog watch in a shell goes silent (t0002).  The
 * test, not time, ends the stall; BACKSTOP_MS only keeps a broken test from holding the
 * job-manager for ever.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <flux/core.h>
#include <flux/jobtap.h>

static const int BACKSTOP_MS = 300 * 1000;

struct stall {
    char *fifo;
    int done;
};

static void stall_free (void *arg)
{
    struct stall *stall = arg;

    if (stall) {
        free (stall->fifo);
        free (stall);
    }
}

static int new_cb (flux_plugin_t *p, const char *topic, flux_plugin_arg_t *args, void *arg)
{
    return flux_jobtap_job_subscribe (p, FLUX_JOBTAP_CURRENT_JOB);
}

static int start_cb (flux_plugin_t *p, const char *topic, flux_plugin_arg_t *args, void *arg)
{
    struct stall *stall = arg;
    flux_t *h = flux_jobtap_get_flux (p);
    struct pollfd pfd = { .events = POLLIN };
    char buf[64];
    int n;

    if (stall->done)
        return 0;
    stall->done = 1;
    if ((pfd.fd = open (stall->fifo, O_RDONLY | O_NONBLOCK)) < 0) {
        flux_log_error (h, "stall: %s", stall->fifo);
        return -1;
    }
    flux_log (h, LOG_INFO, "stall: the job-manager stalls until %s is written", stall->fifo);
    for (;;) {
        if ((n = poll (&pfd, 1, BACKSTOP_MS)) < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        if ((n = read (pfd.fd, buf, sizeof (buf))) < 0 && errno == EAGAIN)
            continue;
        if (n <= 0)
            break;
    }
    close (pfd.fd);
    flux_log (h, LOG_INFO, "stall: the job-manager goes on");
    return 0;
}

int flux_plugin_init (flux_plugin_t *p)
{
    struct stall *stall;
    const char *fifo;

    if (flux_plugin_conf_unpack (p, "{s:s}", "fifo", &fifo) < 0
        || !(stall = calloc (1, sizeof (*stall))))
        return -1;
    if (!(stall->fifo = strdup (fifo))
        || flux_plugin_aux_set (p, NULL, stall, stall_free) < 0) {
        stall_free (stall);
        return -1;
    }
    if (flux_plugin_set_name (p, "stall") < 0
        || flux_plugin_add_handler (p, "job.new", new_cb, stall) < 0
        || flux_plugin_add_handler (p, "job.event.start", start_cb, stall) < 0)
        return -1;
    return 0;
}

// vi:ts=4 sw=4 expandtab
