"""What stops a provider, or one of its rounds (raised by the client and its helpers;
re-exported by :mod:`spgc.providers.client`)."""

from __future__ import annotations

from spgc.settings.config import ConfigError

__all__ = ["ModelFailed", "ProviderRefusal", "RoundFailed", "RunFailed", "SelfCheckFailed"]


class ProviderRefusal(RuntimeError):
    """The provider refuses to take part: the servers disagree, or announce parameters it does
    not accept (weaker privacy than its minimum, another encoding, another model), or its data
    set's budget would be passed."""


class SelfCheckFailed(ConfigError):
    """The provider's own model or data cannot be used (providers/selfcheck.py): found at its
    start, before any server is called, as ``spgc config check`` finds it."""


class RoundFailed(RuntimeError):
    """This provider's contribution to one round could not be delivered (the run goes on).
    ``resending``: a server has the share and another not yet; the missing half is sent again
    while the round still collects, so the round may yet count."""

    def __init__(self, message: str, resending: bool = False) -> None:
        super().__init__(message)
        self.resending = resending


class ModelFailed(RuntimeError):
    """The model raised while computing this provider's gradients (its data are checked at
    start-up, so this is a failure the check could not see): the provider stops."""


class RunFailed(RuntimeError):
    """A server says its run stopped on an error (RoundInfo.failure): training did not end as
    planned."""
