/* policy/vision_backward.h: backward of the image front end on the CPU, fp32 (spec/policy.md
 * 10.2-10.3): the gradient of the vision tower's and projector's weights from the gradient of
 * the image token rows (what arl_model_backward returns as d_media).
 *
 * What this is: the forward of policy/vision.c recomputed with its intermediates kept (same
 * kernels, same order, same bits), then its reverse: projector RMSNorm, Linear, GELU(erf),
 * Linear; the 2x2 merge (a permutation); final RMSNorm; per block the MLP (fc1, GELU_tanh,
 * fc0, RMSNorm) and the attention (Wo, softmax attention inside each image, 2-D RoPE as the
 * inverse rotation, Wqkv, RMSNorm); the position grid through the adjoint of the bilinear
 * resize; the patch embedding.  What this is not: patchifying (policy/image.h) - pixels get no
 * gradient - or video (no time embedding).
 *
 * Symbols as policy/vision.h: Np patches, D width, Q qkv width, F MLP width, N = Np/4 tokens,
 * d text width.  Gradients ACCUMULATE (+=); the work buffer comes from the caller.
 */
#ifndef ARL_POLICY_VISION_BACKWARD_H
#define ARL_POLICY_VISION_BACKWARD_H

#include <stdint.h>

#include "core/status.h"
#include "policy/config.h"
#include "policy/params.h"

/* Floats of work buffer for arl_vision_bwd over at most max_patches patches. */
int64_t arl_vision_train_ws_floats(const arl_model_config *cfg, int64_t max_patches);

/* For the images of arl_vision_fwd (patches (Np, 3, p, p), grids (n_img, 2)) and d_tokens
 * (N, d), the gradient of the image token rows: every vision_tower.* and mm_projector.* tensor
 * of grads (a view over a gradient arena) +=.  tokens (N, d): receives the forward's tokens
 * (bit-identical to arl_vision_fwd) unless NULL.  Errors as arl_vision_fwd. */
arl_status arl_vision_bwd(const arl_model_params *grads, float *tokens, const float *d_tokens,
                          const arl_model_params *w, const arl_model_config *cfg,
                          const float *patches, const int32_t *grids, int32_t n_img, float *ws,
                          int64_t ws_floats);

#endif
