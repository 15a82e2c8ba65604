/* SPDX-License-Identifier: LGPL-3.0-only */
/* priority-plugin.c - a test-only jobtap plugin that gives every job priority 42, as a
 * site's priority plugin (mf_priority) would: in job.state.priority and job.priority.get.
 * Loaded after the dws plugin (t0005), it overrides the dws plugin's "unavailable".
 */
#include <flux/core.h>
#include <flux/jobtap.h>

static int priority_cb (flux_plugin_t *p,
                        const char *topic,
                        flux_plugin_arg_t *args,
                        void *arg)
{
    return flux_plugin_arg_pack (args, FLUX_PLUGIN_ARG_OUT, "{s:I}", "priority", 42);
}

int flux_plugin_init (flux_plugin_t *p)
{
    if (flux_plugin_set_name (p, "priority-42") < 0
        || flux_plugin_add_handler (p, "job.state.priority", priority_cb, NULL) < 0
        || flux_plugin_add_handler (p, "job.priority.get", priority_cb, NULL) < 0)
        return -1;
    return 0;
}
