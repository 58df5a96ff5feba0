/* policy/model_device_bump.h: the bump layout of the device model's blocks (weights, activations,
 * work buffers, training state): consecutive pieces of one arena block in 256-byte steps.  With
 * base NULL it only measures (used = the floats the layout needs), so one function both sizes a
 * block and lays it out.  Internal to policy/model_device*.c. */
#ifndef ARL_POLICY_MODEL_DEVICE_BUMP_H
#define ARL_POLICY_MODEL_DEVICE_BUMP_H

#include <stddef.h>
#include <stdint.h>

typedef struct bump {
    float *base; /* the block, or NULL to measure */
    int64_t used; /* floats laid out so far */
} bump;

static inline float *take(bump *b, int64_t n) {
    float *p = b->base ? b->base + b->used : NULL;
    b->used += (n + 63) & ~(int64_t)63; /* 256-byte steps (device alignment) */
    return p;
}

#endif
