#include "crossknn/version.h"

#ifndef CROSSKNN_VERSION
#define CROSSKNN_VERSION "0.1.0"
#endif

namespace crossknn {
const char* version() noexcept { return CROSSKNN_VERSION; }
}  // namespace crossknn
