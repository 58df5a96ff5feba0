#!/usr/bin/python3
"""tests/golden/gen_golden.py: float64 reference of spec/policy.md and its golden vectors.

What it is: the equations of spec/policy.md written directly in float64 torch (1.13, Debian's
python3-torch) and numpy, one function per section, plus a generator that writes one
safetensors file per case of spec section 16.2 under tests/golden/data/ and a manifest.json.
Before writing anything it runs the checks of section 16.3: every analytic backward of the
spec against torch.autograd, recurrent KDA against the chunk form (C = 16 and 64), naive MLA
against the absorbed form, decode against prefill; agreement is the max|ref| form with
atol = 0, rtol = 1e-12.  Any failed check stops the script with exit status 1 and a message.

What it is not: a model implementation for training, or third-party code.  No model code is
imported or copied; RMSNorm, reshapes, bilinear resize, RoPE2D etc. are written by hand.

Run:  /usr/bin/python3 tests/golden/gen_golden.py [--out DIR] [--only case,case] [--no-write]

File conventions (read by tests/golden/golden.c):
  - every floating tensor NAME is stored twice: NAME (F64, the reference) and NAME.f32 (F32,
    the same values rounded to nearest);
  - every input is generated in float64 and then rounded to a float32-representable value
    before it is used, so NAME.f32 of an input is exact and C and Python see the same inputs;
  - integer tensors (indices, counts, cu_seqlens, tokens) are I64;
  - model_tiny stores its weights under the checkpoint keys of spec 14.2 as F32 only (the
    reference computed with exactly these values) and the parameter gradients as
    "grad.<key>" in F32 only, to keep the committed data small (see manifest.json).
Layouts: token-major, heads head-major (channel c of head h at h*D + c), Linear weights [out, in].
"""

import argparse
import json
import math
import os
import struct
import sys
import time
from collections import OrderedDict

import numpy as np
import torch

torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)
F64 = torch.float64

HERE = os.path.dirname(os.path.abspath(__file__))
RTOL_CHECK = 1e-12  # spec 16.3: analytic vs autograd, recurrent vs chunk, naive vs absorbed

# ---------------------------------------------------------------------------------------------
# checks, rounding, random inputs
# ---------------------------------------------------------------------------------------------

CHECKS = []  # (name, max|a-ref| / max|ref|, limit)


class CheckFailed(Exception):
    pass


def check(name, a, ref, rtol=RTOL_CHECK):
    """max|ref| form with atol = 0: max|a - ref| <= rtol * max|ref| (spec 16.3/16.4)."""
    a = torch.as_tensor(a, dtype=F64).detach()
    ref = torch.as_tensor(ref, dtype=F64).detach()
    if a.shape != ref.shape:
        raise CheckFailed("%s: shape %s vs reference %s" % (name, tuple(a.shape), tuple(ref.shape)))
    m = ref.abs().max().item() if ref.numel() else 0.0
    err = (a - ref).abs().max().item() if ref.numel() else 0.0
    rel = err / m if m > 0 else err
    CHECKS.append((name, rel, rtol))
    if not (err <= rtol * m) and not (m == 0 and err == 0):
        raise CheckFailed("%s: max|diff| %.3e > %.1e * max|ref| %.3e (relative %.3e)"
                          % (name, err, rtol, m, rel))


def check_exact(name, a, ref):
    a = torch.as_tensor(a)
    ref = torch.as_tensor(ref)
    if a.shape != ref.shape or not torch.equal(a, ref):
        raise CheckFailed("%s: integer outputs differ" % name)
    CHECKS.append((name, 0.0, 0.0))


def r32(t):
    """Round to the nearest float32 value, kept in float64."""
    return t.to(torch.float32).to(F64)


class Rand:
    """Seeded float64 inputs rounded to float32-representable values."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, *shape, std=1.0, mean=0.0):
        return r32(torch.randn(*shape, generator=self.g) * std + mean)

    def uniform(self, *shape, lo=0.0, hi=1.0):
        return r32(torch.rand(*shape, generator=self.g) * (hi - lo) + lo)

    def ints(self, lo, hi, *shape):
        return torch.randint(lo, hi, shape, generator=self.g)

    def unit_rows(self, *shape):
        """Rows of unit L2 norm (last axis), rounded to float32."""
        x = torch.randn(*shape, generator=self.g)
        return r32(x / x.norm(dim=-1, keepdim=True))


def grads_of(out_terms, inputs):
    """Gradients of sum_i <out_i, up_i> w.r.t. inputs (autograd)."""
    loss = sum((o * u).sum() for o, u in out_terms)
    gs = torch.autograd.grad(loss, inputs, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(gs, inputs)]


def leaf(t):
    return t.detach().clone().requires_grad_(True)


# ---------------------------------------------------------------------------------------------
# safetensors writer (spec 14.1) and the case container
# ---------------------------------------------------------------------------------------------

ST_DTYPES = {torch.float64: ("F64", np.float64), torch.float32: ("F32", np.float32),
             torch.int64: ("I64", np.int64), torch.int32: ("I32", np.int32),
             torch.uint8: ("U8", np.uint8)}


def write_safetensors(path, tensors, metadata):
    """tensors: OrderedDict name -> torch tensor.  8-byte aligned header; data without holes,
    8-byte element types first so that every tensor is aligned to its element size."""
    order = sorted(tensors.keys(), key=lambda k: (-tensors[k].element_size(), 0))
    header = OrderedDict()
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    blobs = []
    off = 0
    for name in order:
        t = tensors[name].detach().contiguous()
        code, npdt = ST_DTYPES[t.dtype]
        b = t.numpy().astype(npdt, copy=False).astype(np.dtype(npdt).newbyteorder("<")).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    return 8 + len(hj) + off


class Case:
    def __init__(self, name, seed, config=None, notes=""):
        self.name = name
        self.seed = seed
        self.config = dict(config or {})
        self.notes = notes
        self.tensors = OrderedDict()
        self.listing = OrderedDict()  # logical name -> {shape, stored}

    def _put(self, key, t):
        if key in self.tensors:
            raise CheckFailed("%s: tensor %s written twice" % (self.name, key))
        self.tensors[key] = t

    def f(self, name, t):
        """A floating tensor: NAME as F64 and NAME.f32 as F32."""
        t = torch.as_tensor(t).detach().to(F64)
        if not torch.isfinite(t).all():
            raise CheckFailed("%s: tensor %s is not finite" % (self.name, name))
        self._put(name, t.clone())
        self._put(name + ".f32", t.to(torch.float32))
        self.listing[name] = {"shape": list(t.shape), "stored": "F64+F32"}

    def f32only(self, name, t):
        t = torch.as_tensor(t).detach()
        if not torch.isfinite(t).all():
            raise CheckFailed("%s: tensor %s is not finite" % (self.name, name))
        self._put(name, t.to(torch.float32).clone())
        self.listing[name] = {"shape": list(t.shape), "stored": "F32"}

    def i(self, name, t):
        t = torch.as_tensor(t).detach().to(torch.int64)
        self._put(name, t.clone())
        self.listing[name] = {"shape": list(t.shape), "stored": "I64"}

    def u8(self, name, t):
        t = torch.as_tensor(t).detach().to(torch.uint8)
        self._put(name, t.clone())
        self.listing[name] = {"shape": list(t.shape), "stored": "U8"}


# ---------------------------------------------------------------------------------------------
# elementwise stages: norms, activations (spec 1.3, 3.9, 8)
# ---------------------------------------------------------------------------------------------

def rmsnorm(x, w, eps):
    """RMSNorm_{w,eps}(x) over the last axis (spec 1.3); w may be None (= 1)."""
    y = x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps)
    return y if w is None else y * w


def rmsnorm_bwd(x, w, eps, dy):
    """Spec 3.9 RMSNorm backward (gate = 1): returns dx, dw (summed over all leading axes)."""
    rho = torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps)
    xh = x * rho
    dxh = dy * (w if w is not None else 1.0)
    dx = rho * (dxh - xh * (dxh * xh).mean(dim=-1, keepdim=True))
    dw = (dy * xh).reshape(-1, x.shape[-1]).sum(0)
    return dx, dw


def l2norm(x):
    """L2Norm(x) = x (sum x^2 + 1e-6)^(-1/2) over the last axis (spec 1.3)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def l2norm_bwd(x, dxh):
    nu = torch.sqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)
    xh = x / nu
    return (dxh - xh * (xh * dxh).sum(dim=-1, keepdim=True)) / nu


def silu(x):
    return x * torch.sigmoid(x)


def softplus(x):
    # ln(1 + e^x), stable for large |x|
    return torch.where(x > 30, x, torch.log1p(torch.exp(torch.clamp(x, max=30.0))))


def situ(g, u, b1=4.0, b2=25.0):
    """SiTU(g, u) = b1 tanh(g/b1) sigma(g) * b2 tanh(u/b2) (spec 8)."""
    return b1 * torch.tanh(g / b1) * torch.sigmoid(g) * (b2 * torch.tanh(u / b2))


def situ_derivs(g, u, b1=4.0, b2=25.0):
    """Spec 8: returns (phi, psi, phi', psi', dSiTU/dg, dSiTU/du)."""
    tg = torch.tanh(g / b1)
    sg = torch.sigmoid(g)
    tu = torch.tanh(u / b2)
    phi = b1 * tg * sg
    psi = b2 * tu
    dphi = (1 - tg * tg) * sg + b1 * tg * sg * (1 - sg)
    dpsi = 1 - tu * tu
    return phi, psi, dphi, dpsi, dphi * psi, phi * dpsi


def glu(x, wg, wu, wd, b1=4.0, b2=25.0):
    """GLU_{Wg,Wu,Wd}(x) = Wd SiTU(Wg x, Wu x), token rows (spec 7.1, 8)."""
    return situ(x @ wg.T, x @ wu.T, b1, b2) @ wd.T


def glu_bwd(x, wg, wu, wd, dy, b1=4.0, b2=25.0):
    """Analytic GLU backward: dx, dWg, dWu, dWd."""
    a = x @ wg.T
    b = x @ wu.T
    _, _, _, _, dsg, dsu = situ_derivs(a, b, b1, b2)
    hsit = situ(a, b, b1, b2)
    dWd = dy.T @ hsit
    dh = dy @ wd
    da = dh * dsg
    db = dh * dsu
    return da @ wg + db @ wu, da.T @ x, db.T @ x, dWd


# ---------------------------------------------------------------------------------------------
# KDA (spec 3)
# ---------------------------------------------------------------------------------------------

def doc_ranges(cu):
    return [(int(cu[i]), int(cu[i + 1])) for i in range(len(cu) - 1)]


def short_conv(x, w, cu, tails=None):
    """Depthwise causal conv (spec 3.1) before SiLU.  x (T, C), w (C, W); cu cu_seqlens;
    tails (n_docs, C, W-1) or None: the W-1 inputs before each document (oldest first),
    0 when None.  Returns y (T, C)."""
    T, C = x.shape
    W = w.shape[1]
    outs = []
    for di, (a, b) in enumerate(doc_ranges(cu)):
        pre = tails[di].T if tails is not None else torch.zeros(W - 1, C, dtype=x.dtype)
        xx = torch.cat([pre, x[a:b]], 0)  # (W-1+n, C)
        n = b - a
        y = torch.zeros(n, C, dtype=x.dtype)
        for j in range(W):
            y = y + w[:, j] * xx[j:j + n]
        outs.append(y)
    return torch.cat(outs, 0)


def conv_tail(x_doc, W, prev_tail=None):
    """The last W-1 pre-conv inputs of a document (C, W-1), oldest first (spec 3.6)."""
    C = x_doc.shape[1]
    pre = prev_tail.T if prev_tail is not None else torch.zeros(W - 1, C, dtype=x_doc.dtype)
    xx = torch.cat([pre, x_doc], 0)
    return xx[xx.shape[0] - (W - 1):].T.clone()


def short_conv_bwd(x, w, cu, dz, tails=None):
    """Spec 3.9 short conv + SiLU backward: dx (T, C), dw (C, W)."""
    T, C = x.shape
    W = w.shape[1]
    y = short_conv(x, w, cu, tails)
    sy = torch.sigmoid(y)
    dy = dz * sy * (1 + y * (1 - sy))
    dx = torch.zeros_like(x)
    dw = torch.zeros_like(w)
    for di, (a, b) in enumerate(doc_ranges(cu)):
        n = b - a
        pre = tails[di].T if tails is not None else torch.zeros(W - 1, C, dtype=x.dtype)
        xx = torch.cat([pre, x[a:b]], 0)
        for tau in range(n):  # dx_tau = sum_j w[:, j] dy_{tau+W-1-j}
            acc = torch.zeros(C, dtype=x.dtype)
            for j in range(W):
                t = tau + W - 1 - j
                if t < n:
                    acc = acc + w[:, j] * dy[a + t]
            dx[a + tau] = acc
        for j in range(W):  # dw[:, j] = sum_t dy_t * x_{t-W+1+j}
            dw[:, j] += (dy[a:b] * xx[j:j + n]).sum(0)
    return dx, dw


def gate_k3(f, A_log, dt_bias, H, g_min):
    """g = g_min sigma(a_h (f + dt_bias)) (spec 3.2).  f (T, P), A_log (H), dt_bias (P)."""
    T, P = f.shape
    a = torch.exp(A_log).repeat_interleave(P // H)
    return g_min * torch.sigmoid(a * (f + dt_bias))


def gate_softplus(f, A_log, dt_bias, H):
    T, P = f.shape
    a = torch.exp(A_log).repeat_interleave(P // H)
    return -a * softplus(f + dt_bias)


def gate_k3_bwd(f, A_log, dt_bias, H, g_min, dg):
    T, P = f.shape
    a = torch.exp(A_log).repeat_interleave(P // H)
    z = a * (f + dt_bias)
    sz = torch.sigmoid(z)
    dz = dg * g_min * sz * (1 - sz)
    du = a * dz
    dA = (dz * z).sum(0).reshape(H, P // H).sum(1)
    return du, dA, du.sum(0)


def gate_softplus_bwd(f, A_log, dt_bias, H, dg):
    T, P = f.shape
    a = torch.exp(A_log).repeat_interleave(P // H)
    u = f + dt_bias
    g = -a * softplus(u)
    du = -a * torch.sigmoid(u) * dg
    dA = (g * dg).sum(0).reshape(H, P // H).sum(1)
    return du, dA, du.sum(0)


def kda_recurrent(q, k, v, g, beta, S0, scale, cu=None):
    """Spec 3.3.  q, k, g (T, H, dk); v (T, H, dv); beta (T, H); S0 (n_docs, H, dk, dv) or
    None.  Returns o (T, H, dv) and the final states (n_docs, H, dk, dv)."""
    T, H, dk = q.shape
    dv = v.shape[2]
    if cu is None:
        cu = [0, T]
    outs, finals = [], []
    for di, (a_, b_) in enumerate(doc_ranges(cu)):
        S = S0[di] if S0 is not None else torch.zeros(H, dk, dv, dtype=q.dtype)
        for t in range(a_, b_):
            S = torch.exp(g[t])[:, :, None] * S                      # 1. decay rows
            r = torch.einsum("hkv,hk->hv", S, k[t])                  # 2. prediction
            delta = beta[t][:, None] * (v[t] - r)                   # 3. error
            S = S + k[t][:, :, None] * delta[:, None, :]            # 4. write
            outs.append(torch.einsum("hkv,hk->hv", S, scale * q[t]))  # 5. read
        finals.append(S)
    return torch.stack(outs), torch.stack(finals)


def kda_recurrent_bwd(q, k, v, g, beta, S0, scale, do, dST, cu=None):
    """Spec 3.7, one pass per document.  Returns dq, dk, dv, dg, dbeta, dS0 (n_docs, ...)."""
    T, H, dk = q.shape
    dv_ = v.shape[2]
    if cu is None:
        cu = [0, T]
    dq, dk_, dvv, dg, db = (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v),
                            torch.zeros_like(g), torch.zeros_like(beta))
    dS0 = []
    for di, (a_, b_) in enumerate(doc_ranges(cu)):
        S = S0[di] if S0 is not None else torch.zeros(H, dk, dv_, dtype=q.dtype)
        prev = []
        for t in range(a_, b_):  # forward to store S_{t-1} (the spec recomputes from chunk states)
            prev.append(S)
            al = torch.exp(g[t])[:, :, None]
            St = al * S
            r = torch.einsum("hkv,hk->hv", St, k[t])
            S = St + k[t][:, :, None] * (beta[t][:, None] * (v[t] - r))[:, None, :]
        dS = dST[di].clone()
        for t in range(b_ - 1, a_ - 1, -1):
            Sp = prev[t - a_]
            al = torch.exp(g[t])
            St = al[:, :, None] * Sp
            r = torch.einsum("hkv,hk->hv", St, k[t])
            delta = beta[t][:, None] * (v[t] - r)
            Sn = St + k[t][:, :, None] * delta[:, None, :]
            dS = dS + scale * q[t][:, :, None] * do[t][:, None, :]
            dq[t] = scale * torch.einsum("hkv,hv->hk", Sn, do[t])
            ddelta = torch.einsum("hkv,hk->hv", dS, k[t])
            dkt = torch.einsum("hkv,hv->hk", dS, delta)
            db[t] = (ddelta * (v[t] - r)).sum(-1)
            dvv[t] = beta[t][:, None] * ddelta
            dr = -beta[t][:, None] * ddelta
            dSt = dS + k[t][:, :, None] * dr[:, None, :]
            dkt = dkt + torch.einsum("hkv,hv->hk", St, dr)
            dk_[t] = dkt
            dg[t] = al * (dSt * Sp).sum(-1)
            dS = al[:, :, None] * dSt
        dS0.append(dS)
    return dq, dk_, dvv, dg, db, torch.stack(dS0)


def tri_inverse_fwdsub(Akk):
    """T = (I + A_kk)^-1 by the forward substitution of spec 3.5."""
    n = Akk.shape[0]
    A = -Akk.clone()
    for i in range(1, n):
        A[i, :i] = A[i, :i] + A[i, :] @ A[:, :i]
    return A + torch.eye(n, dtype=Akk.dtype)


def tri_inverse_neumann(Akk):
    """T = (I - L)(I + L^2)(I + L^4)(I + L^8), exact for n <= 16 (spec 3.5)."""
    n = Akk.shape[0]
    assert n <= 16
    I = torch.eye(n, dtype=Akk.dtype)
    L2 = Akk @ Akk
    L4 = L2 @ L2
    L8 = L4 @ L4
    return (I - Akk) @ (I + L2) @ (I + L4) @ (I + L8)


def chunk_bounds(cu, C):
    out = []
    for a_, b_ in doc_ranges(cu):
        for s in range(a_, b_, C):
            out.append((s, min(s + C, b_), s == a_))
    return out


def kda_chunk_head(Q, K, V, g, beta, S, tinv="fwdsub"):
    """Spec 3.5 (1)-(8) for one head and one chunk; Q already scaled.  Returns O, S_out and
    the intermediates the backward needs."""
    n = Q.shape[0]
    G = torch.cumsum(g, 0)
    Gam = torch.exp(G)
    Gn = G[-1]
    D = G[:, None, :] - G[None, :, :]  # D[r, i, c] = G[r, c] - G[i, c]
    lower_strict = torch.tril(torch.ones(n, n, dtype=torch.bool), -1)
    lower = torch.tril(torch.ones(n, n, dtype=torch.bool), 0)
    E = torch.exp(torch.where(lower[:, :, None], D, torch.zeros_like(D)))  # only i <= r used
    Akk = beta[:, None] * torch.einsum("rc,ic,ric->ri", K, K, E)
    Akk = torch.where(lower_strict, Akk, torch.zeros_like(Akk))
    if tinv == "fwdsub":
        Tm = tri_inverse_fwdsub(Akk)
    elif tinv == "neumann":
        Tm = tri_inverse_neumann(Akk)
    else:
        Tm = torch.linalg.inv(torch.eye(n, dtype=Q.dtype) + Akk)
    Xw = beta[:, None] * (Gam * K)
    Xu = beta[:, None] * V
    Wm = Tm @ Xw
    U = Tm @ Xu
    Vt = U - Wm @ S
    Aqk = torch.einsum("rc,ic,ric->ri", Q, K, E)
    Aqk = torch.where(lower, Aqk, torch.zeros_like(Aqk))
    O = (Gam * Q) @ S + Aqk @ Vt
    Kbar = torch.exp(Gn - G) * K
    Sout = torch.exp(Gn)[:, None] * S + Kbar.T @ Vt
    ctx = dict(G=G, Gam=Gam, Gn=Gn, E=E, Akk=Akk, T=Tm, Xw=Xw, Xu=Xu, W=Wm, U=U, Vt=Vt, Aqk=Aqk,
               Kbar=Kbar, S=S)
    return O, Sout, ctx


def kda_chunk(q, k, v, g, beta, S0, scale, C, cu=None, tinv="fwdsub"):
    """Spec 3.5 over a packed batch.  Returns o, final states (n_docs, H, dk, dv) and the
    incoming state of every chunk (n_chunks, H, dk, dv)."""
    T, H, dk = q.shape
    dv = v.shape[2]
    if cu is None:
        cu = [0, T]
    o = torch.zeros(T, H, dv, dtype=q.dtype)
    finals, cstates = [], []
    docs = doc_ranges(cu)
    di = -1
    S = None
    for (s0, s1, first) in chunk_bounds(cu, C):
        if first:
            if S is not None:
                finals.append(S)
            di += 1
            S = (S0[di].clone() if S0 is not None else torch.zeros(H, dk, dv, dtype=q.dtype))
        cstates.append(S.clone())
        Snew = torch.zeros_like(S)
        for h in range(H):
            O, So, _ = kda_chunk_head(scale * q[s0:s1, h], k[s0:s1, h], v[s0:s1, h], g[s0:s1, h],
                                      beta[s0:s1, h], S[h], tinv)
            o[s0:s1, h] = O
            Snew[h] = So
        S = Snew
    finals.append(S)
    assert len(finals) == len(docs)
    return o, torch.stack(finals), torch.stack(cstates)


def kda_chunk_head_bwd(Q, K, V, g, beta, S, dO, dSp, tinv="fwdsub"):
    """Spec 3.8 for one head and one chunk.  Returns dQ (w.r.t. the scaled Q), dK, dV, dg,
    dbeta and dS (the gradient of the incoming state)."""
    n = Q.shape[0]
    _, _, c = kda_chunk_head(Q, K, V, g, beta, S, tinv)
    G, Gam, Gn, E = c["G"], c["Gam"], c["Gn"], c["E"]
    Akk, Tm, Xw, Xu, Wm, Vt, Aqk, Kbar = (c["Akk"], c["T"], c["Xw"], c["Xu"], c["W"], c["Vt"],
                                          c["Aqk"], c["Kbar"])
    lower = torch.tril(torch.ones(n, n, dtype=torch.bool), 0)
    lower_strict = torch.tril(torch.ones(n, n, dtype=torch.bool), -1)
    dQ = torch.zeros_like(Q)
    dK = torch.zeros_like(K)
    dV = torch.zeros_like(V)
    dG = torch.zeros_like(G)
    db = torch.zeros_like(beta)
    dVt = Aqk.T @ dO + Kbar @ dSp
    dAqk = torch.where(lower, dO @ Vt.T, torch.zeros(n, n, dtype=Q.dtype))
    dS = torch.exp(Gn)[:, None] * dSp + (Gam * Q).T @ dO - Wm.T @ dVt
    M = dO @ S.T
    dQ += Gam * M
    dG += Gam * Q * M
    dW = -dVt @ S.T
    dU = dVt
    dKbar = Vt @ dSp.T
    dK += torch.exp(Gn - G) * dKbar
    dG -= Kbar * dKbar
    dGn = (Kbar * dKbar).sum(0)
    dGn = dGn + torch.exp(Gn) * (dSp * S).sum(-1)
    tq = torch.einsum("ri,ic,ric->rc", dAqk, K, E)
    tk = torch.einsum("ri,rc,ric->ic", dAqk, Q, E)
    dQ += tq
    dK += tk
    dG += Q * tq - K * tk
    dT = dW @ Xw.T + dU @ Xu.T
    dXw = Tm.T @ dW
    dXu = Tm.T @ dU
    dAkk = torch.where(lower_strict, -Tm.T @ dT @ Tm.T, torch.zeros(n, n, dtype=Q.dtype))
    dK += beta[:, None] * Gam * dXw
    dG += beta[:, None] * Gam * K * dXw
    db += (Gam * K * dXw).sum(-1)
    dV += beta[:, None] * dXu
    db += (V * dXu).sum(-1)
    db += (dAkk * Akk).sum(-1) / beta
    Dm = beta[:, None] * dAkk
    ti = torch.einsum("ri,ic,ric->rc", Dm, K, E)
    tj = torch.einsum("ri,rc,ric->ic", Dm, K, E)
    dK += ti + tj
    dG += K * ti - K * tj
    dG[n - 1] += dGn
    dg = torch.flip(torch.cumsum(torch.flip(dG, [0]), 0), [0])
    return dQ, dK, dV, dg, db, dS


def kda_chunk_bwd(q, k, v, g, beta, S0, scale, C, do, dST, cu=None, tinv="fwdsub"):
    """Spec 3.8 over a packed batch, chunks in reverse.  Returns dq, dk, dv, dg, dbeta, dS0."""
    T, H, dk = q.shape
    if cu is None:
        cu = [0, T]
    _, _, cstates = kda_chunk(q, k, v, g, beta, S0, scale, C, cu, tinv)
    chunks = chunk_bounds(cu, C)
    dq, dk_, dvv, dg, db = (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v),
                            torch.zeros_like(g), torch.zeros_like(beta))
    ndoc = len(cu) - 1
    dS0 = [None] * ndoc
    di = ndoc
    dS = None
    for ci in range(len(chunks) - 1, -1, -1):
        s0, s1, first = chunks[ci]
        if dS is None:
            di -= 1
            dS = dST[di].clone()
        S = cstates[ci]
        dSprev = torch.zeros_like(dS)
        for h in range(H):
            dQ, dK, dV, dgh, dbh, dSh = kda_chunk_head_bwd(
                scale * q[s0:s1, h], k[s0:s1, h], v[s0:s1, h], g[s0:s1, h], beta[s0:s1, h],
                S[h], do[s0:s1, h], dS[h], tinv)
            dq[s0:s1, h] = scale * dQ
            dk_[s0:s1, h] = dK
            dvv[s0:s1, h] = dV
            dg[s0:s1, h] = dgh
            db[s0:s1, h] = dbh
            dSprev[h] = dSh
        dS = dSprev
        if first:
            dS0[di] = dS
            dS = None
    return dq, dk_, dvv, dg, db, torch.stack(dS0)


def gated_rmsnorm(o, gamma, w, eps):
    """o_bar = w * RMSNorm_{1,eps}(o) * sigma(gamma), per head over the last axis (spec 3.4)."""
    return rmsnorm(o, None, eps) * w * torch.sigmoid(gamma)


def gated_rmsnorm_bwd(x, gamma, w, eps, dob):
    rho = torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    xh = x * rho
    sg = torch.sigmoid(gamma)
    dxh = dob * w * sg
    dx = rho * (dxh - xh * (dxh * xh).mean(-1, keepdim=True))
    dw = (dob * xh * sg).reshape(-1, x.shape[-1]).sum(0)
    dgam = dob * w * xh * sg * (1 - sg)
    return dx, dgam, dw


def kda_layer(x, p, cfg, cu, state=None):
    """Spec 3.1-3.4 for a packed batch (documents in cu).  x (T, d) is the normalised input.
    p holds the layer's weights (see kda_layer_weights); state, if given, is a list of per-doc
    dicts {S (H, dk, dv), tq, tk, tv (P, W-1)} to resume from.  Returns y (T, d), the list of
    final per-doc states and a dict of intermediates."""
    H, dk, W, gmin, eps = cfg["H"], cfg["dk"], cfg["W"], cfg["g_min"], cfg["eps"]
    T = x.shape[0]
    P = H * dk
    nd = len(cu) - 1
    tails = {}
    for nm in ("tq", "tk", "tv"):
        tails[nm] = (torch.stack([s[nm] for s in state]) if state is not None else None)
    qt, kt, vt = x @ p["q_proj"].T, x @ p["k_proj"].T, x @ p["v_proj"].T
    qc = silu(short_conv(qt, p["q_conv"], cu, tails["tq"]))
    kc = silu(short_conv(kt, p["k_conv"], cu, tails["tk"]))
    vc = silu(short_conv(vt, p["v_conv"], cu, tails["tv"]))
    q = l2norm(qc.reshape(T, H, dk))
    k = l2norm(kc.reshape(T, H, dk))
    v = vc.reshape(T, H, dk)
    f = (x @ p["f_a"].T) @ p["f_b"].T
    if gmin is not None:
        g = gate_k3(f, p["A_log"], p["dt_bias"], H, gmin).reshape(T, H, dk)
    else:
        g = gate_softplus(f, p["A_log"], p["dt_bias"], H).reshape(T, H, dk)
    beta = torch.sigmoid(x @ p["b_proj"].T)
    S0 = torch.stack([s["S"] for s in state]) if state is not None else None
    o, Sf = kda_recurrent(q, k, v, g, beta, S0, dk ** -0.5, cu)
    gam = (x @ p["g_proj"].T).reshape(T, H, dk)
    ob = gated_rmsnorm(o, gam, p["o_norm"], eps)
    y = ob.reshape(T, P) @ p["o_proj"].T
    finals = []
    for di, (a_, b_) in enumerate(doc_ranges(cu)):
        st = {"S": Sf[di]}
        for nm, src in (("tq", qt), ("tk", kt), ("tv", vt)):
            st[nm] = conv_tail(src[a_:b_], W, tails[nm][di] if tails[nm] is not None else None)
        finals.append(st)
    inter = dict(qt=qt, kt=kt, vt=vt, q=q, k=k, v=v, f=f, g=g, beta=beta, o=o, gam=gam, ob=ob)
    return y, finals, inter


def kda_layer_decode(x, p, cfg, st):
    """One decode step (spec 3.6): x (d), st {S, tq, tk, tv}; written independently of the
    prefill path (conv over the tail, one recurrence step).  Returns y (d), new state."""
    H, dk, W, gmin, eps = cfg["H"], cfg["dk"], cfg["W"], cfg["g_min"], cfg["eps"]
    P = H * dk
    new = {}
    outs = {}
    for nm, wn, cn in (("tq", "q_proj", "q_conv"), ("tk", "k_proj", "k_conv"),
                       ("tv", "v_proj", "v_conv")):
        xt = p[wn] @ x                                      # (P,)
        win = torch.cat([st[nm], xt[:, None]], 1)            # (P, W): oldest .. current
        outs[nm] = silu((win * p[cn]).sum(1))
        new[nm] = win[:, 1:].clone()
    q = l2norm(outs["tq"].reshape(H, dk))
    k = l2norm(outs["tk"].reshape(H, dk))
    v = outs["tv"].reshape(H, dk)
    f = p["f_b"] @ (p["f_a"] @ x)
    a = torch.exp(p["A_log"]).repeat_interleave(dk)
    if gmin is not None:
        g = (gmin * torch.sigmoid(a * (f + p["dt_bias"]))).reshape(H, dk)
    else:
        g = (-a * softplus(f + p["dt_bias"])).reshape(H, dk)
    beta = torch.sigmoid(p["b_proj"] @ x)
    S = torch.exp(g)[:, :, None] * st["S"]
    r = torch.einsum("hkv,hk->hv", S, k)
    S = S + k[:, :, None] * (beta[:, None] * (v - r))[:, None, :]
    o = torch.einsum("hkv,hk->hv", S, q) * dk ** -0.5
    gam = (p["g_proj"] @ x).reshape(H, dk)
    ob = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + eps) * p["o_norm"] * torch.sigmoid(gam)
    new["S"] = S
    return p["o_proj"] @ ob.reshape(P), new


def kda_layer_weights(rnd, d, H, dk, W, softplus_gate=False, std=None):
    """Seeded KDA layer weights in the ranges of spec 3.10 (A_log perturbed from 0 and matrices
    scaled 1/sqrt(fan_in) so that every stage sees O(1) values)."""
    P = H * dk
    s = (lambda fan: std if std is not None else fan ** -0.5)
    tau = torch.exp(rnd.uniform(P, lo=math.log(1e-3), hi=math.log(1e-1))).clamp(min=1e-4)
    p = {
        "q_proj": rnd.normal(P, d, std=s(d)), "k_proj": rnd.normal(P, d, std=s(d)),
        "v_proj": rnd.normal(P, d, std=s(d)),
        "q_conv": rnd.uniform(P, W, lo=-W ** -0.5, hi=W ** -0.5),
        "k_conv": rnd.uniform(P, W, lo=-W ** -0.5, hi=W ** -0.5),
        "v_conv": rnd.uniform(P, W, lo=-W ** -0.5, hi=W ** -0.5),
        "f_a": rnd.normal(dk, d, std=s(d)), "f_b": rnd.normal(P, dk, std=s(dk)),
        "dt_bias": r32(tau + torch.log(-torch.expm1(-tau))),
        "A_log": (r32(torch.log(rnd.uniform(H, lo=1.0, hi=16.0))) if softplus_gate
                  else rnd.normal(H, std=0.5)),
        "b_proj": rnd.normal(H, d, std=s(d)), "g_proj": rnd.normal(P, d, std=s(d)),
        "o_norm": rnd.normal(dk, std=0.1, mean=1.0), "o_proj": rnd.normal(d, P, std=s(P)),
    }
    return p


KDA_KEYS = ["q_proj", "k_proj", "v_proj", "q_conv", "k_conv", "v_conv", "f_a", "f_b", "dt_bias",
            "A_log", "b_proj", "g_proj", "o_norm", "o_proj"]
# checkpoint key stems of spec 14.2 where they differ from the short names above
KDA_CKPT = {"f_a": "f_a_proj", "f_b": "f_b_proj"}


# ---------------------------------------------------------------------------------------------
# MLA (spec 4)
# ---------------------------------------------------------------------------------------------

def mla_project(x, p, cfg):
    """Spec 4.1 projections.  Returns q_nope (T, Hm, n), q_pe (T, Hm, r), c (T, rkv),
    k_pe (T, r), k_nope (T, Hm, n), v (T, Hm, vm)."""
    Hm, n, r, vm, rkv = cfg["Hm"], cfg["n"], cfg["r"], cfg["vm"], cfg["rkv"]
    T = x.shape[0]
    cq = rmsnorm(x @ p["q_a_proj"].T, p["q_a_layernorm"], 1e-6)
    qf = (cq @ p["q_b_proj"].T).reshape(T, Hm, n + r)
    ckv = x @ p["kv_a_proj_with_mqa"].T
    c = rmsnorm(ckv[:, :rkv], p["kv_a_layernorm"], 1e-6)
    kpe = ckv[:, rkv:]
    kv = (c @ p["kv_b_proj"].T).reshape(T, Hm, n + vm)
    return qf[:, :, :n], qf[:, :, n:], c, kpe, kv[:, :, :n], kv[:, :, n:]


def mla_core(q_nope, q_pe, k_nope, k_pe, v, cu, scale):
    """Spec 4.1 naive attention with causal + document mask.  Returns o (T, Hm, vm)."""
    outs = []
    for a_, b_ in doc_ranges(cu):
        s = (torch.einsum("thn,shn->hts", q_nope[a_:b_], k_nope[a_:b_]) +
             torch.einsum("thr,sr->hts", q_pe[a_:b_], k_pe[a_:b_])) * scale
        m = b_ - a_
        mask = torch.tril(torch.ones(m, m, dtype=torch.bool))
        s = s.masked_fill(~mask, float("-inf"))
        a = torch.softmax(s, -1)
        outs.append(torch.einsum("hts,shv->thv", a, v[a_:b_]))
    return torch.cat(outs, 0)


def mla_core_bwd(q_nope, q_pe, k_nope, k_pe, v, cu, scale, do):
    """Spec 4.3 per head (Q = [q_nope; q_pe], K = [k_nope; k_pe]); k_pe gradient summed over
    heads.  Returns dq_nope, dq_pe, dk_nope, dk_pe, dv."""
    n = q_nope.shape[2]
    dqn, dqp, dkn, dkp, dv = (torch.zeros_like(q_nope), torch.zeros_like(q_pe),
                              torch.zeros_like(k_nope), torch.zeros_like(k_pe), torch.zeros_like(v))
    Hm = q_nope.shape[1]
    for a_, b_ in doc_ranges(cu):
        m = b_ - a_
        mask = torch.tril(torch.ones(m, m, dtype=torch.bool))
        for h in range(Hm):
            Q = torch.cat([q_nope[a_:b_, h], q_pe[a_:b_, h]], 1)
            K = torch.cat([k_nope[a_:b_, h], k_pe[a_:b_]], 1)
            Z = (scale * Q @ K.T).masked_fill(~mask, float("-inf"))
            A = torch.softmax(Z, -1)
            dO = do[a_:b_, h]
            dv[a_:b_, h] = A.T @ dO
            dA = dO @ v[a_:b_, h].T
            dZ = A * (dA - (dA * A).sum(-1, keepdim=True))
            dQ = scale * dZ @ K
            dK = scale * dZ.T @ Q
            dqn[a_:b_, h] = dQ[:, :n]
            dqp[a_:b_, h] = dQ[:, n:]
            dkn[a_:b_, h] = dK[:, :n]
            dkp[a_:b_] += dK[:, n:]
    return dqn, dqp, dkn, dkp, dv


def mla_absorbed_weights(p, cfg):
    Hm, n, vm, rkv = cfg["Hm"], cfg["n"], cfg["vm"], cfg["rkv"]
    Wkvb = p["kv_b_proj"].reshape(Hm, n + vm, rkv)
    return Wkvb[:, :n, :], Wkvb[:, n:, :]  # W_UK (Hm, n, rkv), W_UV (Hm, vm, rkv)


def mla_absorbed_core(qhat, q_pe, c, k_pe, W_UV, cu, scale, sparse=None):
    """Spec 4.2 (and 4.5 when sparse = (n_c, k_c)).  qhat (T, Hm, rkv), q_pe (T, Hm, r),
    c (T, rkv), k_pe (T, r).  Returns o (T, Hm, vm), ohat (T, Hm, rkv) and, with sparse,
    the selection mask (T, Hm, max_chunks) as int."""
    T, Hm, rkv = qhat.shape
    ohat = torch.zeros(T, Hm, rkv, dtype=qhat.dtype)
    sel_out = None
    if sparse is not None:
        n_c, k_c = sparse
        maxlen = max(b_ - a_ for a_, b_ in doc_ranges(cu))
        sel_out = torch.zeros(T, Hm, (maxlen + n_c - 1) // n_c, dtype=torch.int64)
    for a_, b_ in doc_ranges(cu):
        key = torch.cat([c[a_:b_], k_pe[a_:b_]], 1)  # (m, rkv + r)
        for t in range(a_, b_):
            pos = t - a_
            qq = torch.cat([qhat[t], q_pe[t]], 1)    # (Hm, rkv + r)
            s = (qq @ key[:pos + 1].T) * scale        # (Hm, pos+1)
            if sparse is not None:
                Jt = pos // n_c
                allowed = torch.zeros(Hm, pos + 1, dtype=torch.bool)
                for h in range(Hm):
                    chosen = [Jt]
                    if Jt > 0:
                        summ = torch.stack([key[j * n_c:(j + 1) * n_c].mean(0) for j in range(Jt)])
                        sig = summ @ qq[h]             # (Jt,)
                        order = sorted(range(Jt), key=lambda j: (-sig[j].item(), j))
                        chosen += order[:k_c]
                    for j in chosen:
                        allowed[h, j * n_c:min((j + 1) * n_c, pos + 1)] = True
                        sel_out[t, h, j] = 1
                s = s.masked_fill(~allowed, float("-inf"))
            a = torch.softmax(s, -1)
            ohat[t] = a @ c[a_:a_ + pos + 1]
    o = torch.einsum("hvc,thc->thv", W_UV, ohat)
    return o, ohat, sel_out


def mla_layer(x, p, cfg, cu):
    """Spec 4.1 full layer: y (T, d) and intermediates."""
    Hm, n, r, vm = cfg["Hm"], cfg["n"], cfg["r"], cfg["vm"]
    qn, qp, c, kpe, kn, v = mla_project(x, p, cfg)
    o = mla_core(qn, qp, kn, kpe, v, cu, (n + r) ** -0.5)
    T = x.shape[0]
    gl = x @ p["g_proj"].T
    u = o.reshape(T, Hm * vm)
    y = (torch.sigmoid(gl) * u) @ p["o_proj"].T
    return y, dict(q_nope=qn, q_pe=qp, c=c, k_pe=kpe, k_nope=kn, v=v, o=o, gate_logits=gl)


def mla_layer_decode(x, p, cfg, cache):
    """One absorbed decode step (spec 4.2) for token x (d) over cache {c (m, rkv), k_pe (m, r)}
    (appended in place).  Returns y (d)."""
    Hm, n, r, vm, rkv = cfg["Hm"], cfg["n"], cfg["r"], cfg["vm"], cfg["rkv"]
    cq = rmsnorm(p["q_a_proj"] @ x, p["q_a_layernorm"], 1e-6)
    qf = (p["q_b_proj"] @ cq).reshape(Hm, n + r)
    ckv = p["kv_a_proj_with_mqa"] @ x
    cache["c"] = torch.cat([cache["c"], rmsnorm(ckv[:rkv], p["kv_a_layernorm"], 1e-6)[None]], 0)
    cache["k_pe"] = torch.cat([cache["k_pe"], ckv[rkv:][None]], 0)
    W_UK, W_UV = mla_absorbed_weights(p, cfg)
    qhat = torch.einsum("hnc,hn->hc", W_UK, qf[:, :n])
    s = (qhat @ cache["c"].T + qf[:, n:] @ cache["k_pe"].T) * (n + r) ** -0.5
    ohat = torch.softmax(s, -1) @ cache["c"]
    o = torch.einsum("hvc,hc->hv", W_UV, ohat)
    return p["o_proj"] @ (torch.sigmoid(p["g_proj"] @ x) * o.reshape(Hm * vm))


def mla_weights(rnd, d, cfg):
    Hm, n, r, vm, rq, rkv = cfg["Hm"], cfg["n"], cfg["r"], cfg["vm"], cfg["rq"], cfg["rkv"]
    return {
        "q_a_proj": rnd.normal(rq, d, std=d ** -0.5),
        "q_a_layernorm": rnd.normal(rq, std=0.1, mean=1.0),
        "q_b_proj": rnd.normal(Hm * (n + r), rq, std=rq ** -0.5),
        "kv_a_proj_with_mqa": rnd.normal(rkv + r, d, std=d ** -0.5),
        "kv_a_layernorm": rnd.normal(rkv, std=0.1, mean=1.0),
        "kv_b_proj": rnd.normal(Hm * (n + vm), rkv, std=rkv ** -0.5),
        "g_proj": rnd.normal(Hm * vm, d, std=d ** -0.5),
        "o_proj": rnd.normal(d, Hm * vm, std=(Hm * vm) ** -0.5),
    }


MLA_KEYS = ["q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm",
            "kv_b_proj", "g_proj", "o_proj"]


# ---------------------------------------------------------------------------------------------
# AttnRes (spec 5)
# ---------------------------------------------------------------------------------------------

def attnres_mix(V, w_norm, w_proj, eps):
    """Spec 5.1.  V (N, T, d) sources; returns Mix (T, d) and the weights a (N, T)."""
    w = w_norm * w_proj
    kappa = V * torch.rsqrt((V * V).mean(-1, keepdim=True) + eps)
    z = (kappa * w).sum(-1)          # (N, T)
    a = torch.softmax(z, 0)
    return (a[:, :, None] * V).sum(0), a


def attnres_mix_bwd(V, w_norm, w_proj, eps, dh):
    """Spec 5.3.  Returns dV (N, T, d), dw_norm, dw_proj."""
    d = V.shape[-1]
    w = w_norm * w_proj
    rho = torch.rsqrt((V * V).mean(-1, keepdim=True) + eps)
    kappa = V * rho
    z = (kappa * w).sum(-1)
    a = torch.softmax(z, 0)
    da = (dh[None] * V).sum(-1)
    dz = a * (da - (a * da).sum(0, keepdim=True))
    dV = a[:, :, None] * dh[None] + dz[:, :, None] * rho * (w - z[:, :, None] * kappa / d)
    dw = (dz[:, :, None] * kappa).sum((0, 1))
    return dV, dw * w_proj, dw * w_norm


# ---------------------------------------------------------------------------------------------
# Router, LatentMoE (spec 6, 7)
# ---------------------------------------------------------------------------------------------

def topk_lower_index(vals, k):
    """Top-k per row, ties toward the lower index; indices in descending value order."""
    idx = torch.sort(-vals, dim=-1, stable=True).indices[..., :k]
    return idx


def router_fwd(x, Wr, b, k, rho, forced=None):
    """Spec 6.1.  x (T, d); Wr (E, d); b (E).  Returns sel (T, k) (descending s+b order unless
    forced), weights p (T, k), s (T, E), dense p (T, E)."""
    ell = x @ Wr.T
    s = torch.sigmoid(ell)
    sel = forced if forced is not None else topk_lower_index((s + b).detach(), k)
    ssel = torch.gather(s, 1, sel)
    p = rho * ssel / (ssel.sum(-1, keepdim=True) + 1e-20)
    dense = torch.zeros_like(s).scatter(1, sel, p)
    return sel, p, s, dense


def router_bwd(x, Wr, s, sel, rho, dp):
    """Spec 6.2.  dp (T, k) aligned with sel.  Returns dWr, dx."""
    ssel = torch.gather(s, 1, sel)
    Z = ssel.sum(-1, keepdim=True)
    p = rho * ssel / (Z + 1e-20)
    dsel = (rho * dp - (p * dp).sum(-1, keepdim=True)) / Z
    ds = torch.zeros_like(s).scatter(1, sel, dsel)
    dl = ds * s * (1 - s)
    return dl.T @ x, dl @ Wr


def topk_gap(vals, k):
    """Smallest gap between the k-th and (k+1)-th largest value of any row."""
    sv = torch.sort(vals, dim=-1, descending=True).values
    return (sv[..., k - 1] - sv[..., k]).min().item()


def moe_fwd(x, p, cfg, forced=None):
    """Spec 7.1 Stable LatentMoE with shared experts.  x (T, d) normalised FFN input.  Experts
    are evaluated for every token and weighted by the dense p (exactly 0 off the routes), which
    gives the same values and gradients as the grouped execution of spec 7.2."""
    E, k, rho = cfg["E"], cfg["k"], cfg["rho"]
    b1, b2 = cfg["b1"], cfg["b2"]
    sel, pw, s, dense = router_fwd(x, p["gate"], p["bias"], k, rho, forced)
    z = x @ p["down"].T
    u = torch.zeros(x.shape[0], z.shape[1], dtype=x.dtype)
    for e in range(E):
        u = u + dense[:, e:e + 1] * glu(z, p["w1"][e], p["w3"][e], p["w2"][e], b1, b2)
    un = rmsnorm(u, p["znorm"], cfg["eps"]) if cfg.get("use_norm", True) else u
    y = un @ p["up"].T
    if "sh_gate" in p:
        y = y + glu(x, p["sh_gate"], p["sh_up"], p["sh_down"], b1, b2)
    return y, dict(sel=sel, p=pw, s=s, z=z, u=u)


def moe_bwd(x, p, cfg, dy, forced=None):
    """Spec 7.3 (with 6.2 and 3.9), experts grouped by route as in spec 7.2.  Returns dx and a
    dict of weight gradients."""
    E, k, rho, eps = cfg["E"], cfg["k"], cfg["rho"], cfg["eps"]
    b1, b2 = cfg["b1"], cfg["b2"]
    use_norm = cfg.get("use_norm", True)
    _, info = moe_fwd(x, p, cfg, forced)
    sel, pw, s, z, u = info["sel"], info["p"], info["s"], info["z"], info["u"]
    gr = {}
    dx = torch.zeros_like(x)
    if "sh_gate" in p:
        dxs, gr["sh_gate"], gr["sh_up"], gr["sh_down"] = glu_bwd(x, p["sh_gate"], p["sh_up"],
                                                                 p["sh_down"], dy, b1, b2)
        dx += dxs
    un = rmsnorm(u, p["znorm"], eps) if use_norm else u
    gr["up"] = dy.T @ un
    dun = dy @ p["up"]
    if use_norm:
        du, gr["znorm"] = rmsnorm_bwd(u, p["znorm"], eps, dun)
    else:
        du = dun
    dz = torch.zeros_like(z)
    dp = torch.zeros_like(pw)
    gr["w1"] = torch.zeros_like(p["w1"])
    gr["w3"] = torch.zeros_like(p["w3"])
    gr["w2"] = torch.zeros_like(p["w2"])
    for e in range(E):
        rows, slot = torch.nonzero(sel == e, as_tuple=True)
        if rows.numel() == 0:
            continue  # an expert without tokens is skipped (spec 7.2)
        ze = z[rows]
        Ee = glu(ze, p["w1"][e], p["w3"][e], p["w2"][e], b1, b2)
        dp[rows, slot] = (Ee * du[rows]).sum(-1)
        dEe = pw[rows, slot][:, None] * du[rows]
        dze, gr["w1"][e], gr["w3"][e], gr["w2"][e] = glu_bwd(ze, p["w1"][e], p["w3"][e],
                                                             p["w2"][e], dEe, b1, b2)
        dz.index_add_(0, rows, dze)
    gr["gate"], dxr = router_bwd(x, p["gate"], s, sel, rho, dp)
    gr["down"] = dz.T @ x
    dx += dz @ p["down"] + dxr
    return dx, gr


def moe_weights(rnd, d, E, f, dz, fs, bias_std=0.1):
    return {
        "gate": rnd.normal(E, d, std=d ** -0.5), "bias": rnd.normal(E, std=bias_std),
        "down": rnd.normal(dz, d, std=d ** -0.5), "znorm": rnd.normal(dz, std=0.1, mean=1.0),
        "up": rnd.normal(d, dz, std=dz ** -0.5),
        "w1": rnd.normal(E, f, dz, std=dz ** -0.5), "w3": rnd.normal(E, f, dz, std=dz ** -0.5),
        "w2": rnd.normal(E, dz, f, std=f ** -0.5),
        "sh_gate": rnd.normal(fs, d, std=d ** -0.5), "sh_up": rnd.normal(fs, d, std=d ** -0.5),
        "sh_down": rnd.normal(d, fs, std=fs ** -0.5),
    }


# ---------------------------------------------------------------------------------------------
# Quantile Balancing (spec 9)
# ---------------------------------------------------------------------------------------------

def route_loads(s, b, k):
    sel = topk_lower_index(s + b, k)
    return torch.bincount(sel.reshape(-1), minlength=s.shape[1])


def quantile_linear(col, level):
    """Spec 9.2 step 3: linear-interpolated quantile of a vector at level in [0, 1]."""
    r = torch.sort(col).values
    m = r.shape[0]
    pi = (m - 1) * level
    phi = int(math.floor(pi))
    lam = pi - phi
    if phi + 1 >= m:
        return r[m - 1]
    return r[phi] + lam * (r[phi + 1] - r[phi])


def qb_required_bias(s, b_old, k):
    sv = torch.sort(s + b_old, dim=-1, descending=True).values
    alpha = sv[:, k]                     # (k+1)-th largest
    return alpha, alpha[:, None] - s     # r_ij


def qb_exact(s, b_old, k):
    m, E = s.shape
    alpha, r = qb_required_bias(s, b_old, k)
    bhat = torch.stack([quantile_linear(r[:, j], k / E) for j in range(E)])
    check("qb_exact: spec 9.2 quantile == torch.quantile",
          bhat, torch.quantile(r, k / E, dim=0, interpolation="linear"))
    return alpha, r, bhat, bhat - bhat.mean()


def qb_hist(s, b_old, k, Nb):
    m, E = s.shape
    _, r = qb_required_bias(s, b_old, k)
    lo = b_old.min() - 1
    hi = b_old.max() + 1
    w = (hi - lo) / Nb
    if not ((r > lo).all() and (r < hi).all()):
        raise CheckFailed("qb_hist: r outside (lo, hi)")
    bins = torch.clamp(torch.floor((r - lo) / w).long(), 0, Nb - 1)
    cnt = torch.zeros(E, Nb, dtype=torch.int64)
    for j in range(E):
        cnt[j] = torch.bincount(bins[:, j], minlength=Nb)
    q = m * k / E
    bhat = torch.zeros(E)
    for j in range(E):
        C = torch.cumsum(cnt[j], 0)
        t = int(torch.nonzero(C >= q)[0])
        Cprev = C[t - 1].item() if t > 0 else 0
        lam = min(max((q - Cprev) / max(cnt[j, t].item(), 1), 0.0), 1.0)
        bhat[j] = lo + (t + lam) * w
    return cnt, bhat, bhat - bhat.mean(), (lo, hi, w, hist_margin(r, cnt, lo, w, q))


def hist_margin(r, cnt, lo, w, q):
    """Smallest distance of any r to the two edges of its expert's quantile bin t*: only
    values crossing those edges change b_hat, so this bounds the rounding an fp32
    implementation may make without changing its counts there."""
    m = float("inf")
    for j in range(r.shape[1]):
        t = int(torch.nonzero(torch.cumsum(cnt[j], 0) >= q)[0])
        for edge in (lo + t * w, lo + (t + 1) * w):
            m = min(m, (r[:, j] - edge).abs().min().item())
    return m


def qb_band(s, b_old, k, lam_lo, lam_hi):
    m, E = s.shape
    _, r = qb_required_bias(s, b_old, k)
    qbar = m * k / E
    qmin = (1 - lam_lo) * qbar
    qmax = (1 + lam_hi) * qbar
    load = route_loads(s, b_old, k)
    bhat = torch.zeros(E)
    for j in range(E):
        if qmin <= load[j] <= qmax:
            bhat[j] = b_old[j]
        else:
            qj = min(max(float(load[j]), qmin), qmax)
            bhat[j] = quantile_linear(r[:, j], qj / m)
    return load, bhat, bhat - bhat.mean(), (qmin, qmax)


# ---------------------------------------------------------------------------------------------
# Vision front end (spec 10.3, tiny sizes)
# ---------------------------------------------------------------------------------------------

def bilinear_resize(grid, h, w):
    """grid (G_h, G_w, D) -> (h, w, D); bilinear, half-pixel centres (align_corners = False),
    source coordinates below 0 clamped to 0, as torch's interpolate(mode='bilinear')."""
    Gh, Gw, D = grid.shape

    def coords(n_out, n_in):
        res = []
        for o in range(n_out):
            src = (o + 0.5) * (n_in / n_out) - 0.5
            src = max(src, 0.0)
            i0 = int(math.floor(src))
            i1 = min(i0 + 1, n_in - 1)
            res.append((i0, i1, src - i0))
        return res

    ys, xs = coords(h, Gh), coords(w, Gw)
    out = []
    for (y0, y1, ly) in ys:
        row = []
        for (x0, x1, lx) in xs:
            row.append((1 - ly) * ((1 - lx) * grid[y0, x0] + lx * grid[y0, x1]) +
                       ly * ((1 - lx) * grid[y1, x0] + lx * grid[y1, x1]))
        out.append(torch.stack(row))
    return torch.stack(out)


def rope2d(x, rows, cols):
    """Spec 10.2 RoPE2D over the last axis (head dim D): pairs (4i, 4i+1) by col*theta_i,
    (4i+2, 4i+3) by row*theta_i, theta_i = 10000^(-4i/D).  x (N, heads, D)."""
    D = x.shape[-1]
    i = torch.arange(D // 4, dtype=F64)
    theta = 10000.0 ** (-4 * i / D)
    out = x.clone()
    for which, pos in ((0, cols), (2, rows)):
        ang = pos[:, None].to(F64) * theta[None]           # (N, D/4)
        cs, sn = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
        a = x[..., which::4]
        b = x[..., which + 1::4]
        out[..., which::4] = a * cs - b * sn
        out[..., which + 1::4] = a * sn + b * cs
    return out


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def vision_front(patches, grids, vw, vc, d):
    """Spec 10.2/10.3: patches (N_p, 3, p, p) of images with patch grids [(h, w)] (row-major,
    image after image) -> merged tokens (sum h*w/4, d) and intermediates."""
    D = vc["vt_hidden_size"]
    nh = vc["vt_num_attention_heads"]
    Qd = vc["qkv_hidden_size"]
    hd = Qd // nh
    Np = patches.shape[0]
    x = patches.reshape(Np, -1) @ vw["vision_tower.patch_embed.proj.weight"].reshape(D, -1).T
    pos_all, rows, cols = [], [], []
    for (h, w) in grids:
        G = vw["vision_tower.patch_embed.pos_emb.weight"]
        pe = G if (h, w) == tuple(G.shape[:2]) else bilinear_resize(G, h, w)
        pos_all.append(pe.reshape(h * w, D))
        rows += [y for y in range(h) for _ in range(w)]
        cols += [xx for _ in range(h) for xx in range(w)]
    x = x + torch.cat(pos_all, 0)
    x_embed = x
    rows = torch.tensor(rows)
    cols = torch.tensor(cols)
    cu = [0]
    for (h, w) in grids:
        cu.append(cu[-1] + h * w)
    for bi in range(vc["vt_num_hidden_layers"]):
        pre = "vision_tower.encoder.blocks.%d." % bi
        hN = rmsnorm(x, vw[pre + "norm0.weight"], 1e-6)
        qkv = hN @ vw[pre + "wqkv.weight"].T
        q = rope2d(qkv[:, :Qd].reshape(Np, nh, hd), rows, cols)
        k = rope2d(qkv[:, Qd:2 * Qd].reshape(Np, nh, hd), rows, cols)
        v = qkv[:, 2 * Qd:].reshape(Np, nh, hd)
        att = []
        for a_, b_ in doc_ranges(cu):  # bidirectional within each image
            s = torch.einsum("thd,shd->hts", q[a_:b_], k[a_:b_]) * hd ** -0.5
            att.append(torch.einsum("hts,shd->thd", torch.softmax(s, -1), v[a_:b_]))
        x = x + torch.cat(att, 0).reshape(Np, Qd) @ vw[pre + "wo.weight"].T
        hN = rmsnorm(x, vw[pre + "norm1.weight"], 1e-6)
        x = x + gelu_tanh(hN @ vw[pre + "mlp.fc0.weight"].T) @ vw[pre + "mlp.fc1.weight"].T
    x = rmsnorm(x, vw["vision_tower.encoder.final_layernorm.weight"], 1e-6)
    tower = x
    merged = []
    for (h, w), a_ in zip(grids, cu[:-1]):
        g = x[a_:a_ + h * w].reshape(h, w, D)
        for yy in range(h // 2):
            for xx in range(w // 2):
                merged.append(torch.cat([g[2 * yy, 2 * xx], g[2 * yy, 2 * xx + 1],
                                         g[2 * yy + 1, 2 * xx], g[2 * yy + 1, 2 * xx + 1]]))
    merged = torch.stack(merged)
    hproj = gelu_erf(merged @ vw["mm_projector.proj.0.weight"].T)
    out = rmsnorm(hproj @ vw["mm_projector.proj.2.weight"].T, vw["mm_projector.post_norm.weight"],
                  vc["projector_ln_eps"])
    return out, dict(embed=x_embed, tower=tower, merged=merged, cu=cu)


def vision_weights(rnd, vc, d):
    D, Qd, Fv = vc["vt_hidden_size"], vc["qkv_hidden_size"], vc["vt_intermediate_size"]
    p, G = vc["patch_size"], vc["init_pos_emb_height"]
    w = OrderedDict()
    w["vision_tower.patch_embed.proj.weight"] = rnd.normal(D, 3, p, p, std=(3 * p * p) ** -0.5)
    w["vision_tower.patch_embed.pos_emb.weight"] = rnd.normal(G, G, D, std=0.5)
    for bi in range(vc["vt_num_hidden_layers"]):
        pre = "vision_tower.encoder.blocks.%d." % bi
        w[pre + "norm0.weight"] = rnd.normal(D, std=0.1, mean=1.0)
        w[pre + "norm1.weight"] = rnd.normal(D, std=0.1, mean=1.0)
        w[pre + "wqkv.weight"] = rnd.normal(3 * Qd, D, std=D ** -0.5)
        w[pre + "wo.weight"] = rnd.normal(D, Qd, std=Qd ** -0.5)
        w[pre + "mlp.fc0.weight"] = rnd.normal(Fv, D, std=D ** -0.5)
        w[pre + "mlp.fc1.weight"] = rnd.normal(D, Fv, std=Fv ** -0.5)
    w["vision_tower.encoder.final_layernorm.weight"] = rnd.normal(D, std=0.1, mean=1.0)
    w["mm_projector.proj.0.weight"] = rnd.normal(4 * D, 4 * D, std=(4 * D) ** -0.5)
    w["mm_projector.proj.2.weight"] = rnd.normal(d, 4 * D, std=(4 * D) ** -0.5)
    w["mm_projector.post_norm.weight"] = rnd.normal(d, std=0.1, mean=1.0)
    return w


def image_patches(img, p):
    """img (H, W, 3) uint8 -> normalised patches (h*w, 3, p, p), row-major patch order,
    pixel value (x/255 - 0.5)/0.5 (spec 10.1)."""
    Hh, Ww, _ = img.shape
    x = (img.to(F64) / 255.0 - 0.5) / 0.5
    h, w = Hh // p, Ww // p
    return x.reshape(h, p, w, p, 3).permute(0, 2, 4, 1, 3).reshape(h * w, 3, p, p)


# ---------------------------------------------------------------------------------------------
# AttnRes stack with linear sublayers (spec 5.2 / 5.4), for the attnres_stack case
# ---------------------------------------------------------------------------------------------

def stack_forward(P_, h0, L, B, eps, record=False):
    """Spec 5.2 with Mixer_l(x) = x A_l^T and FFN_l(x) = x F_l^T (token rows); y is the
    final norm of the last mix."""
    mix = lambda src, wn, wp: attnres_mix(torch.stack(src), wn, wp, eps)[0]
    blocks, p = [], h0
    rec = []
    for l in range(L):
        r = {}
        if not blocks:
            h = p
            r["srcA"] = None
        else:
            r["srcA"] = blocks + [p]
            h = mix(r["srcA"], P_["attn_norm"][l], P_["attn_proj"][l])
        r["h"] = h
        if l % B == 0:
            blocks = blocks + [p]
            p = torch.zeros_like(p)
        r["xin"] = rmsnorm(h, P_["in_norm"][l], eps)
        p = p + r["xin"] @ P_["A"][l].T
        r["srcF"] = blocks + [p]
        r["m"] = mix(r["srcF"], P_["ffn_norm"][l], P_["ffn_proj"][l])
        r["xf"] = rmsnorm(r["m"], P_["post_norm"][l], eps)
        p = p + r["xf"] @ P_["F"][l].T
        rec.append(r)
    srcO = blocks + [p]
    out = mix(srcO, P_["out_norm"], P_["out_proj"])
    y = rmsnorm(out, P_["final_norm"], eps)
    if record:
        return y, rec, srcO, out
    return y


def stack_backward(P_, h0, L, B, eps, dy):
    """Spec 5.4 bookkeeping with the analytic Mix (5.3) and RMSNorm (3.9) backward."""
    y, rec, srcO, out = stack_forward(P_, h0, L, B, eps, record=True)
    G = {k: [torch.zeros_like(t) for t in v] if isinstance(v, list) else None
         for k, v in P_.items()}
    dout, G["final_norm"] = rmsnorm_bwd(out, P_["final_norm"], eps, dy)
    dV, G["out_norm"], G["out_proj"] = attnres_mix_bwd(torch.stack(srcO), P_["out_norm"],
                                                       P_["out_proj"], eps, dout)
    d_blocks = [dV[j] for j in range(len(srcO) - 1)]
    dp = dV[-1]
    for l in range(L - 1, -1, -1):
        r = rec[l]
        G["F"][l] = dp.T @ r["xf"]                       # dFFN_out = dp
        dm, G["post_norm"][l] = rmsnorm_bwd(r["m"], P_["post_norm"][l], eps, dp @ P_["F"][l])
        dV, G["ffn_norm"][l], G["ffn_proj"][l] = attnres_mix_bwd(
            torch.stack(r["srcF"]), P_["ffn_norm"][l], P_["ffn_proj"][l], eps, dm)
        for j in range(len(r["srcF"]) - 1):
            d_blocks[j] = d_blocks[j] + dV[j]
        dp = dp + dV[-1]
        G["A"][l] = dp.T @ r["xin"]                      # dMixer_out = dp
        dh, G["in_norm"][l] = rmsnorm_bwd(r["h"], P_["in_norm"][l], eps, dp @ P_["A"][l])
        if l % B == 0:
            dp = d_blocks.pop()
        if r["srcA"] is None:
            dp = dp + dh
        else:
            dV, G["attn_norm"][l], G["attn_proj"][l] = attnres_mix_bwd(
                torch.stack(r["srcA"]), P_["attn_norm"][l], P_["attn_proj"][l], eps, dh)
            for j in range(len(r["srcA"]) - 1):
                d_blocks[j] = d_blocks[j] + dV[j]
            dp = dp + dV[-1]
    assert not d_blocks
    return dp, G


# ---------------------------------------------------------------------------------------------
# The tiny model (spec 2, 12.3, 14.2)
# ---------------------------------------------------------------------------------------------

TINY_TEXT = {
    "vocab_size": 384, "hidden_size": 128, "num_hidden_layers": 8, "intermediate_size": 384,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_attention_heads": 2,
    "num_key_value_heads": 2, "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16, "v_head_dim": 64, "mla_use_nope": True, "mla_use_output_gate": True,
    "linear_attn_config": {"head_dim": 64, "num_heads": 2, "short_conv_kernel_size": 4,
                           "gate_lower_bound": -5.0, "use_full_rank_gate": True,
                           "full_attn_layers": [4, 8], "kda_layers": [1, 2, 3, 5, 6, 7]},
    "num_experts": 16, "num_experts_per_token": 4, "num_shared_experts": 2,
    "moe_intermediate_size": 64, "routed_expert_hidden_size": 64, "latent_moe_use_norm": True,
    "routed_scaling_factor": 1.0, "hidden_act": "situ", "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0, "attn_res_block_size": 3, "rms_norm_eps": 1e-5,
    "bos_token_id": 256, "eos_token_id": 257, "pad_token_id": 258,
}
TINY_VISION = {
    "patch_size": 14, "init_pos_emb_height": 16, "init_pos_emb_width": 16,
    "vt_hidden_size": 64, "vt_num_hidden_layers": 1, "vt_num_attention_heads": 2,
    "qkv_hidden_size": 64, "vt_intermediate_size": 128, "mm_hidden_size": 64,
    "projector_ln_eps": 1e-5, "text_hidden_size": 128, "merge_kernel_size": [2, 2],
}


def load_tiny_config(root):
    """The tiny config of spec 12.3; when configs/tiny/config.json exists its values must agree."""
    path = os.path.join(root, "configs", "tiny", "config.json")
    if os.path.exists(path):
        with open(path) as f:
            cj = json.load(f)
        tc, vc = cj.get("text_config", {}), cj.get("vision_config", {})
        for src, ref in ((tc, TINY_TEXT), (vc, TINY_VISION)):
            for key, val in ref.items():
                if key in src and src[key] != val:
                    raise CheckFailed("%s: field %s = %r, spec 12.3 (and this generator) say %r"
                                      % (path, key, src[key], val))
        return "configs/tiny/config.json (checked against spec 12.3)"
    return "inline values of spec 12.3 (configs/tiny/config.json absent)"


def tiny_dims(tc):
    la = tc["linear_attn_config"]
    return dict(
        V=tc["vocab_size"], d=tc["hidden_size"], L=tc["num_hidden_layers"],
        fd=tc["intermediate_size"], first_dense=tc["first_k_dense_replace"],
        mla_layers=[i - 1 for i in la["full_attn_layers"]], B=tc["attn_res_block_size"],
        eps=tc["rms_norm_eps"],
        kda=dict(H=la["num_heads"], dk=la["head_dim"], W=la["short_conv_kernel_size"],
                 g_min=la["gate_lower_bound"], eps=tc["rms_norm_eps"]),
        mla=dict(Hm=tc["num_attention_heads"], n=tc["qk_nope_head_dim"], r=tc["qk_rope_head_dim"],
                 vm=tc["v_head_dim"], rq=tc["q_lora_rank"], rkv=tc["kv_lora_rank"]),
        moe=dict(E=tc["num_experts"], k=tc["num_experts_per_token"],
                 rho=tc["routed_scaling_factor"], eps=tc["rms_norm_eps"],
                 b1=tc["activation_situ_beta"], b2=tc["activation_situ_linear_beta"],
                 f=tc["moe_intermediate_size"], dz=tc["routed_expert_hidden_size"],
                 fs=tc["num_shared_experts"] * tc["moe_intermediate_size"], use_norm=True))


LM = "language_model.model."


def tiny_weights(rnd, dm, vc):
    """Seeded tiny-model weights under the keys of spec 14.2 (float64 tensors holding float32
    values).  Ranges: matrices N(0, 1/fan_in) so every stage sees O(1) activations (spec 12.5
    uses 0.02, which would make most stages nearly linear), norm weights 1 + N(0, 0.1^2),
    AttnRes projections N(0, 0.05^2), KDA per spec 3.10 with A_log ~ N(0, 0.5^2), router bias
    N(0, 0.1^2)."""
    d, L, V = dm["d"], dm["L"], dm["V"]
    kc, mc, ec = dm["kda"], dm["mla"], dm["moe"]
    w = OrderedDict()
    w[LM + "embed_tokens.weight"] = rnd.normal(V, d)
    for l in range(L):
        pre = LM + "layers.%d." % l
        w[pre + "input_layernorm.weight"] = rnd.normal(d, std=0.1, mean=1.0)
        w[pre + "post_attention_layernorm.weight"] = rnd.normal(d, std=0.1, mean=1.0)
        w[pre + "self_attention_res_norm.weight"] = rnd.normal(d, std=0.1, mean=1.0)
        w[pre + "self_attention_res_proj.weight"] = rnd.normal(1, d, std=0.05)
        w[pre + "mlp_res_norm.weight"] = rnd.normal(d, std=0.1, mean=1.0)
        w[pre + "mlp_res_proj.weight"] = rnd.normal(1, d, std=0.05)
        if l in dm["mla_layers"]:
            for key, t in mla_weights(rnd, d, mc).items():
                w[pre + "self_attn." + key + ("" if key.endswith("weight") else ".weight")] = t
        else:
            kp = kda_layer_weights(rnd, d, kc["H"], kc["dk"], kc["W"])
            P = kc["H"] * kc["dk"]
            for key in KDA_KEYS:
                t = kp[key]
                if key.endswith("_conv"):
                    w[pre + "self_attn." + key + "1d.weight"] = t.reshape(P, 1, kc["W"])
                elif key == "A_log":
                    pad = ((kc["H"] + 127) // 128) * 128
                    w[pre + "self_attn.A_log"] = torch.cat([t, torch.zeros(pad - kc["H"])])
                elif key == "dt_bias":
                    w[pre + "self_attn.dt_bias"] = t
                else:
                    w[pre + "self_attn." + KDA_CKPT.get(key, key) + ".weight"] = t
        if l < dm["first_dense"]:
            w[pre + "mlp.gate_proj.weight"] = rnd.normal(dm["fd"], d, std=d ** -0.5)
            w[pre + "mlp.up_proj.weight"] = rnd.normal(dm["fd"], d, std=d ** -0.5)
            w[pre + "mlp.down_proj.weight"] = rnd.normal(d, dm["fd"], std=dm["fd"] ** -0.5)
        else:
            mw = moe_weights(rnd, d, ec["E"], ec["f"], ec["dz"], ec["fs"])
            mp = pre + "block_sparse_moe."
            w[mp + "gate.weight"] = mw["gate"]
            w[mp + "gate.e_score_correction_bias"] = mw["bias"]
            w[mp + "routed_expert_down_proj.weight"] = mw["down"]
            w[mp + "routed_expert_norm.weight"] = mw["znorm"]
            w[mp + "routed_expert_up_proj.weight"] = mw["up"]
            w[mp + "shared_experts.gate_proj.weight"] = mw["sh_gate"]
            w[mp + "shared_experts.up_proj.weight"] = mw["sh_up"]
            w[mp + "shared_experts.down_proj.weight"] = mw["sh_down"]
            for e in range(ec["E"]):
                w[mp + "experts.%d.w1.weight" % e] = mw["w1"][e]
                w[mp + "experts.%d.w3.weight" % e] = mw["w3"][e]
                w[mp + "experts.%d.w2.weight" % e] = mw["w2"][e]
    w[LM + "norm.weight"] = rnd.normal(d, std=0.1, mean=1.0)
    w[LM + "output_attn_res_norm.weight"] = rnd.normal(d, std=0.1, mean=1.0)
    w[LM + "output_attn_res_proj.weight"] = rnd.normal(1, d, std=0.05)
    w["language_model.lm_head.weight"] = rnd.normal(V, d, std=d ** -0.5)
    for key, t in vision_weights(rnd, vc, d).items():
        w[key] = t
    return w


def tiny_layer_params(w, dm, l):
    pre = LM + "layers.%d.self_attn." % l
    if l in dm["mla_layers"]:
        return {key: w[pre + key + ".weight"] for key in MLA_KEYS}
    kc = dm["kda"]
    P = kc["H"] * kc["dk"]
    p = {}
    for key in KDA_KEYS:
        if key.endswith("_conv"):
            p[key] = w[pre + key + "1d.weight"].reshape(P, kc["W"])
        elif key == "A_log":
            p[key] = w[pre + "A_log"][:kc["H"]]
        elif key == "dt_bias":
            p[key] = w[pre + "dt_bias"]
        else:
            p[key] = w[pre + KDA_CKPT.get(key, key) + ".weight"]
    return p


def tiny_moe_params(w, dm, l):
    mp = LM + "layers.%d.block_sparse_moe." % l
    E = dm["moe"]["E"]
    return {
        "gate": w[mp + "gate.weight"], "bias": w[mp + "gate.e_score_correction_bias"],
        "down": w[mp + "routed_expert_down_proj.weight"],
        "znorm": w[mp + "routed_expert_norm.weight"], "up": w[mp + "routed_expert_up_proj.weight"],
        "sh_gate": w[mp + "shared_experts.gate_proj.weight"],
        "sh_up": w[mp + "shared_experts.up_proj.weight"],
        "sh_down": w[mp + "shared_experts.down_proj.weight"],
        "w1": torch.stack([w[mp + "experts.%d.w1.weight" % e] for e in range(E)]),
        "w3": torch.stack([w[mp + "experts.%d.w3.weight" % e] for e in range(E)]),
        "w2": torch.stack([w[mp + "experts.%d.w2.weight" % e] for e in range(E)]),
    }


def tiny_forward(w, dm, tokens, cu, decode_state=None, want_state=False, stats=None):
    """Spec 2.1 + 5.2 text forward.  Prefill: tokens (T,), documents cu.  Decode: one token and
    decode_state (a per-layer list, updated in place).  Returns logits (T, V) [and the state
    after the batch's last document when want_state]."""
    L, B, eps = dm["L"], dm["B"], dm["eps"]
    decode = decode_state is not None
    mix = (lambda src, key: attnres_mix(torch.stack(src), w[key + "_norm.weight"],
                                        w[key + "_proj.weight"].reshape(-1), eps)[0])
    h0 = w[LM + "embed_tokens.weight"][tokens]
    blocks, p = [], h0
    state_out = [None] * L
    for l in range(L):
        pre = LM + "layers.%d." % l
        h = p if not blocks else mix(blocks + [p], pre + "self_attention_res")
        if l % B == 0:
            blocks = blocks + [p]
            p = torch.zeros_like(p)
        xin = rmsnorm(h, w[pre + "input_layernorm.weight"], eps)
        lp = tiny_layer_params(w, dm, l)
        if l in dm["mla_layers"]:
            if decode:
                y = mla_layer_decode(xin[0], lp, dm["mla"], decode_state[l])[None]
            else:
                y, inter = mla_layer(xin, lp, dm["mla"], cu)
                a_, b_ = cu[-2], cu[-1]
                state_out[l] = {"c": inter["c"][a_:b_].detach(), "k_pe": inter["k_pe"][a_:b_].detach()}
        else:
            if decode:
                y0, decode_state[l] = kda_layer_decode(xin[0], lp, dm["kda"], decode_state[l])
                y = y0[None]
            else:
                y, finals, _ = kda_layer(xin, lp, dm["kda"], cu)
                state_out[l] = {k_: v_.detach() for k_, v_ in finals[-1].items()}
        p = p + y
        m = mix(blocks + [p], pre + "mlp_res")
        xf = rmsnorm(m, w[pre + "post_attention_layernorm.weight"], eps)
        if l < dm["first_dense"]:
            y = glu(xf, w[pre + "mlp.gate_proj.weight"], w[pre + "mlp.up_proj.weight"],
                    w[pre + "mlp.down_proj.weight"], dm["moe"]["b1"], dm["moe"]["b2"])
        else:
            mp = tiny_moe_params(w, dm, l)
            y, info = moe_fwd(xf, mp, dm["moe"])
            if stats is not None:
                sb = (info["s"] + mp["bias"]).detach()
                stats["min_gap"] = min(stats.get("min_gap", 1.0), topk_gap(sb, dm["moe"]["k"]))
                stats.setdefault("routes", []).append(info["sel"].detach())
        p = p + y
    out = mix(blocks + [p], LM + "output_attn_res")
    logits = rmsnorm(out, w[LM + "norm.weight"], eps) @ w["language_model.lm_head.weight"].T
    if want_state:
        return logits, state_out
    return logits


def tiny_param_count(w, dm, text_only=True):
    n = 0
    for key, t in w.items():
        is_text = key.startswith("language_model.")
        if key.endswith("A_log"):
            n += dm["kda"]["H"] if text_only else 0
            continue
        if is_text == text_only:
            n += t.numel()
    return n


# ---------------------------------------------------------------------------------------------
# cases (spec 16.2)
# ---------------------------------------------------------------------------------------------

G_MIN = -5.0


def kda_core_inputs(seed, T, H, dk, dv):
    """Inputs of the KDA core in the ranges of spec 16.3: unit-norm q, k; g spanning
    (g_min, 0); beta across (0, 1); a non-zero initial state."""
    rnd = Rand(seed)
    return dict(
        q=rnd.unit_rows(T, H, dk), k=rnd.unit_rows(T, H, dk), v=rnd.normal(T, H, dv),
        g=r32(G_MIN * torch.sigmoid(torch.randn(T, H, dk, generator=rnd.g) * 2.5)),
        beta=r32(torch.sigmoid(torch.randn(T, H, generator=rnd.g) * 2.0)),
        h0=rnd.normal(1, H, dk, dv, std=0.5),
        do=rnd.normal(T, H, dv), dht=rnd.normal(1, H, dk, dv))


KDA_CORE = dict(seed=101, T=100, H=2, dk=32, dv=16)
_kda_core_cache = {}


def kda_core_reference():
    """Recurrent reference + autograd gradients, shared by kda_recurrent and kda_chunk_*."""
    if _kda_core_cache:
        return _kda_core_cache
    c = KDA_CORE
    x = kda_core_inputs(c["seed"], c["T"], c["H"], c["dk"], c["dv"])
    scale = c["dk"] ** -0.5
    ins = [leaf(x[n]) for n in ("q", "k", "v", "g", "beta", "h0")]
    o, ST = kda_recurrent(*ins, scale)
    grads = grads_of([(o, x["do"]), (ST, x["dht"])], ins)
    _kda_core_cache.update(x=x, scale=scale, o=o.detach(), ST=ST.detach(),
                           grads=dict(zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads)))
    return _kda_core_cache


def put_kda_core_inputs(cs, x):
    for n in ("q", "k", "v", "g", "beta", "do"):
        cs.f(n, x[n])
    cs.f("h0", x["h0"][0])
    cs.f("dht", x["dht"][0])


def case_kda_recurrent():
    c = KDA_CORE
    R = kda_core_reference()
    x = R["x"]
    an = kda_recurrent_bwd(x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"], R["scale"],
                           x["do"], x["dht"])
    for nm, a in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), an):
        check("kda_recurrent: spec 3.7 %s vs autograd" % nm, a, R["grads"][nm])
    cs = Case("kda_recurrent", c["seed"], dict(T=c["T"], H=c["H"], dk=c["dk"], dv=c["dv"],
                                               scale=R["scale"], g_min=G_MIN),
              "spec 3.3 single sequence with initial state h0; upstream gradients do (of o) and "
              "dht (of the final state); gradients from autograd (spec 3.7 agrees to 1e-12)")
    put_kda_core_inputs(cs, x)
    cs.f("o", R["o"])
    cs.f("ht", R["ST"][0])
    for nm, t in R["grads"].items():
        cs.f(nm, t[0] if nm == "dh0" else t)
    return cs


def case_kda_chunk(C):
    c = KDA_CORE
    R = kda_core_reference()
    x = R["x"]
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"], R["scale"], C)
    o, ST, cst = kda_chunk(*args)
    check("kda_chunk_%d: chunk o vs recurrent o" % C, o, R["o"])
    check("kda_chunk_%d: chunk final state vs recurrent" % C, ST, R["ST"])
    for tinv in (["inv", "neumann"] if C <= 16 else ["inv"]):
        o2, _, _ = kda_chunk(*args, tinv=tinv)
        check("kda_chunk_%d: T by %s vs forward substitution" % (C, tinv), o2, o)
    an = kda_chunk_bwd(*args, x["do"], x["dht"])
    for nm, a in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), an):
        check("kda_chunk_%d: spec 3.8 %s vs autograd" % (C, nm), a, R["grads"][nm])
    cs = Case("kda_chunk_%d" % C, c["seed"], dict(T=c["T"], H=c["H"], dk=c["dk"], dv=c["dv"],
                                                  scale=R["scale"], chunk=C, g_min=G_MIN),
              "spec 3.5 on the inputs of kda_recurrent; chunk_states are the incoming states of "
              "the chunks (spec 3.5 'store the per-chunk incoming states'); gradients by spec 3.8 "
              "(equal to autograd of the recurrent form to 1e-12)")
    put_kda_core_inputs(cs, x)
    cs.f("o", o)
    cs.f("ht", ST[0])
    cs.f("chunk_states", cst)
    for nm, a in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), an):
        cs.f(nm, a[0] if nm == "dh0" else a)
    return cs


def case_kda_varlen():
    seed, H, dk, dv, W = 103, 2, 16, 16, 4
    lens = [37, 70]
    cu = [0, lens[0], sum(lens)]
    T = cu[-1]
    P = H * dk
    rnd = Rand(seed)
    qt, kt, vt = rnd.normal(T, P), rnd.normal(T, P), rnd.normal(T, H * dv)
    wq, wk, wv = (rnd.uniform(P, W, lo=-0.5, hi=0.5), rnd.uniform(P, W, lo=-0.5, hi=0.5),
                  rnd.uniform(H * dv, W, lo=-0.5, hi=0.5))
    g = r32(G_MIN * torch.sigmoid(torch.randn(T, H, dk, generator=rnd.g) * 2.5))
    beta = r32(torch.sigmoid(torch.randn(T, H, generator=rnd.g) * 2.0))
    do = rnd.normal(T, H, dv)
    dht = rnd.normal(2, H, dk, dv)
    scale = dk ** -0.5

    def fwd(qt, kt, vt, wq, wk, wv, g, beta):
        q = l2norm(silu(short_conv(qt, wq, cu)).reshape(T, H, dk))
        k = l2norm(silu(short_conv(kt, wk, cu)).reshape(T, H, dk))
        v = silu(short_conv(vt, wv, cu)).reshape(T, H, dv)
        o, ST = kda_recurrent(q, k, v, g, beta, None, scale, cu)
        return o, ST, q, k, v

    ins = [leaf(t) for t in (qt, kt, vt, wq, wk, wv, g, beta)]
    o, ST, q, k, v = fwd(*ins)
    grads = grads_of([(o, do), (ST, dht)], ins)
    q, k, v = q.detach(), k.detach(), v.detach()
    # chunk form and analytic composite backward
    for C in (16, 64):
        oc, STc, _ = kda_chunk(q, k, v, g, beta, None, scale, C, cu)
        check("kda_varlen: chunk %d o vs recurrent" % C, oc, o)
        check("kda_varlen: chunk %d final states vs recurrent" % C, STc, ST)
    dq, dk_, dv_, dg, db, _ = kda_chunk_bwd(q, k, v, g, beta, None, scale, 16, do, dht, cu)
    dq2, dk2, dv2, dg2, db2, _ = kda_recurrent_bwd(q, k, v, g, beta, None, scale, do, dht, cu)
    for nm, a, b in (("dq", dq, dq2), ("dk", dk_, dk2), ("dv", dv_, dv2), ("dg", dg, dg2),
                     ("dbeta", db, db2)):
        check("kda_varlen: spec 3.8 vs 3.7 %s" % nm, a, b)
    comp = []
    for src, wc, dn, norm in ((qt, wq, dq, True), (kt, wk, dk_, True), (vt, wv, dv_, False)):
        zc = silu(short_conv(src, wc, cu))
        dz = l2norm_bwd(zc.reshape(T, H, -1), dn).reshape(T, -1) if norm else dn.reshape(T, -1)
        comp += list(short_conv_bwd(src, wc, cu, dz))
    for nm, a, b in zip(("dqt", "dwq", "dkt", "dwk", "dvt", "dwv"), comp,
                        (grads[0], grads[3], grads[1], grads[4], grads[2], grads[5])):
        check("kda_varlen: analytic %s vs autograd" % nm, a, b)
    check("kda_varlen: analytic dg vs autograd", dg, grads[6])
    check("kda_varlen: analytic dbeta vs autograd", db, grads[7])
    cs = Case("kda_varlen", seed, dict(T=T, H=H, dk=dk, dv=dv, W=W, scale=scale, g_min=G_MIN,
                                       cu_seqlens=cu),
              "two packed documents; pre-conv projections qt, kt, vt (T, P) -> short conv + SiLU "
              "(conv weights (P, W)) -> L2Norm(q, k) -> spec 3.3 with zero state at each "
              "document start; ht are the per-document final states; q, k, v are the "
              "post-norm core inputs")
    cs.i("cu_seqlens", torch.tensor(cu))
    for nm, t in (("qt", qt), ("kt", kt), ("vt", vt), ("wq", wq), ("wk", wk), ("wv", wv),
                  ("g", g), ("beta", beta), ("do", do), ("dht", dht), ("q", q), ("k", k),
                  ("v", v), ("o", o), ("ht", ST)):
        cs.f(nm, t)
    for nm, t in zip(("dqt", "dkt", "dvt", "dwq", "dwk", "dwv", "dg", "dbeta"), grads):
        cs.f(nm, t)
    return cs


def case_kda_gate(kind):
    seed = 104 if kind == "k3" else 105
    T, H, dk = 24, 2, 16
    P = H * dk
    rnd = Rand(seed)
    f = rnd.normal(T, P, std=1.5)
    tau = torch.exp(rnd.uniform(P, lo=math.log(1e-3), hi=math.log(1e-1))).clamp(min=1e-4)
    dt_bias = r32(tau + torch.log(-torch.expm1(-tau)))
    A_log = (rnd.normal(H, std=0.5) if kind == "k3"
             else r32(torch.log(rnd.uniform(H, lo=1.0, hi=16.0))))
    dg = rnd.normal(T, P)
    ins = [leaf(f), leaf(A_log), leaf(dt_bias)]
    if kind == "k3":
        g = gate_k3(*ins, H, G_MIN)
        an = gate_k3_bwd(f, A_log, dt_bias, H, G_MIN, dg)
    else:
        g = gate_softplus(*ins, H)
        an = gate_softplus_bwd(f, A_log, dt_bias, H, dg)
    grads = grads_of([(g, dg)], ins)
    for nm, a, b in zip(("df", "dA_log", "ddt_bias"), an, grads):
        check("kda_gate_%s: spec 3.9 %s vs autograd" % (kind, nm), a, b)
    cs = Case("kda_gate_" + kind, seed,
              dict(T=T, H=H, dk=dk, g_min=G_MIN if kind == "k3" else None),
              "spec 3.2 gate from f = W_fb W_fa x (T, P), A_log (H), dt_bias (P); upstream dg")
    for nm, t in (("f", f), ("A_log", A_log), ("dt_bias", dt_bias), ("dg", dg), ("g", g)):
        cs.f(nm, t)
    for nm, t in zip(("df", "dA_log", "ddt_bias"), grads):
        cs.f(nm, t)
    return cs


def case_kda_layer():
    seed, d, H, dk, W, T = 106, 32, 2, 16, 4, 40
    cfg = dict(H=H, dk=dk, W=W, g_min=G_MIN, eps=1e-5)
    rnd = Rand(seed)
    p = kda_layer_weights(rnd, d, H, dk, W)
    x = rnd.normal(T, d)
    dy = rnd.normal(T, d)
    cu = [0, T]
    names = ["x"] + KDA_KEYS
    ins = [leaf(x)] + [leaf(p[k]) for k in KDA_KEYS]
    y, finals, inter = kda_layer(ins[0], dict(zip(KDA_KEYS, ins[1:])), cfg, cu)
    grads = grads_of([(y, dy)], ins)
    # decode == prefill: decode every token from the zero state, and resume at T1 from the
    # prefill state of the first T1 tokens
    T1 = 17
    P = H * dk
    st = {"S": torch.zeros(H, dk, dk), "tq": torch.zeros(P, W - 1), "tk": torch.zeros(P, W - 1),
          "tv": torch.zeros(P, W - 1)}
    ydec = []
    for t in range(T):
        yt, st = kda_layer_decode(x[t], p, cfg, st)
        ydec.append(yt)
    ydec = torch.stack(ydec)
    check("kda_layer: decode vs prefill", ydec, y)
    _, fin1, _ = kda_layer(x[:T1], p, cfg, [0, T1])
    y2, _, _ = kda_layer(x[T1:], p, cfg, [0, T - T1], state=fin1)
    check("kda_layer: prefill resumed from a prefix state vs one prefill", y2, y[T1:])
    check("kda_layer: final state of decode vs prefill", st["S"], finals[0]["S"])
    # the analytic chain of spec 3.9 + 3.7 through the whole layer
    gr = kda_layer_analytic_bwd(x, p, cfg, cu, dy)
    for nm, gref in zip(names, grads):
        check("kda_layer: analytic d%s vs autograd" % nm, gr[nm], gref)
    cs = Case("kda_layer", seed, dict(T=T, d=d, H=H, dk=dk, dv=dk, W=W, g_min=G_MIN, eps=1e-5,
                                      prefix_T=T1),
              "spec 3.1-3.4 full layer on the normalised input x (T, d); conv weights stored "
              "(P, W); state_prefix_* is the decode state after the first prefix_T tokens (S "
              "(H, dk, dv), conv tails (P, W-1) oldest first); intermediates: pre-conv qt, kt, "
              "vt, post-norm q, k, v, gate g, beta, core output o, gate logits gam, "
              "normalised gated output ob")
    cs.f("x", x)
    cs.f("dy", dy)
    for k in KDA_KEYS:
        cs.f(k, p[k])
    cs.f("y", y)
    for k in ("qt", "kt", "vt", "q", "k", "v", "g", "beta", "o", "gam", "ob"):
        cs.f(k, inter[k])
    cs.f("ht", finals[0]["S"])
    for nm in ("tq", "tk", "tv"):
        cs.f("tail_" + nm[1], finals[0][nm])
    cs.f("state_prefix_S", fin1[0]["S"])
    for nm in ("tq", "tk", "tv"):
        cs.f("state_prefix_tail_" + nm[1], fin1[0][nm])
    for nm, t in zip(names, grads):
        cs.f("d" + nm, t)
    return cs


def kda_layer_analytic_bwd(x, p, cfg, cu, dy):
    """Spec 3.9 + 3.7 chained through the layer (forward intermediates recomputed)."""
    H, dk, W, gmin, eps = cfg["H"], cfg["dk"], cfg["W"], cfg["g_min"], cfg["eps"]
    T = x.shape[0]
    P = H * dk
    y, finals, it = kda_layer(x, p, cfg, cu)
    G = {}
    G["o_proj"] = dy.T @ it["ob"].reshape(T, P)
    dob = (dy @ p["o_proj"]).reshape(T, H, dk)
    do, dgam, G["o_norm"] = gated_rmsnorm_bwd(it["o"], it["gam"], p["o_norm"], eps, dob)
    dgam = dgam.reshape(T, P)
    G["g_proj"] = dgam.T @ x
    dx = dgam @ p["g_proj"]
    dq, dk_, dv, dg, db, _ = kda_recurrent_bwd(it["q"], it["k"], it["v"], it["g"], it["beta"],
                                               None, dk ** -0.5, do, torch.zeros(1, H, dk, dk), cu)
    dbl = db * it["beta"] * (1 - it["beta"])
    G["b_proj"] = dbl.T @ x
    dx = dx + dbl @ p["b_proj"]
    du, G["A_log"], G["dt_bias"] = gate_k3_bwd(it["f"], p["A_log"], p["dt_bias"], H, gmin,
                                               dg.reshape(T, P))
    fa = x @ p["f_a"].T
    G["f_b"] = du.T @ fa
    dfa = du @ p["f_b"]
    G["f_a"] = dfa.T @ x
    dx = dx + dfa @ p["f_a"]
    for nm, src, dn, norm in (("q", it["qt"], dq, True), ("k", it["kt"], dk_, True),
                              ("v", it["vt"], dv, False)):
        wc = p[nm + "_conv"]
        zc = silu(short_conv(src, wc, cu))
        dz = l2norm_bwd(zc.reshape(T, H, dk), dn).reshape(T, P) if norm else dn.reshape(T, P)
        dsrc, G[nm + "_conv"] = short_conv_bwd(src, wc, cu, dz)
        G[nm + "_proj"] = dsrc.T @ x
        dx = dx + dsrc @ p[nm + "_proj"]
    G["x"] = dx
    return G


def case_l2norm():
    seed, N, D = 107, 24, 32
    rnd = Rand(seed)
    scales = torch.ones(N, 1)
    scales[3], scales[7], scales[11] = 1e-2, 1e-3, 1e-4  # near the 1e-6 inside the root
    x = r32(torch.randn(N, D, generator=rnd.g) * scales * 3)
    dy = rnd.normal(N, D)
    xl = leaf(x)
    y = l2norm(xl)
    (dx,) = grads_of([(y, dy)], [xl])
    check("l2norm: spec 3.9 backward vs autograd", l2norm_bwd(x, dy), dx)
    cs = Case("l2norm", seed, dict(N=N, D=D, eps=1e-6),
              "L2Norm over rows of x (N, D) with eps inside the root (spec 1.3); rows 3, 7, 11 "
              "have norms near 1e-2..1e-4 * sqrt(D)")
    for nm, t in (("x", x), ("dy", dy), ("y", y), ("dx", dx)):
        cs.f(nm, t)
    return cs


def case_rmsnorm_gated():
    seed, T, H, dv, eps = 108, 10, 2, 32, 1e-5
    rnd = Rand(seed)
    x = rnd.normal(T, H, dv, std=2.0)
    gam = rnd.normal(T, H, dv, std=2.0)
    w = rnd.normal(dv, std=0.1, mean=1.0)
    dy = rnd.normal(T, H, dv)
    ins = [leaf(x), leaf(gam), leaf(w)]
    y = gated_rmsnorm(*ins, eps)
    grads = grads_of([(y, dy)], ins)
    for nm, a, b in zip(("dx", "dgam", "dw"), gated_rmsnorm_bwd(x, gam, w, eps, dy), grads):
        check("rmsnorm_gated: spec 3.9 %s vs autograd" % nm, a, b)
    ins2 = [leaf(x), leaf(w)]
    y2 = rmsnorm(ins2[0], ins2[1], eps)
    g2 = grads_of([(y2, dy)], ins2)
    for nm, a, b in zip(("dx", "dw"), rmsnorm_bwd(x, w, eps, dy), g2):
        check("rmsnorm: spec 3.9 %s vs autograd" % nm, a, b)
    cs = Case("rmsnorm_gated", seed, dict(T=T, H=H, dv=dv, eps=eps),
              "o_bar = w * RMSNorm_{1,eps}(x) * sigma(gam) per head (spec 3.4); also the plain "
              "RMSNorm_{w,eps}(x) (rms_*) with the same x, w, dy")
    for nm, t in (("x", x), ("gam", gam), ("w", w), ("dy", dy), ("y", y), ("rms_y", y2)):
        cs.f(nm, t)
    for nm, t in zip(("dx", "dgam", "dw"), grads):
        cs.f(nm, t)
    for nm, t in zip(("rms_dx", "rms_dw"), g2):
        cs.f(nm, t)
    return cs


def case_short_conv():
    seed, T, C, W = 109, 20, 8, 4
    rnd = Rand(seed)
    x = rnd.normal(T, C)
    w = rnd.uniform(C, W, lo=-0.5, hi=0.5)
    tail = rnd.normal(1, C, W - 1)
    dz = rnd.normal(T, C)
    cs = Case("short_conv", seed, dict(T=T, C=C, W=W, packed_cu_seqlens=[0, 7, T]),
              "depthwise causal conv + SiLU (spec 3.1, 3.9), w (C, W), tap W-1 = current "
              "token.  single_*: one sequence resumed from tail (C, W-1) (oldest first; the "
              "tail is a constant input); packed_*: documents [0, 7) and [7, 20) from zero "
              "history; tail_out is the last W-1 inputs of the sequence")
    cs.f("x", x)
    cs.f("w", w)
    cs.f("tail", tail[0])
    cs.f("dz", dz)
    cs.i("packed_cu_seqlens", torch.tensor([0, 7, T]))
    for tag, cu, tl in (("single", [0, T], tail), ("packed", [0, 7, T], None)):
        ins = [leaf(x), leaf(w)]
        z = silu(short_conv(ins[0], ins[1], cu, tl))
        grads = grads_of([(z, dz)], ins)
        for nm, a, b in zip(("dx", "dw"), short_conv_bwd(x, w, cu, dz, tl), grads):
            check("short_conv %s: spec 3.9 %s vs autograd" % (tag, nm), a, b)
        cs.f(tag + "_z", z)
        cs.f(tag + "_dx", grads[0])
        cs.f(tag + "_dw", grads[1])
    cs.f("tail_out", conv_tail(x, W, tail[0]))
    return cs


MLA_CFG = dict(Hm=2, n=8, r=4, vm=12, rq=24, rkv=16)
MLA_SEED = 110
_mla_cache = {}


def mla_reference():
    if _mla_cache:
        return _mla_cache
    cfg = MLA_CFG
    d = 32
    lens = [13, 22]
    cu = [0, lens[0], sum(lens)]
    T = cu[-1]
    rnd = Rand(MLA_SEED)
    p = mla_weights(rnd, d, cfg)
    x = rnd.normal(T, d)
    dy = rnd.normal(T, d)
    ins = [leaf(x)] + [leaf(p[k]) for k in MLA_KEYS]
    y, inter = mla_layer(ins[0], dict(zip(MLA_KEYS, ins[1:])), cfg, cu)
    for t in inter.values():
        t.retain_grad()
    (y * dy).sum().backward()
    grads = [t.grad.clone() for t in ins]
    core_grads = {k: inter[k].grad.clone() for k in ("q_nope", "q_pe", "k_nope", "k_pe", "v", "o")}
    inter = {k: v.detach() for k, v in inter.items()}
    _mla_cache.update(cfg=cfg, d=d, cu=cu, T=T, p=p, x=x, dy=dy, y=y.detach(), inter=inter,
                      grads=grads, core_grads=core_grads)
    return _mla_cache


def case_mla_prefill():
    R = mla_reference()
    cfg, cu, T, p, x, it = R["cfg"], R["cu"], R["T"], R["p"], R["x"], R["inter"]
    scale = (cfg["n"] + cfg["r"]) ** -0.5
    cg = R["core_grads"]
    an = mla_core_bwd(it["q_nope"], it["q_pe"], it["k_nope"], it["k_pe"], it["v"], cu, scale,
                      cg["o"])
    for nm, a in zip(("q_nope", "q_pe", "k_nope", "k_pe", "v"), an):
        check("mla_prefill: spec 4.3 d%s vs autograd" % nm, a, cg[nm])
    # output gate (spec 4.3): du = e * sigma(gamma), dgamma = e * u * sigma'(gamma)
    e = R["dy"] @ p["o_proj"]
    sg = torch.sigmoid(it["gate_logits"])
    uu = it["o"].reshape(T, -1)
    check("mla_prefill: spec 4.3 output-gate du vs autograd", e * sg, cg["o"].reshape(T, -1))
    dgl = e * uu * sg * (1 - sg)
    check("mla_prefill: spec 4.3 output-gate dW_g vs autograd", dgl.T @ x,
          R["grads"][1 + MLA_KEYS.index("g_proj")])
    cs = Case("mla_prefill", MLA_SEED, dict(T=T, d=R["d"], cu_seqlens=cu, scale=scale, **cfg),
              "spec 4.1 gated NoPE MLA over two packed documents (causal + document mask) on "
              "the normalised input x (T, d); intermediates q_nope (T, Hm, n), q_pe (T, Hm, r), "
              "c (T, rkv), k_pe (T, r), k_nope (T, Hm, n), v (T, Hm, vm), o (T, Hm, vm), "
              "gate_logits (T, Hm*vm); do_core is the gradient of o, and dq_nope .. dv the "
              "core gradients (spec 4.3)")
    cs.i("cu_seqlens", torch.tensor(cu))
    cs.f("x", x)
    cs.f("dy", R["dy"])
    for k in MLA_KEYS:
        cs.f(k, p[k])
    cs.f("y", R["y"])
    for k, v in it.items():
        cs.f(k, v)
    cs.f("do_core", cg["o"])
    for nm in ("q_nope", "q_pe", "k_nope", "k_pe", "v"):
        cs.f("d" + nm, cg[nm])
    for nm, g in zip(["x"] + MLA_KEYS, R["grads"]):
        cs.f("d" + nm, g)
    return cs


def case_mla_decode_absorbed():
    R = mla_reference()
    cfg, cu, T, p, x, it = R["cfg"], R["cu"], R["T"], R["p"], R["x"], R["inter"]
    n, r = cfg["n"], cfg["r"]
    scale = (n + r) ** -0.5
    W_UK, W_UV = mla_absorbed_weights(p, cfg)
    qhat = torch.einsum("hnc,thn->thc", W_UK, it["q_nope"])
    o_abs, ohat, _ = mla_absorbed_core(qhat, it["q_pe"], it["c"], it["k_pe"], W_UV, cu, scale)
    check("mla_decode_absorbed: spec 4.2 absorbed o vs 4.1 naive o", o_abs, it["o"])
    # token-by-token decode through the whole layer, one cache per document
    ydec = []
    for a_, b_ in doc_ranges(cu):
        cache = {"c": torch.zeros(0, cfg["rkv"]), "k_pe": torch.zeros(0, r)}
        for t in range(a_, b_):
            ydec.append(mla_layer_decode(x[t], p, cfg, cache))
    check("mla_decode_absorbed: decode y vs prefill y", torch.stack(ydec), R["y"])
    # spec 4.5 block-sparse selection: n_c = 4, k_c = 2; and k_c covering every chunk == dense
    n_c, k_c = 4, 2
    o_sp, _, sel = mla_absorbed_core(qhat, it["q_pe"], it["c"], it["k_pe"], W_UV, cu, scale,
                                     sparse=(n_c, k_c))
    o_all, _, _ = mla_absorbed_core(qhat, it["q_pe"], it["c"], it["k_pe"], W_UV, cu, scale,
                                    sparse=(n_c, 1000))
    check("mla_decode_absorbed: block-sparse with k_c >= J_t vs dense", o_all, o_abs)
    gap = mla_sparse_min_gap(qhat, it["q_pe"], it["c"], it["k_pe"], cu, n_c, k_c)
    if gap < 1e-3:
        raise CheckFailed("mla_decode_absorbed: chunk-score gap %.2e < 1e-3 (pick another seed)"
                          % gap)
    cs = Case("mla_decode_absorbed", MLA_SEED,
              dict(T=T, d=R["d"], cu_seqlens=cu, scale=scale, sparse_chunk=n_c, sparse_topk=k_c,
                   sparse_min_score_gap=gap, **cfg),
              "spec 4.2 on the weights/inputs of mla_prefill: qhat (T, Hm, rkv) = W_UK^T "
              "q_nope, latent cache rows [c; k_pe], ohat (T, Hm, rkv), o (T, Hm, vm) equal to "
              "the naive o; y_decode is a token-by-token decode of the whole layer; o_sparse "
              "and sel (T, Hm, chunks: 1 = chunk selected) are spec 4.5 with n_c = 4, k_c = 2")
    cs.i("cu_seqlens", torch.tensor(cu))
    cs.f("x", x)
    for k in MLA_KEYS:
        cs.f(k, p[k])
    for k in ("q_nope", "q_pe", "c", "k_pe"):
        cs.f(k, it[k])
    cs.f("qhat", qhat)
    cs.f("ohat", ohat)
    cs.f("o", o_abs)
    cs.f("y_decode", torch.stack(ydec))
    cs.f("o_sparse", o_sp)
    cs.i("sel", sel)
    return cs


def mla_sparse_min_gap(qhat, q_pe, c, k_pe, cu, n_c, k_c):
    """Smallest gap between the k_c-th and (k_c+1)-th chunk score of any query and head."""
    gap = float("inf")
    for a_, b_ in doc_ranges(cu):
        key = torch.cat([c[a_:b_], k_pe[a_:b_]], 1)
        for t in range(a_, b_):
            Jt = (t - a_) // n_c
            if Jt <= k_c:
                continue
            summ = torch.stack([key[j * n_c:(j + 1) * n_c].mean(0) for j in range(Jt)])
            qq = torch.cat([qhat[t], q_pe[t]], 1)
            sv = torch.sort(qq @ summ.T, dim=-1, descending=True).values
            gap = min(gap, (sv[:, k_c - 1] - sv[:, k_c]).min().item())
    return gap


def case_attnres_mix():
    seed, N, T, d, eps = 120, 5, 6, 32, 1e-5
    rnd = Rand(seed)
    V = r32(torch.randn(N, T, d, generator=rnd.g) * torch.linspace(0.5, 3.0, N)[:, None, None])
    wn = rnd.normal(d, std=0.1, mean=1.0)
    wp = rnd.normal(d, std=0.2)
    dh = rnd.normal(T, d)
    ins = [leaf(V), leaf(wn), leaf(wp)]
    out, a = attnres_mix(*ins, eps)
    grads = grads_of([(out, dh)], ins)
    for nm, x_, y_ in zip(("dV", "dw_norm", "dw_proj"), attnres_mix_bwd(V, wn, wp, eps, dh), grads):
        check("attnres_mix: spec 5.3 %s vs autograd" % nm, x_, y_)
    cs = Case("attnres_mix", seed, dict(N=N, T=T, d=d, eps=eps),
              "spec 5.1 Mix of N sources V (N, T, d) with w_norm (d), w_proj (d) (the [1, d] "
              "tensor read as [d]); a (N, T) the softmax weights; upstream dh (T, d)")
    for nm, t in (("V", V), ("w_norm", wn), ("w_proj", wp), ("dh", dh), ("out", out), ("a", a)):
        cs.f(nm, t)
    for nm, t in zip(("dV", "dw_norm", "dw_proj"), grads):
        cs.f(nm, t)
    return cs


def case_attnres_stack():
    seed, L, B, T, d, eps = 121, 8, 3, 4, 16, 1e-5
    rnd = Rand(seed)
    P_ = {
        "A": [rnd.normal(d, d, std=d ** -0.5) for _ in range(L)],
        "F": [rnd.normal(d, d, std=d ** -0.5) for _ in range(L)],
        "in_norm": [rnd.normal(d, std=0.1, mean=1.0) for _ in range(L)],
        "post_norm": [rnd.normal(d, std=0.1, mean=1.0) for _ in range(L)],
        "attn_norm": [rnd.normal(d, std=0.1, mean=1.0) for _ in range(L)],
        "attn_proj": [rnd.normal(d, std=0.3) for _ in range(L)],
        "ffn_norm": [rnd.normal(d, std=0.1, mean=1.0) for _ in range(L)],
        "ffn_proj": [rnd.normal(d, std=0.3) for _ in range(L)],
        "out_norm": rnd.normal(d, std=0.1, mean=1.0), "out_proj": rnd.normal(d, std=0.3),
        "final_norm": rnd.normal(d, std=0.1, mean=1.0),
    }
    h0 = rnd.normal(T, d)
    dy = rnd.normal(T, d)
    leaves = {k: ([leaf(t) for t in v] if isinstance(v, list) else leaf(v)) for k, v in P_.items()}
    h0l = leaf(h0)
    y = stack_forward(leaves, h0l, L, B, eps)
    flat = [h0l]
    for k in P_:
        flat += leaves[k] if isinstance(leaves[k], list) else [leaves[k]]
    gflat = grads_of([(y, dy)], flat)
    dh0_an, G = stack_backward(P_, h0, L, B, eps, dy)
    check("attnres_stack: spec 5.4 d(embedding) vs autograd", dh0_an, gflat[0])
    i = 1
    gauto = {}
    for k in P_:
        if isinstance(P_[k], list):
            gauto[k] = gflat[i:i + L]
            for l in range(L):
                check("attnres_stack: spec 5.4 d%s[%d] vs autograd" % (k, l), G[k][l], gauto[k][l])
            i += L
        else:
            gauto[k] = gflat[i]
            check("attnres_stack: spec 5.4 d%s vs autograd" % k, G[k], gauto[k])
            i += 1
    cs = Case("attnres_stack", seed, dict(L=L, B=B, T=T, d=d, eps=eps),
              "spec 5.2 bookkeeping with Mixer_l(x) = A_l x and FFN_l(x) = F_l x after "
              "RMSNorm_in/post (weights in_norm/post_norm); h0 (T, d) the embeddings; "
              "y = RMSNorm_{final_norm}(final Mix); per-layer tensors stacked as (L, ...); "
              "gradients by spec 5.4 (equal to autograd to 1e-12)")
    cs.f("h0", h0)
    cs.f("dy", dy)
    for k, v in P_.items():
        cs.f(k, torch.stack(v) if isinstance(v, list) else v)
    cs.f("y", y)
    cs.f("dh0", gflat[0])
    for k, v in gauto.items():
        cs.f("d" + k, torch.stack(list(v)) if isinstance(P_[k], list) else v)
    return cs


def case_router():
    T, d, E, k, rho = 12, 16, 8, 3, 2.5
    for seed in range(130, 140):
        rnd = Rand(seed)
        x = rnd.normal(T, d)
        Wr = rnd.normal(E, d, std=d ** -0.5)
        b = rnd.normal(E, std=0.1)
        s = torch.sigmoid(x @ Wr.T)
        if topk_gap(s + b, k) > 1e-4 and (torch.sort(s + b, -1).values.diff(dim=-1).min() > 1e-6):
            break
    else:
        raise CheckFailed("router: no seed without near-ties")
    dp = rnd.normal(T, k)
    forced = torch.stack([torch.randperm(E, generator=rnd.g)[:k] for _ in range(T)])
    dpf = rnd.normal(T, k)
    cs = Case("router", seed, dict(T=T, d=d, E=E, k=k, rho=rho, min_topk_gap=topk_gap(s + b, k)),
              "spec 6 on x (T, d), W_r (E, d), bias b (E), rho = 2.5: sel (T, k) in descending "
              "s+b order (ties toward the lower index), p (T, k) aligned with sel, p_dense "
              "(T, E); upstream dp (T, k).  forced_*: routes given (forced_sel, in the given "
              "order), p recomputed from s on them")
    for nm, t in (("x", x), ("W_r", Wr), ("b", b), ("dp", dp), ("forced_dp", dpf)):
        cs.f(nm, t)
    cs.i("forced_sel", forced)
    for tag, fr, up in (("", None, dp), ("forced_", forced, dpf)):
        ins = [leaf(x), leaf(Wr)]
        sel, pw, s_, dense = router_fwd(ins[0], ins[1], b, k, rho, fr)
        grads = grads_of([(pw, up)], ins)
        dWr, dx = router_bwd(x, Wr, s_.detach(), sel, rho, up)
        check("router %s: spec 6.2 dW_r vs autograd" % (tag or "free"), dWr, grads[1])
        check("router %s: spec 6.2 dx vs autograd" % (tag or "free"), dx, grads[0])
        if fr is None:
            cs.f("s", s_)
            cs.i("sel", sel)
        cs.f(tag + "p", pw)
        cs.f(tag + "p_dense", dense)
        cs.f(tag + "dx", grads[0])
        cs.f(tag + "dW_r", grads[1])
    return cs


def case_situ():
    seed = 140
    rnd = Rand(seed)
    special = torch.tensor([0.0, -1.219, 1.219, 60.0, -60.0, 4.0, -4.0, 25.0, -25.0])
    g = torch.cat([special, rnd.uniform(1024, lo=-60, hi=60), rnd.normal(1024, std=4.0)])
    u = torch.cat([special.flip(0), rnd.uniform(1024, lo=-60, hi=60), rnd.normal(1024, std=4.0)])
    g, u = r32(g), r32(u)
    gl, ul = leaf(g), leaf(u)
    y = situ(gl, ul)
    dgA, duA = torch.autograd.grad(y.sum(), [gl, ul])
    phi, psi, dphi, dpsi, dg_, du_ = situ_derivs(g, u)
    check("situ: spec 8 dSiTU/dg vs autograd", dg_, dgA)
    check("situ: spec 8 dSiTU/du vs autograd", du_, duA)
    if not (y.abs() < 100).all():
        raise CheckFailed("situ: |SiTU| >= 100")
    cs = Case("situ", seed, dict(N=g.numel(), beta1=4.0, beta2=25.0),
              "spec 8 on pairs (g_i, u_i): 9 special points, 1024 uniform in [-60, 60], 1024 "
              "N(0, 4^2); phi, psi, their derivatives and the partials of SiTU")
    for nm, t in (("g", g), ("u", u), ("y", y), ("phi", phi), ("psi", psi), ("dphi", dphi),
                  ("dpsi", dpsi), ("dy_dg", dg_), ("dy_du", du_)):
        cs.f(nm, t)
    return cs


MOE_KEYS = ["gate", "down", "znorm", "up", "w1", "w3", "w2", "sh_gate", "sh_up", "sh_down"]


def case_latent_moe():
    T, d, E, k, f, dz, ns = 12, 32, 8, 2, 16, 16, 2
    empty = 5
    for seed in range(150, 160):
        rnd = Rand(seed)
        p = moe_weights(rnd, d, E, f, dz, ns * f)
        p["bias"][empty] = -10.0  # expert 5 gets no tokens: it can never reach the top-k
        x = rnd.normal(T, d)
        s = torch.sigmoid(x @ p["gate"].T)
        if topk_gap(s + p["bias"], k) > 1e-4:
            break
    else:
        raise CheckFailed("latent_moe: no seed without near-ties")
    dy = rnd.normal(T, d)
    out = {}
    for tag, rho, use_norm in (("", 1.0, True), ("nonorm_", 2.5, False)):
        cfg = dict(E=E, k=k, rho=rho, eps=1e-5, b1=4.0, b2=25.0, use_norm=use_norm)
        ins = [leaf(x)] + [leaf(p[k_]) for k_ in MOE_KEYS]
        pl = dict(zip(MOE_KEYS, ins[1:]))
        pl["bias"] = p["bias"]
        y, info = moe_fwd(ins[0], pl, cfg)
        grads = grads_of([(y, dy)], ins)
        dx_an, gr = moe_bwd(x, p, cfg, dy)
        check("latent_moe %s: spec 7.3 dx vs autograd" % (tag or "norm"), dx_an, grads[0])
        for nm, gref in zip(MOE_KEYS, grads[1:]):
            if nm == "znorm" and not use_norm:
                continue
            check("latent_moe %s: spec 7.3 d%s vs autograd" % (tag or "norm", nm), gr[nm], gref)
        out[tag] = (y, info, grads)
    loads = torch.bincount(out[""][1]["sel"].reshape(-1), minlength=E)
    assert loads[empty] == 0
    cs = Case("latent_moe", seed, dict(T=T, d=d, E=E, k=k, f=f, dz=dz, num_shared=ns,
                                       fs=ns * f, rho=1.0, eps=1e-5, beta1=4.0, beta2=25.0,
                                       empty_expert=empty, nonorm_rho=2.5),
              "spec 7.1 Stable LatentMoE on the normalised FFN input x (T, d): router gate (E, d) "
              "+ bias (E) -> sel, p; z = down x; u = sum p_i E_i(z), E_i = w2 SiTU(w1 z, w3 z) "
              "(w1, w3 (E, f, dz), w2 (E, dz, f)); y = up RMSNorm_{znorm}(u) + shared GLU "
              "(sh_gate, sh_up (fs, d), sh_down (d, fs)).  Expert 5 has bias -10 and no tokens.  "
              "nonorm_*: the same with latent_moe_use_norm = false and rho = 2.5")
    cs.f("x", x)
    cs.f("dy", dy)
    cs.f("bias", p["bias"])
    for k_ in MOE_KEYS:
        cs.f(k_, p[k_])
    for tag, (y, info, grads) in out.items():
        cs.f(tag + "y", y)
        if tag == "":
            cs.i("sel", info["sel"])
            cs.f("p", info["p"])
            cs.f("z", info["z"])
            cs.f("u", info["u"])
            cs.i("loads", loads)
        cs.f(tag + "dx", grads[0])
        for nm, g in zip(MOE_KEYS, grads[1:]):
            if nm == "znorm" and tag:
                continue
            cs.f(tag + "d" + nm, g)
    return cs


def qb_inputs(seed, m, E):
    rnd = Rand(seed)
    skew = torch.linspace(-1.5, 1.5, E)[torch.randperm(E, generator=rnd.g)]
    s = r32(torch.sigmoid(torch.randn(m, E, generator=rnd.g) + skew))
    b_old = rnd.normal(E, std=0.05)
    return s, b_old


def case_qb(kind):
    m, E, k = 512, 16, 4
    for seed in range(160, 200):
        s, b_old = qb_inputs(seed, m, E)
        if kind == "exact":
            alpha, r, bhat, bnew = qb_exact(s, b_old, k)
            news = {"": bnew}
        elif kind == "hist":
            res = {Nb: qb_hist(s, b_old, k, Nb) for Nb in (64, 1024)}
            news = {"nb%d_" % Nb: v[2] for Nb, v in res.items()}
        else:
            load, bhat, bnew, (qmin, qmax) = qb_band(s, b_old, k, 0.2, 0.3)
            news = {"": bnew}
        gaps = [topk_gap(s + b_old, k)] + [topk_gap(s + bn, k) for bn in news.values()]
        margin = min(v[3][3] for v in res.values()) if kind == "hist" else 1.0
        if min(gaps) > 1e-5 and margin > 1e-5:
            break
    else:
        raise CheckFailed("qb_%s: no seed without near-ties" % kind)
    cs = Case("qb_" + kind, seed, dict(m=m, E=E, k=k, min_topk_gap=min(gaps)),
              "one Quantile Balancing step on fixed sigmoid scores s (m, E) and b_old (E); "
              "loads_* are per-expert token counts of top-k(s + b) routing with b_old (before) "
              "and with the new bias (after)")
    cs.f("s", s)
    cs.f("b_old", b_old)
    cs.i("loads_before", route_loads(s, b_old, k))
    if kind == "exact":
        cs.notes += "; spec 9.2: alpha (m) the (k+1)-th largest s + b_old, bhat (E), b_new (E)"
        cs.f("alpha", alpha)
        cs.f("bhat", bhat)
    elif kind == "hist":
        cs.notes += ("; spec 9.3 with N_b = 64 and 1024: nb*_cnt (E, N_b) bin counts, nb*_bhat, "
                     "nb*_b_new; lo, hi, w per N_b in the config; exact_b_new is spec 9.2 on the "
                     "same data (the estimator error is below one bin width)")
        for Nb, (cnt, bh, bn, (lo, hi, w, mg)) in res.items():
            cs.i("nb%d_cnt" % Nb, cnt)
            cs.f("nb%d_bhat" % Nb, bh)
            cs.config["nb%d" % Nb] = dict(lo=float(lo), hi=float(hi), w=float(w),
                                          quantile_bin_edge_margin=mg)
            _, _, exb, ex = qb_exact(s, b_old, k)
            # spec 9.3 says the estimator error is below one bin width.  That holds for the
            # uncentred b_hat up to the gap between the two order statistics the exact rule
            # interpolates (they may sit in different bins), and centring can add the mean
            # error: the check allows 2 bin widths for b_hat and reports both in bin widths.
            err_hat = (bh - exb).abs().max().item()
            err = (bn - ex).abs().max().item()
            cs.config["nb%d" % Nb].update(bhat_err_bins=err_hat / w, b_new_err_bins=err / w)
            if not err_hat <= 2 * w:
                raise CheckFailed("qb_hist: N_b = %d b_hat differs from exact by %.3e > 2 bin "
                                  "widths %.3e" % (Nb, err_hat, 2 * w))
            CHECKS.append(("qb_hist: N_b = %d b_hat vs exact, in bin widths" % Nb,
                           err_hat / w, 2.0))
        cs.f("exact_b_new", ex)
    else:
        cs.notes += ("; spec 9.5 with band_low 0.2, band_high 0.3: q_min, q_max in the config, "
                     "bhat (E), b_new (E)")
        cs.config.update(band_low=0.2, band_high=0.3, q_min=qmin, q_max=qmax)
        cs.f("bhat", bhat)
    for tag, bn in news.items():
        cs.f(tag + "b_new", bn)
        cs.i(tag + "loads_after", route_loads(s, bn, k))
    return cs


def case_vision_front():
    seed = 170
    vc = dict(TINY_VISION)
    d = vc["text_hidden_size"]
    p = vc["patch_size"]
    rnd = Rand(seed)
    vw = vision_weights(rnd, vc, d)
    grids = [(4, 6), (2, 4)]
    imgs = [torch.randint(0, 256, (h * p, w * p, 3), generator=rnd.g, dtype=torch.uint8)
            for h, w in grids]
    patches = torch.cat([image_patches(im, p) for im in imgs], 0)
    emb = rnd.normal(TINY_TEXT["vocab_size"], d)
    # the resize written by hand vs torch's interpolate (align_corners = False)
    G = vw["vision_tower.patch_embed.pos_emb.weight"]
    for (h, w) in grids + [(20, 10)]:
        ref = torch.nn.functional.interpolate(G.permute(2, 0, 1)[None], size=(h, w),
                                              mode="bilinear", align_corners=False)[0]
        check("vision_front: bilinear resize to %dx%d vs torch interpolate" % (h, w),
              bilinear_resize(G, h, w), ref.permute(1, 2, 0))
    # token stream: text, image 1 placeholders, text, image 2 placeholders, text
    n1, n2 = (grids[0][0] * grids[0][1]) // 4, (grids[1][0] * grids[1][1]) // 4
    toks = ([256] + [int(t) for t in rnd.ints(0, 256, 5)] + [260] + [259] * n1 + [261] +
            [int(t) for t in rnd.ints(0, 256, 3)] + [260] + [259] * n2 + [261] +
            [int(t) for t in rnd.ints(0, 256, 2)])
    toks = torch.tensor(toks)
    keys = list(vw.keys())
    ins = [leaf(vw[k_]) for k_ in keys]
    vwl = OrderedDict(zip(keys, ins))
    out, it = vision_front(patches, grids, vwl, vc, d)
    seq = emb[toks].clone()
    seq[toks == 259] = out
    dseq = rnd.normal(*seq.shape)
    grads = grads_of([(seq, dseq)], ins)
    cs = Case("vision_front", seed, dict(grids=grids, cu_seqlens_patches=it["cu"], **vc),
              "spec 10.3 tiny front end (vision_config of spec 12.3; block norms eps 1e-6, "
              "projector post_norm eps 1e-5, images only: no time embedding).  img0, img1 "
              "(h*14, w*14, 3) uint8; patches (N_p, 3, 14, 14) normalised, row-major patch "
              "order; patch_tokens (N_p, D) = patch embed + resized pos_emb; tower (N_p, D) "
              "after the blocks and final norm; merged (N, 4D); vision_tokens (N, d) after the "
              "projector; tokens (S) with placeholders 259; embed (V, d); seq (S, d) the "
              "embedded sequence with placeholders replaced; dseq the upstream gradient and "
              "grad.<key> the vision weight gradients")
    for i, im in enumerate(imgs):
        cs.u8("img%d" % i, im)
    cs.f("patches", patches)
    for k_ in keys:
        cs.f(k_, vw[k_])
    cs.f("patch_tokens", it["embed"])
    cs.f("tower", it["tower"])
    cs.f("merged", it["merged"])
    cs.f("vision_tokens", out)
    cs.i("tokens", toks)
    cs.f("embed", emb)
    cs.f("seq", seq)
    cs.f("dseq", dseq)
    for k_, g in zip(keys, grads):
        cs.f("grad." + k_, g)
    return cs


def case_model_tiny():
    src = load_tiny_config(os.path.dirname(os.path.dirname(HERE)))
    dm = tiny_dims(TINY_TEXT)
    lens = [29, 35]
    cu = [0, lens[0], sum(lens)]
    T = cu[-1]
    n_dec = 16
    gap_min = 1e-4
    tried = []
    for seed in range(200, 240):
        rnd = Rand(seed)
        w = tiny_weights(rnd, dm, TINY_VISION)
        toks = []
        for L_ in lens:
            toks += [256] + [int(t) for t in rnd.ints(0, 266, L_ - 1)]
        toks = torch.tensor(toks)
        stats = {}
        with torch.no_grad():
            tiny_forward(w, dm, toks, cu, stats=stats)
        tried.append((seed, stats["min_gap"]))
        if stats["min_gap"] <= gap_min:
            continue
        # the same forward in float32 (what the C reference computes) must route every token
        # of every MoE layer identically; its logits show the size of fp32 error to expect
        stats32 = {}
        with torch.no_grad():
            w32 = OrderedDict((k_, t.to(torch.float32)) for k_, t in w.items())
            lg32 = tiny_forward(w32, dm, toks, cu, stats=stats32).to(F64)
            lg64 = tiny_forward(w, dm, toks, cu)
        same = all(torch.equal(a_, b_) for a_, b_ in zip(stats["routes"], stats32["routes"]))
        fp32_rel = ((lg32 - lg64).abs().max() / lg64.abs().max()).item()
        if same:
            break
    else:
        raise CheckFailed("model_tiny: no seed with router top-k gaps > %g: %s" % (gap_min, tried))
    n_text = tiny_param_count(w, dm, True)
    n_vis = tiny_param_count(w, dm, False)
    if n_text != 2822908 or n_vis != 86976 + 98432:
        raise CheckFailed("model_tiny: parameter counts %d / %d differ from spec 13.3"
                          % (n_text, n_vis))
    text_keys = [k_ for k_ in w if k_.startswith("language_model.")
                 and not k_.endswith("e_score_correction_bias")]
    leaves = OrderedDict((k_, leaf(t)) if k_ in text_keys else (k_, t) for k_, t in w.items())
    logits = tiny_forward(leaves, dm, toks, cu)
    # loss: mean over positions whose next token is in the same document of -log pi(next)
    tgt_pos = [t for a_, b_ in doc_ranges(cu) for t in range(a_, b_ - 1)]
    lp = torch.log_softmax(logits, -1)
    tgt_lp = lp[tgt_pos, toks[[t + 1 for t in tgt_pos]]]
    loss = -tgt_lp.mean()
    # layer 0's pre-mixer AttnRes weights are never read (no block entries yet, spec 5.2):
    # their gradient is exactly 0
    grads = [torch.zeros_like(leaves[k_]) if g is None else g for k_, g in
             zip(text_keys, torch.autograd.grad(loss, [leaves[k_] for k_ in text_keys],
                                                allow_unused=True))]
    logits = logits.detach()
    # decode: prefill the first part of document 2, then decode the last n_dec tokens
    a2 = cu[1]
    n_pre = lens[1] - n_dec
    with torch.no_grad():
        lg_pre, state = tiny_forward(w, dm, toks[a2:a2 + n_pre], [0, n_pre], want_state=True)
        check("model_tiny: prefill of a document alone vs packed prefill", lg_pre,
              logits[a2:a2 + n_pre])
        st = [dict((k_, v_.clone()) for k_, v_ in s.items()) for s in state]
        dec = []
        for t in range(a2 + n_pre, cu[2]):
            dec.append(tiny_forward(w, dm, toks[t:t + 1], None, decode_state=st)[0])
        dec = torch.stack(dec)
        check("model_tiny: decode of %d tokens vs prefill logits" % n_dec, dec,
              logits[a2 + n_pre:cu[2]])
    tc_meta = dict(TINY_TEXT)
    cs = Case("model_tiny", seed,
              dict(config_source=src, text_config=tc_meta, vision_config=TINY_VISION,
                   cu_seqlens=cu, decode_prefix=n_pre, decode_tokens=n_dec,
                   min_router_topk_gap=stats["min_gap"], seeds_tried=tried,
                   fp32_forward_logits_max_rel_err=fp32_rel,
                   params_text=n_text, params_vision_and_projector=n_vis),
              "tiny config of spec 12.3.  Weights under the spec 14.2 keys, F32 only (the "
              "float64 reference used exactly these values); matrices N(0, 1/fan_in), norm "
              "weights 1 + N(0, 0.1^2), AttnRes proj N(0, 0.05^2), router bias N(0, 0.1^2), "
              "KDA per spec 3.10 with A_log N(0, 0.5^2); vision weights are included (the "
              "batch is text-only, so they get no gradient).  tokens (T) two packed documents "
              "(cu_seqlens), each starting with <|bos|>; logits (T, V); loss = mean over "
              "positions t with a next token in the same document of -log_softmax(logits_t)"
              "[tokens_{t+1}] (target_pos, target_logprob); grad.<key> = dloss/dweight for every "
              "text weight except e_score_correction_bias (no gradient), F32 only.  Decode: "
              "state_* is the decode state after the first decode_prefix tokens of document 2 "
              "(KDA: state.<l>.S (H, dk, dv), state.<l>.conv (3, P, W-1) q/k/v tails oldest "
              "first; MLA: state.<l>.latent (decode_prefix, rkv + r) rows [c; k_pe]); "
              "decode_logits (decode_tokens, V) from decoding the rest of document 2 one token "
              "at a time (equal to the prefill rows, checked to 1e-12); routes (MoE layers, "
              "T, k) the selected experts per layer 1..7")
    for k_, t in w.items():
        cs.f32only(k_, t)
    cs.i("tokens", toks)
    cs.i("cu_seqlens", torch.tensor(cu))
    cs.f("logits", logits)
    cs.f("loss", loss.detach().reshape(1))
    cs.i("target_pos", torch.tensor(tgt_pos))
    cs.f("target_logprob", tgt_lp.detach())
    for k_, g in zip(text_keys, grads):
        cs.f32only("grad." + k_, g)
    for l, s_ in enumerate(state):
        if "S" in s_:
            cs.f("state.%d.S" % l, s_["S"])
            cs.f("state.%d.conv" % l, torch.stack([s_["tq"], s_["tk"], s_["tv"]]))
        else:
            cs.f("state.%d.latent" % l, torch.cat([s_["c"], s_["k_pe"]], 1))
    cs.f("decode_logits", dec)
    cs.i("routes", torch.stack(stats["routes"]))
    return cs


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------

CASES = OrderedDict([
    ("kda_recurrent", case_kda_recurrent),
    ("kda_chunk_16", lambda: case_kda_chunk(16)),
    ("kda_chunk_64", lambda: case_kda_chunk(64)),
    ("kda_varlen", case_kda_varlen),
    ("kda_gate_k3", lambda: case_kda_gate("k3")),
    ("kda_gate_softplus", lambda: case_kda_gate("softplus")),
    ("kda_layer", case_kda_layer),
    ("l2norm", case_l2norm),
    ("rmsnorm_gated", case_rmsnorm_gated),
    ("short_conv", case_short_conv),
    ("mla_prefill", case_mla_prefill),
    ("mla_decode_absorbed", case_mla_decode_absorbed),
    ("attnres_mix", case_attnres_mix),
    ("attnres_stack", case_attnres_stack),
    ("router", case_router),
    ("situ", case_situ),
    ("latent_moe", case_latent_moe),
    ("qb_exact", lambda: case_qb("exact")),
    ("qb_hist", lambda: case_qb("hist")),
    ("qb_band", lambda: case_qb("band")),
    ("vision_front", case_vision_front),
    ("model_tiny", case_model_tiny),
])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "data"))
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--no-write", action="store_true", help="run the checks only")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(CASES)
    for n in names:
        if n not in CASES:
            print("gen_golden: unknown case %r (known: %s)" % (n, ", ".join(CASES)),
                  file=sys.stderr)
            return 2
    t0 = time.time()
    results = []
    try:
        for n in names:
            t1 = time.time()
            cs = CASES[n]()
            results.append(cs)
            print("gen_golden: %-20s %3d tensors  %.1fs" % (n, len(cs.tensors), time.time() - t1),
                  flush=True)
    except CheckFailed as e:
        print("gen_golden: CHECK FAILED: %s" % e, file=sys.stderr)
        return 1
    tight = [c for c in CHECKS if c[2] == RTOL_CHECK]
    worst = max(tight, key=lambda c: c[1]) if tight else ("none", 0.0, 0.0)
    print("gen_golden: %d checks passed; %d at rtol %g, largest relative error %.3e (%s)"
          % (len(CHECKS), len(tight), RTOL_CHECK, worst[1], worst[0]))
    if args.no_write:
        return 0
    os.makedirs(args.out, exist_ok=True)
    mpath = os.path.join(args.out, "manifest.json")
    manifest = {"cases": {}}
    if os.path.exists(mpath) and args.only:
        with open(mpath) as f:
            manifest = json.load(f)
    total = 0
    for cs in results:
        fn = cs.name + ".safetensors"
        size = write_safetensors(os.path.join(args.out, fn), cs.tensors,
                                 {"format": "pt", "case": cs.name,
                                  "generator": "tests/golden/gen_golden.py", "seed": cs.seed})
        total += size
        manifest["cases"][cs.name] = {
            "file": fn, "bytes": size, "seed": cs.seed, "config": cs.config, "notes": cs.notes,
            "tensors": cs.listing,
        }
    manifest["generator"] = "tests/golden/gen_golden.py"
    manifest["complete_run"] = not args.only  # commit data from complete runs only
    manifest["torch"] = torch.__version__
    manifest["conventions"] = (
        "NAME is F64 and NAME.f32 its F32 copy for floating tensors; integer tensors I64; "
        "model_tiny weights (spec 14.2 keys) and grad.<key> F32 only. Inputs are "
        "float32-representable. Token-major layouts, head-major channels, Linear [out, in].")
    manifest["storage"] = (
        "Target < 40 MB committed. Every case but model_tiny stores F64 + F32 copies on small "
        "shapes. model_tiny (about 24.6 MB) stores its 3.0M weights and 2.8M text-weight "
        "gradients as F32 only: the weights are float32 values (the F64 reference used them "
        "exactly) and F64 gradients would add 22.6 MB; its logits, loss, decode logits and "
        "states are F64 + F32.")
    manifest["checks"] = {"rtol": RTOL_CHECK, "form": "max|a-ref| <= rtol * max|ref|",
                          "results": [{"name": n, "max_rel_err": e, "limit": lim}
                                      for n, e, lim in CHECKS]}
    with open(mpath, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=False,
                  default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
        f.write("\n")
    allb = sum(os.path.getsize(os.path.join(args.out, c["file"]))
               for c in manifest["cases"].values() if os.path.exists(os.path.join(args.out, c["file"])))
    print("gen_golden: wrote %d files (%.1f MB this run, %.1f MB in %s) in %.1fs"
          % (len(results), total / 1e6, allb / 1e6, args.out, time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
