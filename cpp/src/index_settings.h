#pragma once
// What crossknn::Searcher reads from index.json's params (private to the core).
#include <cstdint>
#include <utility>
#include <vector>

#include "crossknn/index.h"

namespace crossknn {

struct Index::Settings {
  // params.auto (crossknn.index.auto.auto_index_of)
  bool has_auto = false;
  double rho_d = 0.3, rho_r = 0.3, decay = 0.0;
  int64_t rounds = 10;
  bool has_first_share = false;
  double first_share = 0.0;
  double prior_alpha = 0.0, prior_tau = 10.0, prior_ridge = 0.0, prior_kernel_tau = 2.0;
  // the CE -> DE score map (crossknn.score_map.ScoreMap.from_params): AXN's normalization
  bool has_score_map = false;
  double score_scale = 1.0, score_offset = 0.0;
  bool has_cur = false;        // the dense CUR rows R
  bool has_gar_graph = false;  // GAR's corpus graph, made from the current de_items
  // params.auto.stop_curve.by_budget (crossknn.search.stopping): per calibrated budget (in the
  // file's order), its (target recall, threshold) pairs sorted by target; empty: none
  std::vector<std::pair<int64_t, std::vector<std::pair<double, double>>>> stop_table;
};

}  // namespace crossknn
