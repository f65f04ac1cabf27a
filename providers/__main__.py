"""``python -m spgc.providers --config provider.yaml [--KEY VALUE ...]``: run one provider.

Exit status: 0 when training finished (or ``max_rounds`` were done), 2 for a configuration
error, 3 when the provider refused to take part (the message says why), 1 otherwise.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from spgc.providers.client import ProviderClient, ProviderRefusal
from spgc.providers.config import ConfigError, config_from_args, parse_args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    log = logging.getLogger("spgc.provider")
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        log.error("configuration: %s", exc)
        return 2
    try:
        with ProviderClient(cfg) as client:
            reports = client.run()
    except ProviderRefusal as exc:
        log.error("refusing to take part: %s", exc)
        return 3
    except KeyboardInterrupt:
        log.info("interrupted")
        return 130
    except (TimeoutError, OSError, ValueError) as exc:
        log.error("%s", exc)
        return 1
    accepted = sum(r.accepted for r in reports)
    log.info("done: %d round(s), %d accepted by every server", len(reports), accepted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
