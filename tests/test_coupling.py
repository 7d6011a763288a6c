"""The L-lag coupling bound on the TV distance (dpinfer.lattice.coupling), by hand."""

import numpy as np
import pytest

from dpinfer.lattice.coupling import MeetingTimes


def test_tv_bound_by_hand_and_censoring():
    times = MeetingTimes(tau=np.array([5, 9, 13]), lag=2, max_iterations=100)
    # terms at l = 0: ceil(3/2)=2, ceil(7/2)=4, ceil(11/2)=6 -> mean 4
    assert times.tv_upper_bound(0).estimate[0] == pytest.approx(4.0)
    # at l = 8: 0, 0, ceil(3/2) = 2 -> 2/3
    assert times.tv_upper_bound(8).estimate[0] == pytest.approx(2 / 3)
    censored = MeetingTimes(tau=np.array([5, -1]), lag=2, max_iterations=100)
    b = censored.tv_upper_bound([0, 200])
    assert b.n_censored == 1 and np.isinf(b.upper[0]) and b.upper[1] < 1
