# SPDX-License-Identifier: GPL-2.0
"""hybd's benchmark harness (make bench), split by concern: tools/bench.py
runs it (main.main) and its docstring is the usage.

  catalogue  the lines, the modes, the comparisons and the targets (data)
  common     errors, messages, running commands
  devio      direct I/O: writing the measured regions, reading them back
  setup      a line, the run's context and cleanup, what lines share
  peers      the setup of the drivers hybd is measured against
  hybd       the setup of hybd's drivers (its servers, hybdctl)
  runner     fio: one run of a line, the interleaved rounds
  document   bench.json: the run's metadata and every round
  report     the summary, the tables, the targets and the chart (--report)
  tracing    --trace and --profile (tools/reqtrace.py)
  hostload   the host's CPU load during a run (tools/vm-run runs it as a
             script, on the host, beside the guest)
  main       the command line and main()
"""
