#include "deltatron/core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <cstring>

namespace dt {

void init_logging(int rank, bool all_ranks) {
  const char* env = std::getenv("DELTATRON_LOG_ALL_RANKS");
  if (env && std::strcmp(env, "0") != 0) all_ranks = true;
  auto logger = spdlog::stderr_color_mt(fmt::format("dt{}", rank));
  logger->set_pattern(fmt::format("[deltatron r{}] %^%l%$ %v", rank));
  logger->set_level(rank == 0 || all_ranks ? spdlog::level::info : spdlog::level::off);
  if (const char* lvl = std::getenv("DELTATRON_LOG_LEVEL"); lvl && (rank == 0 || all_ranks))
    logger->set_level(spdlog::level::from_str(lvl));
  spdlog::set_default_logger(logger);
}

}  // namespace dt
