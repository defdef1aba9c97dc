"""`eagle-zoo convert`: checkpoint converters.

One module per job:
  errors.py       exit codes and the errors that carry them
  source.py       open a checkpoint lazily: names, shapes and dtypes from headers,
                  tensor bytes only when written
  plan.py         what a conversion will write (printed by --dry-run) and the atomic
                  writer (temporary directory beside OUT, renamed into place)
  safetensors_out.py  streaming safetensors writer (one tensor in memory at a time)
  legacy.py       yuhuili EAGLE-1 -> vLLM < 0.7 layout
  eagle3.py       yuhuili EAGLE-3 <-> speculators eagle3
  files.py        to-safetensors, shard, unshard (names and values unchanged)
  average.py      the weighted mean of heads of one config and draft vocabulary
  cli.py          the argparse subcommands
"""
