/* replay/show.c: `show` (spec section 13.2): one trajectory rendered as a person reads it --
 * header, rewards at all levels, per segment its boundaries and states, per turn the
 * observation that preceded it, the assistant turn with tool calls and parse status, tool
 * results, process rewards, and the evidence of a mask.  Bodies are parsed with jansson; images
 * appear as [image WxH sha256:...].  A failure to read (out of memory above all) ends the
 * rendering with its error: show never exits 0 with a reward line, a turn or an event left
 * out; data that is there but cannot be decoded (a bad blob, a body jansson rejects) is shown
 * as such. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/json_dump.h"
#include "replay/codec.h"
#include "replay/inspect.h"
#include "replay/internal.h"

static const char *nz(const char *s, const char *d) {
    return s ? s : d;
}

/* Set when a column's text could not be had (SQLite out of memory: a NULL text of a value that
 * is not NULL); replay_show then fails instead of showing "" for it. */
static _Thread_local int col_oom;

static const char *col_txt(sqlite3_stmt *q, int i) {
    const unsigned char *t = sqlite3_column_text(q, i);
    if (!t && sqlite3_column_type(q, i) != SQLITE_NULL) col_oom = 1;
    return t ? (const char *)t : "";
}

/* col_txt, NULL for NULL. */
static const char *col_txt_or_null(sqlite3_stmt *q, int i) {
    return sqlite3_column_type(q, i) == SQLITE_NULL ? NULL : col_txt(q, i);
}

/* Put byte i of s (n bytes) as a terminal shows it harmlessly: a control character other than
 * tab and newline (C0, DEL, or C1 as UTF-8 0xC2 0x80..0x9F: ESC sequences, CR, backspace, which
 * would let a model's or an environment's text rewrite the screen) as U+FFFD, as `replay view`
 * does; returns the bytes consumed. */
static size_t put_safe_char(FILE *out, const char *s, size_t i, size_t n) {
    const unsigned char c = (unsigned char)s[i];
    if ((c < 0x20 && c != '\t' && c != '\n') || c == 0x7F) {
        fputs("\xEF\xBF\xBD", out);
        return 1;
    }
    if (c == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 &&
        (unsigned char)s[i + 1] <= 0x9F) {
        fputs("\xEF\xBF\xBD", out);
        return 2;
    }
    fputc(c, out);
    return 1;
}

/* A stored string (a name, an id, an error code) on one line, put_safe_char. */
static void put_safe(FILE *out, const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        if (s[i] == '\n') {
            fputs("\xEF\xBF\xBD", out);
            i++;
        } else {
            i += put_safe_char(out, s, i, n);
        }
    }
}

/* "INDENT tool call ID NAME" of a tool call c whose name is in named (c itself, or its
 * "function" member), put_safe. */
static void put_call_head(FILE *out, const char *indent, const json_t *c, const json_t *named) {
    fprintf(out, "%stool call ", indent);
    put_safe(out, nz(json_string_value(json_object_get(c, "id")), "?"));
    fputc(' ', out);
    put_safe(out, nz(json_string_value(json_object_get(named, "name")), "?"));
}

/* Print a string indented, one line per line, cut after `max` bytes; control characters as
 * put_safe_char shows them (also in the label, which may hold stored names). */
static void print_text(FILE *out, const char *indent, const char *label, const char *s,
                       size_t max) {
    if (!s) return;
    size_t n = strlen(s);
    fputs(indent, out);
    put_safe(out, label);
    size_t i = 0;
    while (i < n && i < max) {
        const int nl = s[i] == '\n';
        i += put_safe_char(out, s, i, n);
        if (nl && i < n) fprintf(out, "%s%*s", indent, (int)strlen(label), "");
    }
    if (n > max) fprintf(out, "... [%zu more bytes]", n - max);
    fputc('\n', out);
}

static arl_status show_nomem(void) {
    return arl_errorf(ARL_ERR_NOMEM, "replay show: out of memory");
}

/* A body or action that does not parse (arl_json_load*): out of memory is an error, a syntax
 * error (*bad = 1) is data to show as such. */
static arl_status json_failed(const json_error_t *e, int *bad) {
    *bad = 0;
    if (arl_json_error_nomem(e)) return show_nomem();
    *bad = 1;
    return ARL_OK;
}

static arl_status print_content(FILE *out, const char *indent, const char *label, json_t *content) {
    if (json_is_string(content)) {
        print_text(out, indent, label, json_string_value(content), 4000);
        return ARL_OK;
    }
    if (!json_is_array(content)) return ARL_OK;
    size_t cap = 256, n = 0;
    char *buf = malloc(cap);
    if (!buf) return show_nomem();
    buf[0] = 0;
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        char piece[256];
        const char *add = piece;
        piece[0] = 0;
        if (type && !strcmp(type, "text")) {
            add = json_string_value(json_object_get(part, "text"));
        } else if (type && !strcmp(type, "image")) {
            json_t *im = json_object_get(part, "image");
            const char *data = json_string_value(json_object_get(im, "data"));
            char hex[17] = "?";
            if (data && !strncmp(data, "sha256:", 7)) {
                snprintf(hex, sizeof hex, "%.16s", data + 7);
            } else if (data) { /* not elided: hash the decoded bytes */
                size_t dl = strlen(data), pn;
                uint8_t *png = malloc(dl / 4 * 3 + 3);
                if (!png) {
                    free(buf);
                    return show_nomem();
                }
                if (!replay_base64_decode(data, dl, png, &pn)) {
                    char full[65];
                    replay_sha256_hex(png, pn, full);
                    snprintf(hex, sizeof hex, "%.16s", full);
                }
                free(png);
            }
            snprintf(piece, sizeof piece, "[image %lldx%lld sha256:%s...]",
                     (long long)json_integer_value(json_object_get(im, "width")),
                     (long long)json_integer_value(json_object_get(im, "height")), hex);
        }
        if (!add) continue;
        size_t l = strlen(add);
        if (n + l + 2 > cap) {
            cap = (n + l + 2) * 2;
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                return show_nomem();
            }
            buf = p;
        }
        if (n) buf[n++] = ' ';
        memcpy(buf + n, add, l + 1);
        n += l;
    }
    print_text(out, indent, label, buf, 4000);
    free(buf);
    return ARL_OK;
}

static arl_status print_messages(FILE *out, json_t *msgs) {
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        char label[300];
        if (role && !strcmp(role, "tool")) {
            json_t *e = json_object_get(m, "is_error");
            const char *code = json_string_value(json_object_get(m, "error_code"));
            snprintf(label, sizeof label, "tool[%s]%s%s%s: ",
                     nz(json_string_value(json_object_get(m, "tool_call_id")), "?"),
                     json_is_true(e) ? " is_error " : "", json_is_true(e) && code ? code : "",
                     json_is_true(json_object_get(m, "output_truncated")) ? " (truncated)" : "");
        } else {
            snprintf(label, sizeof label, "%s: ", role ? role : "?");
        }
        ARL_TRY(print_content(out, "    ", label, json_object_get(m, "content")));
        json_t *tc = json_object_get(m, "tool_calls");
        size_t j;
        json_t *c;
        json_array_foreach(tc, j, c) {
            json_t *fn = json_object_get(c, "function");
            put_call_head(out, "      ", c, fn);
            fputc('(', out);
            put_safe(out, nz(json_string_value(json_object_get(fn, "arguments")), ""));
            fputs(")\n", out);
        }
    }
    return ARL_OK;
}

static arl_status print_action(FILE *out, const char *action_json) {
    if (!action_json) return ARL_OK;
    json_error_t e;
    json_t *a = arl_json_loads(action_json, 0, &e); /* (not jansson#362's lost byte) */
    if (!a) {
        int bad;
        ARL_TRY(json_failed(&e, &bad));
        print_text(out, "    ", "action (unparsed): ", action_json, 2000);
        return ARL_OK;
    }
    const char *r = json_string_value(json_object_get(a, "reasoning"));
    if (r && *r) print_text(out, "    ", "reasoning: ", r, 4000);
    print_text(out, "    ", "content: ", nz(json_string_value(json_object_get(a, "content")), ""),
               4000);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(a, "tool_calls"), i, c) {
        char *args = rjson_dumps(json_object_get(c, "arguments"));
        if (!args) {
            json_decref(a);
            return show_nomem();
        }
        put_call_head(out, "    ", c, c);
        fprintf(out, "(%s) ok\n", args); /* JSON text: control characters escaped */
        free(args);
    }
    json_array_foreach(json_object_get(a, "parse_errors"), i, c) {
        fputs("    failed block ", out);
        put_safe(out, nz(json_string_value(json_object_get(c, "id")), "?"));
        fputs(": ", out);
        put_safe(out, nz(json_string_value(json_object_get(c, "status")), "?"));
        fputs(": ", out);
        put_safe(out, nz(json_string_value(json_object_get(c, "message")), ""));
        fputc('\n', out);
        print_text(out, "      ", "raw: ", json_string_value(json_object_get(c, "raw")), 1000);
    }
    json_decref(a);
    return ARL_OK;
}

/* Response body of call_seq, images restored (*out malloc'd). */
static arl_status call_body(rdb *d, int64_t traj_id, int64_t call_seq, const uint8_t *stored,
                            size_t n, uint8_t **out, size_t *out_n) {
    sqlite3_stmt *q;
    ARL_TRY(
        rdb_prepare(d,
                    "SELECT r.body_offset, i.png FROM image_refs r JOIN images i ON i.image_id = "
                    "r.image_id WHERE r.traj_id = ?1 AND r.call_seq = ?2 ORDER BY r.body_offset",
                    &q));
    sqlite3_bind_int64(q, 1, traj_id);
    sqlite3_bind_int64(q, 2, call_seq);
    rimage_ref refs[64];
    size_t nr = 0;
    uint8_t *copies[64];
    int rc;
    arl_status s = ARL_OK;
    while (nr < 64 && (rc = sqlite3_step(q)) == SQLITE_ROW) {
        size_t pn = (size_t)sqlite3_column_bytes(q, 1);
        const void *png = sqlite3_column_blob(q, 1);
        copies[nr] = malloc(pn ? pn : 1);
        if (!copies[nr] || (pn && !png)) { /* (a NULL blob of a non-empty one: out of memory) */
            free(copies[nr]);
            s = show_nomem();
            break;
        }
        memcpy(copies[nr], png, pn);
        refs[nr] = (rimage_ref){(size_t)sqlite3_column_int64(q, 0), copies[nr], pn};
        nr++;
    }
    if (s == ARL_OK && nr < 64 && rc != SQLITE_DONE) s = rdb_fail(d, rc, "reading images");
    sqlite3_finalize(q);
    if (s == ARL_OK) s = rimages_restore(stored, n, refs, nr, out, out_n);
    for (size_t i = 0; i < nr; i++)
        free(copies[i]);
    return s;
}

static arl_status print_rewards(FILE *out, rdb *d, int64_t traj_id, const char *level,
                                int64_t scope, const char *indent) {
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(d,
                        "SELECT scope_index, component, source, value FROM rewards WHERE traj_id = "
                        "?1 AND level = ?2 AND (?3 < 0 OR scope_index = ?3) ORDER BY scope_index, "
                        "component, source",
                        &q));
    sqlite3_bind_int64(q, 1, traj_id);
    sqlite3_bind_text(q, 2, level, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 3, scope);
    int64_t cur = -1;
    int any = 0, rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        int64_t si = sqlite3_column_int64(q, 0);
        if (si != cur || !any) {
            if (any) fprintf(out, "\n");
            if (scope < 0 && strcmp(level, "outcome"))
                fprintf(out, "%s%s %lld:", indent,
                        !strcmp(level, "segment") ? "segment" : "process step", (long long)si);
            else
                fprintf(out, "%s%s:", indent, level);
            cur = si;
            any = 1;
        }
        const char *comp = col_txt(q, 1);
        const char *src = col_txt(q, 2);
        char val[32];
        if (sqlite3_column_type(q, 3) == SQLITE_NULL)
            snprintf(val, sizeof val, "null");
        else
            snprintf(val, sizeof val, "%.6g", sqlite3_column_double(q, 3));
        fprintf(out, " %s=%s%s%s",
                !*comp                      ? "reward"
                : !strcmp(comp, "@derived") ? "derived"
                                            : comp,
                val, strcmp(src, "env") ? "@" : "", strcmp(src, "env") ? src : "");
    }
    if (any) fprintf(out, "\n");
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return rdb_fail(d, rc, "reading rewards");
    return ARL_OK;
}

/* A per-token f32/u8 array of a learner or re-score blob column, checked (kind, n), in *out;
 * NULL if absent or bad (the table then shows '-'); out of memory is an error. Caller frees. */
static arl_status blob_array(sqlite3_stmt *q, int col, arl_blob_kind kind, int64_t n, void **out) {
    *out = NULL;
    const void *b = sqlite3_column_blob(q, col);
    size_t len = (size_t)sqlite3_column_bytes(q, col);
    if (!b) return ARL_OK;
    arl_blob_expect ex = {.kind = kind, .dims_mask = 1, .dims = {(uint64_t)n}};
    arl_blob_header h;
    size_t es = kind == ARL_BLOB_TOKEN_FLAGS ? 1 : 4;
    void *dst = malloc((size_t)n * es + 1);
    if (!dst) return show_nomem();
    arl_status s = arl_blob_check_copy(b, len, &ex, &h, dst, (size_t)n * es);
    if (s != ARL_OK) {
        free(dst);
        if (s == ARL_ERR_NOMEM) return s; /* (inflating codec 1) */
        arl_error_clear();
        return ARL_OK;
    }
    *out = dst;
    return ARL_OK;
}

/* A read of another file that failed: out of memory is the show's failure; anything else (no
 * states file, an unreadable one: verify reports it) leaves that file out. */
static arl_status other_file(arl_status s) {
    if (s == ARL_ERR_NOMEM) return s;
    arl_error_clear();
    return ARL_OK;
}

/* The columns the learner and a re-score add to the token table (NULL arrays: absent). */
typedef struct tok_extra {
    float *old, *ref, *w, *adv, *rescore;
    uint8_t *flags;
    int64_t update_n;
} tok_extra;

/* (x is filled as far as it got: free it with tok_extra_free on failure too) */
static arl_status tok_extra_load(replay_store *st, const char *uid, int32_t seg, int64_t n,
                                 const char *label, tok_extra *x) {
    memset(x, 0, sizeof *x);
    x->update_n = -1;
    for (size_t i = 0; i < st->n_shards; i++) {
        rshard *sh = &st->shards[i];
        if (sh->kind != REPLAY_FILE_LEARNER && sh->kind != REPLAY_FILE_TOOL) continue;
        rdb *d;
        sqlite3_stmt *q;
        arl_status s = rstore_shard_db(st, sh, &d);
        if (s != ARL_OK) {
            ARL_TRY(other_file(s));
            continue;
        }
        /* the newest update that consumed the segment (learner_records_by_traj) */
        s = rstore_prepare(st, d,
                           "SELECT update_n, old_logprobs, ref_logprobs, is_weights, token_flags, "
                           "advantages FROM learner_records WHERE traj_uid = ?1 AND seg_index = ?2 "
                           "ORDER BY update_n DESC LIMIT 1",
                           &q);
        if (s == ARL_OK) {
            sqlite3_bind_text(q, 1, uid, -1, SQLITE_STATIC);
            sqlite3_bind_int(q, 2, seg);
            int rc = sqlite3_step(q);
            if (rc == SQLITE_ROW && sqlite3_column_int64(q, 0) > x->update_n) {
                free(x->old), free(x->ref), free(x->w), free(x->flags), free(x->adv);
                x->old = x->ref = x->w = x->adv = NULL;
                x->flags = NULL;
                x->update_n = sqlite3_column_int64(q, 0);
                s = blob_array(q, 1, ARL_BLOB_OLD_LOGPROBS, n, (void **)&x->old);
                if (s == ARL_OK) s = blob_array(q, 2, ARL_BLOB_REF_LOGPROBS, n, (void **)&x->ref);
                if (s == ARL_OK) s = blob_array(q, 3, ARL_BLOB_IS_WEIGHTS, n, (void **)&x->w);
                if (s == ARL_OK) s = blob_array(q, 4, ARL_BLOB_TOKEN_FLAGS, n, (void **)&x->flags);
                if (s == ARL_OK) s = blob_array(q, 5, ARL_BLOB_ADVANTAGES, n, (void **)&x->adv);
            } else if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
                s = rdb_fail(d, rc, "reading learner records");
            }
            sqlite3_finalize(q);
        }
        ARL_TRY(other_file(s));
        if (label && !x->rescore && sh->kind == REPLAY_FILE_TOOL) {
            s = rstore_prepare(st, d,
                               "SELECT logprobs FROM rescores WHERE label = ?1 AND traj_uid = ?2 "
                               "AND seg_index = ?3 ORDER BY routing = 'replay' DESC LIMIT 1",
                               &q);
            if (s == ARL_OK) {
                sqlite3_bind_text(q, 1, label, -1, SQLITE_STATIC);
                sqlite3_bind_text(q, 2, uid, -1, SQLITE_STATIC);
                sqlite3_bind_int(q, 3, seg);
                int rc = sqlite3_step(q);
                if (rc == SQLITE_ROW)
                    s = blob_array(q, 0, ARL_BLOB_RESCORE_LOGPROBS, n, (void **)&x->rescore);
                else if (rc != SQLITE_DONE)
                    s = rdb_fail(d, rc, "reading re-scores");
                sqlite3_finalize(q);
            }
            ARL_TRY(other_file(s));
        }
    }
    return ARL_OK;
}

static void tok_extra_free(tok_extra *x) {
    free(x->old), free(x->ref), free(x->w), free(x->flags), free(x->adv), free(x->rescore);
}

static void cell(FILE *out, const float *a, int64_t i) {
    if (a)
        fprintf(out, " %10.5f", (double)a[i]);
    else
        fprintf(out, " %10s", "-");
}

/* Token rows of segment seg, within stream positions [lo, hi) (the chosen turns). */
static arl_status print_token_table(FILE *out, replay_store *st, const char *uid, int64_t traj_id,
                                    int32_t seg, int64_t lo, int64_t hi,
                                    const replay_show_opts *o) {
    replay_seg_data sd = {0};
    arl_status s =
        replay_segment_load(st, traj_id, seg, REPLAY_LOAD_TOKENS | REPLAY_LOAD_ROUTES, &sd);
    if (s != ARL_OK) {
        replay_seg_data_free(&sd);
        if (s == ARL_ERR_NOMEM) return s;
        fprintf(out, "    tokens: unreadable: %s\n", arl_error_msg());
        arl_error_clear();
        return ARL_OK;
    }
    tok_extra x;
    s = tok_extra_load(st, uid, seg, sd.ref.n_tokens, o->rescore, &x);
    if (s != ARL_OK) {
        tok_extra_free(&x);
        replay_seg_data_free(&sd);
        return s;
    }
    if (x.update_n >= 0) fprintf(out, "    learner record of update %lld\n", (long long)x.update_n);
    if (o->rescore && !x.rescore)
        fprintf(out, "    no re-score '%s' of this segment\n", o->rescore);
    fprintf(out, "    %8s %10s", "pos", "token");
    if (o->token_text) fprintf(out, " %-16s", "text");
    fprintf(out, " %4s %7s %12s %10s %10s %10s %10s %5s %10s", "mask", "version", "logprob", "old",
            "ref", "u", "w", "flags", "adv");
    if (o->rescore) fprintf(out, " %10s %10s", "rescored", "diff");
    fprintf(out, "  %s\n", sd.n_moe_layers ? "routes (experts per MoE layer)" : "");
    for (int64_t i = 0; i < sd.ref.n_tokens; i++) {
        int64_t pos = sd.ref.tok_start + i;
        if (pos < lo || pos >= hi) continue;
        fprintf(out, "    %8lld %10u", (long long)pos, sd.tokens[i]);
        if (o->token_text) {
            char txt[64];
            txt[0] = 0;
            o->token_text(sd.tokens[i], txt, sizeof txt);
            fputc(' ', out);
            put_safe(out, txt);
            for (size_t w = strlen(txt); w < 16; w++)
                fputc(' ', out);
        }
        fprintf(out, " %4u %7u %12.6f", sd.loss_mask[i], sd.versions[i], (double)sd.logprobs[i]);
        cell(out, x.old, i);
        cell(out, x.ref, i);
        if (x.old) { /* u = exp(old - mu), the behaviour ratio before TIS caps it into w
                      * (spec/objective.md 8.2); w's format, or an exponent when it is wide */
            const double u = exp((double)x.old[i] - (double)sd.logprobs[i]);
            fprintf(out, u < 1e4 ? " %10.5f" : " %10.3e", u);
        } else
            fprintf(out, " %10s", "-");
        cell(out, x.w, i);
        if (x.flags)
            fprintf(out, "  0x%02x", x.flags[i]);
        else
            fprintf(out, " %5s", "-");
        cell(out, x.adv, i);
        if (o->rescore) {
            cell(out, x.rescore, i);
            if (x.rescore && sd.loss_mask[i])
                fprintf(out, " %10.2e", (double)x.rescore[i] - (double)sd.logprobs[i]);
            else
                fprintf(out, " %10s", "-");
        }
        fputc(' ', out);
        for (int32_t l = 0; l < sd.n_moe_layers; l++) {
            fputc(l ? '|' : ' ', out);
            for (int32_t j = 0; j < sd.route_k; j++) {
                size_t at = ((size_t)l * (size_t)sd.ref.n_tokens + (size_t)i) * (size_t)sd.route_k +
                            (size_t)j;
                unsigned e = sd.route_dtype == ARL_BLOB_U16 ? ((const uint16_t *)sd.routes)[at]
                                                            : ((const uint8_t *)sd.routes)[at];
                fprintf(out, "%s%u", j ? "," : "", e);
            }
        }
        fputc('\n', out);
    }
    tok_extra_free(&x);
    replay_seg_data_free(&sd);
    return ARL_OK;
}

/* --group: the members of t's group across every shard, side by side (section 13.2). */
static arl_status print_group(FILE *out, replay_store *st, const replay_traj_row *t) {
    char group[300];
    ARL_TRY(rcat_group_uid(st, t->group_id, group, sizeof group));
    fprintf(out, "\n== group %s\n  %4s %4s %-32s %-9s %-14s %5s %8s %8s %10s\n", group, "slot",
            "try", "traj_uid", "status", "end/error", "turns", "tokens", "outcome", "AO");
    for (size_t i = 0; i < st->n_shards; i++) {
        rshard *sh = &st->shards[i];
        if (sh->kind == REPLAY_FILE_LEARNER) continue;
        rdb *d;
        sqlite3_stmt *q;
        ARL_TRY(rstore_shard_db(st, sh, &d));
        ARL_TRY(rstore_prepare(st, d,
                               "SELECT " RTRAJ_COLS " FROM trajectories WHERE group_id = ?1 ORDER "
                               "BY slot, attempt",
                               &q));
        sqlite3_bind_int64(q, 1, t->group_id);
        int rc;
        arl_status s = ARL_OK;
        while (s == ARL_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
            replay_traj_row m;
            rtraj_fill(q, sh->shard_id, &m);
            /* the outcome advantage of the newest learner record of its first segment */
            char ao[32] = "-";
            for (size_t k = 0; s == ARL_OK && k < st->n_shards; k++) {
                rshard *lh = &st->shards[k];
                rdb *ld;
                sqlite3_stmt *lq;
                if (lh->kind != REPLAY_FILE_LEARNER && lh->kind != REPLAY_FILE_TOOL) continue;
                arl_status o = rstore_shard_db(st, lh, &ld);
                if (o == ARL_OK)
                    o = rstore_prepare(st, ld,
                                       "SELECT json_extract(levels_json, '$.AO') FROM "
                                       "learner_records WHERE traj_uid = ?1 ORDER BY update_n "
                                       "DESC, seg_index LIMIT 1",
                                       &lq);
                if (o != ARL_OK) {
                    s = other_file(o);
                    continue;
                }
                sqlite3_bind_text(lq, 1, m.traj_uid, -1, SQLITE_STATIC);
                int lrc = sqlite3_step(lq);
                if (lrc == SQLITE_ROW && sqlite3_column_type(lq, 0) != SQLITE_NULL)
                    snprintf(ao, sizeof ao, "%.6g", sqlite3_column_double(lq, 0));
                else if (lrc != SQLITE_ROW && lrc != SQLITE_DONE)
                    s = rdb_fail(ld, lrc, "reading learner records");
                sqlite3_finalize(lq);
            }
            if (s != ARL_OK) break;
            char outc[32] = "-";
            if (m.outcome_reward == m.outcome_reward)
                snprintf(outc, sizeof outc, "%.4g", m.outcome_reward);
            fprintf(out, "  %4d %4d %-32s %-9s %-14s %5d %8lld %8s %10s%s\n", (int)m.slot,
                    (int)m.attempt, m.traj_uid, replay_status_name(m.status),
                    m.error_code[0]  ? m.error_code
                    : m.end_cause[0] ? m.end_cause
                                     : "-",
                    (int)m.n_turns, (long long)m.n_tokens, outc, ao,
                    m.traj_id == t->traj_id ? "  <-" : "");
        }
        sqlite3_finalize(q);
        if (s != ARL_OK) return s;
        if (rc != SQLITE_DONE) return rdb_fail(d, rc, "reading the group's members");
    }
    return ARL_OK;
}

/* "   states: ..." of segment seg (spec 13.2 "presence of states"): every state row of the
 * trajectory's segment in any states file - producer, kind, versions (none shown for weights
 * that are no policy version of the run) and status (complete,
 * evicted, writing) - and a rollout state the segment references that no states file holds
 * ("missing").  has_end, has_lat: the segment references a rollout kda_boundary / mla_segment. */
static arl_status print_seg_states(FILE *out, replay_store *st, const char *uid, int32_t seg,
                                   int has_end, int has_lat) {
    int n = 0, seen_end = 0, seen_lat = 0;
    fprintf(out, "   states:");
    for (size_t i = 0; i < st->n_shards; i++) {
        rdb *sd;
        sqlite3_stmt *q;
        arl_status o = rstore_shard_states(st, &st->shards[i], &sd);
        if (o == ARL_OK && !sd->db) continue;
        if (o == ARL_OK)
            o = rstore_prepare(st, sd,
                               "SELECT producer, kind, version_min, version_max, status FROM "
                               "states WHERE traj_uid = ?1 AND seg_index = ?2 ORDER BY state_id",
                               &q);
        if (o != ARL_OK) { /* no states file, or an unreadable one: verify reports it */
            ARL_TRY(other_file(o));
            continue;
        }
        sqlite3_bind_text(q, 1, uid, -1, SQLITE_STATIC);
        sqlite3_bind_int(q, 2, seg);
        int rc;
        while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
            const char *prod = col_txt(q, 0), *kind = col_txt(q, 1);
            const int64_t v0 = sqlite3_column_int64(q, 2), v1 = sqlite3_column_int64(q, 3);
            const int rollout = !strcmp(prod, "rollout");
            seen_end |= rollout && !strcmp(kind, "kda_boundary");
            seen_lat |= rollout && !strcmp(kind, "mla_segment");
            if (v0 < 0) /* weights that are no version of the run (a tool's checkpoint) */
                fprintf(out, "%s %s %s %s", n++ ? "," : "", prod, kind, col_txt(q, 4));
            else if (v0 == v1)
                fprintf(out, "%s %s %s v%lld %s", n++ ? "," : "", prod, kind, (long long)v0,
                        col_txt(q, 4));
            else
                fprintf(out, "%s %s %s v%lld..%lld %s", n++ ? "," : "", prod, kind, (long long)v0,
                        (long long)v1, col_txt(q, 4));
        }
        sqlite3_finalize(q);
        if (rc != SQLITE_DONE) return rdb_fail(sd, rc, "reading states");
    }
    if (has_end && !seen_end) fprintf(out, "%s rollout kda_boundary missing", n++ ? "," : "");
    if (has_lat && !seen_lat) fprintf(out, "%s rollout mla_segment missing", n++ ? "," : "");
    fprintf(out, "%s\n", n ? "" : " none");
    return ARL_OK;
}

/* "   learner: update N, staleness S, trained|masked (REASON)" of segment seg (spec 13.2: the
 * learner mask reason, if consumed): its newest learner record in any learner or tool file;
 * nothing when no update consumed it. */
static arl_status print_seg_learner(FILE *out, replay_store *st, const char *uid, int32_t seg) {
    int64_t update_n = -1, staleness = 0;
    char reason[16] = "";
    for (size_t i = 0; i < st->n_shards; i++) {
        rshard *sh = &st->shards[i];
        if (sh->kind != REPLAY_FILE_LEARNER && sh->kind != REPLAY_FILE_TOOL) continue;
        rdb *d;
        sqlite3_stmt *q;
        arl_status s = rstore_shard_db(st, sh, &d);
        if (s == ARL_OK)
            s = rstore_prepare(st, d,
                               "SELECT update_n, staleness, mask_reason FROM learner_records WHERE "
                               "traj_uid = ?1 AND seg_index = ?2 ORDER BY update_n DESC LIMIT 1",
                               &q);
        if (s != ARL_OK) {
            ARL_TRY(other_file(s));
            continue;
        }
        sqlite3_bind_text(q, 1, uid, -1, SQLITE_STATIC);
        sqlite3_bind_int(q, 2, seg);
        int rc = sqlite3_step(q);
        if (rc == SQLITE_ROW && sqlite3_column_int64(q, 0) > update_n) {
            update_n = sqlite3_column_int64(q, 0);
            staleness = sqlite3_column_int64(q, 1);
            snprintf(reason, sizeof reason, "%s", col_txt(q, 2));
        }
        sqlite3_finalize(q);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE)
            return rdb_fail(d, rc, "reading learner records");
    }
    if (update_n < 0) return ARL_OK;
    fprintf(out, "   learner: update %lld, staleness %lld, ", (long long)update_n,
            (long long)staleness);
    if (reason[0])
        fprintf(out, "masked (%s)\n", reason);
    else
        fprintf(out, "trained\n");
    return ARL_OK;
}

/* "  pinned <time> (<reason>)" when the catalog's pins table holds traj_uid (replay pin). */
static arl_status show_pin(replay_store *st, const char *traj_uid, FILE *out) {
    sqlite3_stmt *q = NULL;
    if (!st->cat.db) return ARL_OK;
    ARL_TRY(other_file(
        rdb_prepare(&st->cat, "SELECT reason, created_at_ms FROM pins WHERE traj_uid = ?1", &q)));
    if (!q) return ARL_OK;
    sqlite3_bind_text(q, 1, traj_uid, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        const char *reason = (const char *)sqlite3_column_text(q, 0);
        time_t when = (time_t)(sqlite3_column_int64(q, 1) / 1000);
        struct tm tm;
        char ts[32];
        gmtime_r(&when, &tm);
        strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
        fprintf(out, "  pinned %s", ts);
        if (reason && *reason) fprintf(out, " (%s)", reason);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rdb_fail(&st->cat, rc, "reading pins");
    return ARL_OK;
}

arl_status replay_show_turns_parse(const char *s, int32_t *lo, int32_t *hi) {
    const char *c = strchr(s, ':');
    int64_t v[2] = {0, 0};
    int ok = c != NULL;
    for (int k = 0; ok && k < 2; k++) { /* digits only: no sign, space or overflow */
        const char *p = k ? c + 1 : s, *e = k ? c + strlen(c) : c;
        if (e - p > 10) ok = 0;
        for (; ok && p < e; p++)
            if (*p < '0' || *p > '9')
                ok = 0;
            else
                v[k] = v[k] * 10 + (*p - '0');
        if (ok && e > (k ? c + 1 : s) && (v[k] < 1 || v[k] > INT32_MAX)) ok = 0;
    }
    if (!ok || (v[0] && v[1] && v[1] < v[0]))
        return arl_errorf(ARL_ERR_ARG, "turns '%.100s': expected A:B with steps 1 <= A <= B", s);
    *lo = (int32_t)v[0];
    *hi = (int32_t)v[1];
    return ARL_OK;
}

/* replay_show of trajectory t of shard sh (file d), inside one read transaction of d. */
static arl_status show_traj(replay_store *st, rshard *sh, rdb *d, const replay_traj_row *tp,
                            const replay_show_opts *o, FILE *out) {
    const replay_traj_row t = *tp;
    char run[300], group[300], task[300], env[128], ver[64];
    ARL_TRY(rcat_run_uid(st, t.run_id, run, sizeof run));
    ARL_TRY(rcat_group_uid(st, t.group_id, group, sizeof group));
    ARL_TRY(rcat_task_uid(st, t.task_id, task, sizeof task));
    ARL_TRY(rcat_env_name(st, t.env_id, env, sizeof env, ver, sizeof ver));
    fprintf(out, "trajectory %s  (traj_id %lld, %s)\n", t.traj_uid, (long long)t.traj_id, sh->file);
    fprintf(out, "  run %s  group %s slot %d attempt %d  task %s  env %s %s\n", run, group,
            (int)t.slot, (int)t.attempt, task, env, ver);
    fprintf(out, "  status %s", replay_status_name(t.status));
    if (t.end_cause[0]) fprintf(out, "  end_cause %s", t.end_cause);
    if (t.error_code[0]) fprintf(out, "  error %s (%s)", t.error_code, t.error_attribution);
    fprintf(out, "  resume_count %d", (int)t.resume_count);
    if (t.parent_traj_uid[0])
        fprintf(out, "  fork of %s after segment %d", t.parent_traj_uid, (int)t.fork_seg_index);
    ARL_TRY(show_pin(st, t.traj_uid, out));
    if (t.parent_traj_uid[0]) /* the prefix is not copied (spec/replay.md 13.7 step 3) */
        fprintf(out, "\n  its segments 0..%d are the parent's: agentrl replay show %s %s",
                (int)t.fork_seg_index, replay_store_root(st), t.parent_traj_uid);
    fprintf(out, "\n  versions ");
    if (t.min_version >= 0)
        fprintf(out, "%lld..%lld", (long long)t.min_version, (long long)t.max_version);
    else
        fprintf(out, "-");
    fprintf(out, "  turns %d  segments %d  tokens %lld (action %lld)\n", (int)t.n_turns,
            (int)t.n_segments, (long long)t.n_tokens, (long long)t.n_action_tokens);
    fprintf(out, "  rewards:\n");
    ARL_TRY(print_rewards(out, d, t.traj_id, "outcome", -1, "    "));
    ARL_TRY(print_rewards(out, d, t.traj_id, "segment", -1, "    "));
    ARL_TRY(print_rewards(out, d, t.traj_id, "process", -1, "    "));
    /* rows that `rescore --rewards` wrote into tool files (source rescore:<label>, 13.6) */
    for (size_t i = 0; i < st->n_shards; i++) {
        rshard *ts = &st->shards[i];
        rdb *td;
        sqlite3_stmt *cq;
        if (ts == sh || ts->kind != REPLAY_FILE_TOOL) continue;
        arl_status o = rstore_shard_db(st, ts, &td);
        if (o == ARL_OK)
            o = rstore_prepare(st, td, "SELECT 1 FROM rewards WHERE traj_id = ?1 LIMIT 1", &cq);
        if (o != ARL_OK) {
            ARL_TRY(other_file(o));
            continue;
        }
        sqlite3_bind_int64(cq, 1, t.traj_id);
        const int rc1 = sqlite3_step(cq);
        sqlite3_finalize(cq);
        if (rc1 != SQLITE_ROW && rc1 != SQLITE_DONE) return rdb_fail(td, rc1, "reading rewards");
        if (rc1 != SQLITE_ROW) continue;
        fprintf(out, "  re-scored rewards (%s):\n", ts->file);
        ARL_TRY(print_rewards(out, td, t.traj_id, "outcome", -1, "    "));
        ARL_TRY(print_rewards(out, td, t.traj_id, "segment", -1, "    "));
        ARL_TRY(print_rewards(out, td, t.traj_id, "process", -1, "    "));
    }
    if (o->group) ARL_TRY(print_group(out, st, &t));

    /* turns with their calls, grouped under their segments */
    sqlite3_stmt *sq, *tq, *cq;
    ARL_TRY(rstore_prepare(
        st, d,
        "SELECT seg_index, start_kind, end_cause, first_step, last_step, tok_start, "
        "n_tokens, n_action_tokens, ctx_start, min_version, max_version, "
        "end_state_id, latent_state_id, routes_layout FROM segments WHERE traj_id = ?1 "
        "ORDER BY seg_index",
        &sq));
    arl_status s =
        rstore_prepare(st, d,
                       "SELECT step_index, act_tok_start, act_tok_end, policy_version, "
                       "finish_reason, parse_status, n_tool_calls, context, reward, terminated, "
                       "truncated, anchor, call_seq, action_json FROM turns WHERE traj_id = ?1 "
                       "AND seg_index = ?2 ORDER BY step_index",
                       &tq);
    if (s != ARL_OK) {
        sqlite3_finalize(sq);
        return s;
    }
    s = rstore_prepare(st, d,
                       "SELECT call_seq, endpoint, http_status, error_code, attempts, latency_ms, "
                       "response_complete, response_body, request_body, step_index, segment_index "
                       "FROM env_calls WHERE traj_id = ?1 AND call_seq = ?2",
                       &cq);
    if (s != ARL_OK) {
        sqlite3_finalize(sq);
        sqlite3_finalize(tq);
        return s;
    }
    sqlite3_bind_int64(sq, 1, t.traj_id);
    int rc, tables = 0; /* token tables printed */
    while (s == ARL_OK && (rc = sqlite3_step(sq)) == SQLITE_ROW) {
        int32_t seg = sqlite3_column_int(sq, 0);
        int64_t tok0 = sqlite3_column_int64(sq, 5), ntok = sqlite3_column_int64(sq, 6);
        fprintf(out,
                "\n== segment %d  %s -> %s  steps %d..%d  tokens [%lld, %lld) action %lld  "
                "ctx_start %lld"
                "  versions %lld..%lld\n",
                (int)seg, col_txt(sq, 1), col_txt(sq, 2), sqlite3_column_int(sq, 3),
                sqlite3_column_int(sq, 4), (long long)tok0, (long long)(tok0 + ntok),
                (long long)sqlite3_column_int64(sq, 7), (long long)sqlite3_column_int64(sq, 8),
                (long long)sqlite3_column_int64(sq, 9), (long long)sqlite3_column_int64(sq, 10));
        s = print_seg_states(out, st, t.traj_uid, seg, sqlite3_column_type(sq, 11) != SQLITE_NULL,
                             sqlite3_column_type(sq, 12) != SQLITE_NULL);
        if (s == ARL_OK) s = print_seg_learner(out, st, t.traj_uid, seg);
        if (s == ARL_OK) s = print_rewards(out, d, t.traj_id, "segment", seg, "   ");
        if (s != ARL_OK) break;
        sqlite3_reset(tq);
        sqlite3_bind_int64(tq, 1, t.traj_id);
        sqlite3_bind_int(tq, 2, seg);
        int trc;
        while (s == ARL_OK && (trc = sqlite3_step(tq)) == SQLITE_ROW) {
            int32_t step = sqlite3_column_int(tq, 0);
            int64_t call_seq = sqlite3_column_int64(tq, 12);
            json_t *resp = NULL;
            sqlite3_reset(cq);
            sqlite3_bind_int64(cq, 1, t.traj_id);
            sqlite3_bind_int64(cq, 2, call_seq);
            char callinfo[200] = "no call recorded", http[24] = "-";
            int bad_body = 0;
            int crc = sqlite3_step(cq);
            if (crc == SQLITE_ROW) {
                if (sqlite3_column_type(cq, 2) != SQLITE_NULL)
                    snprintf(http, sizeof http, "%lld", (long long)sqlite3_column_int64(cq, 2));
                snprintf(callinfo, sizeof callinfo, "%s http %s%s%s, %lld ms, %d attempt(s)",
                         col_txt(cq, 1), http, sqlite3_column_type(cq, 3) == SQLITE_NULL ? "" : " ",
                         col_txt(cq, 3), (long long)sqlite3_column_int64(cq, 5),
                         sqlite3_column_int(cq, 4));
                const void *b = sqlite3_column_blob(cq, 7);
                if (b && sqlite3_column_int(cq, 6)) {
                    json_error_t e;
                    resp = arl_json_loadb(b, (size_t)sqlite3_column_bytes(cq, 7), 0, &e);
                    if (!resp) s = json_failed(&e, &bad_body);
                }
                if (s == ARL_OK && o->raw) {
                    uint8_t *full = NULL;
                    size_t fn = 0;
                    const void *rb = sqlite3_column_blob(cq, 8);
                    size_t rn = (size_t)sqlite3_column_bytes(cq, 8);
                    char *rz = rb ? malloc(rn + 1) : NULL;
                    if (rb && !rz) s = show_nomem();
                    if (rz) {
                        memcpy(rz, rb, rn);
                        rz[rn] = 0;
                        print_text(out, "    ", "request: ", rz, 1u << 20);
                        free(rz);
                    }
                    if (s == ARL_OK && b)
                        s = call_body(d, t.traj_id, call_seq, b,
                                      (size_t)sqlite3_column_bytes(cq, 7), &full, &fn);
                    char *z = s == ARL_OK && b ? malloc(fn + 1) : NULL;
                    if (s == ARL_OK && b && !z) s = show_nomem();
                    if (z) {
                        memcpy(z, full, fn);
                        z[fn] = 0;
                        print_text(out, "    ", "response: ", z, 1u << 20);
                        free(z);
                    }
                    free(full);
                }
            } else if (crc != SQLITE_DONE) {
                s = rdb_fail(d, crc, "reading environment calls");
            }
            if (s != ARL_OK) {
                json_decref(resp);
                break;
            }
            if (step == 0) {
                fprintf(out, "  [step 0] session created (%s)\n", callinfo);
            } else {
                /* the observation before this turn was printed with the previous step */
                fprintf(out,
                        "  [step %d] assistant (version %lld, tokens [%lld, %lld), finish %s, "
                        "parse %s) -- %s\n",
                        (int)step, (long long)sqlite3_column_int64(tq, 3),
                        (long long)sqlite3_column_int64(tq, 1),
                        (long long)sqlite3_column_int64(tq, 2), col_txt(tq, 4), col_txt(tq, 5),
                        callinfo);
                s = print_action(out, col_txt_or_null(tq, 13));
            }
            json_t *obs = json_object_get(resp, "observation");
            if (bad_body) {
                fprintf(out, "    (the response does not parse as JSON: see --raw)\n");
            } else if (obs && s == ARL_OK) {
                const char *ctx = json_string_value(json_object_get(obs, "context"));
                if (ctx && !strcmp(ctx, "reset") && step > 0)
                    fprintf(out, "    -- context reset --\n");
                s = print_messages(out, json_object_get(obs, "messages"));
            } else if (step > 0 && sqlite3_column_type(tq, 8) == SQLITE_NULL) {
                fprintf(out, "    (no response: the step failed)\n");
            }
            if (s != ARL_OK) {
                json_decref(resp);
                break;
            }
            if (step > 0) {
                fprintf(out, "    process reward ");
                if (sqlite3_column_type(tq, 8) == SQLITE_NULL)
                    fprintf(out, "-");
                else
                    fprintf(out, "%.6g", sqlite3_column_double(tq, 8));
                json_t *rc2 = json_object_get(resp, "reward_components");
                if (json_object_size(rc2)) {
                    char *c = rjson_dumps(rc2);
                    if (!c) {
                        json_decref(resp);
                        s = show_nomem();
                        break;
                    }
                    fprintf(out, " %s", c);
                    free(c);
                }
                if (sqlite3_column_type(tq, 11) != SQLITE_NULL)
                    fprintf(out, "  anchor %s", col_txt(tq, 11));
                if (sqlite3_column_int(tq, 9)) fprintf(out, "  TERMINATED");
                if (sqlite3_column_int(tq, 10)) fprintf(out, "  TRUNCATED");
                fprintf(out, "\n");
            }
            json_decref(resp);
        }
        if (s == ARL_OK && trc != SQLITE_DONE && trc != SQLITE_ROW)
            s = rdb_fail(d, trc, "reading turns");
        if (s == ARL_OK && o->tokens) {
            int64_t lo = tok0, hi = tok0 + ntok;
            if (o->turn_lo > 0 || o->turn_hi > 0) { /* the action spans of steps a..b */
                sqlite3_stmt *rq;
                lo = hi = 0;
                s = rdb_prepare(d,
                                "SELECT min(act_tok_start), max(act_tok_end) FROM turns WHERE "
                                "traj_id = ?1 AND seg_index = ?2 AND step_index BETWEEN ?3 AND ?4",
                                &rq);
                if (s == ARL_OK) {
                    sqlite3_bind_int64(rq, 1, t.traj_id);
                    sqlite3_bind_int(rq, 2, seg);
                    sqlite3_bind_int(rq, 3, o->turn_lo > 0 ? o->turn_lo : 1);
                    sqlite3_bind_int(rq, 4, o->turn_hi > 0 ? o->turn_hi : INT32_MAX);
                    int rrc = sqlite3_step(rq);
                    if (rrc == SQLITE_ROW && sqlite3_column_type(rq, 0) != SQLITE_NULL) {
                        lo = sqlite3_column_int64(rq, 0);
                        hi = sqlite3_column_int64(rq, 1);
                    } else if (rrc != SQLITE_ROW && rrc != SQLITE_DONE) {
                        s = rdb_fail(d, rrc, "reading turns");
                    }
                    sqlite3_finalize(rq);
                }
            }
            if (s == ARL_OK && hi > lo) {
                s = print_token_table(out, st, t.traj_uid, t.traj_id, seg, lo, hi, o);
                tables++;
            }
        }
    }
    /* --turns naming no step of this trajectory: say so rather than print no table */
    if (s == ARL_OK && rc == SQLITE_DONE && o->tokens && (o->turn_lo > 0 || o->turn_hi > 0) &&
        !tables) {
        char a[16] = "", b[16] = "";
        if (o->turn_lo > 0) snprintf(a, sizeof a, "%d", (int)o->turn_lo);
        if (o->turn_hi > 0) snprintf(b, sizeof b, "%d", (int)o->turn_hi);
        fprintf(out,
                "\n  no token rows: --turns %s:%s names no step of this trajectory (steps 1..%d)\n",
                a, b, (int)t.n_turns);
    }
    sqlite3_finalize(sq);
    sqlite3_finalize(tq);
    sqlite3_finalize(cq);
    if (s != ARL_OK) return s;
    if (rc != SQLITE_DONE) return rdb_fail(d, rc, "reading segments");

    /* scores and errors: calls that are not a turn's */
    sqlite3_stmt *eq;
    ARL_TRY(rstore_prepare(
        st, d,
        "SELECT c.call_seq, c.endpoint, c.http_status, c.error_code, c.response_body, "
        "c.response_complete FROM env_calls c WHERE c.traj_id = ?1 AND (c.endpoint "
        "NOT IN ('create','step') OR c.error_code IS NOT NULL) ORDER BY c.call_seq",
        &eq));
    sqlite3_bind_int64(eq, 1, t.traj_id);
    int header = 0;
    while ((rc = sqlite3_step(eq)) == SQLITE_ROW) {
        if (!header) fprintf(out, "\n== other calls\n");
        header = 1;
        char http[24] = "-";
        if (sqlite3_column_type(eq, 2) != SQLITE_NULL)
            snprintf(http, sizeof http, "%lld", (long long)sqlite3_column_int64(eq, 2));
        fprintf(out, "  call %lld %s http %s%s%s\n", (long long)sqlite3_column_int64(eq, 0),
                col_txt(eq, 1), http, sqlite3_column_type(eq, 3) == SQLITE_NULL ? "" : "  error ",
                col_txt(eq, 3));
        const void *b = sqlite3_column_blob(eq, 4);
        int n = sqlite3_column_bytes(eq, 4);
        if (b) {
            char pre[260];
            int k = n < 256 ? n : 256;
            memcpy(pre, b, (size_t)k);
            pre[k] = 0;
            print_text(out, "    ",
                       sqlite3_column_int(eq, 5) ? "response: " : "response prefix: ", pre, 256);
        }
    }
    sqlite3_finalize(eq);
    if (rc != SQLITE_DONE) return rdb_fail(d, rc, "reading environment calls");
    if (t.status == REPLAY_MASKED || t.status == REPLAY_RUNNING) {
        fprintf(out, "\n== %s\n", t.status == REPLAY_MASKED ? "mask" : "still running");
        sqlite3_stmt *q;
        ARL_TRY(
            rdb_prepare(d, "SELECT error_detail_json FROM trajectories WHERE traj_id = ?1", &q));
        sqlite3_bind_int64(q, 1, t.traj_id);
        rc = sqlite3_step(q);
        if (rc == SQLITE_ROW && sqlite3_column_type(q, 0) != SQLITE_NULL)
            print_text(out, "  ", "detail: ", col_txt(q, 0), 4000);
        sqlite3_finalize(q);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rdb_fail(d, rc, "reading the mask");
        if (t.status == REPLAY_MASKED)
            fprintf(out, "  error %s, attribution %s, end cause %s\n", t.error_code,
                    t.error_attribution, t.end_cause);
        else
            fprintf(out, "  interrupted? run 'agentrl replay recover' when its writer is gone\n");
    }
    /* events */
    sqlite3_stmt *vq;
    ARL_TRY(rdb_prepare(d,
                        "SELECT seq, at_ms, kind, detail_json FROM trajectory_events WHERE traj_id "
                        "= ?1 ORDER BY seq",
                        &vq));
    sqlite3_bind_int64(vq, 1, t.traj_id);
    fprintf(out, "\n== events\n");
    while ((rc = sqlite3_step(vq)) == SQLITE_ROW)
        fprintf(out, "  %3lld %s %s\n", (long long)sqlite3_column_int64(vq, 0), col_txt(vq, 2),
                col_txt(vq, 3));
    sqlite3_finalize(vq);
    if (rc != SQLITE_DONE) return rdb_fail(d, rc, "reading events");
    return ARL_OK;
}

arl_status replay_show(replay_store *st, const char *traj, const replay_show_opts *o, FILE *out) {
    replay_show_opts none = {0};
    if (!o) o = &none;
    replay_traj_row t;
    ARL_TRY(replay_traj_get(st, traj, &t));
    rshard *sh = rstore_shard(st, t.shard_id);
    if (!sh && st->single_file) sh = &st->shards[0];
    if (!sh) return arl_errorf(ARL_ERR_NOT_FOUND, "replay: shard %d missing", (int)t.shard_id);
    rdb *d;
    ARL_TRY(rstore_shard_db(st, sh, &d));
    /* the row read again in the snapshot the rest is read from: a writer's commits meanwhile
     * (a running trajectory's segments, its end) made the header disagree with its segments */
    rdb_read_begin(d);
    col_oom = 0;
    arl_status s = replay_traj_get_id(st, t.traj_id, &t);
    if (s == ARL_OK) s = show_traj(st, sh, d, &t, o, out);
    if (s == ARL_OK && col_oom) s = show_nomem();
    rdb_read_end(d);
    return s;
}
