"""The ``tcp_hierarchical`` backend: shared memory inside a machine, tcp between machines."""
