"""Provider sets in pages, for the Peer service's AgreeProviders stream.

A round's provider set grows with the providers: each carries its name, its vector id and,
with verified inputs, the server's norm-proof verifier message (2 KB at d = 62, 6 KB at
MNIST's d, 31 KB at d = 10^6). At a thousand providers one message would pass gRPC's limit
(:data:`spgc.wire.transport.DEFAULT_MAX_MESSAGE_BYTES`), so both the set and the answer travel
as pages (proto/spgc/v1/peer.proto, ``ProviderSet.pages``): the first page holds the scalar
fields, every page the next slice of each list. :func:`provider_set_pages` and
:func:`agreement_pages` cut, :func:`join_provider_set` and :func:`join_agreement` rebuild and
refuse a page stream that is not one whole message (a count that does not match, a later page
that carries a first page's fields). :func:`agree_providers` is the caller's side of the call:
its first page (with the norm-proof coin) goes out before its verifier messages are computed,
so that the two servers compute theirs at the same time.

The privacy ledger grows by about 1.5 KB a round, so FetchLedger answers a page too
(:func:`ledger_page`): the lines from the one asked for that fit :data:`PAGE_BYTES`; the
caller asks again from the next line until it holds ``total_lines``.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from spgc.wire._generated import peer_pb2
from spgc.wire.errors import InvalidArgumentError

__all__ = [
    "MAX_PAGES",
    "PAGE_BYTES",
    "agree_providers",
    "agreement_pages",
    "join_agreement",
    "join_provider_set",
    "ledger_page",
    "provider_set_pages",
]

#: The lists' bytes a page holds at most (an item larger than this gets a page of its own).
PAGE_BYTES = 512 << 10
#: The most pages a set or an answer may have (bounds what a peer can make the other buffer:
#: with 1 MiB messages about 2 GiB; 100,000 providers at MNIST's d take about 1,200 pages).
MAX_PAGES = 2048

_SET_LISTS = ("providers", "vector_ids", "norm_verifiers")
# A list element's framing on the wire: its tag and a length of up to 3 bytes.
_ITEM_OVERHEAD = 4

T = TypeVar("T", str, bytes)


def _item_bytes(item: str | bytes) -> int:
    return len(item.encode() if isinstance(item, str) else item) + _ITEM_OVERHEAD


def _run_lengths(sizes: Iterable[int], budget: int) -> list[int]:
    """How many items each run takes when items of ``sizes`` bytes are cut, in order, into
    runs of at most ``budget`` bytes (an item larger than that alone in its run)."""
    runs: list[int] = []
    count = size = 0
    for n in sizes:
        if count and size + n > budget:
            runs.append(count)
            count = size = 0
        count += 1
        size += n
    if count:
        runs.append(count)
    return runs


def _slices(items: Sequence[T], budget: int) -> list[list[T]]:
    """``items`` cut in order into runs of at most ``budget`` bytes each (with framing)."""
    out, start = [], 0
    for count in _run_lengths((_item_bytes(item) for item in items), budget):
        out.append(list(items[start : start + count]))
        start += count
    return out


def _set_budget(page_bytes: int | None) -> int:
    return max(1, (page_bytes or PAGE_BYTES) // len(_SET_LISTS))


def _set_page_count(sizes: dict[str, Iterable[int]], page_bytes: int | None = None) -> int:
    """The pages of a set whose lists' items have these sizes (with framing): the first, then
    as many as the longest list's runs."""
    budget = _set_budget(page_bytes)
    return 1 + max(0, *(len(_run_lengths(v, budget)) for v in sizes.values()))


def _first_page(message: peer_pb2.ProviderSet, count: int) -> peer_pb2.ProviderSet:
    """The first page of ``message``'s ``count``: every field but the lists."""
    first = peer_pb2.ProviderSet()
    first.CopyFrom(message)
    for name in _SET_LISTS:
        first.ClearField(name)
    first.pages = count
    return first


def provider_set_pages(
    message: peer_pb2.ProviderSet, page_bytes: int | None = None
) -> list[peer_pb2.ProviderSet]:
    """``message`` as pages, in order: the first with every field but the lists (and
    ``pages``), then the lists' slices; ``page_bytes`` default PAGE_BYTES."""
    budget = _set_budget(page_bytes)
    cut = {name: _slices(list(getattr(message, name)), budget) for name in _SET_LISTS}
    count = 1 + max(0, *(len(runs) for runs in cut.values()))
    if count > MAX_PAGES:
        raise ValueError(f"a provider set of {count} pages is over the {MAX_PAGES}-page limit")
    pages = [_first_page(message, count)] + [peer_pb2.ProviderSet() for _ in range(count - 1)]
    for name, runs in cut.items():
        for page, run in zip(pages[1:], runs, strict=False):
            getattr(page, name).extend(run)
    return pages


def _page_error(what: str, detail: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{what} pages: {detail}")


def _join(
    pages: Iterable[Any],
    what: str,
    first_only: Sequence[str],
    add_page: Any,
) -> Any:
    """Reads ``pages``: the first's ``pages`` count, then exactly that many pages, each later
    one with none of ``first_only`` set; ``add_page(page)`` takes each page's slices."""
    stream = iter(pages)
    first = next(stream, None)
    if first is None:
        raise _page_error(what, "the stream ended before its first page")
    count = first.pages
    if not 1 <= count <= MAX_PAGES:
        raise _page_error(what, f"the first page names {count} pages (1 to {MAX_PAGES})")
    add_page(first)
    seen = 1
    for page in stream:
        seen += 1
        if seen > count:
            raise _page_error(what, f"more than the {count} pages the first named")
        fields = {f.name for f, _ in page.ListFields()}
        extra = sorted(fields & set(first_only))
        if extra:
            raise _page_error(what, f"page {seen} carries {', '.join(extra)}")
        add_page(page)
    if seen < count:
        raise _page_error(what, f"the stream ended after {seen} of {count} pages")
    return first


_SET_SCALARS = tuple(
    f.name for f in peer_pb2.ProviderSet.DESCRIPTOR.fields if f.name not in _SET_LISTS
)


def join_provider_set(pages: Iterable[peer_pb2.ProviderSet]) -> peer_pb2.ProviderSet:
    """The set a page stream carries (InvalidArgumentError if it is not one whole set)."""
    lists: dict[str, list[Any]] = {name: [] for name in _SET_LISTS}

    def add(page: peer_pb2.ProviderSet) -> None:
        for name in _SET_LISTS:
            lists[name].extend(getattr(page, name))

    whole = peer_pb2.ProviderSet()
    whole.CopyFrom(_join(pages, "provider set", _SET_SCALARS, add))
    for name, values in lists.items():
        whole.ClearField(name)
        getattr(whole, name).extend(values)
    whole.ClearField("pages")
    return whole


def agreement_pages(
    message: peer_pb2.ProviderAgreement, page_bytes: int | None = None
) -> list[peer_pb2.ProviderAgreement]:
    """``message`` as pages (at least one): the callee's set and the agreed list, each cut
    into pages of about ``page_bytes`` (default PAGE_BYTES), side by side."""
    page_bytes = page_bytes or PAGE_BYTES
    callee = provider_set_pages(message.callee, page_bytes) if message.HasField("callee") else []
    agreed = _slices(list(message.agreed), max(1, page_bytes // 2))
    count = max(1, len(callee), len(agreed))
    if count > MAX_PAGES:
        raise ValueError(f"an agreement of {count} pages is over the {MAX_PAGES}-page limit")
    pages = [peer_pb2.ProviderAgreement() for _ in range(count)]
    pages[0].agreed_digest = message.agreed_digest
    pages[0].proceed = message.proceed
    pages[0].pages = count
    for page, part in zip(pages, callee, strict=False):
        page.callee.CopyFrom(part)
    for page, run in zip(pages, agreed, strict=False):
        page.agreed.extend(run)
    return pages


def join_agreement(pages: Iterable[peer_pb2.ProviderAgreement]) -> peer_pb2.ProviderAgreement:
    """The answer a page stream carries (InvalidArgumentError if it is not one whole answer)."""
    agreed: list[str] = []
    callee: list[peer_pb2.ProviderSet] = []

    def add(page: peer_pb2.ProviderAgreement) -> None:
        agreed.extend(page.agreed)
        if page.HasField("callee"):
            callee.append(page.callee)

    first = _join(pages, "agreement", ("agreed_digest", "proceed", "pages"), add)
    whole = peer_pb2.ProviderAgreement(
        agreed=agreed, agreed_digest=first.agreed_digest, proceed=first.proceed
    )
    if callee:
        whole.callee.CopyFrom(join_provider_set(callee))
    return whole


def agree_providers(
    stub: Any,
    message: peer_pb2.ProviderSet,
    timeout: float,
    late_verifiers: tuple[Callable[[], Sequence[bytes]], int] | None = None,
) -> peer_pb2.ProviderAgreement:
    """The caller's AgreeProviders: ``message`` out in pages, the whole answer back.

    ``late_verifiers`` (make, size): ``message`` comes without its norm-proof verifier messages;
    the first page goes out first, so that the callee starts on its own messages, then
    ``make()`` computes ours (one of ``size`` bytes per provider, which fixes the page count
    before) and the rest of the pages follow. ``message`` holds them afterwards."""
    if late_verifiers is None:
        pages = iter(provider_set_pages(message))
        return join_agreement(stub.AgreeProviders(pages, timeout=timeout))
    make, size = late_verifiers
    message.ClearField("norm_verifiers")
    planned = _set_page_count(
        {
            "providers": map(_item_bytes, message.providers),
            "vector_ids": map(_item_bytes, message.vector_ids),
            "norm_verifiers": [size + _ITEM_OVERHEAD] * len(message.providers),
        }
    )
    if planned > MAX_PAGES:
        raise ValueError(f"a provider set of {planned} pages is over the {MAX_PAGES}-page limit")
    head = _first_page(message, planned)
    outbox: queue.SimpleQueue[peer_pb2.ProviderSet | None] = queue.SimpleQueue()
    answer = stub.AgreeProviders(iter(outbox.get, None), timeout=timeout)
    outbox.put(head)
    try:
        verifiers = list(make())
        if len(verifiers) != len(message.providers) or any(len(v) != size for v in verifiers):
            raise ValueError(f"verifier messages of other sizes than the {size} bytes planned")
        message.norm_verifiers.extend(verifiers)
        pages = provider_set_pages(message)
        if len(pages) != planned:
            raise ValueError("the provider set's pages are not the ones its first page named")
    except BaseException:
        answer.cancel()  # the callee sees a cancelled call, never a short set
        outbox.put(None)
        raise
    for page in pages[1:]:
        outbox.put(page)
    outbox.put(None)
    return join_agreement(answer)


def ledger_page(
    lines: Sequence[bytes], from_line: int, page_bytes: int | None = None
) -> list[bytes]:
    """The ledger lines from ``from_line`` on that fit ``page_bytes`` (default PAGE_BYTES),
    at least one while any is left (a line is about 1.5 KB)."""
    runs = _slices(lines[from_line:], page_bytes or PAGE_BYTES)
    return runs[0] if runs else []
