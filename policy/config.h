/* policy/config.h: the model configuration (spec/policy.md section 12): reading and
 * validating a Hugging Face config.json with Kimi K3 field names and nesting, writing it
 * back, the config hash, and the derived sizes every other part of policy/ uses.
 *
 * What this is: the typed form of config.json (top level, text_config with its
 * linear_attn_config, optional vision_config), the validation rules of section 12.2, and
 * helpers for the layer schedule (KDA/MLA, dense/MoE).  What this is not: trainer settings
 * (chunk length, QB bins, context stage) -- those live in the experiment configuration;
 * parameter counts and the tensor inventory -- policy/params.h.
 *
 * Reading: every field of section 12.1 is read.  Fields the model needs are required
 * (a missing or invalid one is ARL_ERR_CONFIG with a message naming the file, the JSON path
 * of the field, e.g. 'text_config.linear_attn_config.num_heads', what was expected and
 * what was found).  Fields that are K3 additions to Kimi Linear default to the Kimi Linear
 * meaning when absent (gate_lower_bound, attn_res_block_size: null; use_full_rank_gate,
 * mla_use_output_gate, latent_moe_use_norm: false); informational ones default to K3's
 * values.  Fields the toolkit does not use are ignored, listed in ONE warning line, and
 * kept (in `json`) so that writing the config back preserves them -- except the fields
 * "not to be written" of section 12.1 (head_dim, rope_theta, rope_scaling,
 * n_routed_experts, num_experts_per_tok, n_shared_experts, scoring_func), which are dropped.
 *
 * Symbols (spec section 1.1): d hidden width, L layers, V vocabulary, H KDA heads,
 * dk = dv KDA head dim, P = H*dk, W conv taps, Hm MLA heads, rq/rkv latent ranks,
 * n/r/vm MLA head dims, E experts, k top-k, f expert width, dz latent width,
 * fs = ns*f shared width, fd dense width, B AttnRes block size.
 */
#ifndef ARL_POLICY_CONFIG_H
#define ARL_POLICY_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "core/sha256.h"
#include "core/status.h"

#define ARL_CONFIG_STR 64     /* capacity of string fields, including the NUL */
#define ARL_CONFIG_MAX_ARCH 4 /* entries of "architectures" kept */
/* The most parameters a valid config may have (2^50, about 400 times Kimi K3): below it every
 * count and byte size of policy/params.h is an exact int64. */
#define ARL_MODEL_MAX_PARAMS (1LL << 50)
/* Optional top-level integer field that is absent from the file (not written back). */
#define ARL_CONFIG_ABSENT INT64_MIN

/* An owned list of integers (JSON array).  v: (n), freed by arl_model_config_free. */
typedef struct arl_config_ints {
    int64_t *v;
    int64_t n;
} arl_config_ints;

typedef struct arl_config_strs {
    char v[ARL_CONFIG_MAX_ARCH][ARL_CONFIG_STR];
    int32_t n;
} arl_config_strs;

typedef enum arl_layer_kind {
    ARL_LAYER_KDA = 0, /* Kimi Delta Attention mixer */
    ARL_LAYER_MLA = 1, /* gated Multi-head Latent Attention mixer */
} arl_layer_kind;

/* text_config.linear_attn_config */
typedef struct arl_linear_attn_config {
    int64_t head_dim;                 /* dk = dv */
    int64_t num_heads;                /* H */
    int64_t short_conv_kernel_size;   /* W */
    double gate_lower_bound;          /* g_min in [-5, 0); NAN = null (softplus gate) */
    int32_t use_full_rank_gate;       /* 1: g_proj (P, d); 0: g_a_proj/g_b_proj low rank */
    arl_config_ints full_attn_layers; /* 1-based MLA layers */
    arl_config_ints kda_layers;       /* 1-based KDA layers */
} arl_linear_attn_config;

/* text_config (field names as in config.json) */
typedef struct arl_text_config {
    char model_type[ARL_CONFIG_STR];
    arl_config_strs architectures;
    int64_t vocab_size;            /* V */
    int64_t hidden_size;           /* d */
    int64_t num_hidden_layers;     /* L */
    int64_t intermediate_size;     /* fd */
    int64_t first_k_dense_replace; /* layers 0..first_k_dense_replace-1 are dense */
    int64_t moe_layer_freq;        /* must be 1 */
    int64_t num_attention_heads;   /* Hm */
    int64_t num_key_value_heads;   /* must equal Hm */
    int64_t q_lora_rank;           /* rq; 0 = null (direct q_proj) */
    int64_t kv_lora_rank;          /* rkv */
    int64_t qk_nope_head_dim;      /* n */
    int64_t qk_rope_head_dim;      /* r (never rotated: NoPE) */
    int64_t v_head_dim;            /* vm */
    int32_t mla_use_nope;          /* must be 1 */
    int32_t mla_use_output_gate;
    arl_linear_attn_config linear_attn_config;
    int64_t num_experts;               /* E */
    int64_t num_experts_per_token;     /* k */
    int64_t num_shared_experts;        /* ns */
    int64_t moe_intermediate_size;     /* f */
    int64_t routed_expert_hidden_size; /* dz */
    int32_t latent_moe_use_norm;
    char moe_router_activation_func[ARL_CONFIG_STR]; /* "sigmoid" */
    int32_t moe_renormalize;                         /* must be 1 */
    double routed_scaling_factor;                    /* rho */
    int32_t use_grouped_topk;
    int64_t num_expert_group; /* must be 1 */
    int64_t topk_group;       /* must be 1 */
    char topk_method[ARL_CONFIG_STR];
    char hidden_act[ARL_CONFIG_STR];    /* "situ" | "silu" */
    double activation_situ_beta;        /* beta1 */
    double activation_situ_linear_beta; /* beta2 */
    int64_t attn_res_block_size;        /* B; 0 = null (plain pre-norm residual) */
    double rms_norm_eps;
    double initializer_range;
    int64_t max_position_embeddings;
    int32_t tie_word_embeddings;      /* must be 0 */
    int64_t num_nextn_predict_layers; /* must be 0 */
    int64_t bos_token_id, eos_token_id, pad_token_id;
    char dtype[ARL_CONFIG_STR]; /* "bfloat16" | "float32": checkpoint storage */
    int32_t use_cache;
} arl_text_config;

/* vision_config (present iff has_vision) */
typedef struct arl_vision_config {
    int64_t patch_size;          /* p */
    int64_t init_pos_emb_height; /* G_h */
    int64_t init_pos_emb_width;  /* G_w */
    int64_t init_pos_emb_time;
    char pos_emb_type[ARL_CONFIG_STR];
    char pos_emb_interpolation_mode[ARL_CONFIG_STR];
    int64_t vt_hidden_size;       /* D */
    int64_t vt_num_hidden_layers; /* L_v (may be 0) */
    int64_t vt_num_attention_heads;
    int64_t qkv_hidden_size;      /* Q */
    int64_t vt_intermediate_size; /* F */
    char norm_type[ARL_CONFIG_STR];
    char mlp_type[ARL_CONFIG_STR];
    char activation_func[ARL_CONFIG_STR];
    int32_t attn_bias, linear_bias, patch_embed_proj_bias; /* must be 0 */
    arl_config_ints merge_kernel_size;                     /* must be [2, 2] */
    char merge_type[ARL_CONFIG_STR];
    char mm_projector_type[ARL_CONFIG_STR];
    int64_t mm_hidden_size; /* must equal D */
    char projector_hidden_act[ARL_CONFIG_STR];
    double projector_ln_eps;
    int64_t text_hidden_size; /* must equal d */
} arl_vision_config;

/* Sizes derived from a valid config (spec section 1.1 names). */
typedef struct arl_model_dims {
    int64_t d, L, V;
    int64_t H, dk, dv, P, W;              /* KDA */
    int64_t Hm, rq, rkv, n, r, vm;        /* MLA (rq 0 = direct q_proj) */
    int64_t E, k, f, dz, ns, fs, fd;      /* FFN */
    int64_t B;                            /* AttnRes block size, 0 = none */
    int64_t n_kda, n_mla, n_dense, n_moe; /* layer counts */
    int64_t a_log_padded;                 /* ceil(H/128)*128: stored A_log length */
    /* vision (all 0 without vision_config) */
    int64_t vD, vQ, vF, vL, vp, vGh, vGw, vheads;
} arl_model_dims;

typedef struct arl_model_config {
    /* top level; optional ones are ARL_CONFIG_ABSENT / "" / -1 when absent */
    arl_config_strs architectures;
    char model_type[ARL_CONFIG_STR];
    int64_t bos_token_id, eos_token_id, pad_token_id, media_placeholder_token_id;
    char image_placeholder[ARL_CONFIG_STR];
    int64_t ignore_index;
    int32_t tie_word_embeddings; /* -1 absent, else must be 0 */
    char dtype[ARL_CONFIG_STR];

    arl_text_config text;
    int32_t has_vision;
    arl_vision_config vision;

    arl_model_dims dims; /* filled by validation */
    uint8_t *layer_kind; /* (L) arl_layer_kind per 0-based layer; owned */

    char path[1024];      /* file it was read from ("" if built in memory) */
    char *ignored_fields; /* comma-separated JSON paths of ignored fields, or NULL;
                             owned */
    void *json;           /* the parsed document (json_t *), owned; kept so unknown
                             fields survive a write; NULL for a config not read */
} arl_model_config;

/* Parse config.json text.  `where` names the source in messages (copied to cfg->path).
 * On success *cfg is valid (validated, dims filled) and owns its memory (free with
 * arl_model_config_free); ignored fields are listed in one arl_log_warn line unless
 * `quiet`.  On failure *cfg is zeroed (nothing to free). */
arl_status arl_model_config_parse(const char *text, const char *where, int quiet,
                                  arl_model_config *cfg);

/* Read a config: `path` is a config.json file or a directory holding one. */
arl_status arl_model_config_read(const char *path, arl_model_config *cfg);

/* Resolve a config argument of the CLI into the path of a config.json file (into out,
 * cap bytes).  `arg` is a file, a directory holding config.json, or the name of a shipped
 * config ("tiny", "mini", "kimi-k3") looked up as NAME/config.json in $AGENTRL_CONFIG_DIR,
 * ./configs, and configs/ beside or one level above the running executable.
 * ARL_ERR_NOT_FOUND lists the places tried. */
arl_status arl_model_config_resolve(const char *arg, char *out, size_t cap);

/* arl_model_config_resolve + arl_model_config_read. */
arl_status arl_model_config_load(const char *arg, arl_model_config *cfg);

/* Re-run validation after fields were changed in memory (recomputes dims and layer_kind).
 * Errors as for parse.  The struct stays owned as before. */
arl_status arl_model_config_validate(arl_model_config *cfg);

/* Deep copy (lists, json, strings).  dst is overwritten; free with arl_model_config_free. */
arl_status arl_model_config_copy(arl_model_config *dst, const arl_model_config *src);

/* Free owned memory and zero the struct.  NULL is a no-op. */
void arl_model_config_free(arl_model_config *cfg);

/* The config as JSON text (2-space indentation, fields in file order, unknown fields
 * preserved, "not to be written" fields dropped).  Caller frees with free().  NULL on OOM. */
char *arl_model_config_dumps(const arl_model_config *cfg);

/* Write config.json atomically (temp file in the same directory, fsync, rename). */
arl_status arl_model_config_write(const arl_model_config *cfg, const char *path);

/* Config hash (spec section 12.1): SHA-256 of the compact sorted-key JSON of
 * {"text_config": ..., "vision_config": ...} with only the fields of section 12.1 (no
 * "vision_config" key without vision).  Numbers are written as Python's json.dumps does:
 * integers as integers, reals in shortest round-trip form ("1e-05", "4.0"). */
/* ARL_ERR_NOMEM when the JSON cannot be built (out is zeros then). */
arl_status arl_model_config_hash(const arl_model_config *cfg, uint8_t out[ARL_SHA256_BYTES]);
/* The same as 64 lower-case hex digits plus NUL ("" on failure). */
arl_status arl_model_config_hash_hex(const arl_model_config *cfg, char hex[ARL_SHA256_HEX_CHARS]);
/* The canonical JSON text that is hashed.  Caller frees with free().  NULL on OOM. */
char *arl_model_config_canonical_json(const arl_model_config *cfg);

/* Layer schedule (0-based layer l, 0 <= l < L; asserts otherwise). */
arl_layer_kind arl_model_config_layer_kind(const arl_model_config *cfg, int64_t l);
int arl_model_config_layer_is_moe(const arl_model_config *cfg, int64_t l);

/* 1 if the K3 lower-bound gate is used (gate_lower_bound not null). */
int arl_model_config_has_gate_lower_bound(const arl_model_config *cfg);

/* 1 if checkpoints of this config store bf16 (dtype "bfloat16"), 0 for "float32". */
int arl_model_config_stores_bf16(const arl_model_config *cfg);

#endif
