"""Provider sets and agreements in pages (spgc.wire.pages): any size within the message limit,
rebuilt exactly, and a page stream that is not one whole message refused."""

from __future__ import annotations

import os
import threading

import pytest

from spgc.wire import peer_pb2, provider_set_digest
from spgc.wire.errors import InvalidArgumentError
from spgc.wire.pages import (
    MAX_PAGES,
    PAGE_BYTES,
    agree_providers,
    agreement_pages,
    join_agreement,
    join_provider_set,
    ledger_page,
    provider_set_pages,
)
from spgc.wire.transport import DEFAULT_MAX_MESSAGE_BYTES


def provider_set(n: int, verifier_bytes: int = 6088, ids: bool = True) -> peer_pb2.ProviderSet:
    names = sorted(f"provider-{i:06d}" for i in range(n))
    return peer_pb2.ProviderSet(
        run_id="run",
        round=7,
        role=1,
        providers=names,
        digest=provider_set_digest(names),
        min_providers=2,
        vector_ids=[os.urandom(16) for _ in names] if ids else [],
        norm_verifiers=[os.urandom(verifier_bytes) for _ in names] if verifier_bytes else [],
        verify_coin=os.urandom(32),
        release=peer_pb2.ReleaseStatement(run_id="run", round=7, statement=b"{}"),
    )


@pytest.mark.parametrize(
    ("n", "verifier_bytes", "ids"),
    [(0, 0, True), (1, 6088, True), (3, 0, False), (1000, 6088, True), (20_000, 0, True)],
)
def test_a_set_of_any_size_travels_in_pages_within_the_limit(n, verifier_bytes, ids):
    whole = provider_set(n, verifier_bytes, ids)
    pages = provider_set_pages(whole)
    assert pages[0].pages == len(pages) and all(p.pages == 0 for p in pages[1:])
    for page in pages:
        assert page.ByteSize() < DEFAULT_MAX_MESSAGE_BYTES
    assert join_provider_set(iter(pages)) == whole
    if whole.ByteSize() > DEFAULT_MAX_MESSAGE_BYTES:  # 1000 providers at MNIST's d: 6 MB
        assert len(pages) > 1 and all(p.ByteSize() <= PAGE_BYTES + 4096 for p in pages)
    assert not any(getattr(pages[0], name) for name in ("providers", "norm_verifiers"))
    if n <= 3:  # the first page, then one of lists (none without providers)
        assert len(pages) == (1 if n == 0 else 2)


def test_an_agreement_of_any_size_travels_in_pages():
    callee = provider_set(700, 6088)
    agreed = [f"provider-{i:06d}" for i in range(60_000)]
    whole = peer_pb2.ProviderAgreement(
        callee=callee, agreed=agreed, agreed_digest=provider_set_digest(agreed), proceed=True
    )
    pages = agreement_pages(whole)
    assert len(pages) > 1 and pages[0].pages == len(pages)
    assert all(p.ByteSize() < DEFAULT_MAX_MESSAGE_BYTES for p in pages)
    assert join_agreement(iter(pages)) == whole
    # small: one page; no callee at all stays without one
    small = peer_pb2.ProviderAgreement(agreed=["a"], agreed_digest=b"d", proceed=False)
    assert len(agreement_pages(small)) == 1
    assert join_agreement(agreement_pages(small)) == small


def test_page_streams_that_are_not_one_message_are_refused():
    pages = provider_set_pages(provider_set(400, 6088))
    assert len(pages) >= 3
    with pytest.raises(InvalidArgumentError, match="ended before its first page"):
        join_provider_set(iter([]))
    with pytest.raises(InvalidArgumentError, match="ended after 2 of"):
        join_provider_set(pages[:2])
    with pytest.raises(InvalidArgumentError, match="more than the"):
        join_provider_set([*pages, pages[1]])
    relabelled = peer_pb2.ProviderSet()
    relabelled.CopyFrom(pages[1])
    relabelled.run_id = "another run"  # a later page must not carry a first page's fields
    with pytest.raises(InvalidArgumentError, match="page 2 carries run_id"):
        join_provider_set([pages[0], relabelled, *pages[2:]])
    for count in (0, MAX_PAGES + 1):
        first = peer_pb2.ProviderSet()
        first.CopyFrom(pages[0])
        first.pages = count
        with pytest.raises(InvalidArgumentError, match="the first page names"):
            join_provider_set([first, *pages[1:]])
    answer = agreement_pages(
        peer_pb2.ProviderAgreement(callee=provider_set(400, 6088), agreed_digest=b"d")
    )
    with pytest.raises(InvalidArgumentError, match="agreement pages: the stream ended after"):
        join_agreement(answer[:-1])
    # the callee's own pages are checked too
    broken = [peer_pb2.ProviderAgreement() for _ in answer]
    for mine, theirs in zip(broken, answer, strict=True):
        mine.CopyFrom(theirs)
    broken[-1].ClearField("callee")
    broken[-1].agreed.append("x")
    with pytest.raises(InvalidArgumentError, match="provider set pages: the stream ended"):
        join_agreement(broken)


def test_a_ledger_answers_a_page_of_lines_at_a_time():
    lines = [b"x" * 1500 for _ in range(2000)]  # a 2,000-round ledger: 3 MB
    first = ledger_page(lines, 0)
    assert len(first) > 1 and sum(len(x) + 4 for x in first) <= PAGE_BYTES
    got, start = [], 0
    while start < len(lines):
        page = ledger_page(lines, start)
        assert page, start
        got.extend(page)
        start += len(page)
    assert got == lines
    assert ledger_page(lines, len(lines)) == [] and ledger_page(lines, 2**63 - 1) == []
    assert ledger_page([b"y" * (PAGE_BYTES + 1)], 0) == [b"y" * (PAGE_BYTES + 1)]  # one line


class _PagedPeer:
    """A Peer stub's AgreeProviders, as gRPC runs it: the request pages read on a thread of
    their own while the caller goes on; the answer's pages once the request stream ended."""

    def __init__(self) -> None:
        self.received: list[peer_pb2.ProviderSet] = []
        self.first_in = threading.Event()
        self.cancelled = False

    def AgreeProviders(self, pages, timeout):
        done = threading.Event()

        def read() -> None:
            for page in pages:
                self.received.append(page)
                self.first_in.set()
            done.set()

        threading.Thread(target=read, daemon=True).start()
        peer = self

        class Call:
            def cancel(self) -> None:
                peer.cancelled = True

            def __iter__(self):
                assert done.wait(10)
                whole = join_provider_set(peer.received)
                answer = peer_pb2.ProviderAgreement(
                    callee=whole, agreed=list(whole.providers), agreed_digest=b"d", proceed=True
                )
                return iter(agreement_pages(answer, page_bytes=4096))

        return Call()


def test_the_first_page_goes_out_before_the_callers_verifier_messages_are_made():
    full = provider_set(50, 700)
    message = peer_pb2.ProviderSet()
    message.CopyFrom(full)
    message.ClearField("norm_verifiers")
    peer = _PagedPeer()

    def make() -> list[bytes]:
        # the callee holds the first page (the coin) while ours are computed
        assert peer.first_in.wait(10) and peer.received[0].verify_coin == full.verify_coin
        return list(full.norm_verifiers)

    answer = agree_providers(peer, message, timeout=10, late_verifiers=(make, 700))
    assert message == full  # the caller's set now holds its messages
    assert join_provider_set(peer.received) == full
    assert answer.callee == full and list(answer.agreed) == list(full.providers)

    # messages of another size than planned: the call is cancelled, never sent short
    peer = _PagedPeer()
    message.ClearField("norm_verifiers")
    with pytest.raises(ValueError, match="other sizes than the 699 bytes planned"):
        agree_providers(peer, message, timeout=10, late_verifiers=(make, 699))
    assert peer.cancelled
