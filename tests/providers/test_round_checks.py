"""What a provider checks in the two servers' round announcements before it takes part."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spgc.providers.errors import RunFailed
from spgc.providers.rounds import check_same_statistics
from spgc.wire import aggregation_pb2 as pb

SERVERS = [SimpleNamespace(name="h1"), SimpleNamespace(name="h2")]


def _info(mean: list[float], std: list[float]) -> pb.RoundInfo:
    return pb.RoundInfo(round=3, feature_mean=mean, feature_std=std)


def test_the_same_released_statistics_at_both_servers_pass() -> None:
    check_same_statistics(SERVERS, [_info([1.5, -2.0], [3.0, 0.5])] * 2)
    check_same_statistics(SERVERS, [_info([], []), _info([], [])])  # before the release


@pytest.mark.parametrize(
    ("h2_mean", "h2_std"),
    [
        ([1.5, -2.5], [3.0, 0.5]),  # a mean moved
        ([1.5, -2.0], [3.0, 5.0]),  # a deviation inflated
        ([], []),  # one server announces none
    ],
)
def test_one_server_cannot_hand_providers_statistics_of_its_own(h2_mean, h2_std) -> None:
    infos = [_info([1.5, -2.0], [3.0, 0.5]), _info(h2_mean, h2_std)]
    with pytest.raises(RunFailed, match="h1 and h2 announce different released feature"):
        check_same_statistics(SERVERS, infos)
