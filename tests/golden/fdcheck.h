/* tests/golden/fdcheck.h: central finite-difference checks of fp32 backward functions.
 *
 * The C components are fp32, so the differences are taken in fp32 inputs with the loss
 * accumulated in double: L(x + h e_i) - L(x - h e_i) over 2h.  With h = 1e-2 relative to the
 * input scale the truncation error is O(h^2 |L'''|) ~ 1e-4 and the rounding error about
 * 2^-24 |L| / h ~ 1e-5 |L|, so the checks use the max|ref| form with rtol 2e-2: loose enough
 * for fp32, tight enough to catch a wrong sign, a missing term or a transposed index (errors of
 * order 1).  Shapes are a few elements, every element is checked.
 */
#ifndef ARL_TESTS_GOLDEN_FDCHECK_H
#define ARL_TESTS_GOLDEN_FDCHECK_H

#include <math.h>
#include <stdio.h>

#include "tests/test.h"

/* loss(ctx) evaluates the scalar loss from the current inputs (which it reads through ctx). */
typedef double (*fd_loss_fn)(void *ctx);

/* Compare grad (n) with finite differences of loss w.r.t. x (n), perturbing x in place. */
static inline int fd_check(const char *what, float *x, const float *grad, int n, fd_loss_fn loss,
                           void *ctx, float h) {
    double maxg = 0.0, worst = 0.0;
    int wi = 0;
    double fd_w = 0.0;
    for (int i = 0; i < n; i++)
        if (fabs(grad[i]) > maxg) maxg = fabs(grad[i]);
    for (int i = 0; i < n; i++) {
        float x0 = x[i];
        x[i] = x0 + h;
        double lp = loss(ctx);
        x[i] = x0 - h;
        double lm = loss(ctx);
        x[i] = x0;
        float xp = x0 + h, xm = x0 - h;
        double fd = (lp - lm) / ((double)xp - (double)xm);
        double err = fabs(fd - grad[i]);
        if (err > worst) {
            worst = err;
            wi = i;
            fd_w = fd;
        }
    }
    /* max|ref| form, rtol 2e-2 (see the file comment); atol 1e-4 covers all-zero gradients */
    if (!(worst <= 1e-4 + 2e-2 * maxg)) {
        fprintf(stderr,
                "%s: finite difference mismatch at [%d]: analytic %.6g, fd %.6g "
                "(max|grad| %.3g)\n",
                what, wi, (double)grad[wi], fd_w, maxg);
        test_failures_++;
        return 0;
    }
    return 1;
}

#endif
