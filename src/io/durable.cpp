#include "deltatron/io/durable.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace dt::io {

std::string fsync_path(const std::filesystem::path& p, bool dir) {
  const int fd = ::open(p.c_str(), dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return fmt::format("{}: cannot open for fsync ({})", p.string(), std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return fmt::format("{}: fsync failed ({})", p.string(), std::strerror(err));
  return "";
}

}  // namespace dt::io
