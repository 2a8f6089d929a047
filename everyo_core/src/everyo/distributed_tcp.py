"""Multi-machine process groups over authenticated TCP, provided by everyo-dist.

Forwards to ``everyo_dist.tcp``: ``from everyo.distributed_tcp import TCPRendezvousServer``.
"""

from everyo.first_party import require

require("everyo_dist", "everyo-dist", "distributed_tcp")

from everyo_dist.tcp import *  # noqa: E402,F401,F403
from everyo_dist.tcp import __all__  # noqa: E402,F401
