#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# demo.sh [--runtime S] - the hybd fast path in a minute (make demo).
#
# Starts the ramdisk example (a block driver whose slow path is a user-space
# process), writes 16 MiB of data, and measures 4 KiB random reads at QD1
# over it with fio: first with the slow path only, then with the cache
# fast path (bpf/cache.bpf.o) attached and warmed up.  Prints both mean
# latencies and IOPS, the speedup, and how many reads each path served.
#
# Runs as root where the hybd module can be loaded: tools/vm-run demo does
# that in a guest.  Exit status 0 when the demo ran and the fast path served
# the cached reads, 1 otherwise (with the reason).
#
# Environment: HYBD_KMOD (module to insmod if /dev/hybd-control is missing).

set -u

REPO=$(cd "$(dirname "$0")/.." && pwd)
HYBDCTL=$REPO/tools/hybdctl/hybdctl
RAMDISK=$REPO/examples/ramdisk/ramdisk
PROG=$REPO/bpf/cache.bpf.o
KMOD=${HYBD_KMOD:-$REPO/kmod/hybd.ko}
REGION_MIB=16		# read over; the cache holds 32 MiB
RUNTIME=10

TMP=""
RD_PID=""
FIO_PID=""
DEV=""
ATTACHED=0
LOADED=0

say() { printf 'demo: %s\n' "$*"; }
die() {
	say "FAILED: $*"
	exit 1
}

# bench.py's parsers (fio JSON, hybdctl stats), so both read them alike
py() {
	local code=$1
	shift
	PYTHONPATH=$REPO/tools PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -c "
import sys, bench
try:
    $code
except bench.BenchError as e:
    sys.exit(f'demo: {e}')" "$@"
}

# "FAST SLOW": the device's fast_done and slow_done counters
counters() { py 'print(*bench.fast_slow(bench.hybd_stats(sys.argv[1])))' "$DEV"; }

cleanup() {
	local rc=$? i

	[ -n "$FIO_PID" ] && kill "$FIO_PID" 2>/dev/null && wait "$FIO_PID" 2>/dev/null
	if [ "$ATTACHED" = 1 ]; then
		"$HYBDCTL" detach "$DEV" >/dev/null || say "warning: hybdctl detach $DEV failed"
	fi
	if [ -n "$RD_PID" ] && kill -0 "$RD_PID" 2>/dev/null; then
		kill -TERM "$RD_PID"
		for i in $(seq 300); do
			kill -0 "$RD_PID" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$RD_PID" 2>/dev/null; then
			say "warning: the ramdisk ignored SIGTERM: killing it"
			kill -KILL "$RD_PID"
		fi
		wait "$RD_PID" 2>/dev/null
	fi
	[ "$LOADED" = 1 ] && { rmmod hybd || say "warning: rmmod hybd failed"; }
	[ -n "$TMP" ] && rm -rf "$TMP"
	exit "$rc"
}

while [ $# -gt 0 ]; do
	case $1 in
	--runtime) RUNTIME=${2:-}; shift 2 ;;
	--runtime=*) RUNTIME=${1#*=}; shift ;;
	-h|--help) sed -n '4,17s/^# \{0,1\}//p' "$0"; exit 0 ;;
	*) echo "usage: $0 [--runtime SECONDS]" >&2; exit 2 ;;
	esac
done
case $RUNTIME in
'' | *[!0-9]* | 0) echo "demo: --runtime wants a number of seconds >= 1" >&2; exit 2 ;;
esac

trap cleanup EXIT
trap 'exit 1' INT TERM

[ "$(id -u)" = 0 ] || die "run as root (make demo runs it in a guest)"
command -v fio >/dev/null || die "fio is not installed (make guest-deps)"
for f in "$HYBDCTL" "$RAMDISK"; do
	[ -x "$f" ] || die "$f is not built: run make"
done
[ -f "$PROG" ] || die "$PROG is not built: run make -C bpf"
TMP=$(mktemp -d /tmp/hybd-demo.XXXXXX) || die "mktemp failed"

if [ ! -e /dev/hybd-control ]; then
	[ -f "$KMOD" ] || die "/dev/hybd-control missing and $KMOD not built (make kmod)"
	say "loading $KMOD"
	insmod "$KMOD" || die "insmod $KMOD failed (see dmesg)"
	LOADED=1
fi

# ---- the driver: its slow path is this process
say "starting the ramdisk driver (slow path in user space)"
"$RAMDISK" --size 64M >"$TMP/ramdisk.out" 2>&1 &
RD_PID=$!
for i in $(seq 600); do
	DEV=$(sed -n 's|^ready \(/dev/hybd[0-9]*\)$|\1|p' "$TMP/ramdisk.out")
	[ -n "$DEV" ] && break
	kill -0 "$RD_PID" 2>/dev/null || break
	sleep 0.1
done
if [ -z "$DEV" ]; then
	say "ramdisk output:"
	sed 's/^/    /' "$TMP/ramdisk.out"
	die "the ramdisk did not come up"
fi
say "serving $DEV"

say "writing ${REGION_MIB} MiB of random data to $DEV"
dd if=/dev/urandom of="$DEV" bs=1M count=$REGION_MIB iflag=fullblock oflag=direct \
	conv=fsync status=none || die "writing $DEV failed"

# run_fio NAME: 4 KiB random reads at QD1 over the region, RUNTIME seconds,
# with a line a second; the JSON result goes to $TMP/NAME.json.
run_fio() {
	local name=$1 stat=/sys/block/${DEV#/dev/}/stat
	local start="" t0 t1 last now rc

	fio --output-format=json --output="$TMP/$name.json" --name="$name" \
		--filename="$DEV" --rw=randread --bs=4k --direct=1 \
		--ioengine=psync --iodepth=1 --size=${REGION_MIB}M --offset=0 \
		--time_based --runtime="$RUNTIME" --norandommap --randrepeat=0 \
		--invalidate=0 --thread --disk_util=0 >"$TMP/$name.log" 2>&1 &
	FIO_PID=$!
	printf 'demo:   fio %-7s starting\n' "$name"
	last=$(awk '{ print $1 }' "$stat")
	t0=$EPOCHREALTIME
	# the clock starts with the first reads: fio takes a while to start
	while sleep 1 && kill -0 "$FIO_PID" 2>/dev/null; do
		now=$(awk '{ print $1 }' "$stat")
		t1=$EPOCHREALTIME
		if [ -z "$start" ]; then
			if [ "$now" = "$last" ]; then
				t0=$t1
				continue
			fi
			start=$t0
		fi
		awk -v n="$name" -v a="$start" -v b="$t0" -v c="$t1" \
			-v r="$RUNTIME" -v d=$((now - last)) 'BEGIN {
			if (c - a <= r + 0.5)
				printf "demo:   fio %-7s %4.1fs/%ds %8.0f reads/s\n",
					n, c - a, r, d / (c - b) }'
		last=$now
		t0=$t1
	done
	wait "$FIO_PID"
	rc=$?
	FIO_PID=""
	if [ $rc -ne 0 ]; then
		sed 's/^/    /' "$TMP/$name.log" | tail -n 5
		die "fio ($name) exited with $rc"
	fi
}

# "MEAN_US IOPS" of a run
result() {
	py 'r = bench.parse_fio(open(sys.argv[1]).read())
    print("%.1f %.0f" % (r["mean_us"], r["iops"]))' "$TMP/$1.json"
}

# ---- 1: every read goes to the user-space slow path
say "1/2: 4 KiB random reads, QD1, ${RUNTIME}s, slow path only"
run_fio slow
read -r slow_mean slow_iops < <(result slow) || die "no result from fio (slow)"

# ---- 2: the cache fast path serves the reads in the kernel
say "attaching $(basename "$PROG") to $DEV"
"$HYBDCTL" attach "$PROG" "$DEV" || die "hybdctl attach $PROG $DEV failed"
ATTACHED=1
say "warm-up: one sequential pass over ${REGION_MIB} MiB fills the cache"
dd if="$DEV" of=/dev/null bs=4k count=$((REGION_MIB * 256)) iflag=direct \
	status=none || die "reading $DEV failed"

say "2/2: the same reads with the cache attached"
read -r f0 s0 < <(counters) || die "cannot read the counters of $DEV"
run_fio cached
read -r f1 s1 < <(counters) || die "cannot read the counters of $DEV"
read -r fast_mean fast_iops < <(result cached) || die "no result from fio (cached)"

"$HYBDCTL" detach "$DEV" || die "hybdctl detach $DEV failed"
ATTACHED=0

fast=$((f1 - f0))
slow=$((s1 - s0))
echo
say "4 KiB random reads at QD1 over ${REGION_MIB} MiB of $DEV, ${RUNTIME}s each"
printf 'demo:   %-26s %10s %10s\n' "" "mean" "IOPS"
printf 'demo:   %-26s %7s us %10s\n' "slow path (user space)" "$slow_mean" "$slow_iops"
printf 'demo:   %-26s %7s us %10s\n' "+ cache.bpf.o fast path" "$fast_mean" "$fast_iops"
awk -v a="$slow_mean" -v b="$fast_mean" -v c="$slow_iops" -v d="$fast_iops" \
	'BEGIN { printf "demo:   speedup: %.1fx lower mean latency, %.1fx the IOPS\n", a / b, d / c }'
say "  during run 2: $fast reads served by the fast path (in the kernel), $slow by the slow path"
echo

[ $((fast + slow)) -gt 0 ] || die "the counters of $DEV did not move during run 2"
# a warm cache over the whole region serves (nearly) every read
[ $((fast * 100)) -ge $(((fast + slow) * 90)) ] ||
	die "the fast path served only $fast of $((fast + slow)) reads: the cache did not work"
say "done"
exit 0
