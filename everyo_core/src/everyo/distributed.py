"""Data-parallel training, provided by the everyo-dist distribution.

This module only forwards to ``everyo_dist.api`` so that users write
``from everyo.distributed import spawn``; without everyo-dist the import explains what to install.
"""

from everyo.first_party import require

require("everyo_dist", "everyo-dist", "distributed")

from everyo_dist.api import *  # noqa: E402,F401,F403
from everyo_dist.api import __all__  # noqa: E402,F401
