/* policy/train_state.c: train_state.json, optimizer moments as safetensors, and numbered
 * training checkpoints (see train_state.h). */
#include "policy/train_state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/assert.h"
#include "core/file.h"
#include "core/json_dump.h"
#include "core/log.h"
#include "policy/checkpoint.h"
#include "policy/safetensors.h"

/* ------------------------------------------------------------------------------------ */
/* files                                                                                 */

static void dir_of(const char *path, char *dir, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(dir, cap, ".");
    } else if (slash == path) {
        snprintf(dir, cap, "/");
    } else {
        snprintf(dir, cap, "%.*s", (int)(slash - path), path);
    }
}

static arl_status fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return arl_errorf(ARL_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    int r = fsync(fd);
    int e = errno;
    close(fd);
    /* some file systems refuse fsync on directories; that is not a data error */
    if (r != 0 && e != EINVAL && e != EROFS)
        return arl_errorf(ARL_ERR_IO, "%s: fsync of the directory failed: %s", dir, strerror(e));
    return ARL_OK;
}

arl_status arl_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", path) >= (int)sizeof tmp)
        return arl_errorf(ARL_ERR_ARG, "%s: path too long", path);
    int fd = mkstemp(tmp);
    if (fd < 0)
        return arl_errorf(errno == ENOSPC ? ARL_ERR_FULL : ARL_ERR_IO, "%s: cannot create: %s", tmp,
                          strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return arl_errorf(e == ENOSPC ? ARL_ERR_FULL : ARL_ERR_IO, "%s: write failed: %s", tmp,
                              strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fchmod(fd, 0644) != 0 || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return arl_errorf(ARL_ERR_IO, "%s: fsync failed: %s", tmp, strerror(e));
    }
    if (close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return arl_errorf(ARL_ERR_IO, "%s: close failed: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return arl_errorf(ARL_ERR_IO, "%s: rename into place failed: %s", path, strerror(e));
    }
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    return fsync_dir(dir);
}

static int rm_cb(const char *p, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)type;
    (void)ftw;
    return remove(p) != 0 ? -1 : 0;
}

static arl_status rm_tree(const char *path) {
    if (nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        return arl_errorf(ARL_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return ARL_OK;
}

/* ------------------------------------------------------------------------------------ */
/* train state                                                                           */

void arl_train_state_init(arl_train_state *st) {
    memset(st, 0, sizeof *st);
}

void arl_train_state_free(arl_train_state *st) {
    if (!st) return;
    free(st->extra_json);
    free(st->run_config_json);
    memset(st, 0, sizeof *st);
}

arl_status arl_train_state_set_rng(arl_train_state *st, const char *name, const arl_rng *r) {
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len >= ARL_TRAIN_RNG_NAME)
        return arl_errorf(ARL_ERR_ARG, "train state: generator name '%s' must have 1 to %d bytes",
                          name ? name : "", ARL_TRAIN_RNG_NAME - 1);
    for (int32_t i = 0; i < st->n_rng; i++)
        if (!strcmp(st->rng_name[i], name)) {
            st->rng[i] = *r;
            return ARL_OK;
        }
    if (st->n_rng >= ARL_TRAIN_MAX_RNG)
        return arl_errorf(ARL_ERR_FULL, "train state: more than %d generators (adding '%s')",
                          ARL_TRAIN_MAX_RNG, name);
    memcpy(st->rng_name[st->n_rng], name, len + 1);
    st->rng[st->n_rng++] = *r;
    return ARL_OK;
}

arl_status arl_train_state_get_rng(const arl_train_state *st, const char *name, arl_rng *r) {
    for (int32_t i = 0; i < st->n_rng; i++)
        if (!strcmp(st->rng_name[i], name)) {
            *r = st->rng[i];
            return ARL_OK;
        }
    return arl_errorf(ARL_ERR_NOT_FOUND, "train state: no generator named '%s'", name);
}

/* *slot := a compact copy of text (a JSON object; NULL clears); what names it in the error. */
static arl_status set_object_text(char **slot, const char *text, const char *what) {
    char *copy = NULL;
    if (text) {
        json_error_t e;
        json_t *j = arl_json_loads(text, 0, &e);
        if (!j && arl_json_error_nomem(&e))
            return arl_errorf(ARL_ERR_NOMEM, "train state: '%s': out of memory", what);
        if (!j || !json_is_object(j)) {
            json_decref(j);
            return arl_errorf(ARL_ERR_ARG, "train state: '%s' must be a JSON object", what);
        }
        copy = arl_json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
        json_decref(j);
        if (!copy) return arl_errorf(ARL_ERR_NOMEM, "train state: out of memory");
    }
    free(*slot);
    *slot = copy;
    return ARL_OK;
}

arl_status arl_train_state_set_extra(arl_train_state *st, const char *text) {
    return set_object_text(&st->extra_json, text, "extra");
}

arl_status arl_train_state_set_run_config(arl_train_state *st, const char *text) {
    return set_object_text(&st->run_config_json, text, "run_config");
}

static json_t *hex_u64(uint64_t v) {
    char buf[24];
    snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
    return json_string(buf);
}

arl_status arl_train_state_write(const char *path, const arl_train_state *st) {
    json_t *root = json_object();
    json_t *rng = json_object();
    json_t *data = json_object();
    if (!root || !rng || !data) goto nomem;
    int bad = 0;
    bad |= json_object_set_new(root, "format", json_string(ARL_TRAIN_STATE_FORMAT));
    bad |= json_object_set_new(root, "version", json_integer(ARL_TRAIN_STATE_VERSION));
    bad |= json_object_set_new(root, "step", json_integer(st->step));
    bad |= json_object_set_new(root, "tokens", json_integer(st->tokens));
    bad |= json_object_set_new(root, "lr", json_real(st->lr));
    bad |= json_object_set_new(root, "model_config_sha256", json_string(st->model_sha256));
    bad |= json_object_set_new(root, "run_config_sha256", json_string(st->run_sha256));
    for (int32_t i = 0; i < st->n_rng; i++) {
        json_t *a = json_array();
        if (!a) goto nomem;
        for (int w = 0; w < 4; w++)
            bad |= json_array_append_new(a, hex_u64(st->rng[i].s[w]));
        bad |= json_object_set_new(rng, st->rng_name[i], a);
    }
    bad |= json_object_set(root, "rng", rng);
    const arl_data_cursor *c = &st->data;
    bad |= json_object_set_new(data, "epoch", json_integer(c->epoch));
    bad |= json_object_set_new(data, "index", json_integer(c->index));
    bad |= json_object_set_new(data, "items", json_integer(c->items));
    bad |= json_object_set_new(data, "seed", hex_u64(c->seed));
    bad |= json_object_set_new(data, "offset", json_integer(c->offset));
    bad |= json_object_set_new(data, "line", json_integer(c->line));
    bad |= json_object_set_new(data, "sha256", json_string(c->sha256));
    bad |= json_object_set(root, "data", data);
    const char *const texts[2] = {st->extra_json, st->run_config_json};
    const char *const names[2] = {"extra", "run_config"};
    for (int i = 0; i < 2; i++) {
        if (!texts[i]) continue;
        json_error_t e;
        json_t *x = arl_json_loads(texts[i], 0, &e);
        if (!x || !json_is_object(x)) {
            json_decref(x);
            json_decref(root);
            json_decref(rng);
            json_decref(data);
            if (!x && arl_json_error_nomem(&e))
                return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
            return arl_errorf(ARL_ERR_ARG, "%s: train state '%s' is not a JSON object", path,
                              names[i]);
        }
        bad |= json_object_set_new(root, names[i], x);
    }
    if (bad) goto nomem;
    char *text = arl_json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(root);
    json_decref(rng);
    json_decref(data);
    if (!text) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
    size_t n = strlen(text);
    arl_status s = ARL_OK;
    char *t2 = realloc(text, n + 2);
    if (!t2)
        s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
    else {
        text = t2;
        text[n] = '\n';
        text[n + 1] = 0;
        s = arl_write_file_atomic(path, text, n + 1);
    }
    free(text);
    return s;
nomem:
    json_decref(root);
    json_decref(rng);
    json_decref(data);
    return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
}

static arl_status get_i64(const json_t *obj, const char *key, const char *path, const char *ctx,
                          int64_t *out) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v))
        return arl_errorf(ARL_ERR_FORMAT, "%s: member '%s%s': expected an integer", path, ctx, key);
    *out = json_integer_value(v);
    return ARL_OK;
}

static arl_status get_u64_hex(const json_t *v, const char *path, const char *what, uint64_t *out) {
    const char *s = json_string_value(v);
    char *end = NULL;
    if (!s || strncmp(s, "0x", 2) != 0 || !s[2])
        return arl_errorf(ARL_ERR_FORMAT, "%s: member '%s': expected a hex string \"0x...\"", path,
                          what);
    errno = 0;
    unsigned long long x = strtoull(s + 2, &end, 16);
    if (errno || *end)
        return arl_errorf(ARL_ERR_FORMAT, "%s: member '%s': bad hex value '%s'", path, what, s);
    *out = (uint64_t)x;
    return ARL_OK;
}

static arl_status get_hash(const json_t *obj, const char *key, const char *path, char *out) {
    json_t *v = json_object_get(obj, key);
    const char *s = json_string_value(v);
    if (!s || (strlen(s) != 0 && strlen(s) != 64))
        return arl_errorf(ARL_ERR_FORMAT, "%s: member '%s': expected a SHA-256 hex string", path,
                          key);
    memcpy(out, s, strlen(s) + 1);
    return ARL_OK;
}

arl_status arl_train_state_read(const char *path, arl_train_state *st) {
    arl_train_state_init(st);
    json_error_t e;
    json_t *root = arl_json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    if (!root) {
        if (arl_json_error_nomem(&e)) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
        if (access(path, F_OK) != 0)
            return arl_errorf(ARL_ERR_NOT_FOUND, "%s: no such train state file", path);
        return arl_errorf(ARL_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", path, e.line, e.column,
                          e.text);
    }
    arl_status s = ARL_OK;
    const char *fmt = json_string_value(json_object_get(root, "format"));
    json_t *ver = json_object_get(root, "version");
    if (!json_is_object(root) || !fmt || strcmp(fmt, ARL_TRAIN_STATE_FORMAT)) {
        s = arl_errorf(ARL_ERR_FORMAT,
                       "%s: not an agentrl train state (member 'format' is not "
                       "\"%s\")",
                       path, ARL_TRAIN_STATE_FORMAT);
        goto done;
    }
    if (!json_is_integer(ver) || json_integer_value(ver) < 1) {
        s = arl_errorf(ARL_ERR_FORMAT, "%s: member 'version': expected a positive integer", path);
        goto done;
    }
    if (json_integer_value(ver) > ARL_TRAIN_STATE_VERSION) {
        s = arl_errorf(ARL_ERR_VERSION,
                       "%s: train state version %lld was written by a newer agentrl; this build "
                       "reads up to version %d (upgrade agentrl to resume this run)",
                       path, (long long)json_integer_value(ver), ARL_TRAIN_STATE_VERSION);
        goto done;
    }
    if ((s = get_i64(root, "step", path, "", &st->step))) goto done;
    if ((s = get_i64(root, "tokens", path, "", &st->tokens))) goto done;
    json_t *lr = json_object_get(root, "lr");
    if (!json_is_number(lr)) {
        s = arl_errorf(ARL_ERR_FORMAT, "%s: member 'lr': expected a number", path);
        goto done;
    }
    st->lr = json_number_value(lr);
    if ((s = get_hash(root, "model_config_sha256", path, st->model_sha256))) goto done;
    if ((s = get_hash(root, "run_config_sha256", path, st->run_sha256))) goto done;
    json_t *rng = json_object_get(root, "rng");
    if (!json_is_object(rng)) {
        s = arl_errorf(ARL_ERR_FORMAT, "%s: member 'rng': expected an object", path);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(rng, key, v) {
        arl_rng r;
        if (!json_is_array(v) || json_array_size(v) != 4) {
            s = arl_errorf(ARL_ERR_FORMAT, "%s: member 'rng.%s': expected 4 hex strings", path,
                           key);
            goto done;
        }
        char what[96];
        snprintf(what, sizeof what, "rng.%s", key);
        for (int w = 0; w < 4; w++)
            if ((s = get_u64_hex(json_array_get(v, (size_t)w), path, what, &r.s[w]))) goto done;
        if ((s = arl_train_state_set_rng(st, key, &r))) {
            s = arl_error_prefix(ARL_ERR_FORMAT, "%s", path);
            goto done;
        }
    }
    json_t *d = json_object_get(root, "data");
    if (!json_is_object(d)) {
        s = arl_errorf(ARL_ERR_FORMAT, "%s: member 'data': expected an object", path);
        goto done;
    }
    arl_data_cursor *c = &st->data;
    if ((s = get_i64(d, "epoch", path, "data.", &c->epoch))) goto done;
    if ((s = get_i64(d, "index", path, "data.", &c->index))) goto done;
    if ((s = get_i64(d, "items", path, "data.", &c->items))) goto done;
    if ((s = get_i64(d, "offset", path, "data.", &c->offset))) goto done;
    if ((s = get_i64(d, "line", path, "data.", &c->line))) goto done;
    if ((s = get_u64_hex(json_object_get(d, "seed"), path, "data.seed", &c->seed))) goto done;
    if ((s = get_hash(d, "sha256", path, c->sha256))) {
        s = arl_error_prefix(s, "data");
        goto done;
    }
    char **const slots[2] = {&st->extra_json, &st->run_config_json};
    const char *const names[2] = {"extra", "run_config"};
    for (int i = 0; i < 2; i++) { /* both optional */
        json_t *x = json_object_get(root, names[i]);
        if (!x || json_is_null(x)) continue;
        if (!json_is_object(x)) {
            s = arl_errorf(ARL_ERR_FORMAT, "%s: member '%s': expected an object", path, names[i]);
            goto done;
        }
        *slots[i] = arl_json_dumps(x, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
        if (!*slots[i]) {
            s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
    }
done:
    json_decref(root);
    if (s) arl_train_state_free(st);
    return s;
}

arl_status arl_train_state_check(const arl_train_state *st, const char *where,
                                 const char *model_sha256, const char *run_sha256) {
    if (model_sha256 && strcmp(st->model_sha256, model_sha256))
        return arl_errorf(ARL_ERR_CONFIG,
                          "%s: this train state belongs to another model config (saved with "
                          "model config %s, this run has %s); resume with the model config of "
                          "that run, or start a new run in another output directory",
                          where, st->model_sha256[0] ? st->model_sha256 : "(none)", model_sha256);
    if (run_sha256 && run_sha256[0] && strcmp(st->run_sha256, run_sha256))
        return arl_errorf(ARL_ERR_CONFIG,
                          "%s: this train state belongs to another run configuration (saved "
                          "with run config %s, this run has %s); an exact resume needs the same "
                          "settings: restore them, or start a new run in another output "
                          "directory",
                          where, st->run_sha256[0] ? st->run_sha256 : "(none)", run_sha256);
    return ARL_OK;
}

/* The differences of two settings objects, flattened ("learner.lr"), appended to a list. */
typedef struct diff_list {
    char text[1536];
    size_t len;
    int n;
} diff_list;

static int cmp_key(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void diff_value_text(const json_t *v, char *out, size_t cap) {
    if (!v) {
        snprintf(out, cap, "(unset)");
    } else if (json_is_real(v)) {
        snprintf(out, cap, "%.9g", json_real_value(v));
    } else {
        char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_SORT_KEYS);
        snprintf(out, cap, "%s", t ? t : "?");
        free(t);
    }
}

static void diff_objects(const json_t *a, const json_t *b, const char *prefix, diff_list *d) {
    /* the union of the keys, sorted */
    const size_t na = json_object_size(a), nb = json_object_size(b);
    const char **keys = malloc((na + nb + 1) * sizeof *keys);
    if (!keys) return;
    size_t n = 0;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)a, k, v) keys[n++] = k;
    json_object_foreach((json_t *)b, k, v) if (!json_object_get(a, k)) keys[n++] = k;
    qsort(keys, n, sizeof *keys, cmp_key);
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_object_get(a, keys[i]), *y = json_object_get(b, keys[i]);
        char name[512];
        snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", keys[i]);
        if (json_is_object(x) && json_is_object(y)) {
            diff_objects(x, y, name, d);
            continue;
        }
        if (x && y && json_equal((json_t *)x, (json_t *)y)) continue;
        if (d->n++ >= 8) continue;
        char vx[160], vy[160];
        diff_value_text(x, vx, sizeof vx);
        diff_value_text(y, vy, sizeof vy);
        if (d->len < sizeof d->text)
            d->len += (size_t)snprintf(d->text + d->len, sizeof d->text - d->len, "%s%s %s -> %s",
                                       d->n > 1 ? ", " : "", name, vx, vy);
    }
    free(keys);
}

int arl_run_config_diff(const char *saved_json, const char *now_json, char *out, size_t cap) {
    diff_list d = {.len = 0};
    json_t *a = saved_json ? arl_json_loads(saved_json, 0, NULL) : NULL;
    json_t *b = now_json ? arl_json_loads(now_json, 0, NULL) : NULL;
    if (json_is_object(a) && json_is_object(b)) diff_objects(a, b, "", &d);
    json_decref(a);
    json_decref(b);
    if (d.n > 8)
        snprintf(d.text + d.len, d.len < sizeof d.text ? sizeof d.text - d.len : 0, " and %d more",
                 d.n - 8);
    if (cap) snprintf(out, cap, "%s", d.text);
    return d.n;
}

arl_status arl_train_ckpt_explain(arl_status s, const char *dir, const arl_model_config *cfg,
                                  const char *run_config_json) {
    if (s != ARL_ERR_CONFIG || !run_config_json) return s;
    char msg[2048], path[4200];
    snprintf(msg, sizeof msg, "%s", arl_error_msg());
    snprintf(path, sizeof path, "%s/%s", dir, ARL_TRAIN_STATE_FILE);
    arl_train_state st;
    if (arl_train_state_read(path, &st) != ARL_OK) {
        arl_errorf(s, "%s", msg); /* the refusal as it was */
        return s;
    }
    /* the refusal of the run's settings: the same model config, another run hash */
    char model_hex[ARL_SHA256_HEX_CHARS], run_hex[ARL_SHA256_HEX_CHARS];
    uint8_t dg[ARL_SHA256_BYTES];
    if (arl_model_config_hash_hex(cfg, model_hex) != ARL_OK) {
        arl_errorf(s, "%s", msg); /* the refusal as it was */
        return s;
    }
    arl_sha256(run_config_json, strlen(run_config_json), dg);
    arl_sha256_hex(dg, run_hex);
    char text[1600] = "";
    int n = 0;
    if (!strcmp(st.model_sha256, model_hex) && strcmp(st.run_sha256, run_hex))
        n = arl_run_config_diff(st.run_config_json, run_config_json, text, sizeof text);
    arl_train_state_free(&st);
    if (n > 0)
        arl_errorf(s,
                   "%s: this checkpoint belongs to a run with other settings (as saved -> as "
                   "now): %s; an exact resume needs the same settings: restore them, or start a "
                   "new run in another output directory",
                   path, text);
    else
        arl_errorf(s, "%s", msg);
    return s;
}

/* ------------------------------------------------------------------------------------ */
/* optimizer moments                                                                     */

static const char *const moment_suffix[2] = {".exp_avg", ".exp_avg_sq"};

arl_status arl_optim_state_save(const char *path, const arl_adamw *opt) {
    arl_st_writer *w;
    ARL_TRY(arl_st_writer_open(path, &w));
    arl_st_writer_data_crc(w); /* a byte changed on disk later is found at load */
    char buf[32];
    arl_status s = arl_st_writer_set_metadata(w, "format", ARL_OPTIM_STATE_FORMAT);
    snprintf(buf, sizeof buf, "%d", ARL_OPTIM_STATE_VERSION);
    if (!s) s = arl_st_writer_set_metadata(w, "version", buf);
    snprintf(buf, sizeof buf, "%lld", (long long)opt->step);
    if (!s) s = arl_st_writer_set_metadata(w, "step", buf);
    const arl_param_inventory *inv = &opt->m.inv;
    char name[512];
    for (int64_t i = 0; i < inv->n && !s; i++) {
        if (!(opt->rule[i] & ARL_OPTIM_TRAIN)) continue;
        const arl_param_tensor *t = &inv->t[i];
        for (int k = 0; k < 2 && !s; k++) {
            snprintf(name, sizeof name, "%s%s", t->name, moment_suffix[k]);
            const float *src = (k ? opt->v_arena : opt->m_arena) + t->offset;
            s = arl_st_writer_add(w, name, ARL_DTYPE_F32, t->rank, t->shape, src);
        }
    }
    if (s) {
        arl_st_writer_abort(w);
        return arl_error_prefix(s, "%s", path);
    }
    return arl_st_writer_close(w);
}

/* Append "name" to a problem list (at most ARL_CHECKPOINT_MAX_LISTED names, then a count). */
typedef struct problems {
    char text[1536];
    int64_t n;
} problems;

static void problem_add(problems *p, const char *fmt, const char *a, const char *b) {
    if (p->n < ARL_CHECKPOINT_MAX_LISTED) {
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, "%s", p->n ? ", " : "");
        used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, fmt, a, b);
    }
    p->n++;
}

static void problem_finish(problems *p) {
    if (p->n > ARL_CHECKPOINT_MAX_LISTED) {
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, " and %lld more",
                 (long long)(p->n - ARL_CHECKPOINT_MAX_LISTED));
    }
}

/* Index of the trained tensor whose moment key this is, or -1. */
static int64_t moment_owner(const arl_adamw *opt, const char *key) {
    size_t n = strlen(key);
    for (int k = 1; k >= 0; k--) { /* ".exp_avg_sq" before ".exp_avg" */
        size_t sl = strlen(moment_suffix[k]);
        if (n > sl && !strcmp(key + n - sl, moment_suffix[k])) {
            char base[512];
            if (n - sl >= sizeof base) return -1;
            memcpy(base, key, n - sl);
            base[n - sl] = 0;
            int64_t i = arl_param_inventory_find(&opt->m.inv, base);
            return i >= 0 && (opt->rule[i] & ARL_OPTIM_TRAIN) ? i : -1;
        }
    }
    return -1;
}

arl_status arl_optim_state_load(const char *path, arl_adamw *opt) {
    arl_st_file *f;
    ARL_TRY(arl_st_file_open(path, &f));
    arl_status s = arl_st_file_check_data(f);
    if (s) goto done;
    const char *fmt = arl_st_file_metadata(f, "format");
    const char *ver = arl_st_file_metadata(f, "version");
    const char *stp = arl_st_file_metadata(f, "step");
    if (!fmt || strcmp(fmt, ARL_OPTIM_STATE_FORMAT) || !ver || !stp) {
        s = arl_errorf(ARL_ERR_FORMAT,
                       "%s: not an agentrl optimizer state (metadata 'format' must be \"%s\" with "
                       "'version' and 'step')",
                       path, ARL_OPTIM_STATE_FORMAT);
        goto done;
    }
    char *end;
    long long v = strtoll(ver, &end, 10);
    if (*end || v < 1) {
        s = arl_errorf(ARL_ERR_FORMAT, "%s: metadata 'version' is not a positive integer", path);
        goto done;
    }
    if (v > ARL_OPTIM_STATE_VERSION) {
        s = arl_errorf(ARL_ERR_VERSION,
                       "%s: optimizer state version %lld was written by a newer agentrl; this "
                       "build reads up to version %d",
                       path, v, ARL_OPTIM_STATE_VERSION);
        goto done;
    }
    long long step = strtoll(stp, &end, 10);
    if (*end || step < 0) {
        s = arl_errorf(ARL_ERR_FORMAT, "%s: metadata 'step' is not a non-negative integer", path);
        goto done;
    }
    const arl_param_inventory *inv = &opt->m.inv;
    problems missing = {{0}, 0}, shape = {{0}, 0}, extra = {{0}, 0};
    char name[512], sb[2][96];
    for (int64_t i = 0; i < inv->n; i++) {
        if (!(opt->rule[i] & ARL_OPTIM_TRAIN)) continue;
        const arl_param_tensor *t = &inv->t[i];
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "%s%s", t->name, moment_suffix[k]);
            const arl_st_tensor *x = arl_st_file_find(f, name);
            if (!x) {
                problem_add(&missing, "%s%s", name, "");
                continue;
            }
            int ok = x->dtype == ARL_DTYPE_F32 && x->rank == t->rank;
            for (int32_t d = 0; ok && d < t->rank; d++)
                ok = x->shape[d] == t->shape[d];
            if (!ok) {
                char desc[700];
                arl_st_shape_str(t->rank, t->shape, sb[0], sizeof sb[0]);
                arl_st_shape_str(x->rank, x->shape, sb[1], sizeof sb[1]);
                snprintf(desc, sizeof desc, "%s (expected F32 %s, got %s %s)", name, sb[0],
                         arl_dtype_name(x->dtype), sb[1]);
                problem_add(&shape, "%s%s", desc, "");
            }
        }
    }
    for (int64_t i = 0; i < arl_st_file_count(f); i++) {
        const arl_st_tensor *x = arl_st_file_tensor(f, i);
        if (moment_owner(opt, x->name) < 0) problem_add(&extra, "%s%s", x->name, "");
    }
    if (missing.n || shape.n || extra.n) {
        problem_finish(&missing);
        problem_finish(&shape);
        problem_finish(&extra);
        s = arl_errorf(ARL_ERR_SHAPE,
                       "%s: optimizer state does not match the model: %lld missing%s%s, %lld "
                       "mis-shaped%s%s, %lld unexpected%s%s (was it saved for another config?)",
                       path, (long long)missing.n, missing.n ? ": " : "", missing.text,
                       (long long)shape.n, shape.n ? ": " : "", shape.text, (long long)extra.n,
                       extra.n ? ": " : "", extra.text);
        goto done;
    }
    for (int64_t i = 0; i < inv->n && !s; i++) {
        if (!(opt->rule[i] & ARL_OPTIM_TRAIN)) continue;
        const arl_param_tensor *t = &inv->t[i];
        for (int k = 0; k < 2 && !s; k++) {
            snprintf(name, sizeof name, "%s%s", t->name, moment_suffix[k]);
            const arl_st_tensor *x = arl_st_file_find(f, name);
            float *dst = (k ? opt->v_arena : opt->m_arena) + t->offset;
            s = arl_st_tensor_read_raw(x, dst, (uint64_t)t->numel * sizeof(float));
        }
    }
    if (!s) opt->step = step;
done:
    arl_st_file_close(f);
    return s;
}

/* ------------------------------------------------------------------------------------ */
/* numbered checkpoints                                                                  */

#define STEP_PREFIX "step-"
#define TMP_PREFIX ".tmp-step-"
#define OLD_PREFIX ".old-step-"

/* step of a "step-NNNNNNNN" name, or -1. */
static int64_t parse_step_name(const char *name) {
    if (strncmp(name, STEP_PREFIX, strlen(STEP_PREFIX))) return -1;
    const char *p = name + strlen(STEP_PREFIX);
    if (!*p) return -1;
    int64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Open ROOT for listing: *d NULL (and ARL_OK) when it does not exist yet. */
static arl_status root_open(const char *root, DIR **d) {
    *d = opendir(root);
    if (*d || errno == ENOENT) return ARL_OK;
    return arl_errorf(ARL_ERR_IO, "%s: cannot list: %s", root, strerror(errno));
}

arl_status arl_train_ckpt_list(const char *root, int64_t **steps, int64_t *n) {
    *steps = NULL;
    *n = 0;
    DIR *d;
    ARL_TRY(root_open(root, &d));
    if (!d) return ARL_OK;
    int64_t cap = 0;
    struct dirent *e;
    arl_status s = ARL_OK;
    while ((e = readdir(d))) {
        int64_t st = parse_step_name(e->d_name);
        if (st < 0) continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s/%s", root, e->d_name, ARL_TRAIN_STATE_FILE);
        if (access(p, F_OK) != 0) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *nv = realloc(*steps, (size_t)cap * sizeof *nv);
            if (!nv) {
                s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", root);
                break;
            }
            *steps = nv;
        }
        (*steps)[(*n)++] = st;
    }
    closedir(d);
    if (s) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return s;
    }
    if (*n) qsort(*steps, (size_t)*n, sizeof **steps, cmp_i64);
    return ARL_OK;
}

static void step_dir(char *out, size_t cap, const char *root, int64_t step) {
    snprintf(out, cap, "%s/" STEP_PREFIX "%08lld", root, (long long)step);
}

arl_status arl_train_ckpt_latest(const char *root, char *path, size_t cap, int64_t *step) {
    int64_t *steps, n;
    ARL_TRY(arl_train_ckpt_list(root, &steps, &n));
    if (n == 0)
        return arl_errorf(ARL_ERR_NOT_FOUND,
                          "%s: no complete training checkpoint (step-N "
                          "directory with %s)",
                          root, ARL_TRAIN_STATE_FILE);
    int64_t last = steps[n - 1];
    free(steps);
    /* the directory name may carry more or fewer leading zeros than step_dir writes */
    DIR *d = opendir(root);
    if (!d) return arl_errorf(ARL_ERR_IO, "%s: cannot list: %s", root, strerror(errno));
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d)))
        if (parse_step_name(e->d_name) == last) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s/%s", root, e->d_name, ARL_TRAIN_STATE_FILE);
            if (access(p, F_OK) != 0) continue;
            snprintf(path, cap, "%s/%s", root, e->d_name);
            found = 1;
            break;
        }
    closedir(d);
    if (!found) return arl_errorf(ARL_ERR_NOT_FOUND, "%s: checkpoint vanished", root);
    if (step) *step = last;
    return ARL_OK;
}

/* Step of a save's ".old-step-N-XXXXXX" name (a checkpoint moved aside to be replaced), or -1
 * (also for prune's ".old-step-N-pruned", which is being deleted). */
static int64_t parse_old_name(const char *name) {
    if (strncmp(name, OLD_PREFIX, strlen(OLD_PREFIX))) return -1;
    const char *p = name + strlen(OLD_PREFIX);
    int64_t v = 0;
    const char *digits = p;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    if (p == digits || *p != '-' || !strcmp(p + 1, "pruned")) return -1;
    return v;
}

/* Remove what interrupted saves and prunes left under ROOT.  A save that replaces step-N moves
 * it to .old-step-N-XXXXXX before renaming the new one into place: where step-N is missing, a
 * complete one (with train_state.json) goes back to step-N with a warning.  The other
 * .old-step-* (prune's .old-step-N-pruned among them) and the .tmp-step-* of a save that did not
 * finish are removed. */
static arl_status remove_leftovers(const char *root) {
    DIR *d;
    ARL_TRY(root_open(root, &d));
    if (!d) return ARL_OK;
    struct dirent *e;
    arl_status s = ARL_OK;
    int changed = 0;
    while (!s && (e = readdir(d))) {
        int tmp = !strncmp(e->d_name, TMP_PREFIX, strlen(TMP_PREFIX));
        if (!tmp && strncmp(e->d_name, OLD_PREFIX, strlen(OLD_PREFIX))) continue;
        char p[4096], f[4200], final[4096];
        snprintf(p, sizeof p, "%s/%s", root, e->d_name);
        int64_t st = tmp ? -1 : parse_old_name(e->d_name);
        struct stat sb;
        if (st >= 0) {
            step_dir(final, sizeof final, root, st);
            snprintf(f, sizeof f, "%s/%s", p, ARL_TRAIN_STATE_FILE);
            if (lstat(final, &sb) != 0 && errno == ENOENT && access(f, F_OK) == 0) {
                if (rename(p, final) != 0)
                    s = arl_errorf(ARL_ERR_IO, "%s: cannot put the checkpoint back as %s: %s", p,
                                   final, strerror(errno));
                else
                    arl_log_warn("checkpoint %s was missing: a save that replaced it was "
                                 "interrupted; put back from %s",
                                 final, p);
                changed = 1;
                continue;
            }
        }
        s = rm_tree(p);
        changed = 1;
    }
    closedir(d);
    if (!s && changed) s = fsync_dir(root);
    return s;
}

static arl_status prune(const char *root, int64_t keep_last) {
    if (keep_last <= 0) return ARL_OK;
    DIR *d = opendir(root);
    if (!d) return arl_errorf(ARL_ERR_IO, "%s: cannot list: %s", root, strerror(errno));
    /* keep the newest keep_last complete checkpoints; remove every step-N directory older
       than the oldest kept, complete or not */
    int64_t *steps = NULL, n = 0;
    arl_status s = arl_train_ckpt_list(root, &steps, &n);
    if (s) {
        closedir(d);
        return s;
    }
    int64_t oldest_kept = n > keep_last ? steps[n - keep_last] : (n ? steps[0] : INT64_MIN);
    free(steps);
    struct dirent *e;
    while ((e = readdir(d)) && !s) {
        int64_t st = parse_step_name(e->d_name);
        if (st < 0 || st >= oldest_kept) continue;
        /* rename first, so that a crash in the middle of the removal never leaves a
           partly deleted directory under a step- name */
        char p[4096], old[4096];
        snprintf(p, sizeof p, "%s/%s", root, e->d_name);
        snprintf(old, sizeof old, "%s/" OLD_PREFIX "%lld-pruned", root, (long long)st);
        if (rename(p, old) != 0)
            s = arl_errorf(ARL_ERR_IO, "%s: cannot move aside for removal: %s", p,
                           strerror(errno));
        if (!s) s = rm_tree(old);
    }
    closedir(d);
    if (!s) s = fsync_dir(root);
    return s;
}

arl_status arl_train_ckpt_save(const char *root, const arl_model_config *cfg,
                               const arl_model_params *params, const arl_adamw *opt,
                               const arl_train_state *st, int64_t keep_last, uint64_t shard_bytes,
                               char *path_out, size_t cap) {
    ARL_ASSERT(st->step >= 0);
    ARL_TRY(arl_mkdir_p(root));
    ARL_TRY(remove_leftovers(root));
    char tmp[4096], final[4096], path[4200];
    snprintf(tmp, sizeof tmp, "%s/" TMP_PREFIX "%08lld-XXXXXX", root, (long long)st->step);
    if (!mkdtemp(tmp))
        return arl_errorf(errno == ENOSPC ? ARL_ERR_FULL : ARL_ERR_IO,
                          "%s: cannot create a temporary checkpoint directory: %s", root,
                          strerror(errno));
    arl_status s = arl_checkpoint_save(tmp, cfg, params, shard_bytes);
    if (!s) {
        snprintf(path, sizeof path, "%s/%s", tmp, ARL_OPTIM_STATE_FILE);
        s = arl_optim_state_save(path, opt);
    }
    if (!s) {
        snprintf(path, sizeof path, "%s/%s", tmp, ARL_TRAIN_STATE_FILE);
        s = arl_train_state_write(path, st);
    }
    if (!s) s = fsync_dir(tmp);
    step_dir(final, sizeof final, root, st->step);
    char old[4096] = "";
    if (!s && access(final, F_OK) == 0) {
        /* a checkpoint of this step exists (a run resumed from an earlier one): swap it out */
        snprintf(old, sizeof old, "%s/" OLD_PREFIX "%08lld-XXXXXX", root, (long long)st->step);
        if (!mkdtemp(old) || rename(final, old) != 0)
            s = arl_errorf(ARL_ERR_IO, "%s: cannot move the existing checkpoint aside: %s", final,
                           strerror(errno));
    }
    if (!s && rename(tmp, final) != 0)
        s = arl_errorf(ARL_ERR_IO, "%s: cannot rename %s into place: %s", final, tmp,
                       strerror(errno));
    if (s) {
        rm_tree(tmp);
        return arl_error_prefix(s, "saving training checkpoint of step %lld", (long long)st->step);
    }
    ARL_TRY(fsync_dir(root));
    if (old[0]) ARL_TRY(rm_tree(old));
    if (path_out) snprintf(path_out, cap, "%s", final);
    return prune(root, keep_last);
}

arl_status arl_train_ckpt_load(const char *dir, const arl_model_config *cfg, const char *run_sha256,
                               arl_model_params *params, arl_adamw *opt, arl_train_state *st) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, ARL_TRAIN_STATE_FILE);
    ARL_TRY(arl_train_state_read(path, st));
    char model_hex[ARL_SHA256_HEX_CHARS];
    ARL_TRY(arl_model_config_hash_hex(cfg, model_hex));
    arl_status s = arl_train_state_check(st, path, model_hex, run_sha256);
    if (!s) s = arl_checkpoint_load(dir, cfg, params);
    if (!s) {
        snprintf(path, sizeof path, "%s/%s", dir, ARL_OPTIM_STATE_FILE);
        s = arl_optim_state_load(path, opt);
    }
    if (!s && opt->step != st->step)
        s = arl_errorf(ARL_ERR_CORRUPT,
                       "%s: optimizer state is at step %lld but the train state at step %lld "
                       "(files of different saves mixed?)",
                       dir, (long long)opt->step, (long long)st->step);
    if (s) arl_train_state_free(st);
    return s;
}

/* Whether a failure s of arl_train_ckpt_load means that the checkpoint's own files are damaged. */
static int ckpt_damaged(arl_status s) {
    return s == ARL_ERR_FORMAT || s == ARL_ERR_CORRUPT || s == ARL_ERR_SHAPE ||
           s == ARL_ERR_NOT_FOUND;
}

/* Move checkpoint directory dir to damaged-<its name> beside it (.K for the first K free); the
 * new path into moved. */
static arl_status ckpt_set_aside(const char *dir, char *moved, size_t cap) {
    const char *slash = strrchr(dir, '/');
    const char *name = slash ? slash + 1 : dir;
    const int root_len = slash ? (int)(slash - dir) : 0;
    struct stat sb;
    for (int k = 0; k < 1000; k++) {
        int n =
            k == 0 ? snprintf(moved, cap, "%.*s%sdamaged-%s", root_len, dir, slash ? "/" : "", name)
                   : snprintf(moved, cap, "%.*s%sdamaged-%s.%d", root_len, dir, slash ? "/" : "",
                              name, k);
        if (n < 0 || (size_t)n >= cap)
            return arl_errorf(ARL_ERR_ARG, "%s: path too long to set the checkpoint aside", dir);
        if (lstat(moved, &sb) == 0) continue;
        if (rename(dir, moved) == 0) return ARL_OK;
        return arl_errorf(ARL_ERR_IO, "%s: cannot move the damaged checkpoint to %s: %s", dir,
                          moved, strerror(errno));
    }
    return arl_errorf(ARL_ERR_IO, "%s: no free name to set the damaged checkpoint aside", dir);
}

/* Before a resume reads ROOT: a step-N that is not a complete checkpoint (no train_state.json:
 * a save never leaves one, so it was made by hand or damaged on disk) is set aside as
 * damaged-step-N with a warning, as a damaged one is; then remove_leftovers (in this order, a
 * complete .old-step-N goes back in place of an incomplete step-N instead of being removed). */
static arl_status ckpt_recover(const char *root) {
    DIR *d;
    ARL_TRY(root_open(root, &d));
    if (!d) return ARL_OK;
    struct dirent *e;
    arl_status s = ARL_OK;
    int changed = 0;
    while (!s && (e = readdir(d))) {
        if (parse_step_name(e->d_name) < 0) continue;
        char p[4096], f[4200], moved[4400];
        snprintf(p, sizeof p, "%s/%s", root, e->d_name);
        snprintf(f, sizeof f, "%s/%s", p, ARL_TRAIN_STATE_FILE);
        if (access(f, F_OK) == 0 || (errno != ENOENT && errno != ENOTDIR)) continue;
        s = ckpt_set_aside(p, moved, sizeof moved);
        if (!s)
            arl_log_warn("checkpoint %s is incomplete (no %s; a save never leaves one); moved to "
                         "%s",
                         p, ARL_TRAIN_STATE_FILE, moved);
        changed = 1;
    }
    closedir(d);
    if (!s && changed) s = fsync_dir(root);
    return s ? s : remove_leftovers(root);
}

arl_status arl_train_ckpt_load_newest(const char *root, const arl_model_config *cfg,
                                      const char *run_sha256, arl_model_params *params,
                                      arl_adamw *opt, arl_train_state *st, int set_aside,
                                      char *path, size_t cap, int64_t *step) {
    if (set_aside) ARL_TRY(ckpt_recover(root));
    for (;;) {
        ARL_TRY(arl_train_ckpt_latest(root, path, cap, step));
        arl_status s = arl_train_ckpt_load(path, cfg, run_sha256, params, opt, st);
        if (!s || !set_aside || !ckpt_damaged(s)) return s;
        char why[1024], moved[4400];
        snprintf(why, sizeof why, "%s", arl_error_msg());
        arl_error_clear();
        ARL_TRY(ckpt_set_aside(path, moved, sizeof moved));
        arl_log_warn("checkpoint %s is damaged (%s); moved to %s, resuming from the one before it",
                     path, why, moved);
    }
}
