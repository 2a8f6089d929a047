"""The ``tcp`` backend: a rendezvous server, authenticated peer connections, and a ring that
carries the collectives. The public names are re-exported by :mod:`everyo_dist.tcp`."""
