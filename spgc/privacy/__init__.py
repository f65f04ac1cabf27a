"""Differential privacy: what is released, how much it costs, and the record of it.

Calibration and the RDP/PLD accountant (``accounting``), the exact discrete Gaussian noise one
party samples alone (``noise``), clip schedules (``clipping``), a data set's budget across runs
(``budget``), the co-signed write-ahead ledger (``ledger``) and a pair of ledgers held to each
other (``ledger_pair``), private feature statistics (``feature_stats``).

May import: garbled_core, spgc.common, spgc.wire, spgc.protocol.
"""
