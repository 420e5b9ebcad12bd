// The FLOP model of a training step (include/deltatron/train/flops.h).
#include "deltatron/train/flops.h"

#include <algorithm>
#include <string>
#include <vector>

#include "deltatron/core/check.h"
#include "deltatron/ops/varlen.h"

namespace dt::train {

FlopCount& FlopCount::operator+=(const FlopCount& o) {
  gemm += o.gemm;
  gdn += o.gdn;
  attention += o.attention;
  return *this;
}

FlopCount step_flops(const io::ModelConfig& m, std::span<const int64_t> seq_lens) {
  const double H = double(m.hidden_size), I = double(m.intermediate_size), V = double(m.vocab_size);
  const double Hk = double(m.linear_num_key_heads), Hv = double(m.linear_num_value_heads);
  const double dk = double(m.linear_key_head_dim), dv = double(m.linear_value_head_dim);
  const double Hq = double(m.num_attention_heads), Hkv = double(m.num_key_value_heads), D = double(m.head_dim);

  // Weight elements each token multiplies by, per layer type (2 FLOPs each forward).
  const double gdn_w = H * (2 * Hk * dk + Hv * dv)  // in_proj_qkv
                       + H * Hv * dv                 // in_proj_z
                       + 2 * H * Hv                  // in_proj_b, in_proj_a
                       + Hv * dv * H;                // out_proj
  const double attn_w = H * 2 * Hq * D      // q_proj: query and gate halves
                        + 2 * H * Hkv * D   // k_proj, v_proj
                        + Hq * D * H;       // o_proj
  const double mlp_w = 3 * H * I, head_w = V * H;

  int64_t n_gdn = 0, n_attn = 0;
  for (const std::string& t : io::resolved_layer_types(m)) {
    if (t == "linear_attention") ++n_gdn;
    else if (t == "full_attention") ++n_attn;
    else DT_FAIL("step_flops: unknown layer type '{}' (the model refuses it first)", t);
  }
  const double layers = double(n_gdn + n_attn);

  double tokens = 0, gdn_tok = 0, attn_pairs = 0;
  for (int64_t L : seq_lens) {
    DT_CHECK(L >= 0, "step_flops: negative sequence length {}", L);
    tokens += double(L);
    attn_pairs += double(L) * double(L + 1) / 2;
    for (int64_t c0 = 0; c0 < L; c0 += ops::kGdnChunk) {  // per chunk: c tokens, each with chunk size c
      const double c = double(std::min<int64_t>(ops::kGdnChunk, L - c0));
      const double fwd = 3 * c * dk + 2 * c * dv + 6 * dk * dv;
      const double bwd = 8 * c * dk + 4 * c * dv + 12 * dk * dv + 2.0 / 3.0 * c * c;
      gdn_tok += c * (fwd + bwd);
    }
  }
  FlopCount f;
  f.gemm = 3 * 2 * tokens * (double(n_gdn) * gdn_w + double(n_attn) * attn_w + layers * mlp_w + head_w);
  f.gdn = double(n_gdn) * Hv * gdn_tok;
  f.attention = double(n_attn) * 3.5 * 4 * attn_pairs * D * Hq;
  return f;
}

FlopCount micro_batch_flops(const io::ModelConfig& m, std::span<const int64_t> cu_seqlens) {
  std::vector<int64_t> lens;
  for (size_t i = 1; i < cu_seqlens.size(); ++i) lens.push_back(cu_seqlens[i] - cu_seqlens[i - 1]);
  return step_flops(m, lens);
}

double peak_tflops(const std::string& device_name, bool bf16) {
  const bool hopper = device_name.find("H100") != std::string::npos || device_name.find("H200") != std::string::npos;
  if (!hopper) return 0;
  if (device_name.find("PCIe") != std::string::npos) return bf16 ? 756 : 51;
  return bf16 ? 989 : 67;
}

}  // namespace dt::train
