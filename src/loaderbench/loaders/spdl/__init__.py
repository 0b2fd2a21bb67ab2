"""``loader=spdl``: SPDL's thread pipeline: ``loader`` builds and runs it, ``decoders`` holds
the decode functions (turbo, ffmpeg, nvjpeg), ``stats`` keeps SPDL's per-stage statistics."""
