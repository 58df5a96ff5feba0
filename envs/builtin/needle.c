/* envs/builtin/needle.c: the "needle" built-in environment: retrieval from a long document
 * (up to millions of tokens) through open(), read(offset, length) and search(pattern), then
 * answer(value).  read's arguments are optional, as with a file: offset defaults to where the
 * previous read ended (0 before any read), length to max_read, so read({}) reads the next
 * chunk and a whole-document scan needs no arithmetic on offsets.
 *
 * The document is never stored.  It is a sequence of N fixed-width lines of NEEDLE_LW bytes
 * (63 characters and '\n'; line k starts at byte 64*k), and any line is generated on demand
 * from (seed, k): lower-case filler words, except a few special lines chosen at reset:
 *   line 0       a title;
 *   fact lines   hops 1: "The code of vault ORCHID is 48213." (the target, within the first
 *                10% of the document: far back) plus `distractors` facts about other vaults;
 *                hops 2: "Agent ORCHID keeps the key of vault 417." (first 10%) and
 *                "The code of vault 417 is 48213." (first half) plus distractors of both kinds;
 *   line N-1     the question ("QUESTION: What is the code of vault ORCHID?").
 * Key names are upper case and never occur in filler; digits occur only in facts.  A read
 * costs O(length), a search O(N) time; memory is O(1) in the document size (a session state
 * is a few KiB whatever the size).
 *
 * Options (or task.data): doc_tokens (document size in tokens, estimated at 4 bytes per
 * token: N = ceil(doc_tokens / 16) lines; default 2000, 256 .. 4194304), doc_tokens_min (when
 * set, each task's size is drawn from [doc_tokens_min, doc_tokens] by its seed), hops (1 or 2),
 * distractors (0..64, default 8), max_read (largest read length, 256..65536, default 8192),
 * teacher ("search": open, read the question, search, answer; "scan": read the whole
 * document from the start with read({}), then answer: drives trajectories as long as the
 * document).
 *
 * Rewards: process found (+0.1 the first time the question is shown, +0.2 the first time
 * each needed fact line is shown whole by a read or a search hit), format (-0.1 per
 * malformed or failing call or turn without a call, at least -0.5); segment progress (the
 * fraction of those 1 + hops milestones reached during the segment); outcome answer_correct
 * (the answer, trimmed, equals the code).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "envs/builtin/builtin.h"

#define NEEDLE_LW 64           /* bytes per line including '\n' */
#define NEEDLE_MAX_SPECIAL 136 /* 2 targets + 2 * 64 distractors + slack */
#define NEEDLE_MAX_STEPS 4096
#define NEEDLE_SEARCH_SHOW 5

static const char needle_info_json[] =
    "{\"tools\": ["
    "{\"type\": \"function\", \"function\": {\"name\": \"open\", "
    "\"description\": \"Open the document and get its size.\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {}, \"required\": [], "
    "\"additionalProperties\": false}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"read\", "
    "\"description\": \"Read length bytes of the document from byte offset (defaults: offset "
    "where the previous read ended, length the largest read).\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"offset\": {\"type\": "
    "\"integer\", \"minimum\": 0, \"maximum\": 9007199254740991}, \"length\": {\"type\": "
    "\"integer\", \"minimum\": 1, \"maximum\": 1048576}}, \"required\": [], "
    "\"additionalProperties\": false}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"search\", "
    "\"description\": \"Find the lines containing pattern (case-sensitive text).\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"pattern\": {\"type\": "
    "\"string\", \"minLength\": 1, \"maxLength\": 63}}, \"required\": [\"pattern\"], "
    "\"additionalProperties\": false}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"answer\", "
    "\"description\": \"Give the final answer. Ends the task.\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"value\": {\"type\": "
    "\"string\", \"maxLength\": 64}}, \"required\": [\"value\"], "
    "\"additionalProperties\": false}}}],"
    "\"reward_levels\": {\"process\": {\"range\": [-0.5, 0.5]}, "
    "\"segment\": {\"range\": [0, 1]}, \"outcome\": {\"range\": [0, 1]}},"
    "\"reward_components\": ["
    "{\"name\": \"answer_correct\", \"level\": \"outcome\", \"range\": [0, 1], "
    "\"description\": \"1 if the answer equals the code\"},"
    "{\"name\": \"progress\", \"level\": \"segment\", \"range\": [0, 1], "
    "\"description\": \"fraction of the milestones (question, facts) reached in the "
    "segment\"},"
    "{\"name\": \"found\", \"level\": \"process\", \"range\": [0, 0.5], "
    "\"description\": \"+0.1 question first shown, +0.2 per needed fact first shown\"},"
    "{\"name\": \"format\", \"level\": \"process\", \"range\": [-0.5, 0], "
    "\"description\": \"-0.1 per malformed or failing call or turn without a call\"}],"
    "\"capabilities\": {\"fork\": true, \"segment_score\": true, \"deterministic_replay\": "
    "true, \"parallel_tool_calls\": true, \"multimodal\": false, \"context_reset\": false},"
    "\"limits\": {\"max_sessions\": 4096, \"max_steps\": 4096, \"default_step_timeout_ms\": "
    "30000, \"max_observation_bytes\": 1048576}}";

/* Filler vocabulary by length (1..12): every length exists, so a line can be filled to an
 * exact width.  No word is a key name, "code", "vault", "agent", "key" or a digit. */
static const char *const nw1[] = {"a", "o"};
static const char *const nw2[] = {"an", "as", "at", "by", "in", "is", "it", "of",
                                  "on", "or", "to", "up", "we", "so", "no"};
static const char *const nw3[] = {"and", "are", "but", "can", "day", "far", "for", "had",
                                  "her", "his", "its", "may", "new", "not", "old", "one",
                                  "our", "out", "sea", "the", "two", "was", "way", "who"};
static const char *const nw4[] = {
    "also", "area", "back", "been", "city", "door", "each", "even", "face", "fire", "from",
    "hand", "have", "hill", "into", "lake", "land", "long", "made", "many", "more", "name",
    "near", "once", "over", "road", "said", "ship", "some", "than", "that", "then", "they",
    "time", "town", "tree", "upon", "wall", "were", "when", "wind", "with"};
static const char *const nw5[] = {"about", "after", "again", "along", "below", "bread", "chair",
                                  "early", "field", "first", "found", "great", "green", "horse",
                                  "house", "light", "river", "round", "small", "stone", "table",
                                  "their", "there", "these", "think", "three", "under", "water",
                                  "where", "which", "while", "white", "world", "would", "young"};
static const char *const nw6[] = {"across", "always", "around", "before", "better", "bridge",
                                  "castle", "corner", "garden", "golden", "ground", "harbor",
                                  "island", "market", "little", "mother", "people", "silver",
                                  "window", "winter", "yellow", "summer", "valley"};
static const char *const nw7[] = {"against", "another", "because", "between", "brother",
                                  "country", "evening", "forward", "morning", "nothing",
                                  "quietly", "shelter", "someone", "through", "village",
                                  "weather", "without", "kitchen", "lantern", "meadows"};
static const char *const nw8[] = {"children", "distance", "mountain", "northern", "southern",
                                  "together", "traveler", "whenever", "yourself", "orchards",
                                  "sunlight", "shoulder", "slightly", "tomorrow"};
static const char *const nw9[] = {"afternoon", "beautiful", "something", "carefully",
                                  "gathering", "shoreline", "wandering", "whispered"};
static const char *const nw10[] = {"everything", "throughout", "themselves",
                                   "lighthouse", "storehouse", "understood"};
static const char *const nw11[] = {"countryside", "remembering", "marketplace",
                                   "shipwrights", "grandmother", "thunderclap"};
static const char *const nw12[] = {"neighborhood", "occasionally", "surroundings", "storytelling",
                                   "thunderstorm"};

typedef struct needle_bucket {
    const char *const *w;
    int n;
} needle_bucket;

#define NB(a)                                                                                      \
    { a, (int)(sizeof a / sizeof a[0]) }
static const needle_bucket needle_words[13] = {{NULL, 0}, NB(nw1),  NB(nw2), NB(nw3), NB(nw4),
                                               NB(nw5),   NB(nw6),  NB(nw7), NB(nw8), NB(nw9),
                                               NB(nw10),  NB(nw11), NB(nw12)};

static const char *const needle_keys[] = {
    "ORCHID", "FALCON", "GRANITE", "MARLIN",  "JUNIPER", "COBALT",  "SAFFRON",  "TUNDRA",  "QUARTZ",
    "HERON",  "EMBER",  "VIOLET",  "CANYON",  "WALRUS",  "ZEPHYR",  "MAGNOLIA", "BISON",   "CITRUS",
    "DELTA",  "EAGLE",  "FJORD",   "GLACIER", "HARBOR",  "IBIS",    "JASPER",   "KESTREL", "LOTUS",
    "MAPLE",  "NEBULA", "OSPREY",  "PEBBLE",  "RAVEN",   "SEQUOIA", "TOPAZ",    "UMBER",   "VORTEX",
    "WILLOW", "YARROW", "ZIRCON",  "ALDER",   "BRAMBLE", "CEDAR",   "DUNE",     "ELM",     "FERN",
    "GARNET", "HAZEL",  "IRIS",    "JADE",    "KELP",    "LARCH",   "MOSS",     "NUTMEG",  "OPAL",
    "PINE",   "QUILL",  "RUSSET",  "SLATE",   "THISTLE", "ULEX",    "VERBENA",  "WREN",    "YEW",
    "ZINNIA", "ACORN",  "BASALT",  "CORAL",   "DAHLIA",  "EBONY",   "FLINT",    "GINGER",  "HEATH"};
#define NEEDLE_NKEYS ((int)(sizeof needle_keys / sizeof needle_keys[0]))

enum { SPEC_CODE = 0, SPEC_AGENT = 1 };

typedef struct needle_special {
    int64_t line;
    int kind;   /* SPEC_CODE: code of vault `key`/`vault`; SPEC_AGENT: agent keeps vault */
    int key;    /* index into needle_keys (SPEC_AGENT, and SPEC_CODE with hops 1) */
    int vault;  /* 100..999 (hops 2) */
    int code;   /* 10000..99999 */
    int needed; /* bit of the milestone it satisfies (0: a distractor) */
} needle_special;

typedef struct needle_state {
    uint64_t seed;
    int64_t nlines;
    int hops, distractors;
    int64_t max_read;
    int scan_teacher;
    needle_special spec[NEEDLE_MAX_SPECIAL]; /* sorted by line */
    int nspec;
    int target_key, target_vault, target_code;
    char question[NEEDLE_LW];
    /* progress */
    int opened;
    int seen;         /* milestone bits: 1 question, 2 first fact, 4 second fact (hops 2) */
    int64_t scan_hwm; /* bytes [0, scan_hwm) read contiguously from the start */
    int64_t cursor;   /* where the last read ended: read's default offset */
    int64_t steps;
    uint8_t progress_at[NEEDLE_MAX_STEPS + 1]; /* popcount(seen) after each step */
    int answered, correct;
    char given[72];
} needle_state;

/* ---- document generation ---- */

/* Fill buf[0..n-1] with filler words and single spaces, exactly n bytes (n >= 0). */
static void needle_fill(arl_rng *r, char *buf, int n) {
    int i = 0;
    while (i < n) {
        int left = n - i, len;
        if (left <= 12) {
            len = left;
        } else {
            len = 1 + (int)arl_rng_below(r, 8); /* 1..8, then a space */
            if (len > left - 2) len = left - 2;
        }
        const needle_bucket *b = &needle_words[len];
        const char *w = b->w[arl_rng_below(r, (uint64_t)b->n)];
        memcpy(buf + i, w, (size_t)len);
        i += len;
        if (i < n) buf[i++] = ' ';
    }
}

static int needle_fact_text(const needle_state *s, const needle_special *p, char *buf,
                            size_t size) {
    if (p->kind == SPEC_AGENT)
        return snprintf(buf, size, "Agent %s keeps the key of vault %d. ", needle_keys[p->key],
                        p->vault);
    if (s->hops == 1)
        return snprintf(buf, size, "The code of vault %s is %d. ", needle_keys[p->key], p->code);
    return snprintf(buf, size, "The code of vault %d is %d. ", p->vault, p->code);
}

static const needle_special *needle_find_special(const needle_state *s, int64_t line) {
    int lo = 0, hi = s->nspec - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (s->spec[mid].line == line) return &s->spec[mid];
        if (s->spec[mid].line < line)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

/* Line k (0 <= k < nlines) into out[0..NEEDLE_LW-1] (no terminating NUL). */
static void needle_line(const needle_state *s, int64_t k, char *out) {
    arl_rng r;
    arl_rng_seed_stream(&r, s->seed ^ 0x6e656564ull /* "need" */, (uint64_t)k);
    char head[NEEDLE_LW + 16];
    int h = 0;
    if (k == 0) {
        h = snprintf(head, sizeof head, "ARCHIVE OF VAULT RECORDS. ");
    } else if (k == s->nlines - 1) {
        h = snprintf(head, sizeof head, "%s", s->question);
    } else {
        const needle_special *p = needle_find_special(s, k);
        if (p) h = needle_fact_text(s, p, head, sizeof head);
    }
    if (h > NEEDLE_LW - 1) h = NEEDLE_LW - 1;
    memcpy(out, head, (size_t)h);
    needle_fill(&r, out + h, NEEDLE_LW - 1 - h);
    out[NEEDLE_LW - 1] = '\n';
}

/* Bytes [off, off + len) of the document into out (len bytes). */
static void needle_read_bytes(const needle_state *s, int64_t off, int64_t len, char *out) {
    char line[NEEDLE_LW];
    while (len > 0) {
        int64_t k = off / NEEDLE_LW, in = off % NEEDLE_LW;
        int64_t n = NEEDLE_LW - in < len ? NEEDLE_LW - in : len;
        needle_line(s, k, line);
        memcpy(out, line + in, (size_t)n);
        out += n, off += n, len -= n;
    }
}

static int needle_cmp_special(const void *a, const void *b) {
    int64_t x = ((const needle_special *)a)->line, y = ((const needle_special *)b)->line;
    return x < y ? -1 : x > y;
}

/* Choose distinct special lines, keys, vaults and codes from the seed. */
static void needle_generate(needle_state *s) {
    arl_rng r;
    arl_rng_seed_stream(&r, s->seed, 0x6b657973u /* "keys" */);
    int64_t N = s->nlines;
    int used_key[NEEDLE_NKEYS] = {0};
    int nfacts = s->hops == 1 ? 1 + s->distractors : 2 + 2 * s->distractors;
    int64_t lines[NEEDLE_MAX_SPECIAL];
    int codes[NEEDLE_MAX_SPECIAL], vaults[NEEDLE_MAX_SPECIAL];
    /* lines: the target in the first 10% (hops 2: agent fact there, code fact in the first
     * half), the rest anywhere in [1, N-2]; all distinct. */
    for (int i = 0; i < nfacts; i++) {
        for (;;) {
            int64_t hi = N - 2;
            if (i == 0) hi = 1 + (N - 2) / 10;
            if (i == 1 && s->hops == 2) hi = 1 + (N - 2) / 2;
            if (hi < 1) hi = 1;
            int64_t l = 1 + (int64_t)arl_rng_below(&r, (uint64_t)hi);
            int dup = 0;
            for (int j = 0; j < i; j++)
                dup |= lines[j] == l;
            if (!dup) {
                lines[i] = l;
                break;
            }
        }
        for (;;) {
            int c = 10000 + (int)arl_rng_below(&r, 90000), v = 100 + (int)arl_rng_below(&r, 900);
            int dup = 0;
            for (int j = 0; j < i; j++)
                dup |= codes[j] == c || vaults[j] == v;
            if (!dup) {
                codes[i] = c, vaults[i] = v;
                break;
            }
        }
    }
    s->nspec = 0;
    if (s->hops == 1) {
        for (int i = 0; i < nfacts; i++) {
            int key;
            do
                key = (int)arl_rng_below(&r, NEEDLE_NKEYS);
            while (used_key[key]);
            used_key[key] = 1;
            needle_special p = {lines[i], SPEC_CODE, key, 0, codes[i], i == 0 ? 2 : 0};
            s->spec[s->nspec++] = p;
        }
        s->target_key = s->spec[0].key;
        s->target_code = s->spec[0].code;
        snprintf(s->question, sizeof s->question, "QUESTION: What is the code of vault %s? ",
                 needle_keys[s->target_key]);
    } else {
        /* facts 0 (agent of the target) and 1 (code of its vault); then pairs of distractors:
         * every distractor agent keeps its own vault, every distractor vault has a code. */
        for (int i = 0; i < nfacts; i += 2) {
            int key;
            do
                key = (int)arl_rng_below(&r, NEEDLE_NKEYS);
            while (used_key[key]);
            used_key[key] = 1;
            needle_special a = {lines[i], SPEC_AGENT, key, vaults[i], 0, i == 0 ? 2 : 0};
            needle_special c = {lines[i + 1], SPEC_CODE, key, vaults[i], codes[i], i == 0 ? 4 : 0};
            s->spec[s->nspec++] = a;
            s->spec[s->nspec++] = c;
        }
        s->target_key = s->spec[0].key;
        s->target_vault = s->spec[0].vault;
        s->target_code = s->spec[1].code;
        snprintf(s->question, sizeof s->question,
                 "QUESTION: What is the code of the vault of "
                 "agent %s? ",
                 needle_keys[s->target_key]);
    }
    qsort(s->spec, (size_t)s->nspec, sizeof s->spec[0], needle_cmp_special);
}

/* ---- session ---- */

static const char *const needle_data_keys[] = {
    "doc_tokens", "doc_tokens_min", "hops", "distractors", "max_read", "teacher", NULL};
static const char *const needle_option_keys[] = {"doc_tokens", "doc_tokens_min", "hops",
                                                 "distractors", "max_read", "teacher",
                                                 "max_steps", NULL};
static const char *const needle_teachers[] = {"search", "scan", NULL};

static uint64_t needle_anchor_hash(const needle_state *s) {
    int a[6] = {s->target_key, s->target_code, s->opened, s->seen, s->answered, s->correct};
    uint64_t h = arl_bi_hash(&s->seed, sizeof s->seed, 0);
    return arl_bi_hash(a, sizeof a, h);
}

static arl_status needle_instance_create(const json_t *config, void **inst) {
    return arl_bi_instance_open(needle_info_json, config, inst);
}

static void needle_instance_destroy(void *inst) {
    arl_bi_instance_close(inst);
}

static arl_status needle_options(const json_t *o, const char *where, int64_t *tokens,
                                 int64_t *tokens_min, int64_t *hops, int64_t *distr,
                                 int64_t *max_read, const char **teacher) {
    ARL_TRY(arl_bi_get_int(o, "doc_tokens", where, *tokens, 256, 4194304, tokens));
    ARL_TRY(arl_bi_get_int(o, "doc_tokens_min", where, *tokens_min, 0, 4194304, tokens_min));
    ARL_TRY(arl_bi_get_int(o, "hops", where, *hops, 1, 2, hops));
    ARL_TRY(arl_bi_get_int(o, "distractors", where, *distr, 0, 64, distr));
    ARL_TRY(arl_bi_get_int(o, "max_read", where, *max_read, 256, 65536, max_read));
    return arl_bi_get_string(o, "teacher", where, *teacher, needle_teachers, teacher);
}

static arl_status needle_reset(void *inst, const arl_env_reset_req *req, void **state,
                               arl_env_result *out) {
    ARL_TRY(arl_bi_check_keys(req->task.data, "task.data", needle_data_keys));
    ARL_TRY(arl_bi_check_keys(req->options, "options", needle_option_keys));
    int64_t tokens = 2000, tokens_min = 0, hops = 1, distr = 8, max_read = 8192;
    const char *teacher = "search";
    ARL_TRY(needle_options(req->options, "options", &tokens, &tokens_min, &hops, &distr,
                           &max_read, &teacher));
    ARL_TRY(needle_options(req->task.data, "task.data", &tokens, &tokens_min, &hops, &distr,
                           &max_read, &teacher));
    if (tokens_min > tokens)
        return arl_errorf(ARL_ERR_ARG,
                          "needle: doc_tokens_min %lld is above doc_tokens %lld (the document "
                          "size is drawn from [doc_tokens_min, doc_tokens])",
                          (long long)tokens_min, (long long)tokens);
    if (tokens_min > 0) {
        /* a size per task, from the seed alone (the same task always has the same document) */
        arl_rng r;
        arl_rng_seed_stream(&r, req->task.seed, 0x73697a65u /* "size" */);
        int64_t lo = tokens_min < 256 ? 256 : tokens_min;
        tokens = lo + (int64_t)arl_rng_below(&r, (uint64_t)(tokens - lo + 1));
    }
    needle_state *s = calloc(1, sizeof *s);
    if (!s) return arl_errorf(ARL_ERR_NOMEM, "needle: out of memory");
    s->seed = req->task.seed;
    s->nlines = (tokens + 15) / 16;
    s->hops = (int)hops;
    /* every fact needs its own line among lines 1..N-2 */
    int64_t room = (s->nlines - 2) / (s->hops == 1 ? 1 : 2) - 1;
    s->distractors = (int)(distr < room ? distr : room);
    s->max_read = max_read;
    s->scan_teacher = !strcmp(teacher, "scan");
    needle_generate(s);
    char user[512];
    snprintf(user, sizeof user,
             "A long document holds the answer to a question written on its last line. Open "
             "it, find the question and the facts it needs, then answer.");
    out->obs.context = ARL_ENV_CONTEXT_RESET;
    arl_status st = arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_SYSTEM,
                                         "You answer questions about a long document using the "
                                         "open, read, search and answer tools.");
    if (st == ARL_OK) st = arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_USER, user);
    if (st == ARL_OK) st = arl_bi_set_anchor(&out->info, "needle", needle_anchor_hash(s));
    if (st != ARL_OK) {
        free(s);
        return st;
    }
    *state = s;
    return ARL_OK;
}

/* Mark milestones whose text lies entirely inside bytes [off, off + len). */
static int needle_mark_range(needle_state *s, int64_t off, int64_t len) {
    int before = s->seen;
    int64_t qoff = (s->nlines - 1) * NEEDLE_LW;
    if (off <= qoff && off + len >= qoff + (int64_t)strlen(s->question) - 1) s->seen |= 1;
    for (int i = 0; i < s->nspec; i++) {
        const needle_special *p = &s->spec[i];
        if (!p->needed) continue;
        char t[NEEDLE_LW + 16];
        int64_t lo = p->line * NEEDLE_LW, n = needle_fact_text(s, p, t, sizeof t) - 1;
        if (off <= lo && off + len >= lo + n) s->seen |= p->needed;
    }
    return s->seen & ~before;
}

typedef struct needle_turn {
    needle_state *s;
    int newly; /* milestone bits first reached in this step */
} needle_turn;

static arl_status needle_run_call(void *ctx, const arl_env_tool_call *c, arl_env_observation *obs,
                                  arl_bi_call_kind *kind, int *stop) {
    needle_turn *t = ctx;
    needle_state *s = t->s;
    int64_t size = s->nlines * NEEDLE_LW;
    char buf[512];
    if (!strcmp(c->name, "answer")) {
        char nb[64];
        const char *txt = arl_bi_arg_text(c->arguments, "value", nb, sizeof nb);
        char code[16];
        snprintf(code, sizeof code, "%d", s->target_code);
        const char *p = txt ? txt : "";
        while (*p == ' ' || *p == '\t' || *p == '\n')
            p++;
        size_t n = strlen(p);
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t' || p[n - 1] == '\n' || p[n - 1] == '.'))
            n--;
        s->answered = 1;
        s->correct = n == strlen(code) && !strncmp(p, code, n);
        snprintf(s->given, sizeof s->given, "%.64s", txt ? txt : "");
        *kind = ARL_BI_CALL_OK;
        *stop = 1;
        return arl_env_obs_add_tool(obs, c->id, "Answer recorded.", NULL);
    }
    if (!strcmp(c->name, "open")) {
        s->opened = 1;
        snprintf(buf, sizeof buf,
                 "Opened: %lld bytes in %lld lines of %d bytes (line k starts at offset %d*k). "
                 "The question is on the last line, at offset %lld.",
                 (long long)size, (long long)s->nlines, NEEDLE_LW, NEEDLE_LW,
                 (long long)(size - NEEDLE_LW));
        *kind = ARL_BI_CALL_OK;
        return arl_env_obs_add_tool(obs, c->id, buf, NULL);
    }
    if (!s->opened) {
        *kind = ARL_BI_CALL_RUNTIME;
        return arl_env_obs_add_tool(obs, c->id,
                                    "Error: the document is not open; call open() "
                                    "first.",
                                    ARL_ENV_TOOL_RUNTIME_ERROR);
    }
    if (!strcmp(c->name, "read")) {
        const json_t *jo = json_object_get(c->arguments, "offset");
        const json_t *jl = json_object_get(c->arguments, "length");
        int64_t off = jo ? json_integer_value(jo) : s->cursor;
        int64_t len = jl ? json_integer_value(jl) : s->max_read;
        if (!jo && off >= size) {
            *kind = ARL_BI_CALL_RUNTIME;
            snprintf(buf, sizeof buf,
                     "Error: nothing left to read: the previous read ended at the end of the "
                     "document (%lld bytes).",
                     (long long)size);
            return arl_env_obs_add_tool(obs, c->id, buf, ARL_ENV_TOOL_RUNTIME_ERROR);
        }
        if (off >= size) {
            *kind = ARL_BI_CALL_RUNTIME;
            snprintf(buf, sizeof buf,
                     "Error: offset %lld is past the end of the document "
                     "(%lld bytes).",
                     (long long)off, (long long)size);
            return arl_env_obs_add_tool(obs, c->id, buf, ARL_ENV_TOOL_RUNTIME_ERROR);
        }
        int64_t want = len < size - off ? len : size - off;
        int64_t n = want < s->max_read ? want : s->max_read;
        char *text = malloc((size_t)n + 1);
        if (!text) return arl_errorf(ARL_ERR_NOMEM, "needle: out of memory");
        needle_read_bytes(s, off, n, text);
        text[n] = 0;
        t->newly |= needle_mark_range(s, off, n);
        s->cursor = off + n;
        if (off == 0 || off <= s->scan_hwm) {
            if (off + n > s->scan_hwm) s->scan_hwm = off + n;
        }
        arl_status st = arl_env_obs_add_tool(obs, c->id, text, NULL);
        free(text);
        if (st == ARL_OK && n < want) arl_env_obs_mark_truncated(obs, want);
        *kind = ARL_BI_CALL_OK;
        return st;
    }
    /* search */
    const char *pat = json_string_value(json_object_get(c->arguments, "pattern"));
    if (strchr(pat, '\n')) {
        *kind = ARL_BI_CALL_RUNTIME;
        return arl_env_obs_add_tool(obs, c->id, "Error: the pattern cannot contain a newline.",
                                    ARL_ENV_TOOL_RUNTIME_ERROR);
    }
    size_t plen = strlen(pat);
    char out[NEEDLE_SEARCH_SHOW * (NEEDLE_LW + 32) + 128];
    int off = 0;
    int64_t hits = 0;
    char line[NEEDLE_LW + 1];
    for (int64_t k = 0; k < s->nlines; k++) {
        needle_line(s, k, line);
        line[NEEDLE_LW - 1] = 0;
        if (!memmem(line, NEEDLE_LW - 1, pat, plen)) continue;
        if (hits < NEEDLE_SEARCH_SHOW) {
            off += snprintf(out + off, sizeof out - (size_t)off, "offset %lld: %s\n",
                            (long long)(k * NEEDLE_LW), line);
            t->newly |= needle_mark_range(s, k * NEEDLE_LW, NEEDLE_LW);
        }
        hits++;
    }
    char head[160];
    if (hits == 0)
        snprintf(head, sizeof head, "No line contains \"%s\".", pat);
    else if (hits <= NEEDLE_SEARCH_SHOW)
        snprintf(head, sizeof head, "%lld matching line%s:\n", (long long)hits,
                 hits == 1 ? "" : "s");
    else
        snprintf(head, sizeof head, "%lld matching lines, the first %d:\n", (long long)hits,
                 NEEDLE_SEARCH_SHOW);
    char *text = malloc(strlen(head) + (size_t)off + 1);
    if (!text) return arl_errorf(ARL_ERR_NOMEM, "needle: out of memory");
    strcpy(text, head);
    memcpy(text + strlen(head), out, (size_t)off);
    text[strlen(head) + (size_t)off] = 0;
    size_t tl = strlen(text);
    if (tl && text[tl - 1] == '\n') text[tl - 1] = 0;
    arl_status st = arl_env_obs_add_tool(obs, c->id, text, NULL);
    free(text);
    *kind = ARL_BI_CALL_OK;
    return st;
}

static const arl_bi_dispatch needle_dispatch = {
    .max_calls_per_turn = 8,
    .run_call = needle_run_call,
    .nudge_no_call = "Use the tools: open, read, search, then answer.",
    .lenient_tool = "answer",
};

static int popcount(int x) {
    int n = 0;
    for (; x; x &= x - 1)
        n++;
    return n;
}

static arl_status needle_step(void *inst, void *state, const arl_env_step_req *req,
                              arl_env_result *out) {
    needle_state *s = state;
    /* atomic: remember the mutable part */
    int opened = s->opened, seen = s->seen, answered = s->answered, correct = s->correct;
    int64_t hwm = s->scan_hwm, cursor = s->cursor;
    needle_turn t = {s, 0};
    arl_bi_turn_stats st;
    int ended;
    arl_status r =
        arl_bi_dispatch_turn(&needle_dispatch, inst, &t, req->action, &out->obs, &st, &ended);
    if (r == ARL_OK) {
        s->steps++;
        if (s->steps <= NEEDLE_MAX_STEPS) s->progress_at[s->steps] = (uint8_t)popcount(s->seen);
        double found = 0.1 * ((t.newly & 1) != 0) + 0.2 * popcount(t.newly & 6);
        double fmt = -0.1 * (st.n_malformed + st.n_runtime + st.no_tool_call);
        if (fmt < -0.5) fmt = -0.5;
        out->reward = found + fmt;
        out->terminated = ended;
        r = arl_env_result_component(out, "found", found);
        if (r == ARL_OK) r = arl_env_result_component(out, "format", fmt);
        if (r == ARL_OK) r = arl_bi_set_anchor(&out->info, "needle", needle_anchor_hash(s));
        if (r == ARL_OK) return ARL_OK;
        s->steps--;
    }
    s->opened = opened, s->seen = seen, s->answered = answered, s->correct = correct;
    s->scan_hwm = hwm, s->cursor = cursor;
    return r;
}

static arl_status needle_score(void *inst, void *state, const arl_env_score_req *req,
                               arl_env_score_result *out) {
    needle_state *s = state;
    out->scorable = 1;
    char code[16];
    snprintf(code, sizeof code, "%d", s->target_code);
    if (req->scope == ARL_ENV_SCOPE_SEGMENT) {
        int64_t first = req->first < 1 ? 1 : req->first;
        int64_t last = req->last > NEEDLE_MAX_STEPS ? NEEDLE_MAX_STEPS : req->last;
        int d = s->progress_at[last] - s->progress_at[first - 1];
        out->reward = d > 0 ? (double)d / (1 + s->hops) : 0;
        out->info = json_pack("{s:i, s:i}", "milestones", s->progress_at[last], "of", 1 + s->hops);
        return arl_env_score_component(out, "progress", out->reward);
    }
    out->reward = s->correct ? 1.0 : 0.0;
    out->info = json_pack("{s:s, s:s?, s:b}", "expected", code, "given",
                          s->answered ? s->given : NULL, "answered", s->answered);
    return arl_env_score_component(out, "answer_correct", out->reward);
}

static arl_status needle_fork(void *inst, const void *state, void **child) {
    needle_state *c = malloc(sizeof *c);
    if (!c) return arl_errorf(ARL_ERR_NOMEM, "needle: out of memory");
    memcpy(c, state, sizeof *c);
    *child = c;
    return ARL_OK;
}

static void needle_free_state(void *inst, void *state) {
    free(state);
}

static json_t *needle_debug_state(void *inst, const void *state) {
    const needle_state *s = state;
    int64_t target_line = -1;
    for (int i = 0; i < s->nspec; i++)
        if (s->spec[i].needed == 2) target_line = s->spec[i].line;
    return json_pack("{s:I, s:I, s:i, s:s, s:i, s:I, s:b, s:i, s:b}", "lines",
                     (json_int_t)s->nlines, "bytes", (json_int_t)(s->nlines * NEEDLE_LW), "hops",
                     s->hops, "key", needle_keys[s->target_key], "code", s->target_code,
                     "target_line", (json_int_t)target_line, "opened", s->opened, "seen", s->seen,
                     "answered", s->answered);
}

/* ---- teacher ---- */

arl_status arl_env_needle_teacher(void *inst, const void *state, int64_t next_step,
                                  arl_env_action *out) {
    const needle_state *s = state;
    if (s->answered) return arl_errorf(ARL_ERR_STATE, "needle: the episode has ended");
    int64_t size = s->nlines * NEEDLE_LW;
    int all = 1 | 2 | (s->hops == 2 ? 4 : 0);
    char text[160];
    if (!s->opened) {
        ARL_TRY(arl_bi_teacher_call(out, next_step, "open", json_object()));
        return arl_bi_teacher_finish(out, "Opening the document.");
    }
    if (s->scan_teacher && s->scan_hwm < size) {
        /* read on from the cursor when it sits at the end of the contiguous prefix (always,
         * unless the policy read elsewhere in between) */
        int64_t n = size - s->scan_hwm < s->max_read ? size - s->scan_hwm : s->max_read;
        json_t *args = s->cursor == s->scan_hwm
                           ? json_object()
                           : json_pack("{s:I, s:I}", "offset", (json_int_t)s->scan_hwm, "length",
                                       (json_int_t)n);
        ARL_TRY(arl_bi_teacher_call(out, next_step, "read", args));
        return arl_bi_teacher_finish(out,
                                     s->scan_hwm == 0 ? "Reading from the start." : "Reading on.");
    }
    if (!(s->seen & 1)) {
        ARL_TRY(
            arl_bi_teacher_call(out, next_step, "read",
                                json_pack("{s:I, s:i}", "offset", (json_int_t)(size - NEEDLE_LW),
                                          "length", NEEDLE_LW)));
        return arl_bi_teacher_finish(out, "Reading the question on the last line.");
    }
    if (!(s->seen & 2)) {
        ARL_TRY(arl_bi_teacher_call(out, next_step, "search",
                                    json_pack("{s:s}", "pattern", needle_keys[s->target_key])));
        snprintf(text, sizeof text, "Searching for %s.", needle_keys[s->target_key]);
        return arl_bi_teacher_finish(out, text);
    }
    if ((all & 4) && !(s->seen & 4)) {
        char pat[32];
        snprintf(pat, sizeof pat, "vault %d is", s->target_vault);
        ARL_TRY(arl_bi_teacher_call(out, next_step, "search", json_pack("{s:s}", "pattern", pat)));
        snprintf(text, sizeof text, "Agent %s keeps vault %d. Searching for its code.",
                 needle_keys[s->target_key], s->target_vault);
        return arl_bi_teacher_finish(out, text);
    }
    char code[16];
    snprintf(code, sizeof code, "%d", s->target_code);
    ARL_TRY(arl_bi_teacher_call(out, next_step, "answer", json_pack("{s:s}", "value", code)));
    snprintf(text, sizeof text, "The code is %s.", code);
    return arl_bi_teacher_finish(out, text);
}

static const arl_env_ops needle_ops = {
    .thread_safety = 1,
    .instance_create = needle_instance_create,
    .instance_destroy = needle_instance_destroy,
    .reset = needle_reset,
    .step = needle_step,
    .score = needle_score,
    .fork = needle_fork,
    .free_state = needle_free_state,
    .debug_state = needle_debug_state,
};

const arl_env_def arl_env_needle = {
    .name = "needle",
    .version = "1.1.0",
    .description = "Find facts planted far back in a long generated document and answer.",
    .info_json = needle_info_json,
    .ops = &needle_ops,
};
