"""Following the servers' rounds: wait until both collect the same new round (a long poll,
with backoff while a server is down), and what the answers say on the way: a round run again,
a share a server lost and gets again, the privacy count, another run, the end of training (one
of :class:`~spgc.providers.client.ProviderClient`'s parts)."""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any

import grpc

from spgc.providers.errors import ProviderRefusal, RoundFailed, RunFailed
from spgc.providers.transport import (
    CLOCK_AHEAD_SECONDS,
    FINISHED_CALL_TIMEOUT,
    STARTUP_RETRY_MAX,
    Transport,
    _deadline_passed,
    _seconds_past_deadline,
)
from spgc.wire import aggregation_pb2
from spgc.wire.errors import WRONG_RUN

__all__ = ["RoundFollower"]

log = logging.getLogger("spgc.provider")

pb = aggregation_pb2


class RoundFollower(Transport):
    """Waiting for rounds over :class:`Transport`'s calls (a part of ProviderClient: the
    attributes below are set by ``ProviderClient.__init__`` and ``connect``)."""

    _resend: tuple[int, list[Any], bytes] | None
    _last_delivered: bool
    _told_waiting: bool
    _told_clock: bool
    _epsilon_seen: dict[str, float]
    _run_checked_at: int | None
    reports: list[Any]

    def wait_for_round(self) -> Any | None:
        """Poll until every server collects the same new round; returns its RoundInfo (from
        H1), or None when training is finished. TimeoutError after ``wait_timeout``."""
        start = self._clock()
        delays = self._backoffs()
        while True:
            wait = self.cfg.long_poll
            if self._resend is not None and self._resend[0] == self.last_round:
                wait = 0.0  # see _resend: look at every server now
            if self.cfg.wait_timeout is not None:  # never hold past our own deadline
                wait = min(wait, max(0.0, self.cfg.wait_timeout - (self._clock() - start)))
            infos = []
            for index, server in enumerate(self.servers):
                # The server we take the model from sends a small one with its answer.
                info = self._status(server, wait=wait, include_model=index == self._model_source)
                # One server says training is over: the other hears that we know (it waits
                # for its providers to learn it before it exits), briefly: it may be gone.
                if info is not None and info.phase == pb.ROUND_PHASE_FINISHED:
                    self._ask_the_others_briefly(index)
                    if info.failure:
                        raise RunFailed(f"{server.name} stopped the run: {info.failure}")
                    return None
                infos.append(info)
            if all(i is not None for i in infos):
                delays = self._backoffs()  # healthy again
                first = infos[0]
                same = all(
                    i.round == first.round and i.model_version == first.model_version for i in infos
                )
                collecting = all(i.phase == pb.ROUND_PHASE_COLLECTING for i in infos)
                new = self.last_round is None or first.round > self.last_round
                if not new and first.round < self.last_round:
                    self._check_still_the_run(first.round)
                self._check_privacy_count(infos)
                if self._resend is not None and self._resend[0] < first.round:
                    self._resend = None  # a later round: the old shares are never sent again
                if (
                    not new
                    and same
                    and collecting
                    and self._last_delivered
                    and not any(i.caller_share_accepted for i in infos)
                ):
                    # Our shares for this round were dropped: the servers lost each other and
                    # went back to their last common checkpoint. The round runs again as a new
                    # release; we take part with a fresh vector (neither server holds the old).
                    log.info("round %d runs again (servers re-paired): taking part", first.round)
                    new = True
                waiting = [
                    s.name
                    for s, i in zip(self.servers, infos, strict=True)
                    if i.phase == pb.ROUND_PHASE_WAITING_FOR_PEER
                ]
                if waiting and not self._told_waiting:
                    log.warning("%s: waiting for the other server to come back", ", ".join(waiting))
                self._told_waiting = bool(waiting)
                held = [i.caller_share_accepted for i in infos]
                if all(held) and self._resend is not None and self._resend[0] == first.round:
                    self._resend = None  # both hold our shares: back to long polls
                # The server that lacks our share must still collect; the other may be past
                # its intake already (it had every share it waited for).
                lacking = [i for i in infos if not i.caller_share_accepted]
                if (
                    not new
                    and same
                    and any(held)
                    and lacking
                    and all(i.phase == pb.ROUND_PHASE_COLLECTING for i in lacking)
                    and self._resend is not None
                    and self._resend[0] == first.round
                    and not _deadline_passed(lacking[0])
                ):
                    self._resend_missing(infos, lacking[0])
                if same and collecting and new:
                    if all(i.caller_share_accepted for i in infos):
                        log.info("round %d: share already accepted (earlier run)", first.round)
                        self.last_round = first.round
                    elif any(i.caller_share_accepted for i in infos):
                        log.warning(
                            "round %d: only one server holds a share from us (earlier run); "
                            "the shares are lost, sitting this round out",
                            first.round,
                        )
                        self.last_round = first.round
                    elif not _deadline_passed(first):
                        late = _seconds_past_deadline(first)
                        if late > CLOCK_AHEAD_SECONDS and not self._told_clock:
                            log.warning(
                                "round %d: the servers still collect shares, but by this "
                                "machine's clock its deadline passed %.0f s ago: is the clock "
                                "ahead? (taking part; synchronise it, e.g. with NTP)",
                                first.round,
                                late,
                            )
                            self._told_clock = True
                        check_same_statistics(self.servers, infos)
                        self._round_infos = infos
                        return first
                delay = self.cfg.poll_interval
            else:  # a server is down or restarting: ask again soon (it answers once back)
                delay = max(self.cfg.poll_interval, min(next(delays), STARTUP_RETRY_MAX))
            if self.cfg.wait_timeout is not None and self._clock() - start > self.cfg.wait_timeout:
                raise TimeoutError(
                    f"no round opened on every server within {self.cfg.wait_timeout:g}s"
                )
            self._sleep(delay)

    def _ask_the_others_briefly(self, answered: int) -> None:
        """A RoundStatus to every server but ``answered``, errors ignored: a server that
        finished stops once each provider that called it has seen the end."""
        for index, server in enumerate(self.servers):
            if index == answered:
                continue
            req = pb.RoundStatusRequest(provider_id=self.cfg.name)
            with contextlib.suppress(grpc.RpcError):
                server.stub.RoundStatus(req, timeout=FINISHED_CALL_TIMEOUT)

    def _check_privacy_count(self, infos: list[Any]) -> None:
        """The privacy spent (RoundInfo.epsilon_spent) of one run never goes down: a release
        is counted for good, a round that failed included. Lower than before means a server's
        state went back to an earlier point (a state_dir restored from a backup): releases it
        made would be made again and not counted. ProviderRefusal then."""
        for server, info in zip(self.servers, infos, strict=True):
            spent = self._epsilon_seen.get(server.name, 0.0)
            now = info.epsilon_spent
            if not math.isnan(now) and now < spent * (1 - 1e-9):
                raise ProviderRefusal(
                    f"{server.name} says epsilon {now:.6g} is spent, but it said {spent:.6g} "
                    "before: its count of releases went back (its state restored from a "
                    "backup?); releases made since would go uncounted, so not taking part"
                )
            if now > spent:
                self._epsilon_seen[server.name] = now

    def _check_still_the_run(self, seen_round: int) -> None:
        """The servers are at a round before ours: a step back, or another run (their state
        was reset). Asked once per such round; RoundFailed naming WRONG_RUN for another run
        (:meth:`run` then connects again)."""
        if self._run_checked_at == seen_round or self.training is None:
            return
        self._run_checked_at = seen_round
        current = self._hello(self.servers[0]).config.run_id
        if current != self.training.run_id:
            raise RoundFailed(
                f"run {self.training.run_id!r} {WRONG_RUN} any more: the servers run {current!r}"
            )

    def _learn_outcome(self) -> None:
        """Whether the servers used our last share (RoundInfo.caller_left_out, asked of the
        first server once the round is over): a left-out share is said, not taken for
        counted. A server that no longer knows the round (restarted) tells nothing."""
        last = self.reports[-1] if self.reports else None
        if last is None or last.left_out is not None or not last.results:
            return
        try:
            info = self._status(self.servers[0], last.round)
        except grpc.RpcError:  # NOT_FOUND: the server restarted and no longer knows the round
            return
        if info is None or info.phase in (
            pb.ROUND_PHASE_COLLECTING,
            pb.ROUND_PHASE_AGREEING,
            pb.ROUND_PHASE_WAITING_FOR_PEER,
        ):
            return
        last.left_out = info.caller_left_out
        if last.left_out:
            log.warning("round %d: our share is not in the sum: %s", last.round, last.left_out)

    def _resend_missing(self, infos: list[Any], info: Any) -> None:
        """Round ``info.round`` still collects and a server lacks our share (it was down when
        we sent it, or restarted): send it exactly the share it was meant to get. Each server
        only ever sees its own share of the vector, whichever time it arrives."""
        assert self._resend is not None
        _, vectors, vector_id = self._resend
        for server, status, vec in zip(self.servers, infos, vectors, strict=True):
            if status.caller_share_accepted:
                continue
            try:
                result = self._submit(server, vec, info, vector_id)
            except RoundFailed as exc:
                log.warning("round %d: resending to %s failed: %s", info.round, server.name, exc)
                return
            for report in self.reports:
                if report.round == info.round:
                    report.results.append(result)
            log.info("round %d: %s now holds our share (sent again)", info.round, server.name)
        self._resend = None


def check_same_statistics(servers: Any, infos: list[Any]) -> None:
    """standardize: the released feature means and deviations the provider standardises its
    data with are the same at both servers (each computed them from the release it took part
    in), so one server alone cannot hand providers statistics of its choosing. RunFailed
    naming both servers otherwise."""
    released = [(tuple(i.feature_mean), tuple(i.feature_std)) for i in infos]
    if any(r != released[0] for r in released[1:]):
        names = " and ".join(s.name for s in servers)
        raise RunFailed(
            f"{names} announce different released feature statistics (means and deviations): "
            "one of them is not the run's; not taking part"
        )
