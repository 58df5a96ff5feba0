/* tests/train/embed_lm.h: a stand-in model for testing the SFT driver until the real model's
 * forward and backward exist: logits z_t = lm_head e(ids_t), with e the row of embed_tokens
 * (a bigram model over the same parameter arena as the real model; every other tensor gets a
 * zero gradient).  Gradients are exact:
 *   dz_t = scale (softmax(z_t) - onehot(labels_t))     (target positions only)
 *   d lm_head += dz_t e_t^T,   d e_t += lm_head^T dz_t
 * fp32 storage, double accumulation of dot products and of the loss; deterministic.
 * Symbols: T tokens, V vocabulary, d width. */
#ifndef ARL_TESTS_TRAIN_EMBED_LM_H
#define ARL_TESTS_TRAIN_EMBED_LM_H

#include "experiments/sft.h"

/* The ops table (create, destroy, train_step, eval). */
const arl_sft_model_ops *embed_lm_ops(void);

/* Sum of -log p(labels_t) over target positions, in double from the float parameters (the
 * finite-difference reference). */
double embed_lm_loss_ref(const arl_model_params *p, const arl_sft_batch *b);

#endif
