"""The benchmark report (``make bench``): ``report`` runs it and writes bench/report.md,
``limits`` measures what the loaders are compared against (CPU decode limit, plain thread pool),
``peers`` builds the pipelines from the tensordict tutorial to compare with."""
