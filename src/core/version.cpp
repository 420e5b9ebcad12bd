#include "deltatron/core/version.h"

namespace dt {
const char* version() { return DELTATRON_VERSION; }
const char* git_hash() { return DT_GIT_HASH; }
}  // namespace dt
