/************************************************************\
 * This file is part of flux-dws, the Flux adapter for HPE DWS.
 * For details, see doc/protocol.rst and doc/architecture.rst.
 *
 * SPDX-License-Identifier: LGPL-3.0-only
\************************************************************/

/* rabbits.c - the hosts and rabbits of a job's allocation, from R: its
 * execution.nodelist and the JGF Fluxion puts under scheduling (doc/protocol.rst).
 *
 * Layer 2 of 11 (dws-jobtap.h): may call layer 1 only; calls util.c.
 */

#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <flux/hostlist.h>

#include "dws-jobtap.h"

/* Expand R's execution.nodelist (RFC 29 hostlists) into host names.
 */
json_t *hosts_from_R (json_t *R)
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
json_t *rabbits_from_R (json_t *R)
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

/* The containment paths of the job's "ssd" vertices, from the JGF Fluxion put into R
 * (what flux-dws marks down in Fluxion when the job's nodes go back before its Teardown).
 * [] without ssd.
 */
json_t *ssd_from_R (json_t *R)
{
    json_t *vertices = NULL;
    json_t *paths = json_array ();
    json_t *vertex;
    size_t index;
    const char *type = NULL, *path = NULL;

    if (!paths
        || json_unpack (R, "{s:{s:{s:o}}}", "scheduling", "graph", "nodes", &vertices) < 0
        || !json_is_array (vertices))
        return paths ? paths : json_array ();
    json_array_foreach (vertices, index, vertex) {
        if (json_unpack (vertex, "{s:{s:s s:{s:s}}}",
                         "metadata", "type", &type,
                         "paths", "containment", &path) == 0
            && streq (type, "ssd"))
            json_array_append_new (paths, json_string (path));
    }
    return paths;
}

// vi:ts=4 sw=4 expandtab
