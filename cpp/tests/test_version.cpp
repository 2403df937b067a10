#include <cstdio>
#include <cstring>

#include "crossknn/version.h"

int main() {
  if (std::strlen(crossknn::version()) == 0) {
    std::fprintf(stderr, "empty version\n");
    return 1;
  }
  return 0;
}
