"""Report generation: the ``report.generate`` job, its artifact store and its service."""
