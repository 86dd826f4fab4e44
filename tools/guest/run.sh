#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# run.sh RUNDIR - the guest half of tools/vm-run; runs as root in the guest.
#
# Reads RUNDIR/guest.conf (MODE, REPO, KMOD, ACCEL, ARGS), then:
#   1. streams the kernel log to RUNDIR/kmsg.log (survives a guest crash;
#      RUNDIR/kmsg.lost counts records lost to the ring buffer),
#   2. sets hung_task_timeout_secs=10 (60 in the debug kernel), mounts
#      configfs/debugfs,
#   3. loads the module,
#   4. runs the mode's command: pytest for `tests`,
#   5. final checks: rmmod hybd must succeed, a kmemleak scan (debug
#      kernel), no record of the log lost and no kernel splat in it,
#   6. writes RUNDIR/status (and RUNDIR/summary: pytest's summary line).
# Everything it prints is also kept in RUNDIR/guest.log.

set -u

RUNDIR=$1
# shellcheck source=/dev/null
. "$RUNDIR/guest.conf" || { echo "guest: cannot read $RUNDIR/guest.conf"; exit 1; }

PY=/usr/bin/python3
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
export HYBD_KMOD=$KMOD HYBD_RESULTS=$RUNDIR
# a bound on the command itself, well inside the host's bound on the guest
CMD_TIMEOUT=${CMD_TIMEOUT:-2400}

say() { printf 'guest: %s\n' "$*"; }
final_fail() {
	printf 'vm-run: FINAL CHECK FAILED: %s\n' "$*"
	FINAL_FAILED=1
}

load_module() {
	local dep i ver

	ver=$(modinfo -F version "$KMOD" 2>/dev/null)
	if [ ! -f "$KMOD" ]; then
		say "FAILED: $KMOD does not exist (make kmod)"
		return 1
	fi
	for dep in $(modinfo -F depends "$KMOD" 2>/dev/null | tr ',' ' '); do
		modprobe "$dep" || say "warning: modprobe $dep failed"
	done
	if ! insmod "$KMOD"; then
		say "FAILED: insmod $KMOD; kernel log tail:"
		dmesg | tail -n 20
		return 1
	fi
	for i in $(seq 50); do
		[ -e /dev/hybd-control ] && break
		sleep 0.1
	done
	if [ ! -e /dev/hybd-control ]; then
		say "FAILED: /dev/hybd-control did not appear after insmod"
		return 1
	fi
	say "loaded $KMOD${ver:+ version $ver}"
}

run_tests() {
	# the whole suite, unless the arguments name tests under tests/
	# (tests/ beside tests/test_x.py would collect that file twice); not
	# any existing path: `-k bpf` names the top-level bpf/ as well
	local what=tests/ arg
	for arg in "${ARGS[@]}"; do
		case "$arg" in tests/?*|./tests/?*) what= ;; esac
	done
	# -p no:cacheprovider: the repository is read-only in the guest
	timeout -k 10 "$CMD_TIMEOUT" "$PY" -m pytest $what -v --color=no \
		-p no:cacheprovider --junitxml="$RUNDIR/junit.xml" "${ARGS[@]}" \
		2>&1 | tee "$RUNDIR/pytest.log"
	local rc=${PIPESTATUS[0]}
	[ "$rc" -eq 124 ] && say "FAILED: pytest did not finish within ${CMD_TIMEOUT}s"
	# pytest's last line: "==== 3 failed, 9 passed in 81.20s (0:01:21) ===="
	grep -E '^=+ .* in [0-9.]+s( \([0-9:]+\))? =+$' "$RUNDIR/pytest.log" |
		tail -n 1 >"$RUNDIR/summary"
	return "$rc"
}

final_checks() {
	local left out i lost

	left=$(pgrep -a -f 'examples/ramdisk/ramdisk|examples/loop/hybd-loop|examples/dedup/dedup serve|tests/helpers/badserver' || true)
	[ -z "$left" ] || say "warning: servers still running after the run:"$'\n'"$left"
	if [ -x "$REPO/tools/hybdctl/hybdctl" ] && [ -e /dev/hybd-control ]; then
		out=$(timeout 30 "$REPO/tools/hybdctl/hybdctl" list --json 2>&1)
		case $out in
		\[\]|'') ;;
		*) say "devices left after the run: $out" ;;
		esac
	fi

	if [ -d /sys/module/hybd ]; then
		if ! out=$(timeout 120 rmmod hybd 2>&1); then
			final_fail "rmmod hybd: ${out:-timed out}"
		fi
		for i in $(seq 50); do
			[ -d /sys/module/hybd ] || break
			sleep 0.1
		done
		[ -d /sys/module/hybd ] && final_fail "hybd is still loaded after rmmod"
	else
		final_fail "hybd is not loaded at the end of the run (a test must leave it loaded)"
	fi

	if [ -w /sys/kernel/debug/kmemleak ]; then
		sleep 5		# kmemleak reports objects older than 5 s
		echo scan >/sys/kernel/debug/kmemleak
		cat /sys/kernel/debug/kmemleak >"$RUNDIR/kmemleak.txt"
	fi
	end_log
	dmesg >"$RUNDIR/dmesg.txt" 2>&1	# the buffer's tail, for reading only
	lost=$(sed -n 's/.*\blost=\([0-9]*\).*/\1/p' "$RUNDIR/kmsg.lost" 2>/dev/null)
	if [ -z "$lost" ]; then
		final_fail "the kernel log stream left no count of lost records ($RUNDIR/kmsg.lost)"
	elif [ "$lost" -ne 0 ]; then
		final_fail "the kernel log stream lost $lost records (overwritten before they were read): the scan below is incomplete"
	fi
	# the whole boot's log as streamed, not the buffer (it keeps only the
	# last log_buf_len bytes); lines a test declared it causes (kmsg_allow)
	# are not counted again
	if ! out=$("$PY" "$REPO/tests/klog.py" "$RUNDIR/kmsg.log" "$RUNDIR/kmsg-allowed.txt"); then
		final_fail "kernel log of this boot has bad lines:"
		printf '%s\n' "$out" | head -n 60
	fi
}

# The kernel log, from the boot's first record, streamed to RUNDIR/kmsg.log
# (it survives a guest crash) by tests/klog.py's follower, which counts the
# records the kernel overwrote before it read them into RUNDIR/kmsg.lost.
start_log() {
	KMSG_END="hybd-runner: end of the kernel log $$.$RANDOM$RANDOM"
	"$PY" "$REPO/tests/klog.py" follow "$RUNDIR/kmsg.log" "$RUNDIR/kmsg.lost" \
		"$KMSG_END" &
	KMSG_PID=$!
}

# Log the end marker and wait for the follower to copy everything up to it
# and exit.
end_log() {
	local i

	echo "$KMSG_END" >/dev/kmsg
	for i in $(seq 300); do
		kill -0 "$KMSG_PID" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$KMSG_PID" 2>/dev/null; then
		final_fail "the kernel log stream did not reach the end marker within 30s"
		kill "$KMSG_PID" 2>/dev/null
	fi
	wait "$KMSG_PID" 2>/dev/null
}

main() {
	local rc=0

	FINAL_FAILED=0
	: >"$RUNDIR/started"	# from here on nothing is retried
	say "$(uname -r), $(nproc) vCPUs, $(awk '/MemTotal/ { print int($2 / 1024) }' /proc/meminfo) MiB, $ACCEL, up $(cut -d' ' -f1 /proc/uptime)s"

	start_log

	# a task blocked this long is a hang.  The debug kernel (KASAN,
	# lockdep; about 10 times slower under TCG) gets 6 times as long, as
	# the suite's own bounds grow there (tests/hybdlib.py): its 10 s
	# flagged an ext4 sync waiting 27 s on a dedup device's writeback,
	# slow but finishing
	hung=10
	case $(uname -r) in *hybd-debug*) hung=60 ;; esac
	sysctl -q -w kernel.hung_task_timeout_secs=$hung kernel.hung_task_warnings=-1 ||
		say "warning: cannot set hung task sysctls"
	# debugfs: blk-mq's per-hctx counters; configfs, should the module use it
	mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug
	modprobe -q configfs 2>/dev/null
	# kmemleak (the debug kernel with kmemleak=on): what booting leaked is
	# forgotten; scans only when final_checks asks, its reports go to the log
	if [ -w /sys/kernel/debug/kmemleak ]; then
		echo scan=off >/sys/kernel/debug/kmemleak
		echo scan >/sys/kernel/debug/kmemleak
		echo clear >/sys/kernel/debug/kmemleak
	fi
	if [ -d /sys/kernel/config ] && ! mountpoint -q /sys/kernel/config; then
		mount -t configfs configfs /sys/kernel/config
	fi

	cd "$REPO" || { echo 1 >"$RUNDIR/status"; return 1; }

	if ! load_module; then
		rc=1
	else
		case $MODE in
		tests)
			run_tests
			rc=$?
			;;
		bench)
			timeout -k 10 "$CMD_TIMEOUT" "$PY" tools/bench.py "${ARGS[@]}"
			rc=$?
			;;
		demo)
			timeout -k 10 "$CMD_TIMEOUT" /bin/bash tools/demo.sh "${ARGS[@]}"
			rc=$?
			;;
		*)
			say "unknown mode $MODE"
			rc=2
			;;
		esac
		final_checks
		if [ $FINAL_FAILED -ne 0 ] && [ $rc -eq 0 ]; then
			rc=1
		fi
	fi

	kill "$KMSG_PID" 2>/dev/null
	wait "$KMSG_PID" 2>/dev/null
	echo "$rc" >"$RUNDIR/status"
	return $rc
}

main 2>&1 | tee "$RUNDIR/guest.log"
exit "${PIPESTATUS[0]}"
