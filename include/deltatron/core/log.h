// Logging through spdlog with a rank prefix. Only rank 0 prints by default
// (DELTATRON_LOG_ALL_RANKS=1 or init_logging(..., true) lets every rank print).
#pragma once
#include <spdlog/spdlog.h>

namespace dt {
void init_logging(int rank, bool all_ranks = false);
}  // namespace dt
