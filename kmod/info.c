// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - what a device reports: its counters summed over the queues' CPUs
 * (HYBD_CTL_STATS) and its state and parameters (HYBD_CTL_INFO).
 */
#include <linux/blkdev.h>

#include "hybd.h"

/**
 * hybd_queue_stat_add() - add one queue's counters to @dst
 * @q: the queue
 * @dst: where to add; may hold other queues' sums already
 */
void hybd_queue_stat_add(struct hybd_queue *q, struct hybd_queue_stat *dst)
{
	struct hybd_dev_stats *s = &dst->c;
	int cpu, i;

	for_each_possible_cpu(cpu) {
		const struct hybd_queue_stats *qs = per_cpu_ptr(q->stats, cpu);

		s->slow_issued += qs->slow_issued;
		s->slow_done += qs->slow_done;
		s->slow_errors += qs->slow_errors;
		s->fast_done += qs->fast_done;
		s->fast_errors += qs->fast_errors;
		s->failed_dead += qs->failed_dead;
		s->reads += qs->reads;
		s->writes += qs->writes;
		s->flushes += qs->flushes;
		s->fua += qs->fua;
		s->discards += qs->discards;
		s->write_zeroes += qs->write_zeroes;
		s->rej_bad_tag += qs->rej_bad_tag;
		s->rej_not_outstanding += qs->rej_not_outstanding;
		s->rej_stale_seq += qs->rej_stale_seq;
		s->rej_bad_result += qs->rej_bad_result;
		s->rej_ring_index += qs->rej_ring_index;
		s->bpf_bad_ret += qs->bpf_bad_ret;
		s->timed_out += qs->timed_out;
		s->bpf_unfilled += qs->bpf_unfilled;
		s->bpf_pass_zeroes += qs->bpf_pass_zeroes;
		s->held += qs->held;
		s->reissued += qs->reissued;
		s->remapped += qs->remapped;
		s->remap_refused += qs->remap_refused;
		s->remap_waited += qs->remap_waited;
		s->remap_direct += qs->remap_direct;
		s->remap_runs += qs->remap_runs;
		s->remap_polled += qs->remap_polled;
		s->remap_front += qs->remap_front;
		for (i = 0; i < HYBD_LAT_BUCKETS; i++) {
			dst->fast_lat[i] += qs->fast_lat[i];
			dst->slow_lat[i] += qs->slow_lat[i];
		}
	}
}

static void hybd_dev_sum_stats(struct hybd_dev *dev, struct hybd_dev_stats *s)
{
	struct hybd_queue_stat *sum = kzalloc(sizeof(*sum), GFP_KERNEL);
	unsigned int i;

	if (!sum)
		return;
	for (i = 0; i < dev->params.basic.nr_hw_queues; i++)
		hybd_queue_stat_add(&dev->queues[i], sum);
	*s = sum->c;
	kfree(sum);
}

void hybd_dev_fill_info(struct hybd_dev *dev, struct hybd_dev_info *info)
{
	struct gendisk *disk;

	spin_lock(&dev->state_lock);
	info->state = dev->state;
	/* the pid as the caller's namespace sees it (0 if it cannot) */
	info->server_pid = dev->server_open ? pid_vnr(dev->server_pid) : 0;
	/* the disk users open: the front, if the device has one */
	disk = hybd_dev_bdisk(dev);
	if (disk) {
		info->disk_major = disk->major;
		info->disk_minor = disk->first_minor;
	}
	info->recoveries = dev->recoveries;
	info->no_server_ns = dev->no_server_ns;
	if (dev->state == HYBD_STATE_WAITING) {
		long left = (long)(dev->recovery_deadline - jiffies);

		info->no_server_ns += ktime_get_ns() - dev->waiting_since;
		info->recovery_left_ms = left > 0 ? jiffies_to_msecs(left) : 0;
	}
	spin_unlock(&dev->state_lock);
	info->params = dev->params;
	info->mem_bytes = (u64)dev->params.basic.nr_hw_queues *
			  dev->queues[0].area_size;	/* the shared areas */
	info->len = sizeof(*info);
	hybd_owner_fill_info(dev, info);
	hybd_bpf_fill_info(dev, info);
	hybd_dev_sum_stats(dev, &info->stats);
}
