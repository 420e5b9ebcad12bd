// Internal: the environment knobs of the kernels (A/B switches such as DT_GDN_SERIAL,
// DT_GDN_REV_STAGES, DT_OPTIM_MULTI, DT_CONV_GATE_FWD_BLOCKS): one parser and one message form.
// Each is read at every call, so a change between calls takes effect (the tests flip them).
#pragma once
#include <cstdint>
#include <initializer_list>

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

}  // namespace dt::env
