"""A recorded double of libfabric's `fi_info -p efa` on an EFA node: one efa device, RDM and DGRAM endpoints.

The output has the shape fi_info prints (a `provider:` line, then indented `key: value` lines per
endpoint); with DOUBLES_FI_INFO=none it answers as a node without an EFA device does.
"""

from __future__ import annotations

import os
import sys

EFA = """provider: efa
    fabric: efa
    domain: rdmap0s31-rdm
    version: 122.0
    type: FI_EP_RDM
    protocol: FI_PROTO_EFA
provider: efa
    fabric: efa
    domain: rdmap0s31-dgrm
    version: 122.0
    type: FI_EP_DGRAM
    protocol: FI_PROTO_EFA
"""


def main(argv: list[str]) -> int:
    if argv != ["-p", "efa"]:
        sys.stderr.write(f"this double answers `fi_info -p efa` only, got {argv}\n")
        return 2
    if os.environ.get("DOUBLES_FI_INFO") == "none":
        sys.stderr.write("fi_getinfo: -61 (No data available)\n")
        return 1
    sys.stdout.write(EFA)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
