/* tests/fuzz/fuzz_safetensors.c: libFuzzer target for the safetensors header parser
 * (policy/safetensors.c) and the .npy header parser (core/npy.c).
 *
 * Each input goes to both parsers.  Whatever a parser accepts must be readable in bounds:
 * every tensor's data is converted to fp32 (ASan catches any read outside the input).
 * Built by tests/safetensors/CMakeLists.txt with clang and -DAGENTRL_FUZZ=ON:
 *   build/tests/safetensors/fuzz_safetensors -max_total_time=60 CORPUS_DIR
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/npy.h"
#include "policy/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    arl_st_file *f = NULL;
    if (arl_st_file_open_mem(data, size, "fuzz", &f) == ARL_OK) {
        for (int64_t i = 0; i < arl_st_file_count(f); i++) {
            const arl_st_tensor *t = arl_st_file_tensor(f, i);
            ARL_ASSERT(t->offset + t->nbytes <= size);
            ARL_ASSERT(arl_st_file_find(f, t->name) == t);
            if (t->numel > (1 << 20)) continue;
            float *v = malloc((size_t)t->numel * sizeof *v + 1);
            ARL_ASSERT(v && arl_st_tensor_read_f32(t, v, t->numel) == ARL_OK);
            free(v);
        }
        arl_st_file_close(f);
    }
    arl_npy a;
    if (arl_npy_read_mem(data, size, "fuzz", &a) == ARL_OK) {
        ARL_ASSERT(a.nbytes <= size);
        arl_npy_free(&a);
    }
    return 0;
}
