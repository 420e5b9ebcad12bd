#include "deltatron/core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace dt {

void init_logging(int rank, bool all_ranks) {
  const char* env = std::getenv("DELTATRON_LOG_ALL_RANKS");
  if (env && std::strcmp(env, "0") != 0) all_ranks = true;
  const std::string name = fmt::format("dt{}", rank);
  spdlog::drop(name);  // idempotent: a second init replaces the logger instead of throwing
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_pattern(fmt::format("[deltatron r{}] %^%l%$ %v", rank));
  logger->set_level(rank == 0 || all_ranks ? spdlog::level::info : spdlog::level::off);
  if (const char* lvl = std::getenv("DELTATRON_LOG_LEVEL"); lvl && (rank == 0 || all_ranks))
    logger->set_level(spdlog::level::from_str(lvl));
  spdlog::set_default_logger(logger);
}

}  // namespace dt
