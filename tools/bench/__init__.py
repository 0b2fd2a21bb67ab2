"""The benchmark report (``make bench``), measured then drawn: ``measure`` runs the limits, the
loaders' sweeps and the peers and writes bench/report.json (``schema``); ``render`` draws
bench/report.md and bench/report.png from that file alone (``make report``). ``limits`` measures
what the loaders are compared against (CPU decode limit, plain thread pool, crop-and-resize
limit), ``peers``, ``dali`` and ``ffcv`` build the pipelines compared with, ``peer_rows`` times
them, ``stores`` measures memmap's stores."""

# The face names its modules: each is a command (``python -m tools.bench.NAME``) or a part of one.
__all__ = [
    "backends",
    "columns",
    "crop_limit",
    "dali",
    "ffcv",
    "gil_cpu",
    "gil_profile",
    "host_cost",
    "limit_report",
    "limits",
    "measure",
    "peer_rows",
    "peers",
    "plot",
    "profile",
    "py_spy",
    "render",
    "render_cores",
    "render_stores",
    "scale",
    "schema",
    "stores",
    "work_bounds",
]
