#pragma once
// Compatibility header: the core used to live here. New code includes what it uses:
// crossknn/features.h, crossknn/least_squares.h, crossknn/search.h (or crossknn/crossknn.h).
#include "crossknn/crossknn.h"
