/* policy/params.h: the model's parameters -- the tensor inventory of a config (every
 * checkpoint tensor of spec/policy.md section 14.2, in a stable order), parameter counts by
 * component (section 13.1), memory figures, the in-memory parameter set used by forward,
 * backward, optimizer and the CUDA mirror, and initialisation from scratch (section 12.5).
 *
 * What this is not: file I/O (policy/checkpoint.h reads and writes these tensors as
 * safetensors) or any computation of the model.
 *
 * Memory layout.  An arl_model_params holds ONE fp32 arena sized from the config; every
 * tensor is a contiguous row-major block inside it, at the offset recorded in the
 * inventory.  Tensor starts are 64-byte aligned, except that the routed experts of a MoE
 * layer form three banks -- w1 (E, f, dz), w3 (E, f, dz), w2 (E, dz, f) -- in which expert
 * e's matrix directly follows expert e-1's, so a grouped GEMM can stride over experts.
 * Gradients, optimizer moments and device mirrors use the same layout: bind an
 * arl_model_params view to any arena of arl_param_inventory.arena_floats floats with
 * arl_model_params_view and the named fields point into it.
 *
 * A_log is held in memory as its H values; checkpoints store it zero-padded to
 * ceil(H/128)*128 (section 14.3); counts take it as H values.
 *
 * Symbols as in policy/config.h (d, L, V, H, dk, dv, P, W, Hm, rq, rkv, n, r, vm, E, k, f,
 * dz, fs, fd; vision D, Q, F, Lv, p, Gh, Gw).
 */
#ifndef ARL_POLICY_PARAMS_H
#define ARL_POLICY_PARAMS_H

#include <stdint.h>

#include "core/status.h"
#include "policy/config.h"

/* ---- inventory ---- */

/* Components of the parameter count (section 13.1/13.2). */
typedef enum arl_param_component {
    ARL_COMP_EMBED = 0,          /* embed_tokens */
    ARL_COMP_KDA = 1,            /* KDA mixers (incl. o_norm, A_log, dt_bias, convs) */
    ARL_COMP_MLA = 2,            /* MLA mixers (incl. q_a/kv_a layernorms) */
    ARL_COMP_DENSE_FFN = 3,      /* dense layers' mlp */
    ARL_COMP_ROUTED_EXPERTS = 4, /* experts.{e}.w1/w2/w3 */
    ARL_COMP_SHARED_EXPERTS = 5, /* fused shared experts */
    ARL_COMP_LATENT = 6,         /* routed_expert_down_proj, up_proj, routed_expert_norm */
    ARL_COMP_ROUTER = 7,         /* gate.weight and gate.e_score_correction_bias */
    ARL_COMP_NORMS = 8,   /* layer norms, AttnRes norms/projections, final norm, output AttnRes */
    ARL_COMP_LM_HEAD = 9, /* lm_head */
    ARL_COMP_VISION = 10, /* vision_tower.* */
    ARL_COMP_PROJECTOR = 11, /* mm_projector.* */
    ARL_COMP_COUNT_
} arl_param_component;

/* Stable short name ("embedding", "kda", "mla", "dense_ffn", "routed_experts",
 * "shared_experts", "latent_projections", "router", "norms_attnres", "lm_head",
 * "vision_tower", "projector"); used as JSON keys by `agentrl model info --json`. */
const char *arl_param_component_name(arl_param_component c);

/* Initialisation rule of a tensor (sections 3.10, 4.3, 5.2, 12.5). */
typedef enum arl_param_init {
    ARL_INIT_NORMAL = 0,  /* N(0, initializer_range^2) */
    ARL_INIT_ONES = 1,    /* RMSNorm weights, AttnRes w_norm */
    ARL_INIT_ZEROS = 2,   /* AttnRes w_proj, e_score_correction_bias */
    ARL_INIT_CONV = 3,    /* U(-W^-1/2, W^-1/2) */
    ARL_INIT_A_LOG = 4,   /* 0 with the K3 gate; log U(1, 16) with the softplus gate */
    ARL_INIT_DT_BIAS = 5, /* softplus^-1(tau), tau = max(exp(U(ln 1e-3, ln 1e-1)), 1e-4) */
} arl_param_init;

#define ARL_PARAM_MAX_RANK 4

typedef struct arl_param_tensor {
    const char *name; /* checkpoint key; valid until arl_param_inventory_free */
    int64_t offset;   /* position in the arena, in floats */
    int64_t numel;    /* floats in memory = product of shape */
    int32_t rank;
    int64_t shape[ARL_PARAM_MAX_RANK]; /* (rank) memory shape; the checkpoint shape too,
                                          except A_log: [H] here, stored [stored_numel] */
    int64_t stored_numel;              /* elements in a checkpoint (A_log: ceil(H/128)*128) */
    int32_t layer;                     /* decoder layer (0-based) or vision block; -1 otherwise */
    int32_t expert;                    /* routed expert index, or -1 */
    uint8_t component;                 /* arl_param_component */
    uint8_t init;                      /* arl_param_init */
    uint8_t fp32_storage;              /* 1: always F32 in checkpoints (section 1.4) */
    uint8_t no_grad;  /* 1: not trained by gradient (e_score_correction_bias: set by QB) */
    uint8_t is_a_log; /* 1: the KDA A_log (padded on disk) */
} arl_param_tensor;

typedef struct arl_param_inventory {
    arl_param_tensor *t; /* (n) in stable order; owned */
    int64_t n;
    int64_t arena_floats; /* floats an arena of this layout needs (with alignment gaps) */
    int64_t total_numel;  /* sum of numel = total_params (A_log as H) */
    char *names;          /* string pool behind t[i].name; owned */
    int64_t *by_name;     /* (n) indices sorted by name; owned */
} arl_param_inventory;

/* Enumerate every tensor of cfg (section 14.2) in stable order: embed_tokens; for each layer
 * its norms, AttnRes vectors, mixer, FFN (router, bias, latent down/norm/up, shared experts,
 * then expert banks w1[0..E), w3[0..E), w2[0..E)); model.norm, output AttnRes, lm_head;
 * vision tower; projector.  cfg must be valid; it is not referenced after return. */
arl_status arl_param_inventory_build(const arl_model_config *cfg, arl_param_inventory *inv);
void arl_param_inventory_free(arl_param_inventory *inv); /* NULL is a no-op */
/* Index of the tensor with this checkpoint key, or -1 (binary search). */
int64_t arl_param_inventory_find(const arl_param_inventory *inv, const char *name);

/* ---- counts and memory ---- */

typedef struct arl_param_counts {
    int64_t component[ARL_COMP_COUNT_]; /* by arl_param_component */
    int64_t kda_layer;                  /* one KDA layer's mixer */
    int64_t mla_layer;                  /* one MLA layer's mixer */
    int64_t expert;                     /* one routed expert: GLU(dz, f) = 3*dz*f */
    int64_t moe_fixed;                  /* one MoE layer without its experts */
    int64_t dense_layer;                /* one dense FFN */
    int64_t text_total;                 /* text model */
    int64_t vision_tower;               /* 0 without vision_config */
    int64_t projector;                  /* 0 without vision_config */
    int64_t total_params;               /* text_total + vision_tower + projector */
    int64_t active_params;              /* text_total - (E-k)*expert*n_moe - V*d */
} arl_param_counts;

/* Closed-form counts of section 13.1 (independent of the inventory). */
void arl_param_counts_compute(const arl_model_config *cfg, arl_param_counts *c);

typedef struct arl_model_memory {
    int64_t weights_bf16_bytes;    /* release form: BF16, fp32-class tensors F32, A_log padded */
    int64_t weights_fp32_bytes;    /* every tensor F32 (development checkpoints, master weights) */
    int64_t train_fp32_adam_bytes; /* fp32 weights + gradients + two Adam moments (16 B/param) */
    int64_t kda_state_bytes;       /* per sequence: n_kda * H * dk * dv * 4 (fp32 S) */
    int64_t kda_conv_bytes;        /* per sequence: n_kda * 3 * P * (W-1) * 4 (conv tails) */
    int64_t mla_values_per_token;  /* n_mla * (rkv + r) */
    int64_t mla_bytes_per_token_bf16;
    int64_t mla_bytes_per_token_fp32;
    int64_t mla_bytes_1m_bf16; /* at ARL_LONG_CONTEXT_TOKENS tokens */
    int64_t mla_bytes_1m_fp32;
} arl_model_memory;

#define ARL_LONG_CONTEXT_TOKENS 1048576

void arl_model_memory_compute(const arl_model_config *cfg, arl_model_memory *m);

/* ---- the in-memory parameter set ---- */

/* KDA mixer of one layer (self_attn.*). */
typedef struct arl_kda_params {
    float *q_proj;  /* (P, d) */
    float *k_proj;  /* (P, d) */
    float *v_proj;  /* (P, d) */
    float *q_conv;  /* (P, 1, W) q_conv1d; tap W-1 multiplies the current token */
    float *k_conv;  /* (P, 1, W) */
    float *v_conv;  /* (P, 1, W) */
    float *f_a;     /* (dk, d) f_a_proj */
    float *f_b;     /* (P, dk) f_b_proj */
    float *dt_bias; /* (P) */
    float *A_log;   /* (H) */
    float *b_proj;  /* (H, d) beta */
    float *g_proj;  /* (P, d) full-rank output gate; NULL when use_full_rank_gate = false */
    float *g_a;     /* (dk, d) low-rank gate g_a_proj; NULL with the full-rank gate */
    float *g_b;     /* (P, dk) g_b_proj; NULL with the full-rank gate */
    float *o_norm;  /* (dv) shared by heads */
    float *o_proj;  /* (d, P) */
} arl_kda_params;

/* MLA mixer of one layer (self_attn.*). */
typedef struct arl_mla_params {
    float *q_a;       /* (rq, d) q_a_proj; NULL when q_lora_rank is null */
    float *q_a_norm;  /* (rq) q_a_layernorm; NULL when q_lora_rank is null */
    float *q_b;       /* (Hm*(n+r), rq) q_b_proj; NULL when q_lora_rank is null */
    float *q_proj;    /* (Hm*(n+r), d) only when q_lora_rank is null, else NULL */
    float *kv_a;      /* (rkv + r, d) kv_a_proj_with_mqa */
    float *kv_a_norm; /* (rkv) kv_a_layernorm */
    float *kv_b;      /* (Hm*(n+vm), rkv) kv_b_proj */
    float *g_proj;    /* (Hm*vm, d) output gate; NULL when mla_use_output_gate = false */
    float *o_proj;    /* (d, Hm*vm) */
} arl_mla_params;

/* Dense FFN (mlp.*), layers l < first_k_dense_replace. */
typedef struct arl_dense_params {
    float *gate_proj; /* (fd, d) */
    float *up_proj;   /* (fd, d) */
    float *down_proj; /* (d, fd) */
} arl_dense_params;

/* Stable LatentMoE (block_sparse_moe.*). */
typedef struct arl_moe_params {
    float *gate;             /* (E, d) router gate.weight */
    float *gate_bias;        /* (E) gate.e_score_correction_bias (QB; no gradient) */
    float *down_proj;        /* (dz, d) routed_expert_down_proj */
    float *latent_norm;      /* (dz) routed_expert_norm; NULL when latent_moe_use_norm = false */
    float *up_proj;          /* (d, dz) routed_expert_up_proj */
    float *shared_gate_proj; /* (fs, d); the three shared pointers are NULL when ns = 0 */
    float *shared_up_proj;   /* (fs, d) */
    float *shared_down_proj; /* (d, fs) */
    float *w1;               /* (E, f, dz) expert gate bank: expert e at w1 + e*f*dz */
    float *w3;               /* (E, f, dz) expert up bank */
    float *w2;               /* (E, dz, f) expert down bank: expert e at w2 + e*dz*f */
} arl_moe_params;

/* One decoder layer.  Exactly one of kda/mla and one of dense/moe is set (the other
 * struct's pointers are NULL).  The four AttnRes vectors are NULL when attn_res_block_size
 * is null. */
typedef struct arl_layer_params {
    int32_t kind;         /* arl_layer_kind */
    int32_t is_moe;       /* 1: moe is set; 0: dense is set */
    float *input_norm;    /* (d) input_layernorm */
    float *post_norm;     /* (d) post_attention_layernorm */
    float *attn_res_norm; /* (d) self_attention_res_norm (pre-mixer w_norm) */
    float *attn_res_proj; /* (1, d) self_attention_res_proj (pre-mixer w_proj) */
    float *mlp_res_norm;  /* (d) mlp_res_norm (pre-FFN w_norm) */
    float *mlp_res_proj;  /* (1, d) mlp_res_proj (pre-FFN w_proj) */
    arl_kda_params kda;
    arl_mla_params mla;
    arl_dense_params dense;
    arl_moe_params moe;
} arl_layer_params;

/* One vision encoder block (vision_tower.encoder.blocks.{i}.*). */
typedef struct arl_vit_block_params {
    float *norm0; /* (D) */
    float *norm1; /* (D) */
    float *wqkv;  /* (3Q, D) rows [q; k; v] */
    float *wo;    /* (D, Q) */
    float *fc0;   /* (F, D) */
    float *fc1;   /* (D, F) */
} arl_vit_block_params;

typedef struct arl_vision_params {
    float *patch_embed;           /* (D, 3, p, p) patch_embed.proj */
    float *pos_emb;               /* (Gh, Gw, D) patch_embed.pos_emb */
    arl_vit_block_params *blocks; /* (Lv), owned by the arl_model_params */
    float *final_norm;            /* (D) encoder.final_layernorm */
    float *proj0;                 /* (4D, 4D) mm_projector.proj.0 */
    float *proj2;                 /* (d, 4D) mm_projector.proj.2 */
    float *post_norm;             /* (d) mm_projector.post_norm */
} arl_vision_params;

typedef struct arl_model_params {
    const arl_model_config *cfg; /* borrowed: must outlive this struct */
    arl_param_inventory inv;     /* owned */
    float *arena;                /* (inv.arena_floats); owned iff owns_arena */
    int32_t owns_arena;
    float *embed_tokens;      /* (V, d) */
    arl_layer_params *layers; /* (L), owned */
    float *norm;              /* (d) model.norm */
    float *out_res_norm;      /* (d) output_attn_res_norm; NULL without AttnRes */
    float *out_res_proj;      /* (1, d) output_attn_res_proj; NULL without AttnRes */
    float *lm_head;           /* (V, d) */
    int32_t has_vision;
    arl_vision_params vision; /* all NULL without vision_config */
} arl_model_params;

/* Allocate a zeroed arena for cfg and bind every field.  ARL_ERR_NOMEM names the size; an
 * arena larger than the memory available now is refused before it is allocated
 * (arl_params_memory_check). */
arl_status arl_model_params_alloc(arl_model_params *p, const arl_model_config *cfg);

/* Whether `bytes` more memory can be committed now: refused (ARL_ERR_NOMEM, naming `what`, the
 * GiB it needs and the GiB available) beyond this machine's physical memory or beyond the memory
 * it has available (MemAvailable of /proc/meminfo; the physical memory where that cannot be
 * read).  The large arenas (parameters, gradients, reference weights, optimizer moments) are
 * checked before they are allocated and written at once: under the kernel's memory overcommit
 * an allocation beyond the available memory succeeds, and the process is killed later, when
 * its pages are first written. */
arl_status arl_params_memory_check(uint64_t bytes, const char *what);
/* arl_params_memory_check of `copies` fp32 parameter arenas of cfg (weights, gradients,
 * moments): a run checks what it will hold before it allocates the first, so that it is not
 * refused only after it has written some of them. */
arl_status arl_params_memory_check_copies(const arl_model_config *cfg, int copies,
                                          const char *what);
/* Tests: take avail_bytes as the available memory (< 0: read /proc/meminfo again). */
void arl_params_memory_override(int64_t avail_bytes);

/* Bind the fields to a caller's arena of at least arena_floats floats (gradients, moments,
 * a host staging copy, a device buffer: view only computes pointers, it never dereferences
 * them) without owning it.  arena may be NULL: then only the inventory (names, shapes,
 * offsets) is built and every tensor field stays NULL. */
arl_status arl_model_params_view(arl_model_params *p, const arl_model_config *cfg, float *arena);

/* Free the inventory, layer tables and (if owned) the arena; zero p.  NULL is a no-op. */
void arl_model_params_free(arl_model_params *p);

/* SHA-256 (hex) of the fp32 arena as it is: the identity of a set of weights (the policy
 * version's weights_sha256 of spec/replay.md 4.2, the pass_uid of tool and learner states). */
void arl_model_params_sha256_hex(const arl_model_params *p, char hex[65]);

/* Pointer to tensor i of the inventory. */
float *arl_model_params_tensor(const arl_model_params *p, int64_t i);
/* Tensor by checkpoint key, or NULL. */
float *arl_model_params_find(const arl_model_params *p, const char *name);

/* Initialise every tensor from scratch (section 12.5) with the given seed.  Each tensor
 * draws from its own stream (arl_rng_seed_stream(seed, FNV-1a of its name)), so the result
 * is bit-identical for a seed whatever the thread count or iteration order.  Uses up to
 * `threads` threads (0 = one per CPU, at most 16). */
arl_status arl_params_init(arl_model_params *p, const arl_model_config *cfg, uint64_t seed,
                           int threads);

/* Initialise one tensor (same values as arl_params_init gives it). */
void arl_params_init_tensor(const arl_param_tensor *t, const arl_model_config *cfg, uint64_t seed,
                            float *dst);

#endif
