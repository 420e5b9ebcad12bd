#include "core/env_knob.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "deltatron/core/check.h"

namespace dt::env {
namespace {

// f(entry) for each comma-separated entry of the value of var (none when unset or empty); every
// entry is visited, so a malformed one fails even after a match.
template <class F>
void each_entry(const char* var, F&& f) {
  const char* e = std::getenv(var);
  if (e == nullptr || *e == '\0') return;
  const std::string all(e);
  for (size_t at = 0; at <= all.size();) {
    const size_t comma = std::min(all.find(',', at), all.size());
    f(all.substr(at, comma - at), e);
    at = comma + 1;
  }
}

}  // namespace

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

int shape_index(const char* var, int64_t m, int64_t n, int64_t k, int hi, const char* what) {
  int found = -1;
  each_entry(var, [&](const std::string& entry, const char* e) {
    long long em = 0, en = 0, ek = 0;
    int ei = 0, used = 0;
    const bool ok = std::sscanf(entry.c_str(), "%lldx%lldx%lld:%d%n", &em, &en, &ek, &ei, &used) == 4 &&
                    used == int(entry.size()) && em > 0 && en > 0 && ek > 0 && ei >= 0 && ei <= hi;
    DT_CHECK(ok, "{}='{}': entry '{}' is not MxNxK:i with i in [0, {}] ({}); unset it for the default", var, e, entry,
             hi, what);
    if (em == m && en == n && ek == k) found = ei;
  });
  return found;
}

std::vector<int64_t> shape_tuple(const char* var, int64_t m, int64_t n, int64_t k, int count, const char* form,
                                 const char* what) {
  std::vector<int64_t> found;
  each_entry(var, [&](const std::string& entry, const char* e) {
    long long em = 0, en = 0, ek = 0;
    int used = 0;
    bool ok = std::sscanf(entry.c_str(), "%lldx%lldx%lld:%n", &em, &en, &ek, &used) == 3 && used > 0 && em > 0 &&
              en > 0 && ek > 0;
    std::vector<int64_t> vals;
    for (size_t p = size_t(used); ok && int(vals.size()) < count;) {  // count dot-separated numbers, nothing after
      if (!std::isdigit(static_cast<unsigned char>(entry[p]))) { ok = false; break; }
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(entry.c_str() + p, &end, 10);
      ok = errno == 0 && v < (1LL << 31);
      vals.push_back(v);
      p = size_t(end - entry.c_str());
      const bool last = int(vals.size()) == count;
      ok = ok && (last ? p == entry.size() : (p < entry.size() && entry[p] == '.'));
      ++p;
    }
    DT_CHECK(ok, "{}='{}': entry '{}' is not MxNxK:{} ({} whole numbers; {}); unset it for the default", var, e, entry,
             form, count, what);
    if (em == m && en == n && ek == k) found = vals;
  });
  return found;
}

}  // namespace dt::env
