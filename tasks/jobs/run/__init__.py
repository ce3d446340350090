"""How a delivery runs: admitted by the queue's limits, claimed, run by its handler
(``execute``, home of ``KeelTask``), its lock renewed, its prefetch slot watched."""
