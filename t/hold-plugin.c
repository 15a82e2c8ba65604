/* SPDX-License-Identifier: LGPL-3.0-only */
/* hold-plugin.c - a test-only jobtap plugin that stops the job-manager on request.
 *
 * job-manager.hold.hold {"path": FIFO} opens FIFO and reads it to end-of-file before
 * answering, so the job-manager's one thread handles nothing else meanwhile.  A test
 * queues messages behind it in a known order (t0004): the order, not time, decides.
 */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <flux/core.h>
#include <flux/jobtap.h>

static void hold_cb (flux_t *h, flux_msg_handler_t *mh, const flux_msg_t *msg, void *arg)
{
    const char *path;
    char buf[64];
    int fd;

    if (flux_request_unpack (msg, NULL, "{s:s}", "path", &path) < 0
        || (fd = open (path, O_RDONLY)) < 0) {
        if (flux_respond_error (h, msg, errno, NULL) < 0)
            flux_log_error (h, "hold: responding");
        return;
    }
    while (read (fd, buf, sizeof (buf)) > 0)
        ;
    close (fd);
    if (flux_respond (h, msg, NULL) < 0)
        flux_log_error (h, "hold: responding");
}

int flux_plugin_init (flux_plugin_t *p)
{
    if (flux_plugin_set_name (p, "hold") < 0
        || flux_jobtap_service_register (p, "hold", hold_cb, NULL) < 0)
        return -1;
    return 0;
}

// vi:ts=4 sw=4 expandtab
