"""The prepared check for a GPU machine without network (``gpu_check.sh`` beside this file;
``scripts/gpu_check.sh`` forwards to it), and the Python it runs there, from the repository
root: ``python -m tools.gpu_check env|data|decode|report`` (``cli.py``) and
``python -m tools.gpu_check.plan`` (the projected time).

cli.py          the command line (__main__.py runs it)
machine.py      the machine record (env.json)
decode_bench.py the decoder table: batched JPEG decode, each decoder alone and the loaders'
                choice (decode.json); decode_rows.py its rows, decode_table.py its section
report.py       report.md from the sweep folders (read by loaderbench.run.folders), the phases,
                the tests, decode.json and env.json
markdown.py     the report's cell format (its tables: loaderbench.platform.tables)
sharing.py      how the GPU's JPEG decoder is best driven (sharing.json)
plan.py         the projected time of the plan gpu_check.sh walks without running it
gpu_kit.sh      ``make gpu-kit``: the wheels the GPU machine lacks, in .gpu-kit/
"""

# The face names its modules: the GPU machine runs them one by one, as it is set up.
__all__ = [
    "cli",
    "decode_bench",
    "decode_rows",
    "decode_table",
    "machine",
    "markdown",
    "plan",
    "report",
    "sharing",
]
