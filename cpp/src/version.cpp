#include "crossknn/version.h"

namespace crossknn {
const char* version() noexcept { return "0.1.0"; }
}  // namespace crossknn
