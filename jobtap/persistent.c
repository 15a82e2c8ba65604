/************************************************************\
 * This file is part of flux-dws, the Flux adapter for HPE DWS.
 * For details, see doc/protocol.rst and doc/architecture.rst.
 *
 * SPDX-License-Identifier: LGPL-3.0-only
\************************************************************/

/* persistent.c - the persistent storage the service sees, for job.validate.
 *
 * The service pushes its snapshot (method "persistent"); job.validate refuses a job
 * whose "#DW persistentdw name=X" names storage the job's user may not use, with the
 * words the service computed (flux_dws.core.persistent.use_refusal), so submit and
 * Proposal say the same thing.  No snapshot (no service since the load, or the service
 * is gone): every job is accepted and the check happens at Proposal.
 *
 * Layer 3 of 11 (dws-jobtap.h): may call layers 1-2 only; calls util.c.
 */

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dws-jobtap.h"

#define MAX_ENTRIES 4096
#define MAX_NAME 63
#define MAX_TEXT 512
#define NAME_MARK "@NAME@"

static bool valid_text (json_t *o)
{
    return json_is_null (o)
           || (json_is_string (o) && json_string_length (o) <= MAX_TEXT
               && strlen (json_string_value (o)) == json_string_length (o));
}

static bool valid_name (const char *s, size_t len)
{
    if (len == 0 || len > MAX_NAME)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
              || c == '-' || c == '_' || c == '.'))
            return false;
    }
    return true;
}

/* {"storage": [{"name", "owner", "refusal", "others"}, ...], "unknown": text}.
 * Replaces the snapshot whole; refused (the old one kept) unless every entry is sound.
 */
int persistent_method (struct plugin_ctx *ctx,
                       const flux_msg_t *msg,
                       const char *method,
                       json_t *payload,
                       json_t **response,
                       struct rpc_error *err)
{
    json_t *storage = json_object_get (payload, "storage");
    json_t *unknown = json_object_get (payload, "unknown");
    json_t *snap;
    size_t index;
    json_t *entry;

    if (!json_is_array (storage) || json_array_size (storage) > MAX_ENTRIES
        || !json_is_string (unknown) || !valid_text (unknown))
        return fail (err, EPROTO,
                     "job-manager.dws.persistent: storage must be a list of at most %d"
                     " entries and unknown a string of at most %d bytes",
                     MAX_ENTRIES, MAX_TEXT);
    if (!(snap = json_object ()))
        return fail (err, ENOMEM, "job-manager.dws.persistent: out of memory");
    json_array_foreach (storage, index, entry) {
        json_t *name = json_object_get (entry, "name");
        json_t *owner = json_object_get (entry, "owner");
        if (!json_is_string (name)
            || !valid_name (json_string_value (name), json_string_length (name))
            || !(json_is_integer (owner) || json_is_null (owner))
            || !valid_text (json_object_get (entry, "refusal"))
            || !valid_text (json_object_get (entry, "others"))
            || json_object_set (snap, json_string_value (name), entry) < 0) {
            json_decref (snap);
            return fail (err, EPROTO,
                         "job-manager.dws.persistent: entry %zu must have a name (at most"
                         " %d of [A-Za-z0-9._-]), an owner uid, refusal and others"
                         " (text or null)",
                         index, MAX_NAME);
        }
    }
    json_decref (ctx->persistent);
    ctx->persistent = snap;
    free (ctx->persistent_unknown);
    ctx->persistent_unknown = strdup (json_string_value (unknown));
    *response = json_object ();
    return 0;
}

void persistent_forget (struct plugin_ctx *ctx)
{
    json_decref (ctx->persistent);
    ctx->persistent = NULL;
    free (ctx->persistent_unknown);
    ctx->persistent_unknown = NULL;
}

/* Why user's "persistentdw name=..." in one #DW line may not run, or NULL. */
static const char *check_line (struct plugin_ctx *ctx,
                               const char *line,
                               json_int_t userid,
                               char *buf,
                               size_t size)
{
    const char *s = line;
    const char *name = NULL;
    size_t len = 0;
    int word = 0;

    while (*s) {
        const char *start;
        while (*s == ' ' || *s == '\t' || *s == '\n')
            s++;
        if (!*s)
            break;
        start = s;
        while (*s && *s != ' ' && *s != '\t' && *s != '\n')
            s++;
        if (word == 0 && !(s - start == 3 && strncmp (start, "#DW", 3) == 0))
            return NULL;
        if (word == 1 && !(s - start == 12 && strncmp (start, "persistentdw", 12) == 0))
            return NULL;
        if (word >= 2 && s - start > 5 && strncmp (start, "name=", 5) == 0) {
            name = start + 5;
            len = s - name;
        }
        word++;
    }
    if (!name || !valid_name (name, len))
        return NULL;  // the service refuses a malformed directive, as today
    char key[MAX_NAME + 1];
    memcpy (key, name, len);
    key[len] = '\0';
    json_t *entry = json_object_get (ctx->persistent, key);
    if (!entry) {
        const char *mark = strstr (ctx->persistent_unknown, NAME_MARK);
        if (!mark)
            snprintf (buf, size, "%s", ctx->persistent_unknown);
        else
            snprintf (buf, size, "%.*s%s%s", (int)(mark - ctx->persistent_unknown),
                      ctx->persistent_unknown, key, mark + strlen (NAME_MARK));
        return buf;
    }
    json_t *owner = json_object_get (entry, "owner");
    bool is_owner = json_is_integer (owner) && json_integer_value (owner) == userid;
    const char *text = json_string_value (json_object_get (entry,
                                                           is_owner ? "refusal" : "others"));
    if (!text)
        return NULL;
    snprintf (buf, size, "%s", text);
    return buf;
}

const char *persistent_check (struct plugin_ctx *ctx,
                              json_t *system,
                              json_int_t userid,
                              char *buf,
                              size_t size)
{
    json_t *dw = json_object_get (system, "dw");
    const char *problem = NULL;

    if (!ctx->persistent || !ctx->persistent_unknown || !dw)
        return NULL;
    if (json_is_string (dw)) {
        /* One string may hold several #DW lines (a batch script's). */
        char *copy = strdup (json_string_value (dw));
        char *save = NULL;
        if (!copy)
            return NULL;
        for (char *line = strtok_r (copy, "\n", &save); line && !problem;
             line = strtok_r (NULL, "\n", &save))
            problem = check_line (ctx, line, userid, buf, size);
        free (copy);
        return problem;
    }
    size_t index;
    json_t *entry;
    json_array_foreach (dw, index, entry) {
        if (!problem && json_is_string (entry))
            problem = check_line (ctx, json_string_value (entry), userid, buf, size);
    }
    return problem;
}

// vi:ts=4 sw=4 expandtab
