#!/bin/sh
# The Criterion arguments of `make memcheck` for the test binary $1.
#
# On a machine without a GPU the cuda_* suites' tests skip, yet under
# valgrind each still costs a process: Criterion spawns every test in a
# fresh exec of the binary, and valgrind translates its start-up anew each
# time (~2.5 s, against ~0.01 s natively), about 200 processes and minutes of
# CI for tests that check nothing there. So where no GPU is present the
# filter keeps every other suite and, of the cuda_* suites, exactly the tests
# that run (pass or fail) in a native run here: the argument checks and the
# like, which valgrind then still sees. With a GPU it prints nothing: the
# whole suite.
set -eu
bin=$1
[ -e /dev/nvidia0 ] && exit 0
ran=$("$bin" --jobs 2 --verbose --filter 'cuda_*/*' 2>&1 |
  sed -n 's/^\[\(PASS\|FAIL\)\] \([A-Za-z0-9_]*\)::\([A-Za-z0-9_]*\):.*/\2\/\3/p' | sort -u | paste -sd'|' -)
if [ -n "$ran" ]; then
  printf '%s\n' "--filter=@(!(cuda_*)/*|$ran)"
else
  printf '%s\n' "--filter=!(cuda_*)/*"
fi
