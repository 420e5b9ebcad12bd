#include "deltatron/io/durable.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

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

std::string write_durable(const std::filesystem::path& p, const std::string& content) {
  {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    if (!f) return fmt::format("{}: cannot create ({})", p.string(), std::strerror(errno));
    f.write(content.data(), std::streamsize(content.size()));
    f.close();
    if (!f) return fmt::format("{}: write failed ({})", p.string(), std::strerror(errno));
  }
  return fsync_path(p, false);
}

}  // namespace dt::io
