"""What a provider and the two servers must agree on, byte for byte, to run a round.

The modes table (``modes``: every mode and backend, the one list of them), fixed-point encoding
(``encoding``), additive sharing mod 2^L (``sharing``), the providers' norm proofs
(``norm_proof``) and the TLS certificates of the parties (``certs``).

May import: garbled_core, spgc.common.
"""
