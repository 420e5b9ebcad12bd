#!/usr/bin/env python3
"""Baseline for bench/attention: PyTorch's scaled_dot_product_attention run per sequence (causal,
bf16, 16 query / 2 KV heads of dim 256, GQA via enable_gqa) on the lengths bench/attention wrote.
Usage (GPU machine, torch installed): python3 bench/attention_torch.py lengths.txt
Prints fwd and fwd+bwd median ms and TFLOP/s with the same causal FLOP count as bench/attention."""
import sys

import torch
import torch.nn.functional as F


def main():
    lengths = [int(x) for x in open(sys.argv[1]).read().split()]
    Hq, Hkv, D = 16, 2, 256
    dev = torch.device("cuda")
    qs = [torch.randn(1, Hq, L, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for L in lengths]
    ks = [torch.randn(1, Hkv, L, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for L in lengths]
    vs = [torch.randn(1, Hkv, L, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for L in lengths]
    gos = [torch.randn(1, Hq, L, D, device=dev, dtype=torch.bfloat16) for L in lengths]

    def fwd():
        return [F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) for q, k, v in zip(qs, ks, vs)]

    def fwd_bwd():
        outs = fwd()
        torch.autograd.backward(outs, gos)

    def median_ms(f, reps=20):
        for _ in range(3):
            f()
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            f()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        return sorted(ts)[len(ts) // 2]

    flops = 4.0 * sum(L * (L + 1) / 2 for L in lengths) * D * Hq
    with torch.no_grad():
        f_ms = median_ms(fwd)
    fb_ms = median_ms(fwd_bwd)
    print(f"torch {torch.__version__} sdpa per sequence, T {sum(lengths)} N {len(lengths)} | fwd {f_ms:.3f} ms "
          f"{flops / f_ms * 1e-9:.1f} TFLOP/s | fwd+bwd {fb_ms:.3f} ms {3.5 * flops / fb_ms * 1e-9:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
