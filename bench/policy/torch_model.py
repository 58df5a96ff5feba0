#!/usr/bin/python3
"""bench/policy/torch_model.py: the PyTorch baseline of bench_policy - the agentrl policy of
spec/policy.md in fp32, eager mode, written as a reasonably efficient PyTorch user would.

What this is: a whole-model text forward (embedding, Block AttnRes bookkeeping, KDA and gated
NoPE MLA mixers, dense layer 0, router + Stable LatentMoE with grouped expert execution and
fused shared experts, SiTU-GLU, final AttnRes mix, model.norm, lm_head) with two paths:
  prefill  KDA in the chunkwise WY/UT form (spec 3.5) with all chunks' intra-chunk work batched
           and only the state hand-off looped; MLA in the expanded form (spec 4.1);
  decode   one token per sequence for a batch of sequences, from a state cache: KDA state S and
           conv tails (spec 3.6), MLA latent rows [c; k_pe] in a preallocated static cache and
           the absorbed form (spec 4.2).
It loads an agentrl checkpoint directory (config.json + model.safetensors or shards), parsing
safetensors with struct/json/numpy (no safetensors package).  It verifies itself before timing:
against the golden float64 tiny model (tests/golden/data/model_tiny.safetensors: packed-prefill
logits and decode logits) and, when given, against logits the C model computed on the same
checkpoint.  Any disagreement exits 3 with a message: a fast wrong baseline is worthless.

What this is not: a training implementation (no backward), packed/varlen batches (sequences of
one batch have equal lengths; documents are run as separate sequences), the vision tower, or
reference numerics (tests/golden/gen_golden.py is the float64 reference).

Fairness: torch.inference_mode(), torch.set_num_threads(--threads), fused projections of one
input (q/k/v/g/f_a/b for KDA; q_a/kv_a/g for MLA; gate/up of every GLU, w1/w3 of every expert),
per-expert gathered GEMMs (gathered expert weights and bmm when few token-routes, as in decode),
a static latent cache.  Nothing is deliberately slow.

Usage: /usr/bin/python3 bench/policy/torch_model.py --ckpt DIR [--threads N] [--T 2048]
       [--check-tokens F --check-logits F] [--golden FILE --golden-config FILE]
       [--verify-only | --serve]
Prints one JSON object on stdout (checks and timings); progress on stderr.  With --serve it
prints the checks as one JSON line, then answers timing requests on stdin (see serve()).
Exit status: 0 ok, 3 a verification failed, 4 torch is not importable.
"""
import argparse
import json
import os
import signal
import statistics
import struct
import sys
import time

# Ctrl-C or a closed pipe (the benchmark that started this baseline stopped) ends the
# process quietly, as it would a C program, not with a Python traceback.
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # bench_policy reports the baseline as unavailable (exit 4)
    print(json.dumps({"error": "torch unavailable: %s" % e, "unavailable": True}))
    sys.exit(4)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class VerifyFailed(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# checkpoint reading (spec 14.1)
# ---------------------------------------------------------------------------------------------

ST_NP = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64,
         "I32": np.int32, "U8": np.uint8}


def read_safetensors(path, want=None):
    """name -> torch tensor (float tensors as float32, integers as int64) of one file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or (want is not None and not want(name)):
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        dt = info["dtype"]
        if dt == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(ST_NP[dt]).newbyteorder("<"))
        arr = arr.reshape(info["shape"])
        t = torch.from_numpy(np.array(arr))
        if t.is_floating_point():
            t = t.to(torch.float32)
        elif dt != "U8":
            t = t.to(torch.int64)
        out[name] = t
    return out


def read_checkpoint(ckpt):
    """config.json text_config and the weights of an agentrl checkpoint directory."""
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    idx = os.path.join(ckpt, "model.safetensors.index.json")
    w = {}
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for fn in files:
            w.update(read_safetensors(os.path.join(ckpt, fn), want=is_text_key))
    else:
        w = read_safetensors(os.path.join(ckpt, "model.safetensors"), want=is_text_key)
    return cfg["text_config"], w


def is_text_key(name):
    return name.startswith("language_model.")


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------

LM = "language_model.model."


def rmsnorm(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def l2norm(x):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


class Model:
    """The text model of spec 2.1 from a text_config dict and checkpoint weights."""

    def __init__(self, tc, w, chunk=64, sub=16):
        la = tc["linear_attn_config"]
        self.V, self.d, self.L = tc["vocab_size"], tc["hidden_size"], tc["num_hidden_layers"]
        self.H, self.dk, self.W = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
        self.P = self.H * self.dk
        self.g_min = la["gate_lower_bound"]
        self.mla_layers = set(i - 1 for i in la["full_attn_layers"])
        self.Hm = tc["num_attention_heads"]
        self.n, self.r = tc["qk_nope_head_dim"], tc["qk_rope_head_dim"]
        self.vm, self.rq, self.rkv = tc["v_head_dim"], tc["q_lora_rank"], tc["kv_lora_rank"]
        self.E, self.k = tc["num_experts"], tc["num_experts_per_token"]
        self.f, self.dz = tc["moe_intermediate_size"], tc["routed_expert_hidden_size"]
        self.rho = tc["routed_scaling_factor"]
        self.first_dense = tc["first_k_dense_replace"]
        self.B = tc["attn_res_block_size"]
        self.eps = tc["rms_norm_eps"]
        self.b1, self.b2 = tc["activation_situ_beta"], tc["activation_situ_linear_beta"]
        self.C, self.sub = chunk, sub
        for key, want in (("mla_use_nope", True), ("mla_use_output_gate", True),
                          ("latent_moe_use_norm", True), ("hidden_act", "situ")):
            if tc.get(key, want) != want:
                raise SystemExit("torch_model: %s = %r is not supported by this baseline"
                                 % (key, tc[key]))
        if self.g_min is None or self.rq is None or self.B is None or not la["use_full_rank_gate"]:
            raise SystemExit("torch_model: only the K3 layout (lower-bound gate, q_lora, AttnRes, "
                             "full-rank KDA gate) is implemented")
        H, dk, P = self.H, self.dk, self.P
        g = lambda key: w[key].contiguous()
        self.embed = g(LM + "embed_tokens.weight")
        self.lm_head = g("language_model.lm_head.weight")
        self.norm = g(LM + "norm.weight")
        self.out_res = (g(LM + "output_attn_res_norm.weight") *
                        g(LM + "output_attn_res_proj.weight").reshape(-1))
        self.layers = []
        for l in range(self.L):
            pre = LM + "layers.%d." % l
            sa = pre + "self_attn."
            lp = {"in_norm": g(pre + "input_layernorm.weight"),
                  "post_norm": g(pre + "post_attention_layernorm.weight"),
                  # AttnRes pseudo-queries w = w_norm * w_proj (spec 5.1), input independent
                  "w_attn": g(pre + "self_attention_res_norm.weight") *
                            g(pre + "self_attention_res_proj.weight").reshape(-1),
                  "w_ffn": g(pre + "mlp_res_norm.weight") *
                           g(pre + "mlp_res_proj.weight").reshape(-1)}
            if l in self.mla_layers:
                lp["kind"] = "mla"
                lp["w_in"] = torch.cat([g(sa + "q_a_proj.weight"),
                                        g(sa + "kv_a_proj_with_mqa.weight"),
                                        g(sa + "g_proj.weight")], 0)
                lp["q_a_norm"] = g(sa + "q_a_layernorm.weight")
                lp["q_b"] = g(sa + "q_b_proj.weight")
                lp["kv_a_norm"] = g(sa + "kv_a_layernorm.weight")
                lp["kv_b"] = g(sa + "kv_b_proj.weight")
                kvb = lp["kv_b"].reshape(self.Hm, self.n + self.vm, self.rkv)
                lp["W_UK"] = kvb[:, :self.n, :].contiguous()           # (Hm, n, rkv)
                lp["W_UV_T"] = kvb[:, self.n:, :].transpose(1, 2).contiguous()  # (Hm, rkv, vm)
                lp["o_proj"] = g(sa + "o_proj.weight")
            else:
                lp["kind"] = "kda"
                fa = w.get(sa + "f_a_proj.weight", w.get(sa + "f_a.weight"))
                fb = w.get(sa + "f_b_proj.weight", w.get(sa + "f_b.weight"))
                # one GEMM for every projection of x: q, k, v (3P), g (P), f_a (dk), b (H)
                lp["w_in"] = torch.cat([g(sa + "q_proj.weight"), g(sa + "k_proj.weight"),
                                        g(sa + "v_proj.weight"), g(sa + "g_proj.weight"),
                                        fa, g(sa + "b_proj.weight")], 0).contiguous()
                lp["f_b"] = fb.contiguous()
                lp["conv"] = torch.cat([g(sa + "q_conv1d.weight"), g(sa + "k_conv1d.weight"),
                                        g(sa + "v_conv1d.weight")], 0).reshape(3 * P, self.W)
                lp["conv_T"] = lp["conv"].t().contiguous()              # (W, 3P)
                A_log = g(sa + "A_log")[:H]
                lp["a"] = torch.exp(A_log).repeat_interleave(dk)       # (P)
                lp["dt_bias"] = g(sa + "dt_bias")
                lp["o_norm"] = g(sa + "o_norm.weight")
                lp["o_proj"] = g(sa + "o_proj.weight")
            if l < self.first_dense:
                lp["ffn"] = "dense"
                lp["gu"] = torch.cat([g(pre + "mlp.gate_proj.weight"),
                                      g(pre + "mlp.up_proj.weight")], 0)
                lp["down"] = g(pre + "mlp.down_proj.weight")
            else:
                lp["ffn"] = "moe"
                mp = pre + "block_sparse_moe."
                lp["router"] = g(mp + "gate.weight")
                lp["bias"] = g(mp + "gate.e_score_correction_bias")
                # the latent down projection shares the router's input: one GEMM for both
                lp["w_x"] = torch.cat([lp["router"], g(mp + "routed_expert_down_proj.weight"),
                                       g(mp + "shared_experts.gate_proj.weight"),
                                       g(mp + "shared_experts.up_proj.weight")], 0).contiguous()
                lp["fs"] = w[mp + "shared_experts.gate_proj.weight"].shape[0]
                lp["sh_down"] = g(mp + "shared_experts.down_proj.weight")
                lp["znorm"] = g(mp + "routed_expert_norm.weight")
                lp["up"] = g(mp + "routed_expert_up_proj.weight")
                E = self.E
                lp["w13"] = torch.stack([torch.cat([w[mp + "experts.%d.w1.weight" % e],
                                                    w[mp + "experts.%d.w3.weight" % e]], 0)
                                         for e in range(E)]).contiguous()  # (E, 2f, dz)
                lp["w13_T"] = lp["w13"].transpose(1, 2).contiguous()        # (E, dz, 2f)
                lp["w2"] = torch.stack([w[mp + "experts.%d.w2.weight" % e]
                                        for e in range(E)]).contiguous()    # (E, dz, f)
                lp["w2_T"] = lp["w2"].transpose(1, 2).contiguous()          # (E, f, dz)
            self.layers.append(lp)

    # ---- elementwise pieces ----

    def situ(self, g, u):
        """SiTU(g, u) (spec 8)."""
        b1, b2 = self.b1, self.b2
        return torch.tanh(g / b1).mul_(b1).mul_(torch.sigmoid(g)).mul_(torch.tanh(u / b2).mul_(b2))

    def glu_fused(self, x, w_gu, w_down):
        """GLU with the gate and up rows fused in w_gu (2f, in)."""
        gu = x @ w_gu.t()
        f = w_gu.shape[0] // 2
        return self.situ(gu[..., :f], gu[..., f:]) @ w_down.t()

    @staticmethod
    def mix(V, K, w):
        """AttnRes mix (spec 5.1).  V (N, M, d) raw sources, K (N, M, d) their RMS-normalised
        keys, w (d) pseudo-query.  Returns (M, d)."""
        a = torch.softmax(K @ w, 0).unsqueeze(-1)         # (N, M, 1)
        return (a * V).sum(0)

    def rmskey(self, v):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + self.eps)

    # ---- KDA (spec 3) ----

    def kda_chunk(self, q, k, v, g, beta, S):
        """Chunkwise KDA core (spec 3.5) for Bt sequences of equal length.
        q, k, g (Bt, T, H, dk), v (Bt, T, H, dv), beta (Bt, T, H), S (Bt, H, dk, dv) initial
        state (updated: the final state is returned).  Returns o (Bt, T, H, dv), S.

        A_kk and A_qk are dense products per 16-row block b with the reference G at the
        block's first row: exp(G_r - G_i) = exp(G_r - G_ref) exp(G_ref - G_i), the first
        factor <= 1 and the second <= 1 for i < ref and <= e^{75} for i inside the block
        (|g| <= 5), so nothing overflows fp32; upper-triangle entries are masked."""
        Bt, T, H, K = q.shape
        Vd = v.shape[-1]
        C, Sb = self.C, self.sub
        if T < C:
            C = max(Sb, ((T + Sb - 1) // Sb) * Sb)
        pad = (-T) % C
        if pad:
            q, k, v, g = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v, g))
            beta = F.pad(beta, (0, 0, 0, pad))
        N = (T + pad) // C
        nb = C // Sb
        BH = Bt * H
        # (BH, N, C, K) head-major chunks
        q, k, v, g = (t.reshape(Bt, N, C, H, -1).permute(0, 3, 1, 2, 4).reshape(BH, N, C, -1)
                      for t in (q, k, v, g))
        beta = beta.reshape(Bt, N, C, H).permute(0, 3, 1, 2).reshape(BH, N, C, 1)
        q = q * (K ** -0.5)
        G = g.cumsum(2)                                             # inclusive, <= 0
        Gr = G.reshape(BH, N, nb, Sb, K)
        Gref = Gr[:, :, :, :1, :]                                   # (BH, N, nb, 1, K)
        er = torch.exp(Gr - Gref)                                   # rows, <= 1
        qb = q.reshape(BH, N, nb, Sb, K) * er
        kb = k.reshape(BH, N, nb, Sb, K) * er
        ec = torch.exp((Gref - G.unsqueeze(2)).clamp_(max=80.0))    # (BH, N, nb, C, K)
        kc = (k.unsqueeze(2) * ec).transpose(-1, -2)                # (BH, N, nb, K, C)
        Aqk = (qb @ kc).reshape(BH, N, C, C)
        Akk = (kb @ kc).reshape(BH, N, C, C)
        tri = torch.ones(C, C, dtype=torch.bool).tril()
        Aqk.masked_fill_(~tri, 0.0)
        Akk.masked_fill_(~tri.tril(-1), 0.0)
        Akk.mul_(beta)
        Akk.diagonal(dim1=-2, dim2=-1).fill_(1.0)                   # I + A_kk
        Gam = torch.exp(G)
        rhs = torch.cat([beta * Gam * k, beta * v], -1)             # (BH, N, C, K + dv)
        WU = torch.linalg.solve_triangular(Akk, rhs, upper=False, unitriangular=True)
        Wm, U = WU[..., :K], WU[..., K:]
        Gn = G[:, :, C - 1:, :]                                     # (BH, N, 1, K)
        Kbar_T = (torch.exp(Gn - G) * k).transpose(-1, -2).contiguous()  # (BH, N, K, C)
        dec = torch.exp(Gn).transpose(-1, -2).contiguous()          # (BH, N, K, 1)
        S = S.reshape(BH, K, Vd)
        Sin = torch.empty(BH, N, K, Vd)
        Vt = torch.empty(BH, N, C, Vd)
        Wm = Wm.contiguous()
        U = U.contiguous()
        for c in range(N):                                          # the state hand-off
            Sin[:, c] = S
            vt = torch.baddbmm(U[:, c], Wm[:, c], S, alpha=-1.0)    # U - W S
            Vt[:, c] = vt
            S = torch.baddbmm(S * dec[:, c], Kbar_T[:, c], vt)
        O = (q * Gam) @ Sin + Aqk @ Vt                              # (BH, N, C, dv)
        O = O.reshape(Bt, H, N * C, Vd)[:, :, :T].transpose(1, 2)
        return O, S.reshape(Bt, H, K, Vd)

    def kda_prefill(self, lp, x, st):
        """x (Bt, T, d) normalised input; st: per-layer state dict to fill (S, tails)."""
        Bt, T, d = x.shape
        H, dk, P, W = self.H, self.dk, self.P, self.W
        proj = x @ lp["w_in"].t()                                   # (Bt, T, 4P + dk + H)
        qkv = proj[..., :3 * P]
        # causal depthwise conv: zeros before the sequence start (fresh prefill)
        xp = F.pad(qkv, (0, 0, W - 1, 0))                           # (Bt, T+W-1, 3P)
        cw = lp["conv_T"]
        y = xp[:, 0:T] * cw[0]
        for j in range(1, W):
            y.addcmul_(xp[:, j:j + T], cw[j])
        y = F.silu(y)
        q = l2norm(y[..., :P].reshape(Bt, T, H, dk))
        k = l2norm(y[..., P:2 * P].reshape(Bt, T, H, dk))
        v = y[..., 2 * P:].reshape(Bt, T, H, dk)
        gam = proj[..., 3 * P:4 * P]
        f = proj[..., 4 * P:4 * P + dk] @ lp["f_b"].t()
        gdec = torch.sigmoid((f + lp["dt_bias"]) * lp["a"]).mul_(self.g_min).reshape(Bt, T, H, dk)
        beta = torch.sigmoid(proj[..., 4 * P + dk:])
        S0 = torch.zeros(Bt, H, dk, dk)
        o, S = self.kda_chunk(q, k, v, gdec, beta, S0)
        ob = rmsnorm(o, lp["o_norm"], self.eps) * torch.sigmoid(gam.reshape(Bt, T, H, dk))
        if st is not None:
            st["S"] = S.contiguous()
            st["tail"] = xp[:, T:T + W - 1].contiguous()            # (Bt, W-1, 3P) oldest first
        return ob.reshape(Bt, T, P) @ lp["o_proj"].t()

    def kda_decode(self, lp, x, st):
        """x (Bt, d); st {S (Bt, H, dk, dv), tail (Bt, W-1, 3P)} updated in place."""
        Bt = x.shape[0]
        H, dk, P, W = self.H, self.dk, self.P, self.W
        proj = x @ lp["w_in"].t()
        qkv = proj[:, :3 * P]
        tail = st["tail"]
        y = torch.addcmul((tail * lp["conv_T"][:W - 1]).sum(1), qkv, lp["conv_T"][W - 1])
        tail[:, :W - 2] = tail[:, 1:].clone()
        tail[:, W - 2] = qkv
        y = F.silu(y)
        q = l2norm(y[:, :P].reshape(Bt, H, dk))
        k = l2norm(y[:, P:2 * P].reshape(Bt, H, dk))
        v = y[:, 2 * P:].reshape(Bt, H, dk)
        gam = proj[:, 3 * P:4 * P]
        f = proj[:, 4 * P:4 * P + dk] @ lp["f_b"].t()
        gdec = torch.sigmoid((f + lp["dt_bias"]) * lp["a"]).mul_(self.g_min)
        alpha = torch.exp(gdec).reshape(Bt, H, dk, 1)
        beta = torch.sigmoid(proj[:, 4 * P + dk:]).reshape(Bt, H, 1)
        S = st["S"]
        S.mul_(alpha)                                               # 1. decay
        r = (k.unsqueeze(-2) @ S).squeeze(-2)                       # 2. S^T k   (Bt, H, dv)
        delta = (v - r).mul_(beta)                                  # 3.
        S.add_(k.unsqueeze(-1) * delta.unsqueeze(-2))               # 4. write
        o = (q.unsqueeze(-2) @ S).squeeze(-2).mul_(dk ** -0.5)      # 5. read after write
        ob = rmsnorm(o, lp["o_norm"], self.eps) * torch.sigmoid(gam.reshape(Bt, H, dk))
        return ob.reshape(Bt, P) @ lp["o_proj"].t()

    # ---- MLA (spec 4) ----

    def mla_split(self, lp, x):
        rq, rkv = self.rq, self.rkv
        proj = x @ lp["w_in"].t()
        cq = rmsnorm(proj[..., :rq], lp["q_a_norm"], 1e-6)
        ckv = proj[..., rq:rq + rkv + self.r]
        c = rmsnorm(ckv[..., :rkv], lp["kv_a_norm"], 1e-6)
        kpe = ckv[..., rkv:]
        gate = proj[..., rq + rkv + self.r:]
        return cq @ lp["q_b"].t(), c, kpe, gate

    def mla_prefill(self, lp, x, st, cap):
        """Expanded form (spec 4.1), causal within each sequence.  x (Bt, T, d)."""
        Bt, T, _ = x.shape
        Hm, n, r, vm = self.Hm, self.n, self.r, self.vm
        qf, c, kpe, gate = self.mla_split(lp, x)
        kv = (c @ lp["kv_b"].t()).reshape(Bt, T, Hm, n + vm)
        Q = qf.reshape(Bt, T, Hm, n + r).transpose(1, 2)                    # (Bt, Hm, T, n+r)
        Kt = torch.cat([kv[..., :n], kpe.unsqueeze(2).expand(Bt, T, Hm, r)], -1).permute(0, 2, 3, 1)
        Vv = kv[..., n:].transpose(1, 2)                                     # (Bt, Hm, T, vm)
        s = (Q @ Kt).mul_((n + r) ** -0.5)
        s.masked_fill_(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        o = (torch.softmax(s, -1) @ Vv).transpose(1, 2).reshape(Bt, T, Hm * vm)
        if st is not None:
            lat = torch.empty(Bt, cap, self.rkv + r)                         # static cache
            lat[:, :T, :self.rkv] = c
            lat[:, :T, self.rkv:] = kpe
            st["lat"] = lat
            st["len"] = T
        return (torch.sigmoid(gate) * o) @ lp["o_proj"].t()

    def mla_decode(self, lp, x, st):
        """Absorbed form (spec 4.2) over the latent cache.  x (Bt, d)."""
        Bt = x.shape[0]
        Hm, n, r, rkv = self.Hm, self.n, self.r, self.rkv
        qf, c, kpe, gate = self.mla_split(lp, x)
        t = st["len"]
        lat = st["lat"]
        if t >= lat.shape[1]:
            raise SystemExit("torch_model: MLA cache capacity %d exceeded" % lat.shape[1])
        lat[:, t, :rkv] = c
        lat[:, t, rkv:] = kpe
        st["len"] = t + 1
        qf = qf.reshape(Bt, Hm, n + r)
        qhat = torch.bmm(qf[:, :, :n].transpose(0, 1), lp["W_UK"]).transpose(0, 1)  # (Bt, Hm, rkv)
        qq = torch.cat([qhat, qf[:, :, n:]], -1)                                   # (Bt, Hm, rkv+r)
        keys = lat[:, :t + 1]                                           # (Bt, t+1, rkv+r)
        a = torch.softmax((qq @ keys.transpose(1, 2)).mul_((n + r) ** -0.5), -1)  # (Bt, Hm, t+1)
        ohat = a @ keys[:, :, :rkv]                                                 # (Bt, Hm, rkv)
        o = torch.bmm(ohat.transpose(0, 1), lp["W_UV_T"]).transpose(0, 1)          # (Bt, Hm, vm)
        return (torch.sigmoid(gate) * o.reshape(Bt, Hm * self.vm)) @ lp["o_proj"].t()

    # ---- FFN (spec 6, 7) ----

    def moe(self, lp, x):
        """Router + Stable LatentMoE + fused shared experts.  x (M, d)."""
        M = x.shape[0]
        E, k, f, dz = self.E, self.k, self.f, self.dz
        proj = x @ lp["w_x"].t()
        s = torch.sigmoid(proj[:, :E])
        z = proj[:, E:E + dz]
        fs = lp["fs"]
        sh = self.situ(proj[:, E + dz:E + dz + fs], proj[:, E + dz + fs:]) @ lp["sh_down"].t()
        sel = torch.topk(s + lp["bias"], k, dim=-1).indices                 # (M, k)
        p = s.gather(1, sel)
        p = p * (self.rho / (p.sum(-1, keepdim=True) + 1e-20))
        u = torch.zeros(M, dz)
        if M * k < E:
            # few token-routes (decode): gather the routed experts' weights, one bmm each
            flat = sel.reshape(-1)
            zr = z.repeat_interleave(k, 0).unsqueeze(1)                    # (M k, 1, dz)
            h = torch.bmm(zr, lp["w13_T"][flat])                          # (M k, 1, 2f)
            a = self.situ(h[..., :f], h[..., f:])
            out = torch.bmm(a, lp["w2_T"][flat]).reshape(M, k, dz)
            u = torch.einsum("mk,mkz->mz", p, out)
        else:
            # grouped execution (spec 7.2): sort routes by expert, one GEMM pair per expert
            flat = sel.reshape(-1)
            order = torch.argsort(flat, stable=True)
            counts = torch.bincount(flat, minlength=E).tolist()
            tok = order // k
            pw = p.reshape(-1)[order].unsqueeze(1)
            zs = z[tok]
            start = 0
            outs = []
            for e in range(E):
                cnt = counts[e]
                if cnt == 0:
                    continue
                ze = zs[start:start + cnt]
                h = ze @ lp["w13_T"][e]
                outs.append((self.situ(h[:, :f], h[:, f:]) @ lp["w2_T"][e]))
                start += cnt
            y = torch.cat(outs, 0).mul_(pw)
            u.index_add_(0, tok, y)
        un = rmsnorm(u, lp["znorm"], self.eps)
        return un @ lp["up"].t() + sh

    def ffn(self, lp, x):
        shp = x.shape
        x2 = x.reshape(-1, shp[-1])
        if lp["ffn"] == "dense":
            y = self.glu_fused(x2, lp["gu"], lp["down"])
        else:
            y = self.moe(lp, x2)
        return y.reshape(shp)

    # ---- whole model ----

    def forward(self, tokens, state=None, decode=False, cap=0, last_only=False):
        """Prefill: tokens (Bt, T) from a fresh start; fills `state` (a list, one dict per
        layer) if given, with MLA caches of capacity cap.  Decode: tokens (Bt,), state from a
        previous call (updated).  Returns logits (Bt, T, V) or (Bt, V)."""
        h0 = F.embedding(tokens, self.embed)                     # (Bt, [T,] d)
        shp = h0.shape
        M = h0.numel() // self.d
        blocks_v, blocks_k = [], []
        p = h0.reshape(M, self.d)
        for l, lp in enumerate(self.layers):
            if not blocks_v:
                h = p
            else:
                h = self.mix(torch.stack(blocks_v + [p]), torch.stack(blocks_k + [self.rmskey(p)]),
                             lp["w_attn"])
            if l % self.B == 0:
                blocks_v.append(p)
                blocks_k.append(self.rmskey(p))
                p = torch.zeros_like(p)
            xin = rmsnorm(h, lp["in_norm"], self.eps).reshape(shp)
            if decode:
                if lp["kind"] == "kda":
                    y = self.kda_decode(lp, xin, state[l])
                else:
                    y = self.mla_decode(lp, xin, state[l])
            else:
                st = None
                if state is not None:
                    st = {}
                    state.append(st)
                if lp["kind"] == "kda":
                    y = self.kda_prefill(lp, xin, st)
                else:
                    y = self.mla_prefill(lp, xin, st, cap)
            p = p + y.reshape(M, self.d)
            m = self.mix(torch.stack(blocks_v + [p]), torch.stack(blocks_k + [self.rmskey(p)]),
                         lp["w_ffn"])
            xf = rmsnorm(m, lp["post_norm"], self.eps)
            p = p + self.ffn(lp, xf)
        out = self.mix(torch.stack(blocks_v + [p]), torch.stack(blocks_k + [self.rmskey(p)]),
                       self.out_res)
        out = out.reshape(shp)
        if last_only and not decode:
            out = out[:, -1]
        return rmsnorm(out, self.norm, self.eps) @ self.lm_head.t()


def kda_recurrent_ref(q, k, v, g, beta, S):
    """Token-by-token KDA (spec 3.3) for the self-check of the chunk form."""
    Bt, T, H, K = q.shape
    S = S.clone()
    outs = []
    for t in range(T):
        S = S * torch.exp(g[:, t]).unsqueeze(-1)
        r = torch.einsum("bhkv,bhk->bhv", S, k[:, t])
        dl = beta[:, t].unsqueeze(-1) * (v[:, t] - r)
        S = S + k[:, t].unsqueeze(-1) * dl.unsqueeze(-2)
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]) * K ** -0.5)
    return torch.stack(outs, 1), S


# ---------------------------------------------------------------------------------------------
# verification
# ---------------------------------------------------------------------------------------------

def max_ref_err(a, ref):
    """max |a - ref| / max |ref| (the max|ref| form of spec 16.4 with atol = 0)."""
    a = a.to(torch.float64)
    ref = ref.to(torch.float64)
    if a.shape != ref.shape:
        raise VerifyFailed("shape %s vs reference %s" % (tuple(a.shape), tuple(ref.shape)))
    den = ref.abs().max().item()
    return (a - ref).abs().max().item() / (den if den > 0 else 1.0)


# Whole-model forward on the fp32 CPU against a float64 reference or another fp32 path:
# max|ref| form, atol 0, rtol 1e-4 (spec 16.4: long fp32 reductions).
RTOL = 1e-4


def verify_golden(path, config_path, log):
    """Prefill and decode logits of the golden float64 tiny model (spec 16.2 model_tiny)."""
    with open(config_path) as f:
        tc = json.load(f)["text_config"]
    gw = read_safetensors(path)
    m = Model(tc, gw)
    toks = gw["tokens"]
    cu = gw["cu_seqlens"].tolist()
    ref = gw["logits"]
    res = {}
    worst = 0.0
    for i in range(len(cu) - 1):  # packed documents = independent sequences
        a, b = cu[i], cu[i + 1]
        lg = m.forward(toks[a:b].unsqueeze(0))[0]
        worst = max(worst, max_ref_err(lg, ref[a:b]))
    res["prefill_rel_err"] = worst
    # decode: prefill the first n_pre tokens of the last document, decode the rest
    a, b = cu[-2], cu[-1]
    n_dec = gw["decode_logits"].shape[0]
    n_pre = (b - a) - n_dec
    state = []
    m.forward(toks[a:a + n_pre].unsqueeze(0), state=state, cap=b - a)
    dec = [m.forward(toks[t:t + 1], state=state, decode=True)[0] for t in range(a + n_pre, b)]
    res["decode_rel_err"] = max_ref_err(torch.stack(dec), gw["decode_logits"])
    # the chunk form over several chunks and sub-chunks vs the token-by-token recurrence
    gen = torch.Generator().manual_seed(7)
    Tq, H, K = 150, 2, 64
    q = l2norm(torch.randn(2, Tq, H, K, generator=gen))
    k = l2norm(torch.randn(2, Tq, H, K, generator=gen))
    v = torch.randn(2, Tq, H, K, generator=gen)
    g = -5.0 * torch.rand(2, Tq, H, K, generator=gen)
    beta = torch.rand(2, Tq, H, generator=gen)
    S0 = 0.1 * torch.randn(2, H, K, K, generator=gen)
    o1, S1 = m.kda_chunk(q, k, v, g, beta, S0.clone())
    o2, S2 = kda_recurrent_ref(q, k, v, g, beta, S0)
    res["kda_chunk_vs_recurrent_rel_err"] = max(max_ref_err(o1, o2), max_ref_err(S1, S2))
    for key, val in res.items():
        log("torch_model: golden %s = %.3e (limit %g)" % (key, val, RTOL))
        if not val <= RTOL:
            raise VerifyFailed("golden model_tiny check %s: %.3e > %g" % (key, val, RTOL))
    return res


def read_array(path, dtype):
    """A flat array from a .npy file (agentrl score --tokens / --logits-out) or a raw
    little-endian file of dtype (bench_policy's cross-check files)."""
    if path.endswith(".npy"):
        return torch.from_numpy(np.ascontiguousarray(np.load(path).astype(dtype).reshape(-1)))
    return torch.from_numpy(np.fromfile(path, dtype=dtype))


def verify_self(m, T, log):
    """Decode after prefill equals prefill of the longer sequence (this checkpoint)."""
    gen = torch.Generator().manual_seed(11)
    toks = torch.randint(0, m.V, (2, T), generator=gen)
    full = m.forward(toks)
    n_pre = T - 8
    state = []
    m.forward(toks[:, :n_pre], state=state, cap=T)
    dec = torch.stack([m.forward(toks[:, t], state=state, decode=True) for t in range(n_pre, T)], 1)
    err = max_ref_err(dec, full[:, n_pre:])
    log("torch_model: decode vs prefill (T = %d, 2 sequences) rel err %.3e" % (T, err))
    if not err <= RTOL:
        raise VerifyFailed("decode vs prefill on the benchmark checkpoint: %.3e > %g" % (err, RTOL))
    return err


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------

def prefill_tokens(m, T):
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, m.V, (1, T), generator=gen)


def prefill_once(m, toks, last_only):
    """One prefill from a fresh start that also fills a decode state (caches of capacity T)."""
    state = []
    t0 = time.perf_counter()
    m.forward(toks, state=state, cap=toks.shape[1], last_only=last_only)
    return time.perf_counter() - t0


class DecodeBench:
    """`steps` decode steps of one token per sequence for `batch` sequences after a prefill
    of ctx tokens each (untimed); every run starts from a copy of the prefilled state."""

    def __init__(self, m, batch, ctx, steps):
        gen = torch.Generator().manual_seed(2)
        self.m, self.ctx, self.steps = m, ctx, steps
        self.toks = torch.randint(0, m.V, (batch, ctx + steps), generator=gen)
        self.base = []
        m.forward(self.toks[:, :ctx], state=self.base, cap=ctx + steps)

    def run(self):
        st = [dict((key, (val.clone() if torch.is_tensor(val) else val)) for key, val in s.items())
              for s in self.base]
        t0 = time.perf_counter()
        for t in range(self.ctx, self.ctx + self.steps):
            self.m.forward(self.toks[:, t], state=st, decode=True)
        return time.perf_counter() - t0


def summary(ts, tokens):
    med = statistics.median(ts)
    return {"times_s": ts, "median_s": med, "tokens_per_s": tokens / med}


def serve(m, log):
    """Line protocol with bench_policy (which interleaves these runs with its own, so that both
    see the same machine load).  Requests on stdin, one JSON line per reply on stdout:
      prefill T LAST     one timed prefill of T tokens (LAST 1: only the last logits)
      decode B CTX STEPS one timed run of DecodeBench(B, CTX, STEPS) (built on first use)
      quit"""
    toks = {}
    dec = {}
    for line in sys.stdin:
        w = line.split()
        if not w:
            continue
        try:
            if w[0] == "quit":
                break
            elif w[0] == "prefill":
                T, last = int(w[1]), int(w[2])
                if T not in toks:
                    toks[T] = prefill_tokens(m, T)
                    prefill_once(m, toks[T], last)  # warm-up
                reply = {"s": prefill_once(m, toks[T], last)}
            elif w[0] == "decode":
                key = (int(w[1]), int(w[2]), int(w[3]))
                if key not in dec:
                    dec[key] = DecodeBench(m, *key)
                    dec[key].run()  # warm-up
                reply = {"s": dec[key].run()}
            else:
                reply = {"error": "unknown request %r" % line.strip()}
        except (IndexError, ValueError) as e:
            reply = {"error": "bad request %r: %s" % (line.strip(), e)}
        print(json.dumps(reply), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", required=True, help="agentrl checkpoint directory to time")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--T", type=int, default=2048, help="prefill length")
    ap.add_argument("--prefill-reps", type=int, default=5)
    ap.add_argument("--decode-batches", default="1,16")
    ap.add_argument("--decode-context", type=int, default=256)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--decode-reps", type=int, default=5)
    ap.add_argument("--last-only", action="store_true", help="prefill computes only the last "
                    "position's logits (default: all positions, like scoring)")
    ap.add_argument("--golden",
                    default=os.path.join(ROOT, "tests/golden/data/model_tiny.safetensors"))
    ap.add_argument("--golden-config", default=os.path.join(ROOT, "configs/tiny/config.json"))
    ap.add_argument("--check-tokens", help="tokens the C model scored: .npy (int32/int64) or "
                    "a raw int32 file; one sequence")
    ap.add_argument("--check-logits", help="the C model's logits (T, V): .npy or raw float32")
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--verify-only", action="store_true")
    ap.add_argument("--serve", action="store_true", help="after verifying, answer timing "
                    "requests on stdin (the protocol of bench_policy; see serve())")
    args = ap.parse_args()
    log = lambda s: print(s, file=sys.stderr, flush=True)
    torch.set_num_threads(args.threads)
    out = {"torch_version": torch.__version__, "threads": torch.get_num_threads(),
           "python": sys.executable}
    try:
        with torch.inference_mode():
            if not args.no_verify:
                if os.path.exists(args.golden):
                    out["golden"] = verify_golden(args.golden, args.golden_config, log)
                else:
                    log("torch_model: %s missing: golden check skipped" % args.golden)
            tc, w = read_checkpoint(args.ckpt)
            m = Model(tc, w)
            if not args.no_verify:
                out["decode_vs_prefill_rel_err"] = verify_self(m, 160, log)
                if args.check_tokens:
                    toks = read_array(args.check_tokens, np.int32).to(torch.int64)
                    ref = read_array(args.check_logits, np.float32).reshape(toks.numel(), m.V)
                    lg = m.forward(toks.unsqueeze(0))[0]
                    err = max_ref_err(lg, ref)
                    out["c_logits_rel_err"] = err
                    out["c_logits_T"] = toks.numel()
                    log("torch_model: logits vs the C model (T = %d) rel err %.3e (limit %g)"
                        % (toks.numel(), err, RTOL))
                    if not err <= RTOL:
                        raise VerifyFailed("logits differ from the C model's: max|a-ref|/max|ref|"
                                           " = %.3e > %g" % (err, RTOL))
            if args.serve:
                out["ready"] = True
                print(json.dumps(out), flush=True)
                return serve(m, log)
            if args.verify_only:
                print(json.dumps(out))
                return 0
            log("torch_model: prefill T = %d ..." % args.T)
            toks = prefill_tokens(m, args.T)
            prefill_once(m, toks, args.last_only)
            ts = [prefill_once(m, toks, args.last_only) for _ in range(args.prefill_reps)]
            out["prefill"] = dict(summary(ts, args.T), T=args.T,
                                  logits="last" if args.last_only else "all")
            out["decode"] = []
            for b in [int(x) for x in args.decode_batches.split(",") if x]:
                log("torch_model: decode batch %d ..." % b)
                db = DecodeBench(m, b, args.decode_context, args.decode_steps)
                db.run()
                ts = [db.run() for _ in range(args.decode_reps)]
                out["decode"].append(dict(summary(ts, b * args.decode_steps), batch=b,
                                          context=args.decode_context, steps=args.decode_steps))
    except VerifyFailed as e:
        print("torch_model: VERIFY FAILED: %s" % e, file=sys.stderr)
        out["error"] = str(e)
        print(json.dumps(out), flush=True)
        return 3
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
