/* policy/checkpoint.c: checkpoint load/verify/save (contracts in policy/checkpoint.h). */
#include "policy/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/assert.h"
#include "core/dtype.h"
#include "core/file.h"
#include "core/log.h"
#include "policy/safetensors.h"

/* ------------------------------------------------------------------------------------ */
/* problem lists                                                                         */

typedef struct plist {
    char text[1024]; /* "a, b, c" (first ARL_CHECKPOINT_MAX_LISTED entries) */
    size_t len;
    int64_t count;
} plist;

static void plist_add(plist *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void plist_add(plist *l, const char *fmt, ...) {
    l->count++;
    if (l->count > ARL_CHECKPOINT_MAX_LISTED || l->len >= sizeof l->text - 1) return;
    if (l->count > 1) l->len += (size_t)snprintf(l->text + l->len, sizeof l->text - l->len, ", ");
    if (l->len >= sizeof l->text - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l->text + l->len, sizeof l->text - l->len, fmt, ap);
    va_end(ap);
    if (n > 0) l->len += (size_t)n;
    if (l->len > sizeof l->text - 1) l->len = sizeof l->text - 1;
}

/* "\n  missing (3): a, b, c" with "and N more" */
static void plist_format(const plist *l, const char *what, char *out, size_t cap, size_t *pos) {
    if (!l->count || *pos >= cap) return;
    *pos += (size_t)snprintf(out + *pos, cap - *pos, "\n  %s (%lld): %s", what, (long long)l->count,
                             l->text);
    if (*pos < cap && l->count > ARL_CHECKPOINT_MAX_LISTED)
        *pos += (size_t)snprintf(out + *pos, cap - *pos, ", and %lld more",
                                 (long long)(l->count - ARL_CHECKPOINT_MAX_LISTED));
}

/* ------------------------------------------------------------------------------------ */
/* matching a checkpoint against the inventory                                           */

/* Where tensor i of the inventory comes from. */
typedef struct src {
    const arl_st_tensor *plain;  /* .weight (or the key itself) */
    const arl_st_tensor *packed; /* MXFP4 release form: .weight_packed */
    const arl_st_tensor *scale;  /* and .weight_scale */
} src;

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int dtype_ok(const arl_param_tensor *t, arl_dtype dt) {
    if (t->fp32_storage) return dt == ARL_DTYPE_F32;
    return dt == ARL_DTYPE_F32 || dt == ARL_DTYPE_BF16 || dt == ARL_DTYPE_F16;
}

static int shape_eq(const arl_st_tensor *s, int32_t rank, const int64_t *shape) {
    if (s->rank != rank) return 0;
    for (int32_t i = 0; i < rank; i++)
        if (s->shape[i] != shape[i]) return 0;
    return 1;
}

/* Compare the checkpoint's config.json (if any) with cfg by config hash. */
static arl_status check_config_file(const char *dir, const arl_model_config *cfg) {
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return ARL_OK;
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, F_OK) != 0 && errno == ENOENT) return ARL_OK; /* bare tensors */
    char *text;
    /* (read to its end: a size from seeking failed a FIFO as out of memory, and a read error
     * went unnoticed) */
    ARL_TRY(arl_file_read(path, 0, &text, NULL));
    arl_model_config other;
    arl_status s = arl_model_config_parse(text, path, 1, &other);
    free(text);
    if (s) return arl_error_prefix(s, "checkpoint %s", dir);
    char a[ARL_SHA256_HEX_CHARS], b[ARL_SHA256_HEX_CHARS];
    s = arl_model_config_hash_hex(cfg, a);
    if (!s) s = arl_model_config_hash_hex(&other, b);
    arl_model_config_free(&other);
    if (s) return arl_error_prefix(s, "checkpoint %s", dir);
    if (strcmp(a, b))
        return arl_errorf(ARL_ERR_CONFIG,
                          "%s: the checkpoint's config.json describes a different model than %s "
                          "(config hash %.12s... vs %.12s...); load it with its own config",
                          dir, cfg->path[0] ? cfg->path : "the given config", b, a);
    return ARL_OK;
}

/* Match every inventory tensor to checkpoint tensors; report all problems at once. */
static arl_status plan(const arl_st_dir *d, const arl_model_config *cfg,
                       const arl_param_inventory *inv, src *srcs) {
    plist missing = {{0}, 0, 0}, unexpected = {{0}, 0, 0}, bad = {{0}, 0, 0};
    char name[300], s1[96], s2[96];
    for (int64_t i = 0; i < inv->n; i++) {
        const arl_param_tensor *t = &inv->t[i];
        src *sr = &srcs[i];
        memset(sr, 0, sizeof *sr);
        sr->plain = arl_st_dir_find(d, t->name);
        if (!sr->plain && t->expert >= 0 && ends_with(t->name, ".weight")) {
            size_t base = strlen(t->name) - strlen("weight");
            snprintf(name, sizeof name, "%.*sweight_packed", (int)base, t->name);
            sr->packed = arl_st_dir_find(d, name);
            snprintf(name, sizeof name, "%.*sweight_scale", (int)base, t->name);
            sr->scale = arl_st_dir_find(d, name);
            if (sr->packed || sr->scale) {
                int64_t out = t->shape[0], in = t->shape[1];
                if (!sr->packed || !sr->scale) {
                    plist_add(&bad, "%s (MXFP4 form needs both weight_packed and weight_scale)",
                              t->name);
                } else if (in % 32) {
                    plist_add(&bad,
                              "%s (MXFP4 experts need moe_intermediate_size and "
                              "routed_expert_hidden_size multiples of 32, input width is %lld)",
                              t->name, (long long)in);
                } else {
                    int64_t ps[2] = {out, in / 2}, ss[2] = {out, in / 32};
                    if (sr->packed->dtype != ARL_DTYPE_U8 || !shape_eq(sr->packed, 2, ps))
                        plist_add(
                            &bad, "%s (expected U8 %s, got %s %s)", sr->packed->name,
                            arl_st_shape_str(2, ps, s1, sizeof s1),
                            arl_dtype_name(sr->packed->dtype),
                            arl_st_shape_str(sr->packed->rank, sr->packed->shape, s2, sizeof s2));
                    if (sr->scale->dtype != ARL_DTYPE_U8 || !shape_eq(sr->scale, 2, ss))
                        plist_add(
                            &bad, "%s (expected U8 %s, got %s %s)", sr->scale->name,
                            arl_st_shape_str(2, ss, s1, sizeof s1),
                            arl_dtype_name(sr->scale->dtype),
                            arl_st_shape_str(sr->scale->rank, sr->scale->shape, s2, sizeof s2));
                }
                continue;
            }
        }
        if (!sr->plain) {
            plist_add(&missing, "%s", t->name);
            continue;
        }
        const arl_st_tensor *s = sr->plain;
        int ok_shape = shape_eq(s, t->rank, t->shape);
        if (t->is_a_log && !ok_shape) {
            int64_t padded = t->stored_numel;
            ok_shape = shape_eq(s, 1, &padded);
        }
        if (!ok_shape || !dtype_ok(t, s->dtype)) {
            char exp_shape[96];
            arl_st_shape_str(t->rank, t->shape, exp_shape, sizeof exp_shape);
            if (t->is_a_log) {
                size_t k = strlen(exp_shape);
                snprintf(exp_shape + k, sizeof exp_shape - k, " or [%lld]",
                         (long long)t->stored_numel);
            }
            plist_add(&bad, "%s (expected %s %s, got %s %s)", t->name,
                      t->fp32_storage ? "F32" : "F32/BF16/F16", exp_shape, arl_dtype_name(s->dtype),
                      arl_st_shape_str(s->rank, s->shape, s2, sizeof s2));
        }
    }
    /* tensors of the checkpoint that the config does not have */
    int64_t n = arl_st_dir_count(d);
    for (int64_t j = 0; j < n; j++) {
        const char *nm = arl_st_dir_tensor(d, j)->name;
        if (arl_param_inventory_find(inv, nm) >= 0) continue;
        int companion = 0;
        const char *sfx[2] = {"weight_packed", "weight_scale"};
        for (int q = 0; q < 2 && !companion; q++) {
            if (!ends_with(nm, sfx[q])) continue;
            size_t base = strlen(nm) - strlen(sfx[q]);
            snprintf(name, sizeof name, "%.*sweight", (int)base, nm);
            int64_t i = arl_param_inventory_find(inv, name);
            companion = i >= 0 && inv->t[i].expert >= 0;
        }
        if (!companion) plist_add(&unexpected, "%s", nm);
    }
    if (!missing.count && !unexpected.count && !bad.count) return ARL_OK;
    char msg[2000];
    size_t pos = (size_t)snprintf(
        msg, sizeof msg,
        "%s: checkpoint does not match the config %s: %lld missing, %lld unexpected, %lld "
        "mis-shaped tensor%s",
        arl_st_dir_path(d), cfg->path[0] ? cfg->path : "(in memory)", (long long)missing.count,
        (long long)unexpected.count, (long long)bad.count, bad.count == 1 ? "" : "s");
    plist_format(&missing, "missing", msg, sizeof msg, &pos);
    plist_format(&unexpected, "unexpected", msg, sizeof msg, &pos);
    plist_format(&bad, "mis-shaped", msg, sizeof msg, &pos);
    return arl_errorf(ARL_ERR_SHAPE, "%s", msg);
}

static arl_status verify_open(const char *dir, const arl_model_config *cfg,
                              const arl_param_inventory *inv, arl_st_dir **d, src **srcs) {
    *d = NULL;
    *srcs = NULL;
    ARL_TRY(check_config_file(dir, cfg));
    ARL_TRY(arl_st_dir_open(dir, d));
    *srcs = malloc((size_t)(inv->n ? inv->n : 1) * sizeof **srcs);
    if (!*srcs) {
        arl_st_dir_close(*d);
        *d = NULL;
        return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", dir);
    }
    arl_status s = plan(*d, cfg, inv, *srcs);
    if (s) {
        free(*srcs);
        *srcs = NULL;
        arl_st_dir_close(*d);
        *d = NULL;
    }
    return s;
}

arl_status arl_checkpoint_verify(const char *dir, const arl_model_config *cfg) {
    arl_param_inventory inv;
    ARL_TRY(arl_param_inventory_build(cfg, &inv));
    arl_st_dir *d;
    src *srcs;
    arl_status s = verify_open(dir, cfg, &inv, &d, &srcs);
    free(srcs);
    arl_st_dir_close(d);
    arl_param_inventory_free(&inv);
    return s;
}

/* ------------------------------------------------------------------------------------ */
/* load                                                                                  */

/* E2M1 codes 0..15 (section 14.3) */
static const float e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static void decode_mxfp4(const uint8_t *packed, const uint8_t *scale, int64_t out, int64_t in,
                         float *dst) {
    for (int64_t o = 0; o < out; o++) {
        const uint8_t *pr = packed + o * (in / 2);
        const uint8_t *sr = scale + o * (in / 32);
        for (int64_t c = 0; c < in; c++) {
            uint8_t byte = pr[c / 2];
            uint8_t code = (c & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15);
            dst[o * in + c] = ldexpf(e2m1[code], (int)sr[c / 32] - 127);
        }
    }
}

static arl_status load_one(const arl_param_tensor *t, const src *sr, float *dst) {
    if (sr->packed) {
        int64_t out = t->shape[0], in = t->shape[1];
        decode_mxfp4(arl_st_tensor_data(sr->packed), arl_st_tensor_data(sr->scale), out, in, dst);
        return ARL_OK;
    }
    const arl_st_tensor *s = sr->plain;
    if (t->is_a_log && s->numel != t->numel) {
        float *tmp = malloc((size_t)s->numel * sizeof *tmp);
        if (!tmp) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", t->name);
        arl_status st = arl_st_tensor_read_f32(s, tmp, s->numel);
        if (st == ARL_OK) {
            for (int64_t i = t->numel; i < s->numel; i++)
                if (tmp[i] != 0.0f) {
                    st = arl_errorf(ARL_ERR_CORRUPT,
                                    "%s: tensor '%s': padded entry %lld is %g; entries %lld..%lld "
                                    "of the padded A_log must be 0",
                                    arl_st_file_path(s->file), t->name, (long long)i,
                                    (double)tmp[i], (long long)t->numel, (long long)(s->numel - 1));
                    break;
                }
            if (st == ARL_OK) memcpy(dst, tmp, (size_t)t->numel * sizeof *dst);
        }
        free(tmp);
        return st;
    }
    return arl_st_tensor_read_f32(s, dst, t->numel);
}

arl_status arl_checkpoint_load(const char *dir, const arl_model_config *cfg,
                               arl_model_params *params) {
    ARL_ASSERT(params && params->arena);
    const arl_param_inventory *inv = &params->inv;
    arl_st_dir *d;
    src *srcs;
    ARL_TRY(verify_open(dir, cfg, inv, &d, &srcs));
    arl_status s = arl_st_dir_check_data(d);
    for (int64_t i = 0; i < inv->n && s == ARL_OK; i++) {
        const arl_param_tensor *t = &inv->t[i];
        float *dst = params->arena + t->offset;
        s = load_one(t, &srcs[i], dst);
        if (s) break;
        for (int64_t j = 0; j < t->numel; j++)
            if (!isfinite(dst[j])) {
                s = arl_errorf(ARL_ERR_CORRUPT,
                               "%s: tensor '%s': element %lld is %g (non-finite weights; the "
                               "checkpoint is damaged)",
                               dir, t->name, (long long)j, (double)dst[j]);
                break;
            }
    }
    free(srcs);
    arl_st_dir_close(d);
    return s;
}

/* ------------------------------------------------------------------------------------ */
/* save                                                                                  */

/* Remove the plain files in dir, then dir (only used on a checkpoint directory: plain files).
 * Returns the number of files removed; *gone (may be NULL) = 1 when dir no longer exists. */
static int64_t remove_tree_flat(const char *dir, int *gone) {
    int64_t n = 0;
    DIR *dp = opendir(dir);
    if (dp) {
        struct dirent *e;
        char p[1400];
        while ((e = readdir(dp))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            n += unlink(p) == 0;
        }
        closedir(dp);
    }
    const int ok = rmdir(dir) == 0 || errno == ENOENT;
    if (gone) *gone = ok;
    return n;
}

static void fsync_parent(const char *path) {
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", path);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        dir[--n] = 0;
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = 0;
    else if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

static arl_status write_into(const char *target, const arl_model_config *cfg,
                             const arl_model_params *p, uint64_t shard_bytes) {
    const arl_param_inventory *inv = &p->inv;
    /* padded A_log copies, alive until the writer has closed */
    int64_t n_alog = 0, alog_len = cfg->dims.a_log_padded;
    for (int64_t i = 0; i < inv->n; i++)
        n_alog += inv->t[i].is_a_log;
    float *alog = calloc((size_t)(n_alog ? n_alog : 1) * (size_t)alog_len, sizeof *alog);
    if (!alog) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", target);
    arl_st_dir_writer *w;
    arl_status s = arl_st_dir_writer_open(target, shard_bytes, &w);
    if (s) {
        free(alog);
        return s;
    }
    char hex[ARL_SHA256_HEX_CHARS];
    s = arl_model_config_hash_hex(cfg, hex);
    if (!s) s = arl_st_dir_writer_set_metadata(w, "format", "pt");
    if (!s) s = arl_st_dir_writer_set_metadata(w, "agentrl_config_sha256", hex);
    arl_st_dir_writer_data_crc(w); /* a byte changed on disk later is found at load */
    const int bf16 = arl_model_config_stores_bf16(cfg);
    int64_t k = 0;
    for (int64_t i = 0; i < inv->n && !s; i++) {
        const arl_param_tensor *t = &inv->t[i];
        const float *src = p->arena + t->offset;
        arl_dtype dt = t->fp32_storage || !bf16 ? ARL_DTYPE_F32 : ARL_DTYPE_BF16;
        if (t->is_a_log) {
            float *buf = alog + k++ * alog_len;
            memcpy(buf, src, (size_t)t->numel * sizeof *buf);
            s = arl_st_dir_writer_add_f32(w, t->name, dt, 1, &t->stored_numel, buf);
        } else {
            s = arl_st_dir_writer_add_f32(w, t->name, dt, t->rank, t->shape, src);
        }
    }
    if (s)
        arl_st_dir_writer_abort(w);
    else
        s = arl_st_dir_writer_close(w);
    free(alog);
    if (s) return s;
    char cpath[1200];
    snprintf(cpath, sizeof cpath, "%s/config.json", target);
    return arl_model_config_write(cfg, cpath);
}

/* "DIR.SUFFIX-XXXXXX" beside dir (trailing slashes of dir dropped) */
static arl_status sibling_name(const char *dir, const char *suffix, char *out, size_t cap) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    const int k = snprintf(out, cap, "%.*s.%s-XXXXXX", (int)n, dir, suffix);
    if (k < 0 || (size_t)k >= cap)
        return arl_errorf(ARL_ERR_ARG, "%s: path too long for a checkpoint directory", dir);
    return ARL_OK;
}

/* 1 if name is a file that a checkpoint directory holds (or a temporary file of one) */
static int is_checkpoint_file(const char *name) {
    char base[256];
    size_t n = strlen(name);
    const char *tmp = strstr(name, ".tmp-");
    if (tmp && strlen(tmp) == strlen(".tmp-XXXXXX")) n = (size_t)(tmp - name);
    if (n >= sizeof base) return 0;
    memcpy(base, name, n);
    base[n] = 0;
    if (!strcmp(base, "config.json") || !strcmp(base, ARL_ST_SINGLE_NAME) ||
        !strcmp(base, ARL_ST_INDEX_NAME))
        return 1;
    unsigned a, b;
    int end = 0;
    return sscanf(base, "model-%5u-of-%5u.safetensors%n", &a, &b, &end) == 2 && end > 0 &&
           !base[end];
}

arl_status arl_checkpoint_check_replaceable(const char *dir) {
    struct stat st;
    if (lstat(dir, &st) != 0) {
        if (errno == ENOENT) return ARL_OK;
        return arl_errorf(ARL_ERR_IO, "%s: cannot stat: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return arl_errorf(ARL_ERR_STATE, "%s: exists and is not a directory%s", dir,
                          S_ISLNK(st.st_mode) ? " (a symbolic link: give the directory itself)"
                                              : "");
    DIR *dp = opendir(dir);
    if (!dp) return arl_errorf(ARL_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    plist other = {{0}, 0, 0};
    char p[1400];
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (!is_checkpoint_file(e->d_name) || lstat(p, &st) != 0 || !S_ISREG(st.st_mode))
            plist_add(&other, "%s", e->d_name);
    }
    closedir(dp);
    if (!other.count) return ARL_OK;
    char more[64] = "";
    if (other.count > ARL_CHECKPOINT_MAX_LISTED)
        snprintf(more, sizeof more, ", and %lld more",
                 (long long)(other.count - ARL_CHECKPOINT_MAX_LISTED));
    return arl_errorf(ARL_ERR_STATE,
                      "%s: holds more than a model checkpoint (config.json, *.safetensors): %s%s; "
                      "replacing it would remove %s, so nothing was changed (move %s away or "
                      "give another directory)",
                      dir, other.text, more, other.count == 1 ? "it" : "them",
                      other.count == 1 ? "it" : "them");
}

arl_status arl_checkpoint_tmp_create(const char *dir, char *tmp, size_t cap) {
    ARL_TRY(sibling_name(dir, "tmp", tmp, cap));
    char *slash = strrchr(tmp, '/');
    if (slash && slash > tmp) { /* its missing parents first, as mkdir -p */
        *slash = 0;
        const arl_status sp = arl_mkdir_p(tmp);
        *slash = '/';
        if (sp) return arl_error_prefix(sp, "%s", dir);
    }
    if (!mkdtemp(tmp))
        return arl_errorf(errno == ENOSPC ? ARL_ERR_FULL : ARL_ERR_IO,
                          "%s: cannot create a temporary directory %s: %s", dir, tmp,
                          strerror(errno));
    chmod(tmp, 0755);
    return ARL_OK;
}

void arl_checkpoint_tmp_remove(const char *tmp) {
    remove_tree_flat(tmp, NULL);
}

arl_status arl_checkpoint_tmp_sweep(const char *dir, int (*owned)(const char *name),
                                    int64_t *removed) {
    if (removed) *removed = 0;
    DIR *dp = opendir(dir);
    if (!dp) {
        if (errno == ENOENT || errno == ENOTDIR) return ARL_OK; /* (its writer's to report) */
        return arl_errorf(ARL_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    }
    struct dirent *e;
    char p[4400], name[256];
    while ((e = readdir(dp))) {
        const char *tmp = strstr(e->d_name, ".tmp-");
        if (!tmp || tmp == e->d_name || strlen(tmp) != strlen(".tmp-XXXXXX")) continue;
        const size_t n = (size_t)(tmp - e->d_name);
        if (n >= sizeof name) continue;
        memcpy(name, e->d_name, n);
        name[n] = 0;
        if (!owned(name)) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        int gone = 0;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            remove_tree_flat(p, &gone);
        else
            gone = unlink(p) == 0 || errno == ENOENT;
        if (!gone)
            arl_log_warn("%s: the temporary of an interrupted write could not be removed (%s); "
                         "remove it by hand",
                         p, strerror(errno));
        else if (removed)
            (*removed)++;
    }
    closedir(dp);
    return ARL_OK;
}

/* The old checkpoint, moved out of dir's place to old: removed (a warning if it cannot be). */
static int64_t remove_old(const char *old, const char *dir) {
    int gone;
    const int64_t n = remove_tree_flat(old, &gone);
    if (!gone)
        arl_log_warn("%s: replaced, but its previous checkpoint could not be removed from %s "
                     "(%s); remove it by hand",
                     dir, old, strerror(errno));
    return n;
}

/* rename(2) that swaps a and b (both exist) in one step; ENOSYS or EINVAL where it cannot */
static int exchange(const char *a, const char *b) {
#if defined(SYS_renameat2) && defined(RENAME_EXCHANGE)
    return (int)syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE);
#else
    (void)a;
    (void)b;
    errno = ENOSYS;
    return -1;
#endif
}

arl_status arl_checkpoint_commit(const char *tmp, const char *dir, int64_t *old_files) {
    if (old_files) *old_files = -1;
    struct stat st;
    if (lstat(dir, &st) != 0) {
        if (errno != ENOENT)
            return arl_errorf(ARL_ERR_IO, "%s: cannot stat: %s", dir, strerror(errno));
        if (rename(tmp, dir) != 0)
            return arl_errorf(ARL_ERR_IO, "%s: cannot rename the finished checkpoint from %s: %s",
                              dir, tmp, strerror(errno));
        fsync_parent(dir);
        return ARL_OK;
    }
    ARL_TRY(arl_checkpoint_check_replaceable(dir)); /* (again: it may have changed) */
    chmod(tmp, st.st_mode & 07777);                 /* the replaced directory's mode */
    int64_t n = 0;
    if (exchange(tmp, dir) == 0) {
        /* one step: dir is the new checkpoint, tmp the old one */
        fsync_parent(dir);
        n = remove_old(tmp, dir);
    } else if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
        /* a file system without the exchange: move the old one aside, the new one in (the
         * old one goes back if that fails) */
        char old[1200];
        ARL_TRY(sibling_name(dir, "old", old, sizeof old));
        if (!mkdtemp(old) || rename(dir, old) != 0) {
            const int e = errno;
            rmdir(old);
            return arl_errorf(ARL_ERR_IO, "%s: cannot move the old checkpoint aside to %s: %s", dir,
                              old, strerror(e));
        }
        if (rename(tmp, dir) != 0) {
            const int e = errno;
            if (rename(old, dir) != 0)
                return arl_errorf(ARL_ERR_IO,
                                  "%s: cannot rename the new checkpoint from %s (%s), nor move "
                                  "the old one back from %s (%s): move it back by hand",
                                  dir, tmp, strerror(e), old, strerror(errno));
            return arl_errorf(ARL_ERR_IO, "%s: cannot rename the new checkpoint from %s: %s", dir,
                              tmp, strerror(e));
        }
        fsync_parent(dir);
        n = remove_old(old, dir);
    } else {
        const int e = errno;
        return arl_errorf(ARL_ERR_IO,
                          "%s: cannot put the new checkpoint %s in its place: %s%s; the old one "
                          "is as it was",
                          dir, tmp, strerror(e),
                          e == EBUSY || e == EXDEV ? " (a mount point? give a directory in it)"
                                                   : "");
    }
    if (old_files) *old_files = n;
    return ARL_OK;
}

arl_status arl_checkpoint_save(const char *dir, const arl_model_config *cfg,
                               const arl_model_params *params, uint64_t shard_bytes) {
    ARL_ASSERT(params && params->arena);
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return arl_errorf(ARL_ERR_IO, "%s: exists and is not a directory", dir);
        return write_into(dir, cfg, params, shard_bytes);
    }
    if (errno != ENOENT) return arl_errorf(ARL_ERR_IO, "%s: cannot stat: %s", dir, strerror(errno));
    char tmp[1200];
    ARL_TRY(arl_checkpoint_tmp_create(dir, tmp, sizeof tmp));
    arl_status s = write_into(tmp, cfg, params, shard_bytes);
    if (!s && rename(tmp, dir) != 0)
        s = arl_errorf(ARL_ERR_IO, "%s: cannot rename the finished checkpoint from %s: %s", dir,
                       tmp, strerror(errno));
    if (s) {
        remove_tree_flat(tmp, NULL);
        return s;
    }
    fsync_parent(dir);
    return ARL_OK;
}
