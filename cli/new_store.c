/* cli/new_store.c: a replay store that a command creates and then writes nothing to is not left
 * behind (cli.h cli_new_store_begin, cli_new_store_end): rollout and replay import. */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"

/* The store's paths, made before it is, so that an interrupt that ends the process at once can
 * remove it from its signal handler (cli_call_on_interrupt); root "" when none is armed. */
static struct {
    char shards[4200], root[4096], files[4][4300];
    int made_root;
} g_new;

/* The store when nothing was written to it (its shards folder empty, or not made yet): its
 * catalog and shards folder removed, and root too when the command made it (rmdir leaves a
 * folder that holds anything else).  Async-signal-safe (rmdir, unlink). */
static void remove_if_empty(void) {
    if (!g_new.root[0]) return;
    if (rmdir(g_new.shards) != 0 && errno != ENOENT) return; /* a shard: keep it whole */
    for (size_t i = 0; i < 4; i++)
        unlink(g_new.files[i]);
    if (g_new.made_root) rmdir(g_new.root);
}

void cli_new_store_begin(const char *root) {
    static const char *const names[] = {"catalog.sqlite", "catalog.sqlite-wal",
                                        "catalog.sqlite-shm", "catalog.sqlite-journal"};
    struct stat sb;
    char cat[4200];
    snprintf(cat, sizeof cat, "%s/catalog.sqlite", root);
    g_new.root[0] = 0;
    if (lstat(cat, &sb) == 0 || errno != ENOENT) return; /* a store already (or unknown): kept */
    if (snprintf(g_new.root, sizeof g_new.root, "%s", root) >= (int)sizeof g_new.root) {
        g_new.root[0] = 0; /* (too long to name: the store stays) */
        return;
    }
    g_new.made_root = stat(root, &sb) != 0;
    snprintf(g_new.shards, sizeof g_new.shards, "%s/shards", root);
    for (size_t i = 0; i < 4; i++)
        snprintf(g_new.files[i], sizeof g_new.files[i], "%s/%s", root, names[i]);
    cli_call_on_interrupt(remove_if_empty);
}

void cli_new_store_end(int remove) {
    cli_call_on_interrupt(NULL);
    if (remove) remove_if_empty();
    g_new.root[0] = 0;
}
