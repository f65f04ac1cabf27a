"""The model being trained and the data it learns from, on a provider and on the servers.

Built-in and user models (``models``), data sets and loaders (``data``), per-example gradients
(``gradients``), the task's loss (``losses``), the optimiser and test metrics (``optim``),
trainable masks (``trainable``), adapters on a pretrained backbone (``adapters``), provider-level
local training (``local_training``) and the exported model with its privacy report (``export``).

May import: spgc.common, spgc.wire, spgc.protocol, spgc.privacy.
"""
