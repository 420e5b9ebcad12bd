#include "core/env_knob.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "deltatron/core/check.h"

namespace dt::env {

int choice(const char* var, std::initializer_list<Choice> choices) {
  const char* e = std::getenv(var);
  if (e == nullptr || *e == '\0') return -1;
  int i = 0;
  for (const Choice& c : choices) {
    if (std::strcmp(e, c.value) == 0) return i;
    ++i;
  }
  std::string list;
  for (const Choice& c : choices) list += fmt::format("{}{} ({})", list.empty() ? "" : ", ", c.value, c.meaning);
  DT_FAIL("{}='{}' is not one of: {}; unset it for the default", var, e, list);
}

int64_t whole_number(const char* var, int64_t lo, int64_t hi, int64_t dflt, const char* what) {
  const char* e = std::getenv(var);
  if (e == nullptr || *e == '\0') return dflt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(e, &end, 10);
  DT_CHECK(end != e && *end == '\0' && errno == 0 && v >= lo && v <= hi,
           "{}='{}' is not a whole number in [{}, {}] ({}); unset it for the default", var, e, lo, hi, what);
  return v;
}

}  // namespace dt::env
