/* rollout/media.h: the image token rows of a stored trajectory, rebuilt from the replay store
 * alone (spec/replay.md 4.10: the PNG bytes of every observation image are kept once in the
 * worker file's `images` table and restored into the stored response bodies; spec/policy.md
 * 10.1: an image becomes N rows that replace N <|media_pad|> placeholders), for re-scoring and
 * for resuming or continuing a fork without a cached state.
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

/* Load and encode the observation images of trajectory traj_id under the engine's weights:
 * the steps of its own segments from its own worker or tool file, and for a fork the steps of
 * its prefix from the parent's file (recursively for a fork of a fork; the segments
 * replay_traj_segments resolves through the parents say whose call each step is).  A text-only model or a trajectory without images gives no rows
 * (every call still succeeds).  An unreadable stored body or image is ARL_ERR_CORRUPT naming the
 * call; ARL_ERR_NOMEM. */
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

#endif
