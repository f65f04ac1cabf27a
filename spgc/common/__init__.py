"""Plumbing every other part of the library uses and that knows nothing of the protocol.

The one log format (``logs``), progress lines (``progress``), files replaced atomically and
durably (``durable``), the CSPRNG behind every sampling decision (``csprng``) and a batch split
into lanes run on threads (``lanes``) and a process's peak memory (``memory``).

May import: nothing of ours.
"""
