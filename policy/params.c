/* policy/params.c: tensor inventory, parameter counts, memory figures, the parameter arena
 * and initialisation from scratch (spec/policy.md sections 12.5, 13, 14.2).
 *
 * One function, enumerate(), walks the model's tensors in the stable order; it runs twice:
 * a counting pass (tensors, name bytes, arena size) and a filling pass that writes the
 * inventory and, when an arena is given, binds the named fields of arl_model_params. */
#include "policy/params.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/assert.h"
#include "core/rng.h"
#include "core/sha256.h"

#define ALIGN_FLOATS 16 /* 64-byte tensor starts */

static const char *const comp_names[ARL_COMP_COUNT_] = {"embedding",
                                                        "kda",
                                                        "mla",
                                                        "dense_ffn",
                                                        "routed_experts",
                                                        "shared_experts",
                                                        "latent_projections",
                                                        "router",
                                                        "norms_attnres",
                                                        "lm_head",
                                                        "vision_tower",
                                                        "projector"};

const char *arl_param_component_name(arl_param_component c) {
    if ((int)c < 0 || c >= ARL_COMP_COUNT_) return "?";
    return comp_names[c];
}

/* ------------------------------------------------------------------------------------ */
/* enumeration                                                                           */

enum { TF_F32 = 1, TF_NOGRAD = 2, TF_CONTIG = 4, TF_A_LOG = 8 };

typedef struct tb {
    int fill;                 /* 0: counting pass; 1: filling pass */
    arl_param_inventory *inv; /* filled in pass 1 */
    int64_t n;                /* tensors so far */
    int64_t names_len;        /* name bytes so far (with NULs) */
    int64_t off;              /* next free float */
    int64_t total;            /* sum of numel */
    int64_t a_log_padded;
    float *arena; /* NULL: bind nothing */
    uint8_t comp;
    int32_t layer, expert;
} tb;

static float *tb_add(tb *b, uint8_t init, unsigned flags, int rank, const int64_t *shape,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static float *tb_add(tb *b, uint8_t init, unsigned flags, int rank, const int64_t *shape,
                     const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    ARL_ASSERT(len > 0 && len < (int)sizeof name && rank >= 1 && rank <= ARL_PARAM_MAX_RANK);
    int64_t numel = 1;
    for (int i = 0; i < rank; i++)
        numel *= shape[i];
    if (!(flags & TF_CONTIG)) b->off = (b->off + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS;
    int64_t off = b->off;
    if (b->fill) {
        arl_param_tensor *t = &b->inv->t[b->n];
        memset(t, 0, sizeof *t);
        char *dst = b->inv->names + b->names_len;
        memcpy(dst, name, (size_t)len + 1);
        t->name = dst;
        t->offset = off;
        t->numel = numel;
        t->rank = rank;
        for (int i = 0; i < rank; i++)
            t->shape[i] = shape[i];
        t->stored_numel = (flags & TF_A_LOG) ? b->a_log_padded : numel;
        t->layer = b->layer;
        t->expert = b->expert;
        t->component = b->comp;
        t->init = init;
        t->fp32_storage = (flags & TF_F32) ? 1 : 0;
        t->no_grad = (flags & TF_NOGRAD) ? 1 : 0;
        t->is_a_log = (flags & TF_A_LOG) ? 1 : 0;
    }
    b->n++;
    b->names_len += len + 1;
    b->off += numel;
    b->total += numel;
    return b->fill && b->arena ? b->arena + off : NULL;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NARGS_(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
/* ADD(init, flags, (shape...), "fmt", args) */
#define ADD(init, flags, shp, ...) tb_add(b, init, flags, NARGS_ shp, SHAPE shp, __VA_ARGS__)

static void enumerate(const arl_model_config *cfg, tb *b, arl_model_params *p) {
    const arl_model_dims *D = &cfg->dims;
    const int64_t d = D->d, V = D->V, P = D->P, dk = D->dk, H = D->H, W = D->W;
    const int has_res = D->B > 0;
    arl_layer_params dummy;
    b->layer = -1;
    b->expert = -1;

    b->comp = ARL_COMP_EMBED;
    float *embed = ADD(ARL_INIT_NORMAL, 0, (V, d), "language_model.model.embed_tokens.weight");
    if (p) p->embed_tokens = embed;

    for (int64_t l = 0; l < D->L; l++) {
        char pre[80];
        snprintf(pre, sizeof pre, "language_model.model.layers.%lld.", (long long)l);
        arl_layer_params *lp = p && p->layers ? &p->layers[l] : &dummy;
        memset(lp, 0, sizeof *lp);
        lp->kind = (int32_t)arl_model_config_layer_kind(cfg, l);
        lp->is_moe = arl_model_config_layer_is_moe(cfg, l);
        b->layer = (int32_t)l;

        b->comp = ARL_COMP_NORMS;
        lp->input_norm = ADD(ARL_INIT_ONES, 0, (d), "%sinput_layernorm.weight", pre);
        lp->post_norm = ADD(ARL_INIT_ONES, 0, (d), "%spost_attention_layernorm.weight", pre);
        if (has_res) {
            lp->attn_res_norm = ADD(ARL_INIT_ONES, 0, (d), "%sself_attention_res_norm.weight", pre);
            lp->attn_res_proj =
                ADD(ARL_INIT_ZEROS, 0, (1, d), "%sself_attention_res_proj.weight", pre);
            lp->mlp_res_norm = ADD(ARL_INIT_ONES, 0, (d), "%smlp_res_norm.weight", pre);
            lp->mlp_res_proj = ADD(ARL_INIT_ZEROS, 0, (1, d), "%smlp_res_proj.weight", pre);
        }

        if (lp->kind == ARL_LAYER_KDA) {
            arl_kda_params *k = &lp->kda;
            b->comp = ARL_COMP_KDA;
            k->q_proj = ADD(ARL_INIT_NORMAL, 0, (P, d), "%sself_attn.q_proj.weight", pre);
            k->k_proj = ADD(ARL_INIT_NORMAL, 0, (P, d), "%sself_attn.k_proj.weight", pre);
            k->v_proj = ADD(ARL_INIT_NORMAL, 0, (P, d), "%sself_attn.v_proj.weight", pre);
            k->q_conv = ADD(ARL_INIT_CONV, TF_F32, (P, 1, W), "%sself_attn.q_conv1d.weight", pre);
            k->k_conv = ADD(ARL_INIT_CONV, TF_F32, (P, 1, W), "%sself_attn.k_conv1d.weight", pre);
            k->v_conv = ADD(ARL_INIT_CONV, TF_F32, (P, 1, W), "%sself_attn.v_conv1d.weight", pre);
            k->f_a = ADD(ARL_INIT_NORMAL, 0, (dk, d), "%sself_attn.f_a_proj.weight", pre);
            k->f_b = ADD(ARL_INIT_NORMAL, 0, (P, dk), "%sself_attn.f_b_proj.weight", pre);
            k->dt_bias = ADD(ARL_INIT_DT_BIAS, TF_F32, (P), "%sself_attn.dt_bias", pre);
            k->A_log = ADD(ARL_INIT_A_LOG, TF_F32 | TF_A_LOG, (H), "%sself_attn.A_log", pre);
            k->b_proj = ADD(ARL_INIT_NORMAL, 0, (H, d), "%sself_attn.b_proj.weight", pre);
            if (cfg->text.linear_attn_config.use_full_rank_gate) {
                k->g_proj = ADD(ARL_INIT_NORMAL, 0, (P, d), "%sself_attn.g_proj.weight", pre);
            } else {
                k->g_a = ADD(ARL_INIT_NORMAL, 0, (dk, d), "%sself_attn.g_a_proj.weight", pre);
                k->g_b = ADD(ARL_INIT_NORMAL, 0, (P, dk), "%sself_attn.g_b_proj.weight", pre);
            }
            k->o_norm = ADD(ARL_INIT_ONES, TF_F32, (D->dv), "%sself_attn.o_norm.weight", pre);
            k->o_proj = ADD(ARL_INIT_NORMAL, 0, (d, P), "%sself_attn.o_proj.weight", pre);
        } else {
            arl_mla_params *m = &lp->mla;
            const int64_t qw = D->Hm * (D->n + D->r);
            b->comp = ARL_COMP_MLA;
            if (D->rq > 0) {
                m->q_a = ADD(ARL_INIT_NORMAL, 0, (D->rq, d), "%sself_attn.q_a_proj.weight", pre);
                m->q_a_norm =
                    ADD(ARL_INIT_ONES, 0, (D->rq), "%sself_attn.q_a_layernorm.weight", pre);
                m->q_b = ADD(ARL_INIT_NORMAL, 0, (qw, D->rq), "%sself_attn.q_b_proj.weight", pre);
            } else {
                m->q_proj = ADD(ARL_INIT_NORMAL, 0, (qw, d), "%sself_attn.q_proj.weight", pre);
            }
            m->kv_a = ADD(ARL_INIT_NORMAL, 0, (D->rkv + D->r, d),
                          "%sself_attn.kv_a_proj_with_mqa.weight", pre);
            m->kv_a_norm =
                ADD(ARL_INIT_ONES, 0, (D->rkv), "%sself_attn.kv_a_layernorm.weight", pre);
            m->kv_b = ADD(ARL_INIT_NORMAL, 0, (D->Hm * (D->n + D->vm), D->rkv),
                          "%sself_attn.kv_b_proj.weight", pre);
            if (cfg->text.mla_use_output_gate)
                m->g_proj =
                    ADD(ARL_INIT_NORMAL, 0, (D->Hm * D->vm, d), "%sself_attn.g_proj.weight", pre);
            m->o_proj =
                ADD(ARL_INIT_NORMAL, 0, (d, D->Hm * D->vm), "%sself_attn.o_proj.weight", pre);
        }

        if (!lp->is_moe) {
            b->comp = ARL_COMP_DENSE_FFN;
            lp->dense.gate_proj =
                ADD(ARL_INIT_NORMAL, 0, (D->fd, d), "%smlp.gate_proj.weight", pre);
            lp->dense.up_proj = ADD(ARL_INIT_NORMAL, 0, (D->fd, d), "%smlp.up_proj.weight", pre);
            lp->dense.down_proj =
                ADD(ARL_INIT_NORMAL, 0, (d, D->fd), "%smlp.down_proj.weight", pre);
        } else {
            arl_moe_params *m = &lp->moe;
            const int64_t E = D->E, f = D->f, dz = D->dz;
            b->comp = ARL_COMP_ROUTER;
            m->gate = ADD(ARL_INIT_NORMAL, 0, (E, d), "%sblock_sparse_moe.gate.weight", pre);
            m->gate_bias = ADD(ARL_INIT_ZEROS, TF_F32 | TF_NOGRAD, (E),
                               "%sblock_sparse_moe.gate.e_score_correction_bias", pre);
            b->comp = ARL_COMP_LATENT;
            m->down_proj = ADD(ARL_INIT_NORMAL, 0, (dz, d),
                               "%sblock_sparse_moe.routed_expert_down_proj.weight", pre);
            if (cfg->text.latent_moe_use_norm)
                m->latent_norm = ADD(ARL_INIT_ONES, 0, (dz),
                                     "%sblock_sparse_moe.routed_expert_norm.weight", pre);
            m->up_proj = ADD(ARL_INIT_NORMAL, 0, (d, dz),
                             "%sblock_sparse_moe.routed_expert_up_proj.weight", pre);
            if (D->ns > 0) {
                b->comp = ARL_COMP_SHARED_EXPERTS;
                m->shared_gate_proj =
                    ADD(ARL_INIT_NORMAL, 0, (D->fs, d),
                        "%sblock_sparse_moe.shared_experts.gate_proj.weight", pre);
                m->shared_up_proj = ADD(ARL_INIT_NORMAL, 0, (D->fs, d),
                                        "%sblock_sparse_moe.shared_experts.up_proj.weight", pre);
                m->shared_down_proj =
                    ADD(ARL_INIT_NORMAL, 0, (d, D->fs),
                        "%sblock_sparse_moe.shared_experts.down_proj.weight", pre);
            }
            b->comp = ARL_COMP_ROUTED_EXPERTS;
            static const char *const wn[3] = {"w1", "w3", "w2"};
            for (int w = 0; w < 3; w++) {
                for (int64_t e = 0; e < E; e++) {
                    b->expert = (int32_t)e;
                    float *x = w < 2 ? ADD(ARL_INIT_NORMAL, e ? TF_CONTIG : 0, (f, dz),
                                           "%sblock_sparse_moe.experts.%lld.%s.weight", pre,
                                           (long long)e, wn[w])
                                     : ADD(ARL_INIT_NORMAL, e ? TF_CONTIG : 0, (dz, f),
                                           "%sblock_sparse_moe.experts.%lld.%s.weight", pre,
                                           (long long)e, wn[w]);
                    if (e == 0) *(w == 0 ? &m->w1 : w == 1 ? &m->w3 : &m->w2) = x;
                }
                b->expert = -1;
            }
        }
    }
    b->layer = -1;

    b->comp = ARL_COMP_NORMS;
    float *norm = ADD(ARL_INIT_ONES, 0, (d), "language_model.model.norm.weight");
    float *orn = NULL, *orp = NULL;
    if (has_res) {
        orn = ADD(ARL_INIT_ONES, 0, (d), "language_model.model.output_attn_res_norm.weight");
        orp = ADD(ARL_INIT_ZEROS, 0, (1, d), "language_model.model.output_attn_res_proj.weight");
    }
    b->comp = ARL_COMP_LM_HEAD;
    float *head = ADD(ARL_INIT_NORMAL, 0, (V, d), "language_model.lm_head.weight");
    if (p) {
        p->norm = norm;
        p->out_res_norm = orn;
        p->out_res_proj = orp;
        p->lm_head = head;
    }

    if (cfg->has_vision) {
        arl_vision_params vdummy = {0};
        arl_vision_params *vp = p ? &p->vision : &vdummy;
        arl_vit_block_params *blocks = vp->blocks; /* kept across the memset */
        memset(vp, 0, sizeof *vp);
        vp->blocks = blocks;
        const int64_t vD = D->vD, vQ = D->vQ, vF = D->vF, vpz = D->vp;
        b->comp = ARL_COMP_VISION;
        vp->patch_embed =
            ADD(ARL_INIT_NORMAL, 0, (vD, 3, vpz, vpz), "vision_tower.patch_embed.proj.weight");
        vp->pos_emb = ADD(ARL_INIT_NORMAL, 0, (D->vGh, D->vGw, vD),
                          "vision_tower.patch_embed.pos_emb.weight");
        for (int64_t i = 0; i < D->vL; i++) {
            arl_vit_block_params bd;
            arl_vit_block_params *bp = p && vp->blocks ? &vp->blocks[i] : &bd;
            const char *pfx = "vision_tower.encoder.blocks.";
            long long ii = (long long)i;
            b->layer = (int32_t)i;
            bp->norm0 = ADD(ARL_INIT_ONES, 0, (vD), "%s%lld.norm0.weight", pfx, ii);
            bp->norm1 = ADD(ARL_INIT_ONES, 0, (vD), "%s%lld.norm1.weight", pfx, ii);
            bp->wqkv = ADD(ARL_INIT_NORMAL, 0, (3 * vQ, vD), "%s%lld.wqkv.weight", pfx, ii);
            bp->wo = ADD(ARL_INIT_NORMAL, 0, (vD, vQ), "%s%lld.wo.weight", pfx, ii);
            bp->fc0 = ADD(ARL_INIT_NORMAL, 0, (vF, vD), "%s%lld.mlp.fc0.weight", pfx, ii);
            bp->fc1 = ADD(ARL_INIT_NORMAL, 0, (vD, vF), "%s%lld.mlp.fc1.weight", pfx, ii);
        }
        b->layer = -1;
        vp->final_norm = ADD(ARL_INIT_ONES, 0, (vD), "vision_tower.encoder.final_layernorm.weight");
        b->comp = ARL_COMP_PROJECTOR;
        vp->proj0 = ADD(ARL_INIT_NORMAL, 0, (4 * vD, 4 * vD), "mm_projector.proj.0.weight");
        vp->proj2 = ADD(ARL_INIT_NORMAL, 0, (d, 4 * vD), "mm_projector.proj.2.weight");
        vp->post_norm = ADD(ARL_INIT_ONES, 0, (d), "mm_projector.post_norm.weight");
    }
    b->off = (b->off + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS;
}

static int name_cmp(const void *a, const void *b, void *ctx) {
    const arl_param_tensor *t = ctx;
    return strcmp(t[*(const int64_t *)a].name, t[*(const int64_t *)b].name);
}

/* Counting pass + allocation + filling pass.  p (may be NULL) gets its fields bound. */
static arl_status build(const arl_model_config *cfg, arl_param_inventory *inv, arl_model_params *p,
                        int alloc_arena, float *arena) {
    memset(inv, 0, sizeof *inv);
    tb b;
    memset(&b, 0, sizeof b);
    b.a_log_padded = cfg->dims.a_log_padded;
    enumerate(cfg, &b, NULL);
    inv->n = b.n;
    inv->arena_floats = b.off;
    inv->total_numel = b.total;
    inv->t = malloc((size_t)b.n * sizeof *inv->t);
    inv->names = malloc((size_t)b.names_len);
    inv->by_name = malloc((size_t)b.n * sizeof *inv->by_name);
    if (!inv->t || !inv->names || !inv->by_name) {
        arl_param_inventory_free(inv);
        return arl_errorf(ARL_ERR_NOMEM, "parameter inventory: out of memory (%lld tensors)",
                          (long long)b.n);
    }
    if (p) {
        p->layers = calloc((size_t)cfg->dims.L, sizeof *p->layers);
        if (cfg->has_vision && cfg->dims.vL > 0)
            p->vision.blocks = calloc((size_t)cfg->dims.vL, sizeof *p->vision.blocks);
        if (!p->layers || (cfg->has_vision && cfg->dims.vL > 0 && !p->vision.blocks)) {
            arl_param_inventory_free(inv);
            return arl_errorf(ARL_ERR_NOMEM, "parameter tables: out of memory");
        }
        if (alloc_arena) {
            size_t bytes = (size_t)inv->arena_floats * sizeof(float);
            /* refuse sizes beyond the available memory up front (an overcommitted allocation
             * would only fail later, page by page, as an out-of-memory kill) */
            char what[160];
            snprintf(what, sizeof what, "the fp32 parameters of this config (%lld parameters)",
                     (long long)inv->total_numel);
            arl_status s = arl_params_memory_check((uint64_t)bytes, what);
            if (!s && ((uint64_t)inv->arena_floats > (uint64_t)SIZE_MAX / 8 ||
                       !(arena = aligned_alloc(64, (bytes + 63) / 64 * 64))))
                s = arl_errorf(ARL_ERR_NOMEM,
                               "out of memory: cannot allocate the fp32 parameters: %lld floats "
                               "(%.2f GiB) for "
                               "%lld parameters",
                               (long long)inv->arena_floats, (double)bytes / (1024.0 * 1024 * 1024),
                               (long long)inv->total_numel);
            if (s) {
                arl_param_inventory_free(inv);
                free(p->layers);
                free(p->vision.blocks);
                p->layers = NULL;
                p->vision.blocks = NULL;
                return s;
            }
            memset(arena, 0, bytes);
            p->owns_arena = 1;
        }
        p->arena = arena;
    }
    memset(&b, 0, sizeof b);
    b.fill = 1;
    b.inv = inv;
    b.arena = p ? arena : NULL;
    b.a_log_padded = cfg->dims.a_log_padded;
    enumerate(cfg, &b, p);
    ARL_ASSERT(b.n == inv->n && b.off == inv->arena_floats);
    for (int64_t i = 0; i < inv->n; i++)
        inv->by_name[i] = i;
    qsort_r(inv->by_name, (size_t)inv->n, sizeof *inv->by_name, name_cmp, inv->t);
    return ARL_OK;
}

arl_status arl_param_inventory_build(const arl_model_config *cfg, arl_param_inventory *inv) {
    return build(cfg, inv, NULL, 0, NULL);
}

void arl_param_inventory_free(arl_param_inventory *inv) {
    if (!inv) return;
    free(inv->t);
    free(inv->names);
    free(inv->by_name);
    memset(inv, 0, sizeof *inv);
}

int64_t arl_param_inventory_find(const arl_param_inventory *inv, const char *name) {
    int64_t lo = 0, hi = inv->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(inv->t[inv->by_name[mid]].name, name);
        if (c == 0) return inv->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* ------------------------------------------------------------------------------------ */
/* memory check                                                                          */

static _Atomic int64_t g_mem_override = -1;

void arl_params_memory_override(int64_t avail_bytes) {
    atomic_store(&g_mem_override, avail_bytes);
}

static double mem_physical(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (double)pages * (double)psz : 0;
}

/* MemAvailable of /proc/meminfo in bytes, or -1 */
static double mem_available(void) {
    const int64_t o = atomic_load(&g_mem_override);
    if (o >= 0) return (double)o;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    double avail = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            avail = (double)kb * 1024.0;
            break;
        }
    }
    fclose(f);
    return avail;
}

arl_status arl_params_memory_check(uint64_t bytes, const char *what) {
    const double gib = 1024.0 * 1024 * 1024, phys = mem_physical(), avail = mem_available();
    if (phys > 0 && (double)bytes > phys)
        return arl_errorf(ARL_ERR_NOMEM,
                          "%s need %.2f GiB, more than this machine's %.2f GiB of memory", what,
                          (double)bytes / gib, phys / gib);
    if (avail >= 0 && (double)bytes > avail)
        return arl_errorf(ARL_ERR_NOMEM,
                          "%s need %.2f GiB, more than the %.2f GiB of memory available now "
                          "(MemAvailable in /proc/meminfo; this machine has %.2f GiB): what this "
                          "process holds already (weights, gradients, optimizer moments) and "
                          "other processes use the rest; use a smaller model config or a "
                          "machine with more memory",
                          what, (double)bytes / gib, avail / gib, phys / gib);
    return ARL_OK;
}

arl_status arl_params_memory_check_copies(const arl_model_config *cfg, int copies,
                                          const char *what) {
    arl_param_inventory inv;
    ARL_TRY(arl_param_inventory_build(cfg, &inv));
    const uint64_t bytes = (uint64_t)inv.arena_floats * sizeof(float) * (uint64_t)copies;
    char w[300];
    snprintf(w, sizeof w, "%s (%d x %lld parameters in fp32)", what, copies,
             (long long)inv.total_numel);
    arl_param_inventory_free(&inv);
    return arl_params_memory_check(bytes, w);
}

/* ------------------------------------------------------------------------------------ */
/* parameter sets                                                                        */

arl_status arl_model_params_alloc(arl_model_params *p, const arl_model_config *cfg) {
    memset(p, 0, sizeof *p);
    p->cfg = cfg;
    p->has_vision = cfg->has_vision;
    arl_status s = build(cfg, &p->inv, p, 1, NULL);
    if (s) arl_model_params_free(p);
    return s;
}

arl_status arl_model_params_view(arl_model_params *p, const arl_model_config *cfg, float *arena) {
    memset(p, 0, sizeof *p);
    p->cfg = cfg;
    p->has_vision = cfg->has_vision;
    arl_status s = build(cfg, &p->inv, p, 0, arena);
    if (s) arl_model_params_free(p);
    return s;
}

void arl_model_params_sha256_hex(const arl_model_params *p, char hex[65]) {
    uint8_t dg[ARL_SHA256_BYTES];
    arl_sha256(p->arena, sizeof(float) * (size_t)p->inv.arena_floats, dg);
    arl_sha256_hex(dg, hex);
}

void arl_model_params_free(arl_model_params *p) {
    if (!p) return;
    if (p->owns_arena) free(p->arena);
    free(p->layers);
    free(p->vision.blocks);
    arl_param_inventory_free(&p->inv);
    memset(p, 0, sizeof *p);
}

float *arl_model_params_tensor(const arl_model_params *p, int64_t i) {
    ARL_ASSERT(i >= 0 && i < p->inv.n);
    return p->arena ? p->arena + p->inv.t[i].offset : NULL;
}

float *arl_model_params_find(const arl_model_params *p, const char *name) {
    int64_t i = arl_param_inventory_find(&p->inv, name);
    return i < 0 ? NULL : arl_model_params_tensor(p, i);
}

/* ------------------------------------------------------------------------------------ */
/* counts (section 13.1, closed form)                                                    */

/* Products and sums of sizes that stop at INT64_MAX instead of overflowing: the config's
 * validation rejects a model whose counts reach ARL_MODEL_MAX_PARAMS, so every count of a
 * valid config is exact, and an invalid one's can be computed without undefined behaviour. */
static int64_t mul(int64_t a, int64_t b) {
    int64_t r;
    return a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t sum_n(const int64_t *v, size_t n) {
    int64_t s = 0;
    for (size_t i = 0; i < n; i++)
        if (v[i] < 0 || __builtin_add_overflow(s, v[i], &s)) return INT64_MAX;
    return s;
}

#define SUM(...)                                                                                   \
    sum_n((const int64_t[]){__VA_ARGS__}, sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
#define MUL3(a, b, c) mul(mul(a, b), c)

void arl_param_counts_compute(const arl_model_config *cfg, arl_param_counts *c) {
    const arl_model_dims *D = &cfg->dims;
    const int64_t d = D->d, P = D->P, dk = D->dk, H = D->H, W = D->W;
    memset(c, 0, sizeof *c);
    /* KDA: 3dP + 3PW + d*dk + dk*P + P + H + dH + dP + dk + Pd */
    int64_t kda = SUM(MUL3(3, d, P), MUL3(3, P, W), mul(d, dk), mul(dk, P), P, H, mul(d, H), D->dv,
                      mul(P, d));
    kda = SUM(kda, cfg->text.linear_attn_config.use_full_rank_gate ? mul(d, P)
                                                                   : SUM(mul(d, dk), mul(dk, P)));
    /* MLA: d*rq + rq + rq*Hm(n+r) + d(rkv+r) + rkv + rkv*Hm(n+vm) + d*Hm*vm + Hm*vm*d */
    int64_t qw = mul(D->Hm, SUM(D->n, D->r));
    int64_t mla = D->rq > 0 ? SUM(mul(d, D->rq), D->rq, mul(D->rq, qw)) : mul(d, qw);
    mla = SUM(mla, mul(d, SUM(D->rkv, D->r)), D->rkv, MUL3(D->rkv, D->Hm, SUM(D->n, D->vm)),
              MUL3(D->Hm, D->vm, d));
    if (cfg->text.mla_use_output_gate) mla = SUM(mla, MUL3(d, D->Hm, D->vm));
    int64_t expert = MUL3(3, D->dz, D->f);
    int64_t router = SUM(mul(d, D->E), D->E);
    int64_t shared = MUL3(3, d, D->fs);
    int64_t latent = SUM(MUL3(2, d, D->dz), cfg->text.latent_moe_use_norm ? D->dz : 0);
    int64_t dense = MUL3(3, d, D->fd);
    int64_t per_layer_norms = mul(D->B > 0 ? 6 : 2, d);
    int64_t model_norms = mul(D->B > 0 ? 3 : 1, d);

    c->kda_layer = kda;
    c->mla_layer = mla;
    c->expert = expert;
    c->moe_fixed = SUM(router, shared, latent);
    c->dense_layer = dense;
    c->component[ARL_COMP_EMBED] = mul(D->V, d);
    c->component[ARL_COMP_KDA] = mul(D->n_kda, kda);
    c->component[ARL_COMP_MLA] = mul(D->n_mla, mla);
    c->component[ARL_COMP_DENSE_FFN] = mul(D->n_dense, dense);
    c->component[ARL_COMP_ROUTED_EXPERTS] = MUL3(D->n_moe, D->E, expert);
    c->component[ARL_COMP_SHARED_EXPERTS] = mul(D->n_moe, shared);
    c->component[ARL_COMP_LATENT] = mul(D->n_moe, latent);
    c->component[ARL_COMP_ROUTER] = mul(D->n_moe, router);
    c->component[ARL_COMP_NORMS] = SUM(mul(D->L, per_layer_norms), model_norms);
    c->component[ARL_COMP_LM_HEAD] = mul(D->V, d);
    if (cfg->has_vision) {
        const int64_t vD = D->vD, vQ = D->vQ, vF = D->vF, p = D->vp;
        int64_t block = SUM(MUL3(3, vQ, vD), mul(vD, vQ), MUL3(2, vD, vF), mul(2, vD));
        c->component[ARL_COMP_VISION] =
            SUM(MUL3(3, mul(p, p), vD), MUL3(D->vGh, D->vGw, vD), mul(D->vL, block), vD);
        c->component[ARL_COMP_PROJECTOR] = SUM(MUL3(16, vD, vD), MUL3(d, 4, vD), d);
    }
    for (int i = 0; i < ARL_COMP_COUNT_; i++)
        if (i != ARL_COMP_VISION && i != ARL_COMP_PROJECTOR)
            c->text_total = SUM(c->text_total, c->component[i]);
    c->vision_tower = c->component[ARL_COMP_VISION];
    c->projector = c->component[ARL_COMP_PROJECTOR];
    c->total_params = SUM(c->text_total, c->vision_tower, c->projector);
    /* the subtracted terms are parts of text_total, so the difference is exact when it is */
    c->active_params = c->text_total == INT64_MAX
                           ? INT64_MAX
                           : c->text_total - MUL3(D->E - D->k, expert, D->n_moe) - mul(D->V, d);
}

void arl_model_memory_compute(const arl_model_config *cfg, arl_model_memory *m) {
    const arl_model_dims *D = &cfg->dims;
    arl_param_counts c;
    arl_param_counts_compute(cfg, &c);
    memset(m, 0, sizeof *m);
    /* fp32-class values (section 1.4) as stored: convs, dt_bias, A_log (padded), o_norm per
     * KDA layer; e_score_correction_bias per MoE layer */
    int64_t f32_counted =
        SUM(mul(D->n_kda, SUM(MUL3(3, D->P, D->W), D->P, D->H, D->dv)), mul(D->n_moe, D->E));
    int64_t a_log_pad = mul(D->n_kda, D->a_log_padded - D->H);
    int64_t f32_stored = SUM(f32_counted, a_log_pad);
    /* f32_counted is a part of total_params: the difference is exact when total_params is */
    m->weights_bf16_bytes = c.total_params == INT64_MAX
                                ? INT64_MAX
                                : SUM(mul(2, c.total_params - f32_counted), mul(4, f32_stored));
    m->weights_fp32_bytes = mul(4, SUM(c.total_params, a_log_pad));
    m->train_fp32_adam_bytes = mul(16, c.total_params);
    m->kda_state_bytes = mul(MUL3(D->n_kda, D->H, D->dk), mul(D->dv, 4));
    m->kda_conv_bytes = mul(MUL3(D->n_kda, 3, D->P), mul(D->W - 1, 4));
    m->mla_values_per_token = mul(D->n_mla, SUM(D->rkv, D->r));
    m->mla_bytes_per_token_bf16 = mul(2, m->mla_values_per_token);
    m->mla_bytes_per_token_fp32 = mul(4, m->mla_values_per_token);
    m->mla_bytes_1m_bf16 = mul(m->mla_bytes_per_token_bf16, ARL_LONG_CONTEXT_TOKENS);
    m->mla_bytes_1m_fp32 = mul(m->mla_bytes_per_token_fp32, ARL_LONG_CONTEXT_TOKENS);
}

/* ------------------------------------------------------------------------------------ */
/* initialisation (section 12.5)                                                         */

static uint64_t fnv1a64(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

void arl_params_init_tensor(const arl_param_tensor *t, const arl_model_config *cfg, uint64_t seed,
                            float *dst) {
    arl_rng r;
    arl_rng_seed_stream(&r, seed, fnv1a64(t->name));
    const int64_t n = t->numel;
    switch ((arl_param_init)t->init) {
    case ARL_INIT_NORMAL: {
        const double std = cfg->text.initializer_range;
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)(std * arl_rng_normal(&r));
        break;
    }
    case ARL_INIT_ONES:
        for (int64_t i = 0; i < n; i++)
            dst[i] = 1.0f;
        break;
    case ARL_INIT_ZEROS:
        memset(dst, 0, (size_t)n * sizeof *dst);
        break;
    case ARL_INIT_CONV: {
        const double a = 1.0 / sqrt((double)cfg->dims.W);
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)(a * (2.0 * arl_rng_uniform(&r) - 1.0));
        break;
    }
    case ARL_INIT_A_LOG:
        if (arl_model_config_has_gate_lower_bound(cfg))
            memset(dst, 0, (size_t)n * sizeof *dst);
        else
            for (int64_t i = 0; i < n; i++)
                dst[i] = (float)log(1.0 + 15.0 * arl_rng_uniform(&r));
        break;
    case ARL_INIT_DT_BIAS: {
        const double lo = log(1e-3), hi = log(1e-1);
        for (int64_t i = 0; i < n; i++) {
            double tau = exp(lo + (hi - lo) * arl_rng_uniform(&r));
            if (tau < 1e-4) tau = 1e-4;
            dst[i] = (float)(tau + log(-expm1(-tau))); /* softplus^-1(tau) */
        }
        break;
    }
    }
}

typedef struct init_job {
    arl_model_params *p;
    const arl_model_config *cfg;
    uint64_t seed;
    atomic_llong next;
} init_job;

static void *init_worker(void *arg) {
    init_job *j = arg;
    for (;;) {
        long long i = atomic_fetch_add(&j->next, 1);
        if (i >= j->p->inv.n) break;
        const arl_param_tensor *t = &j->p->inv.t[i];
        arl_params_init_tensor(t, j->cfg, j->seed, j->p->arena + t->offset);
    }
    return NULL;
}

arl_status arl_params_init(arl_model_params *p, const arl_model_config *cfg, uint64_t seed,
                           int threads) {
    if (!p->arena) return arl_errorf(ARL_ERR_STATE, "arl_params_init: parameters have no arena");
    if (threads <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        threads = nc > 0 ? (int)nc : 1;
    }
    if (threads > 16) threads = 16;
    if (threads > p->inv.n) threads = (int)(p->inv.n > 0 ? p->inv.n : 1);
    init_job j = {p, cfg, seed, 0};
    atomic_init(&j.next, 0);
    pthread_t tid[16];
    int started = 0;
    for (int i = 1; i < threads; i++) {
        if (pthread_create(&tid[started], NULL, init_worker, &j) != 0) break;
        started++;
    }
    init_worker(&j);
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    return ARL_OK;
}
