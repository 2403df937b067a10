#pragma once

namespace crossknn {
// Version string of the C++ core.
const char* version() noexcept;
}  // namespace crossknn
