"""The strategies are listed once (in ``transformer_pde.testing``) and each one resolves
both lazily through the package and directly from the strategies module."""

import transformer_pde.testing as testing
from transformer_pde.testing import strategies


def test_every_listed_strategy_exists_and_is_re_exported():
    assert strategies.__all__ == testing.__all__
    for name in testing.__all__:
        assert getattr(testing, name) is getattr(strategies, name), name
    assert set(testing.__all__) <= set(dir(testing))
