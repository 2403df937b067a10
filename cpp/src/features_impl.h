#pragma once
// Internal: the stored item matrix behind a Features handle, and raw access for the kernels.
// Not installed; nothing outside cpp/src includes it.
#include <cstdint>
#include <memory>
#include <vector>

#include "crossknn/features.h"

namespace crossknn::detail {

struct FeatureData {
  int64_t n = 0, d = 0;
  Storage st = Storage::Float32;
  // what the kernels read: owned vectors below, caller memory, or a file map kept by `owner`
  const float* p32 = nullptr;
  const uint16_t* p16 = nullptr;
  const int8_t* p8 = nullptr;
  const float* pscale = nullptr;
  std::vector<float> own32;
  std::vector<uint16_t> own16;
  std::vector<int8_t> own8;
  std::vector<float> own_scale;
  std::shared_ptr<const void> owner;
  bool view = false;

  int64_t dim() const noexcept { return d; }
  Storage storage() const noexcept { return st; }
  const float* f32() const noexcept { return p32; }
  const uint16_t* f16() const noexcept { return p16; }
  const int8_t* i8() const noexcept { return p8; }
  const float* scales() const noexcept { return pscale; }
};

}  // namespace crossknn::detail
