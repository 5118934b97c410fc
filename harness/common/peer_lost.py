"""What a rank raises because a peer vanished: a symptom of another rank's stop, never its cause."""

from __future__ import annotations

import re

PEER_LOST = re.compile(
    r"Connection (?:closed|reset) by peer|Broken pipe|DistNetworkError|DistBackendError|communicator was aborted"
    r"|recvValue failed|failed to recv|Socket Timeout|Connection refused",
)
