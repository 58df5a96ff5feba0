/* rollout/media.h: the image token rows of a stored trajectory, rebuilt from the replay store
 * alone (spec/replay.md 4.10: the PNG bytes of every observation image are kept once in the
 * worker file's `images` table and restored into the stored response bodies; spec/policy.md
 * 10.1: an image becomes N rows that replace N <|media_pad|> placeholders), for re-scoring, for
 * resuming or continuing a fork without a cached state, and for the learner (learner/media.c:
 * ro_media_load_input gives the vision input, which the learner encodes under the old, the
 * reference and the current weights, the last with a gradient into the vision tower).
 *
 * What this is: every observation of the trajectory (step 0's create response, then step k's
 * response) parsed for its image parts in message and part order - the order the chat template
 * places them (rollout/turn.c ro_conv_add_obs) - and run through the vision front end one
 * observation at a time, as the rollout did; then a cursor that hands out rows to the
 * placeholders of the token stream in order.  A fresh start re-renders the conversation since
 * the last `reset` observation, so ro_media_fresh moves the cursor back to that observation's
 * first image.  A placeholder the policy sampled (loss mask 1) was fed as a plain token: it gets
 * the embedding row of <|media_pad|>, which is what the plain token embeds to.
 * What this is not: a check that the rows are those the rollout used (re-scoring compares the
 * log-probabilities; a wrong image gives differences of order 0.1 and more).
 *
 * Symbols: d model width. */
#ifndef ARL_ROLLOUT_MEDIA_H
#define ARL_ROLLOUT_MEDIA_H

#include <stdint.h>

#include "policy/config.h"
#include "replay/replay.h"
#include "rollout/engine.h"

typedef struct ro_media {
    float *rows; /* (n_rows, d) image rows of every observation, in order; owned */
    int64_t n_rows, d;
    int64_t *step_row;   /* (n_steps) first row of step k's observation images; owned */
    uint8_t *step_reset; /* (n_steps) step k's observation has context `reset`; owned */
    int64_t n_steps;
    int64_t cursor;       /* next row to hand out */
    const float *pad_row; /* (d) embedding row of <|media_pad|>; borrowed from the engine */
    int32_t media_id;     /* <|media_pad|> */
} ro_media;

/* One observation's images as vision-tower input (policy/vision.h arl_vision_fwd): no weights
 * are involved, so a caller may encode them under any weights, with or without a gradient. */
typedef struct ro_media_obs {
    float *patches; /* (Np, 3, p, p) normalised pixels (arl_image_patchify), image after image;
                       owned */
    int32_t *grids; /* (n_img, 2) [gh, gw] of each image (arl_image_grid); owned */
    int32_t n_img;
    int64_t Np;   /* patches; the observation gives Np / 4 rows */
    int64_t row0; /* its rows are [row0, row0 + Np / 4) of the trajectory's rows */
} ro_media_obs;

typedef struct ro_media_input {
    ro_media_obs *obs; /* (n_obs) every observation with images, in stream order; owned */
    int32_t n_obs;
    int64_t max_Np; /* most patches of one observation */
} ro_media_input;

/* The loading of ro_media_load without the encoding: the vision input of every observation
 * with images into in, and m's bookkeeping (d, media_id, n_rows, step_row, step_reset; rows and
 * pad_row stay NULL: the caller encodes in->obs under weights of its own and hands rows out
 * with ro_media_take_index).  max_patches: the chat template's image_max_patches.  Errors as
 * ro_media_load; on error both are freed. */
arl_status ro_media_load_input(replay_store *st, int64_t traj_id, const arl_model_config *cfg,
                               int64_t max_patches, ro_media_input *in, ro_media *m);
void ro_media_input_free(ro_media_input *in); /* NULL-safe; zeroes in */

/* Load and encode the observation images of trajectory traj_id under the engine's weights:
 * the steps of its own segments from its own worker or tool file, and for a fork the steps of
 * its prefix from the parent's file (recursively for a fork of a fork; the segments
 * replay_traj_segments resolves through the parents say whose call each step is).  A text-only
 * model or a trajectory without images gives no rows (every call still succeeds).  An unreadable
 * stored body or image is ARL_ERR_CORRUPT naming the call; ARL_ERR_NOMEM. */
arl_status ro_media_load(replay_store *st, int64_t traj_id, const ro_engine *e, ro_media *m);
void ro_media_free(ro_media *m); /* NULL-safe; zeroes m */

/* A fresh start opened by the observation of step k: the cursor moves to the first row of the
 * latest `reset` observation at a step <= k (step 0 counts as one). */
void ro_media_fresh(ro_media *m, int64_t k);

/* The rows for n stream tokens (ids, loss mask): for each <|media_pad|> in order, the next image
 * row if it is a context token, the placeholder's own embedding row if it was sampled.
 * out (>= count, d), *count = the placeholders among the tokens.  ARL_ERR_NOT_FOUND (the cursor
 * unchanged) when the stored images run out: the stream holds placeholders this store cannot
 * explain. */
arl_status ro_media_take(ro_media *m, const uint32_t *tokens, const uint8_t *mask, int64_t n,
                         float *out, int64_t *count);

/* ro_media_take's choice as row indices: idx (>= count) receives, for each <|media_pad|> in
 * order, the index of the next image row (into the rows ro_media_load or the caller's encoding
 * of ro_media_load_input gives), or -1 for a sampled placeholder (its own embedding row).
 * Errors and cursor as ro_media_take. */
arl_status ro_media_take_index(ro_media *m, const uint32_t *tokens, const uint8_t *mask, int64_t n,
                               int64_t *idx, int64_t *count);

#endif
