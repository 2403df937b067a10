#pragma once
// crossknn/crossknn.h: the whole C++ API of crossknn::core.
#include "crossknn/auto_index.h"
#include "crossknn/features.h"
#include "crossknn/index.h"
#include "crossknn/least_squares.h"
#include "crossknn/npy.h"
#include "crossknn/prior.h"
#include "crossknn/search.h"
#include "crossknn/searcher.h"
#include "crossknn/version.h"
