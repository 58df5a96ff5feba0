/* policy/vision.h: the image front end of the policy on the CPU, fp32 (spec/policy.md 10.1-10.3)
 * - patches -> patch embedding + position grid -> 0..N encoder blocks -> final norm -> 2x2
 * merge -> projector -> one token of width d per merged patch group - and the placement of
 * those tokens into the embedded token stream in place of the <|media_pad|> placeholders.
 *
 * What this is: the small front ends of 10.3 (and structurally MoonViT-V2 of 10.2 for still
 * images): Conv2d patch embedding as a GEMM over flattened (3, p, p) patches; the learnable
 * (Gh, Gw, D) position grid, bilinearly resized (half-pixel centres, as torch's
 * interpolate(align_corners=False)) to each image's patch grid unless equal; pre-norm blocks
 * x += Wo Attn(RoPE2D(Wqkv RMSNorm(x))), x += fc1 GELU_tanh(fc0 RMSNorm(x)) with
 * bidirectional attention inside each image and 2-D rotary positions (pairs (4i, 4i+1) by
 * column, (4i+2, 4i+3) by row, theta_i = 10000^(-4i/hd)); final RMSNorm; the "sd2_tpool" 2x2
 * merge in the order (2y,2x), (2y,2x+1), (2y+1,2x), (2y+1,2x+1); the "patchmergerv2"
 * projector Linear(4D, 4D) -> GELU(erf) -> Linear(4D, d) -> RMSNorm(projector_ln_eps).
 * Block norms use eps 1e-6 (spec 1.3).  What this is not: image decoding and patchifying
 * (policy/image.h), video (no time embedding), the backward.
 *
 * Symbols: Np patches of all images, D = vt_hidden_size, Q = qkv_hidden_size, hd = Q/heads,
 * F = vt_intermediate_size, p patch size, N = Np/4 output tokens, d text width.
 */
#ifndef ARL_POLICY_VISION_H
#define ARL_POLICY_VISION_H

#include <stdint.h>

#include "core/status.h"
#include "policy/config.h"
#include "policy/image.h"
#include "policy/params.h"

/* Intermediates a test may want; every pointer may be NULL. */
typedef struct arl_vision_trace {
    float *patch_tokens; /* (Np, D) patch embedding + position grid */
    float *tower;        /* (Np, D) after the blocks and the final norm */
    float *merged;       /* (N, 4D) */
} arl_vision_trace;

/* Floats of work buffer for a forward over at most max_patches patches in total. */
int64_t arl_vision_ws_floats(const arl_model_config *cfg, int64_t max_patches);

/* tokens (N, d) from patches (Np, 3, p, p) (normalised pixels, arl_image_patchify) of n_img
 * images with patch grids grids (n_img, 2) = [gh, gw] (each even and >= 2), image after image,
 * patches row-major within an image.  ws: ws_floats >= arl_vision_ws_floats(cfg, Np).
 * Errors: ARL_ERR_UNSUPPORTED when the config has no vision_config ("the model has no vision
 * tower"), ARL_ERR_ARG for a bad grid, ARL_ERR_RANGE when Np exceeds the work buffer. */
/* *Np = the patches of n_img >= 1 images of grids (n_img, 2) patch grids (rows, columns), each
 * side even and >= 2 (the 2x2 merge); ARL_ERR_ARG naming the first bad image otherwise. */
arl_status arl_vision_grids_count(const int32_t *grids, int32_t n_img, int64_t *Np);

/* Heads [h0, h1) of the encoder's bidirectional softmax attention within each image (the
 * forward's, and the backward's recomputation, policy/vision_backward.c): att (Np, Q) from qkv
 * (Np, 3Q) = [q | k | v], hd = Q / heads, 64 queries at a time, each head's scores in scores
 * + h 64 Np. */
void arl_vision_attn_heads(float *att, float *scores, const float *qkv, const int32_t *grids,
                           int32_t n_img, int64_t Q, int64_t hd, int64_t Np, int64_t h0,
                           int64_t h1);

arl_status arl_vision_fwd(float *tokens, const arl_model_params *w, const arl_model_config *cfg,
                          const float *patches, const int32_t *grids, int32_t n_img, float *ws,
                          int64_t ws_floats, const arl_vision_trace *trace);

/* Convenience for CLI and rollout: decode-side images -> tokens.  For each image the grid is
 * arl_image_grid(width, height, p, max_patches) (the grid the chat template counts
 * placeholders with, policy/chat.h), the pixels are resized and patchified, and the tower runs
 * over all images at once.  *tokens (n_tokens, d) is malloc'ed (caller frees with free()). */
arl_status arl_vision_encode_images(const arl_model_params *w, const arl_model_config *cfg,
                                    const arl_image *imgs, int32_t n_img, int64_t max_patches,
                                    float **tokens, int64_t *n_tokens);

/* seq (T, d) = the embedding rows embed[tokens[t]], except that the placeholders
 * (tokens[t] == placeholder_id) take the rows of media (n_media, d) in order.  ARL_ERR_ARG
 * when the number of placeholders differs from n_media; ARL_ERR_RANGE for an id outside
 * [0, V). */
arl_status arl_vision_place(float *seq, const float *embed, int64_t V, int64_t d,
                            const int32_t *tokens, int64_t T, int64_t placeholder_id,
                            const float *media, int64_t n_media);

#endif
