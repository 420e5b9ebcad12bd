#!/usr/bin/python3
"""Numerics of the ungated WY inverse (docs/perf.md v0.31.0), for a fused GDN forward.

Our prep solves the gated matrix: Tm = (I + strict_lower(diag(beta) K K^T (.) Gamma))^-1 and
stores it in bf16. A fused forward (FlashQLA's kkt_solve) may instead solve the ungated
Au = (I + strict_lower(diag(beta) K K^T))^-1 once, store it in bf16, and apply the gate per entry:
Tm_ij = exp(gamma_i - gamma_j) Au_ij (exact: Gamma (.) X = D X D^-1 with D = diag(e^gamma)).
This compares both against float64 on W = Tm diag(beta e^gamma) K and U = Tm diag(beta) V, the
fp32 solve and the bf16 rounding included, over gate regimes from none to Qwen3.5-like strong
decay, and with correlated keys (repeated tokens). Pure numpy (Debian's python3-numpy):
    /usr/bin/python3 bench/ungated_solve_study.py [trials]
"""
import sys

import numpy as np

C, DK, DV = 64, 128, 128


def bf16(x):
    """Round to bfloat16 (nearest even) and back to float32."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def unit_lower_inverse(a, dtype):
    """(I + a)^-1 for strictly lower a, by forward substitution in `dtype`."""
    a = a.astype(dtype)
    t = np.eye(C, dtype=dtype)
    for i in range(1, C):
        t[i, :i] = -(a[i, :i] @ t[:i, :i])
    return t


def trial(rng, regime, corr):
    k = rng.standard_normal((C, DK))
    if corr:  # repeated tokens: a few key directions with small perturbations
        base = rng.standard_normal((4, DK))
        k = base[rng.integers(0, 4, C)] + 0.05 * k
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.standard_normal((C, DV))
    beta = 1 / (1 + np.exp(-rng.standard_normal(C)))
    if regime == "none":
        g = np.zeros(C)
    elif regime == "mild":  # FlashQLA's benchmark: logsigmoid(randn) / 16
        g = -np.log1p(np.exp(-rng.standard_normal(C))) / 16
    else:  # Qwen3.5-like: -exp(A_log) softplus(a + dt_bias), A in (0, 16)
        A = rng.uniform(0, 16)
        g = -A * np.log1p(np.exp(rng.standard_normal(C) + rng.uniform(-5, 1)))
    gam = np.cumsum(g)
    Gam = np.exp(np.minimum(gam[:, None] - gam[None, :], 0.0)) * np.tri(C, k=0)
    kk = k @ k.T
    lower = np.tri(C, k=-1)
    a_gated = beta[:, None] * kk * Gam * lower
    a_ungated = beta[:, None] * kk * lower
    tm64 = unit_lower_inverse(a_gated, np.float64)
    ours = bf16(unit_lower_inverse(a_gated, np.float32))  # gated fp32 solve, stored bf16
    au = bf16(unit_lower_inverse(a_ungated, np.float32))  # ungated fp32 solve, stored bf16
    theirs = (Gam * au.astype(np.float64)).astype(np.float32)  # gate per entry, fp32
    wk = (beta * np.exp(gam))[:, None] * k
    uv = beta[:, None] * v
    out = {}
    for name, tm in (("gated", ours), ("ungated", theirs)):
        for what, x in (("W", wk), ("U", uv)):
            ref = tm64 @ x
            got = tm.astype(np.float64) @ bf16(x).astype(np.float64)
            out[(name, what)] = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-300)
    out["max|Au|"] = float(np.abs(au).max())
    return out


def main():
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    rng = np.random.default_rng(7)
    print(f"rel. L2 error against float64, {trials} chunks per row (median / max); C={C} dk={DK}")
    print(f"{'gates':<8} {'keys':<11} {'W gated':>17} {'W ungated':>17} {'U gated':>17} {'U ungated':>17} {'max|Au|':>8}")
    for regime in ("none", "mild", "strong"):
        for corr in (False, True):
            rs = [trial(rng, regime, corr) for _ in range(trials)]
            cols = []
            for key in (("gated", "W"), ("ungated", "W"), ("gated", "U"), ("ungated", "U")):
                e = np.array([r[key] for r in rs])
                cols.append(f"{np.median(e):.2e} / {e.max():.2e}")
            mx = max(r["max|Au|"] for r in rs)
            print(f"{regime:<8} {'correlated' if corr else 'random':<11} " + " ".join(f"{c:>17}" for c in cols) + f" {mx:8.2f}")


if __name__ == "__main__":
    main()
