"""How a delivery runs (``execute``, home of ``KeelTask``): admitted by the queue's limits
(``admission``), claimed (``claim``), run by its handler (``running``) with its lock
renewed, its end recorded (``outcome``); its prefetch slot watched."""
