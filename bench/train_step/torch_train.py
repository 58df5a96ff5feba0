#!/usr/bin/python3
"""bench/train_step/torch_train.py: the PyTorch baseline of bench_train_step - one training
step (forward, mean next-token NLL, backward, global-norm clipping, AdamW) of the agentrl
policy in fp32 eager autograd, on the same checkpoint, batch, hyper-parameters and threads
as the C step (policy/model_backward.h + policy/optimizer.h).

What this is: bench/policy/torch_model.py's Model (the inference baseline, verified against
the golden model and the C logits) turned into a trainable module.  Its fused projections
(q/k/v/g/f_a/b of KDA, q_a/kv_a/g of MLA, gate/up of the GLUs, router/latent-down/shared
gate/up of MoE, w1/w3 of every expert) become the leaf parameters, so a step does the same
few large GEMMs a reasonably efficient PyTorch user would write; everything the inference
model precomputes from weights (AttnRes pseudo-queries w_norm * w_proj, exp(A_log), the
transposed expert banks) is recomputed from the leaves in every forward (refresh()) so that
autograd reaches the checkpoint tensors.  Overridden for autograd: situ() and kda_prefill(),
whose in-place ops modify outputs that autograd saves.  Every checkpoint tensor of the text
model maps to a slice of one leaf (keymap), which is how gradients are compared with the C
ones and how the optimizer's decay groups follow the C rule (policy/optimizer.h
arl_optim_tensor_rule: decay for tensors with >= 2 dimensions > 1 except the conv filters;
e_score_correction_bias is not trained).

What this is not: the vision tower (the C step's vision tensors get zero gradients and only
the optimizer's decay), Quantile Balancing of the router bias (not part of arl_adamw_step),
a learning-rate schedule (the benchmark uses a constant rate on both sides), decode.

Fairness: fp32 eager as a reasonably efficient user writes it - fused projections (above),
grouped expert GEMMs, F.cross_entropy, AdamW with foreach=True, clip_grad_norm_, parameters
reset with zero_grad(set_to_none=True); torch.set_num_threads(--threads); bench_train_step
starts this process with OMP_WAIT_POLICY=PASSIVE and a correct OPENBLAS_CORETYPE.  Nothing is
deliberately slow.  Not done (they would be a different baseline): torch.compile (not in this
PyTorch), custom autograd functions for KDA, activation recomputation.

Verification before any timing (exit 3 on failure; a fast wrong baseline is worthless):
  loss     the first step's loss vs the C loss (--check-loss): |a - ref| <= 1e-4 |ref|;
  grads    every text tensor's gradient vs the C gradients of the same step
           (--check-dir/grads1.safetensors, from arl_model_grads_save): max|a-ref|/max|ref|
           <= 1e-3 (fp32 backward through 8 layers, MoE and long reductions);
  AdamW    clip_grad_norm_ + torch.optim.AdamW applied to the C gradients of the C run's first
           two steps vs the C parameters after each (--check-dir/step1, step2: checkpoint
           directories): max|ref| form <= 1e-5 per tensor (same gradients, elementwise fp32
           update; a tensor decayed on one side only is off by lr * weight_decay = 3e-5 per
           step with the defaults; the second step checks the betas).
Then the parameters and the optimizer are reset to the checkpoint's state.

Usage: /usr/bin/python3 bench/train_step/torch_train.py --ckpt DIR --tokens FILE --docs N
       [--threads N] [--lr ..] [--beta1 ..] [--beta2 ..] [--eps ..] [--weight-decay ..]
       [--clip-norm ..] [--check-loss X --check-dir DIR] [--serve]
Without --serve: prints the checks and the median step time of --steps steps as one JSON
object.  With --serve: prints the checks as one JSON line, then answers requests on stdin
(see serve()).  Exit status: 0 ok, 3 a verification failed, 4 torch is not importable.
"""
import argparse
import gc
import json
import os
import resource
import signal
import statistics
import sys
import time

# Ctrl-C or a closed pipe (the benchmark that started this baseline stopped) ends the
# process quietly, as it would a C program, not with a Python traceback.
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "policy"))

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # bench_train_step reports the baseline as unavailable (exit 4)
    print(json.dumps({"error": "torch unavailable: %s" % e, "unavailable": True}), flush=True)
    sys.exit(4)

import numpy as np  # noqa: E402  (after the torch check: both come with python3-torch)
import torch_model as tm  # noqa: E402

# Tolerances (spec 16.4, max|ref| form, atol 0), see the file comment.
LOSS_RTOL = 1e-4
GRAD_RTOL = 1e-3
STEP_RTOL = 1e-5

LM = tm.LM


def rss_kb(field):
    """VmRSS / VmHWM of this process in KiB (0 if /proc is unavailable)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def reset_peak():
    """Reset VmHWM to the current RSS (Linux clear_refs 5); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def c_decays(shape, is_conv):
    """arl_optim_tensor_rule's decay flag for a checkpoint tensor of this shape."""
    return sum(1 for s in shape if s > 1) >= 2 and not is_conv


class TrainModel(tm.Model):
    """tm.Model with leaf parameters (see the file comment)."""

    def __init__(self, tc, w):
        super().__init__(tc, w)
        self.leaves = []      # (name, tensor) in a stable order
        self.decay = {}       # leaf name -> bool
        self.keymap = {}      # checkpoint key -> (leaf tensor, index into it)
        H, E, f = self.H, self.E, self.f

        def key_of(*names):
            for n in names:
                if n in w:
                    return n
            raise SystemExit("torch_train: none of %s in the checkpoint" % (names,))

        def make_leaf(name, t, parts):
            """parts: [(checkpoint key, index)] covering the leaf; all must share a decay rule."""
            t = t.detach().clone().contiguous().requires_grad_(True)
            rules = set()
            for key, idx in parts:
                self.keymap[key] = (t, idx)
                is_conv = key.endswith("conv1d.weight")
                rules.add(c_decays(w[key].shape, is_conv))
            if len(rules) != 1:
                raise SystemExit("torch_train: fused leaf %s mixes decayed and undecayed "
                                 "tensors; unfuse it for this config" % name)
            self.leaves.append((name, t))
            self.decay[name] = rules.pop()
            return t

        def rows(keys):
            """[(key, row slice)] for a row-wise concatenation of these tensors."""
            out, a = [], 0
            for k in keys:
                n = w[k].shape[0]
                out.append((k, (slice(a, a + n),)))
                a += n
            return out

        ek = LM + "embed_tokens.weight"
        self.embed = make_leaf("embed", self.embed, [(ek, ())])
        hk = "language_model.lm_head.weight"
        self.lm_head = make_leaf("lm_head", self.lm_head, [(hk, ())])
        nk = LM + "norm.weight"
        self.norm = make_leaf("norm", self.norm, [(nk, ())])
        for nm in ("output_attn_res_norm", "output_attn_res_proj"):
            k = LM + nm + ".weight"
            setattr(self, nm, make_leaf(nm, w[k], [(k, ())]))
        del self.out_res
        for l, lp in enumerate(self.layers):
            pre = LM + "layers.%d." % l
            sa = pre + "self_attn."
            lk = lambda s: pre + s + ".weight"  # noqa: E731
            for key, nm in (("in_norm", "input_layernorm"), ("post_norm", "post_attention_layernorm")):
                lp[key] = make_leaf("%d.%s" % (l, nm), lp[key], [(lk(nm), ())])
            for nm in ("self_attention_res_norm", "self_attention_res_proj", "mlp_res_norm",
                       "mlp_res_proj"):
                lp[nm] = make_leaf("%d.%s" % (l, nm), w[lk(nm)], [(lk(nm), ())])
            del lp["w_attn"], lp["w_ffn"]
            if lp["kind"] == "kda":
                fa = key_of(sa + "f_a_proj.weight", sa + "f_a.weight")
                fb = key_of(sa + "f_b_proj.weight", sa + "f_b.weight")
                lp["w_in"] = make_leaf("%d.kda.w_in" % l, lp["w_in"], rows(
                    [sa + "q_proj.weight", sa + "k_proj.weight", sa + "v_proj.weight",
                     sa + "g_proj.weight", fa, sa + "b_proj.weight"]))
                lp["f_b"] = make_leaf("%d.kda.f_b" % l, lp["f_b"], [(fb, ())])
                convs = [sa + c + "_conv1d.weight" for c in "qkv"]
                lp["conv"] = make_leaf("%d.kda.conv" % l, lp["conv"], rows(convs))
                ak = sa + "A_log"
                lp["A_log"] = make_leaf("%d.kda.A_log" % l, w[ak][:H], [(ak, ())])
                for key, nm in (("dt_bias", "dt_bias"), ("o_norm", "o_norm.weight"),
                                ("o_proj", "o_proj.weight")):
                    lp[key] = make_leaf("%d.kda.%s" % (l, key), lp[key], [(sa + nm, ())])
                del lp["conv_T"], lp["a"]
            else:
                lp["w_in"] = make_leaf("%d.mla.w_in" % l, lp["w_in"], rows(
                    [sa + "q_a_proj.weight", sa + "kv_a_proj_with_mqa.weight",
                     sa + "g_proj.weight"]))
                for key, nm in (("q_a_norm", "q_a_layernorm"), ("q_b", "q_b_proj"),
                                ("kv_a_norm", "kv_a_layernorm"), ("kv_b", "kv_b_proj"),
                                ("o_proj", "o_proj")):
                    lp[key] = make_leaf("%d.mla.%s" % (l, key), lp[key], [(sa + nm + ".weight", ())])
                del lp["W_UK"], lp["W_UV_T"]  # decode only
            if lp["ffn"] == "dense":
                lp["gu"] = make_leaf("%d.mlp.gu" % l, lp["gu"], rows(
                    [pre + "mlp.gate_proj.weight", pre + "mlp.up_proj.weight"]))
                lp["down"] = make_leaf("%d.mlp.down" % l, lp["down"],
                                       [(pre + "mlp.down_proj.weight", ())])
            else:
                mp = pre + "block_sparse_moe."
                lp["w_x"] = make_leaf("%d.moe.w_x" % l, lp["w_x"], rows(
                    [mp + "gate.weight", mp + "routed_expert_down_proj.weight",
                     mp + "shared_experts.gate_proj.weight", mp + "shared_experts.up_proj.weight"]))
                for key, nm in (("sh_down", "shared_experts.down_proj"),
                                ("znorm", "routed_expert_norm"), ("up", "routed_expert_up_proj")):
                    lp[key] = make_leaf("%d.moe.%s" % (l, key), lp[key], [(mp + nm + ".weight", ())])
                ex = mp + "experts.%d.w%d.weight"
                lp["w13"] = make_leaf("%d.moe.w13" % l, lp["w13"],
                                      [(ex % (e, 1), (e, slice(0, f))) for e in range(E)] +
                                      [(ex % (e, 3), (e, slice(f, 2 * f))) for e in range(E)])
                lp["w2"] = make_leaf("%d.moe.w2" % l, lp["w2"], [(ex % (e, 2), (e,)) for e in range(E)])
                del lp["router"], lp["w13_T"], lp["w2_T"]  # router: rows of w_x
                lp["bias"] = lp["bias"].detach()             # QB-set, no gradient
        missing = [k for k in w if k not in self.keymap and is_trained_key(k)]
        if missing:
            raise SystemExit("torch_train: checkpoint tensors without a leaf: %s" % missing[:5])

    def params(self):
        return [t for _, t in self.leaves]

    def refresh(self):
        """Tensors the inference model precomputes, rebuilt from the leaves (autograd)."""
        self.out_res = self.output_attn_res_norm * self.output_attn_res_proj.reshape(-1)
        for lp in self.layers:
            lp["w_attn"] = lp["self_attention_res_norm"] * lp["self_attention_res_proj"].reshape(-1)
            lp["w_ffn"] = lp["mlp_res_norm"] * lp["mlp_res_proj"].reshape(-1)
            if lp["kind"] == "kda":
                lp["a"] = torch.exp(lp["A_log"]).repeat_interleave(self.dk)
                lp["conv_T"] = lp["conv"].t()
            if lp["ffn"] == "moe":
                lp["w13_T"] = lp["w13"].transpose(1, 2)
                lp["w2_T"] = lp["w2"].transpose(1, 2)

    # ---- overrides: the inference versions modify autograd-saved outputs in place ----

    def situ(self, g, u):
        b1, b2 = self.b1, self.b2
        return (b1 * b2) * torch.tanh(g / b1) * torch.sigmoid(g) * torch.tanh(u / b2)

    def kda_prefill(self, lp, x, st):
        """tm.Model.kda_prefill for training (fresh documents, no state kept)."""
        Bt, T, d = x.shape
        H, dk, P, W = self.H, self.dk, self.P, self.W
        proj = x @ lp["w_in"].t()                                   # (Bt, T, 4P + dk + H)
        xp = F.pad(proj[..., :3 * P], (0, 0, W - 1, 0))             # (Bt, T+W-1, 3P)
        cw = lp["conv_T"]                                           # (W, 3P)
        y = xp[:, 0:T] * cw[0]
        for j in range(1, W):
            y = torch.addcmul(y, xp[:, j:j + T], cw[j])
        y = F.silu(y)
        q = tm.l2norm(y[..., :P].reshape(Bt, T, H, dk))
        k = tm.l2norm(y[..., P:2 * P].reshape(Bt, T, H, dk))
        v = y[..., 2 * P:].reshape(Bt, T, H, dk)
        gam = proj[..., 3 * P:4 * P]
        fl = proj[..., 4 * P:4 * P + dk] @ lp["f_b"].t()
        gdec = (torch.sigmoid((fl + lp["dt_bias"]) * lp["a"]) * self.g_min).reshape(Bt, T, H, dk)
        beta = torch.sigmoid(proj[..., 4 * P + dk:])
        o, _ = self.kda_chunk(q, k, v, gdec, beta, torch.zeros(Bt, H, dk, dk))
        ob = tm.rmsnorm(o, lp["o_norm"], self.eps) * torch.sigmoid(gam.reshape(Bt, T, H, dk))
        return ob.reshape(Bt, T, P) @ lp["o_proj"].t()

    def loss(self, tokens):
        """Mean next-token NLL over the target positions of the documents (rows of tokens,
        equal lengths): the loss of arl_model_loss_and_grad."""
        self.refresh()
        logits = self.forward(tokens)                               # (N, Td, V)
        return F.cross_entropy(logits[:, :-1].reshape(-1, self.V), tokens[:, 1:].reshape(-1))


def is_trained_key(k):
    return k.startswith("language_model.") and not k.endswith("e_score_correction_bias")


class Trainer:
    def __init__(self, m, tokens, a):
        self.m, self.tokens, self.a = m, tokens, a
        self.init_state = [t.detach().clone() for t in m.params()]
        self.new_optimizer()

    def new_optimizer(self):
        m, a = self.m, self.a
        dec = [t for n, t in m.leaves if m.decay[n]]
        nodec = [t for n, t in m.leaves if not m.decay[n]]
        self.opt = torch.optim.AdamW([{"params": dec, "weight_decay": a.weight_decay},
                                      {"params": nodec, "weight_decay": 0.0}],
                                     lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                                     foreach=a.foreach)

    def reset(self):
        with torch.no_grad():
            for t, t0 in zip(self.m.params(), self.init_state):
                t.copy_(t0)
                t.grad = None
        self.new_optimizer()

    def clip_and_step(self):
        if self.a.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.m.params(), self.a.clip_norm)
        self.opt.step()

    def step(self):
        """One training step; returns (loss, wall s, cpu s, [forward, backward, optimizer] s)."""
        t0, c0 = time.perf_counter(), time.process_time()
        self.opt.zero_grad(set_to_none=True)
        loss = self.m.loss(self.tokens)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        self.clip_and_step()
        t3 = time.perf_counter()
        return loss.item(), t3 - t0, time.process_time() - c0, [t1 - t0, t2 - t1, t3 - t2]


# ---------------------------------------------------------------------------------------------
# verification against the C step
# ---------------------------------------------------------------------------------------------

def view_of(m, key, grad):
    """The torch tensor (or gradient) of a checkpoint key; a leaf the loss does not reach (the
    pre-mixer AttnRes vectors of layer 0: no earlier block to mix) has zero gradient."""
    t, idx = m.keymap[key]
    src = t.detach() if not grad else t.grad if t.grad is not None else torch.zeros_like(t)
    return src[idx] if idx else src


def c_tensor(cw, key, like):
    """A C tensor reshaped like the torch view (A_log: its first H entries of the padding)."""
    c = cw[key].reshape(-1)[:like.numel()] if key.endswith("A_log") else cw[key]
    return c.reshape(like.shape)


def compare_all(m, cw, grad, rtol, what, named):
    """max|a-ref|/max|ref| per text tensor (ref = C); returns (worst, worst key, named errs)."""
    worst, wkey, errs = 0.0, None, {}
    for key in sorted(m.keymap):
        a = view_of(m, key, grad)
        if a is None:
            raise tm.VerifyFailed("%s: no torch gradient for %s" % (what, key))
        if key not in cw:
            raise tm.VerifyFailed("%s: %s missing from the C file" % (what, key))
        e = tm.max_ref_err(a, c_tensor(cw, key, a))
        if key in named:
            errs[key] = e
        if not e <= worst:
            worst, wkey = e, key
    if not worst <= rtol:
        raise tm.VerifyFailed("%s of %s differs from C: max|a-ref|/max|ref| = %.3e > %g"
                              % (what, wkey, worst, rtol))
    return worst, wkey, errs


NAMED = ["language_model.lm_head.weight", LM + "embed_tokens.weight",
         LM + "layers.0.mlp.gate_proj.weight", LM + "layers.1.self_attn.q_proj.weight",
         LM + "layers.1.self_attn.A_log", LM + "layers.3.self_attn.kv_b_proj.weight",
         LM + "layers.5.block_sparse_moe.gate.weight",
         LM + "layers.5.block_sparse_moe.experts.3.w1.weight",
         LM + "layers.0.self_attention_res_proj.weight"]


def verify(tr, a, log):
    m = tr.m
    out = {}
    tr.opt.zero_grad(set_to_none=True)
    lt = m.loss(tr.tokens)
    lt.backward()
    loss = lt.item()
    out["loss"] = loss
    if a.check_loss is not None:
        err = abs(loss - a.check_loss) / abs(a.check_loss)
        out["loss_rel_err"] = err
        log("torch_train: first-step loss %.8f vs C %.8f, rel err %.2e (limit %g)"
            % (loss, a.check_loss, err, LOSS_RTOL))
        if not err <= LOSS_RTOL:
            raise tm.VerifyFailed("first-step loss %.8g differs from C's %.8g (rel %.3e > %g)"
                                  % (loss, a.check_loss, err, LOSS_RTOL))
    if a.check_dir:
        cw = tm.read_safetensors(os.path.join(a.check_dir, "grads1.safetensors"))
        worst, wkey, errs = compare_all(m, cw, True, GRAD_RTOL, "gradient", NAMED)
        out.update(grad_worst_rel_err=worst, grad_worst_key=wkey, grad_named_rel_err=errs,
                   grad_tensors=len(m.keymap))
        log("torch_train: gradients of %d tensors vs C: worst %.2e (%s), limit %g"
            % (len(m.keymap), worst, wkey, GRAD_RTOL))
        # the optimizer alone: clipping + AdamW on the C gradients of two steps (the second
        # step's moments and bias corrections depend on the betas) vs the C parameters
        worst_all, wkey_all = 0.0, None
        for s in (1, 2):
            if s == 2:
                cw = tm.read_safetensors(os.path.join(a.check_dir, "grads2.safetensors"))
            with torch.no_grad():
                for t in m.params():
                    if t.grad is None:
                        t.grad = torch.zeros_like(t)
                for key, (t, idx) in m.keymap.items():
                    dst = t.grad[idx] if idx else t.grad
                    dst.copy_(c_tensor(cw, key, dst))
            del cw
            tr.clip_and_step()
            _, cp = tm.read_checkpoint(os.path.join(a.check_dir, "step%d" % s))
            worst, wkey, _ = compare_all(m, cp, False, STEP_RTOL, "parameter after AdamW step %d"
                                         % s, ())
            del cp
            if not worst <= worst_all:
                worst_all, wkey_all = worst, wkey
        out.update(adamw_worst_rel_err=worst_all, adamw_worst_key=wkey_all)
        log("torch_train: parameters after two AdamW steps on the C gradients vs C: worst "
            "%.2e (%s), limit %g" % (worst_all, wkey_all, STEP_RTOL))
    tr.reset()
    gc.collect()
    return out


# ---------------------------------------------------------------------------------------------
# serving timing requests
# ---------------------------------------------------------------------------------------------

def mem():
    return {"rss_kb": rss_kb("VmRSS"), "hwm_kb": rss_kb("VmHWM"),
            "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def serve(tr):
    """Line protocol with bench_train_step (which interleaves these runs with its own).
    Requests on stdin, one JSON line per reply on stdout:
      steps K      K training steps; reply {"wall": [s...], "cpu": [s...], "phases":
                   [[forward, backward, optimizer] s...], "loss": the last step's loss}
      reset_peak   VmHWM := VmRSS; reply {"ok": bool}
      mem          reply {"rss_kb", "hwm_kb", "maxrss_kb"}
      quit"""
    for line in sys.stdin:
        w = line.split()
        if not w:
            continue
        try:
            if w[0] == "quit":
                break
            elif w[0] == "steps":
                wall, cpu, phases, loss = [], [], [], None
                for _ in range(int(w[1])):
                    loss, s, c, ph = tr.step()
                    wall.append(s)
                    cpu.append(c)
                    phases.append(ph)
                reply = {"wall": wall, "cpu": cpu, "phases": phases, "loss": loss}
            elif w[0] == "reset_peak":
                reply = {"ok": reset_peak()}
            elif w[0] == "mem":
                reply = mem()
            else:
                reply = {"error": "unknown request %r" % line.strip()}
        except (IndexError, ValueError) as e:
            reply = {"error": "bad request %r: %s" % (line.strip(), e)}
        print(json.dumps(reply), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", required=True, help="agentrl checkpoint directory")
    ap.add_argument("--tokens", required=True, help="the packed batch: raw int32 or .npy")
    ap.add_argument("--docs", type=int, required=True, help="documents of equal length in it")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip-norm", type=float, default=1.0)
    ap.add_argument("--foreach", type=int, default=1, help="1: AdamW's multi-tensor "
                    "implementation; 0: its per-tensor loop")
    ap.add_argument("--check-loss", type=float, help="the C first-step loss")
    ap.add_argument("--check-dir", help="the C step's files: grads1.safetensors (first-step "
                    "gradients), step1/ (parameters after AdamW on them), grads2.safetensors, "
                    "step2/ (the second step's)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps without --serve")
    ap.add_argument("--serve", action="store_true")
    a = ap.parse_args()
    a.foreach = bool(a.foreach)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    torch.set_num_threads(a.threads)
    out = {"torch_version": torch.__version__, "threads": torch.get_num_threads(),
           "rss_floor_kb": rss_kb("VmRSS")}
    try:
        tc, w = tm.read_checkpoint(a.ckpt)
        m = TrainModel(tc, w)
        del w
        gc.collect()
        toks = tm.read_array(a.tokens, np.int32).to(torch.int64)
        if toks.numel() % a.docs:
            raise SystemExit("torch_train: %d tokens do not split into %d equal documents"
                             % (toks.numel(), a.docs))
        tr = Trainer(m, toks.reshape(a.docs, -1), a)
        out["params"] = sum(t.numel() for t in m.params())
        out.update(verify(tr, a, log))
        if a.serve:
            out["ready"] = True
            print(json.dumps(out), flush=True)
            return serve(tr)
        tr.step()
        runs = [tr.step() for _ in range(a.steps)]
        out["step_s"] = statistics.median(r[1] for r in runs)
        out["step_cpu_s"] = statistics.median(r[2] for r in runs)
        out["tokens_per_s"] = toks.numel() / out["step_s"]
        out.update(mem())
    except tm.VerifyFailed as e:
        print("torch_train: VERIFY FAILED: %s" % e, file=sys.stderr)
        out["error"] = str(e)
        print(json.dumps(out), flush=True)
        return 3
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
