// Internal: the environment knobs of the kernels (A/B switches such as DT_GDN_SERIAL,
// DT_GDN_REV_STAGES, DT_OPTIM_MULTI, DT_CONV_GATE_FWD_BLOCKS): one parser and one message form.
// Each is read at every call, so a change between calls takes effect (the tests flip them).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace dt::env {

// One choice of a knob: its value and what it selects (for the error message).
struct Choice {
  const char* value;
  const char* meaning;
};

// The index in `choices` of the variable's value, or -1 when it is unset or empty. Any other
// value fails: "VAR='x' is not one of: a (meaning), b (meaning); unset it for the default".
int choice(const char* var, std::initializer_list<Choice> choices);

// The variable as a whole number in [lo, hi], or `dflt` when unset or empty. Anything else fails:
// "VAR='x' is not a whole number in [lo, hi] (what); unset it for the default".
int64_t whole_number(const char* var, int64_t lo, int64_t hi, int64_t dflt, const char* what);

// A list of per-shape indices, "MxNxK:i[,MxNxK:i...]" (e.g. DT_GEMM_ALGO="32768x2048x12352:3"):
// the index given for the shape (m, n, k), or -1 when the variable is unset, empty or names no
// such shape. Each index must be in [0, hi]; anything malformed fails, naming the entry and the
// form ("VAR='...': entry 'x' is not MxNxK:i with i in [0, hi] (what); unset it for the default").
int shape_index(const char* var, int64_t m, int64_t n, int64_t k, int hi, const char* what);

// A list of per-shape tuples of `count` whole numbers, "MxNxK:a.b.c[,MxNxK:a.b.c...]" (e.g.
// DT_GEMM_CONFIG="32768x2048x12352:29.35.3.0"): the numbers given for the shape (m, n, k), or an
// empty vector when the variable is unset, empty or names no such shape. Each number must be in
// [0, 2^31); anything malformed fails as shape_index does, naming `form` (e.g. "tile.stages.cluster.custom").
std::vector<int64_t> shape_tuple(const char* var, int64_t m, int64_t n, int64_t k, int count, const char* form,
                                 const char* what);

}  // namespace dt::env
