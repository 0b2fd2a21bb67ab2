"""The benchmark report (``make bench``), measured then drawn: ``measure`` runs the limits, the
loaders' sweeps and the peers and writes bench/report.json (``schema``); ``render`` draws
bench/report.md and bench/report.png from that file alone (``make report``). ``limits`` measures
what the loaders are compared against (CPU decode limit, plain thread pool, crop-and-resize
limit), ``peers``, ``dali`` and ``ffcv`` build the pipelines compared with, ``peer_rows`` times
them, ``stores`` measures memmap's stores."""
