"""``random``: B uniform random items, ranked by their exact CE scores (a floor)."""

from __future__ import annotations

from crossknn.search.methods import RoundMethod
from crossknn.search.rounds import Step


class RandomItems(RoundMethod):
    name = "random"

    def plan(self, budget):
        return [Step("first", budget)]
