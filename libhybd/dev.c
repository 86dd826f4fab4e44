// SPDX-License-Identifier: MIT
/*
 * A device served by this process: create, start, stop, wait, delete.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "hybd_internal.h"

/* How long to wait for udev/devtmpfs to create /dev/hybdN-srv. */
#define SRV_OPEN_TRIES		200
#define SRV_OPEN_DELAY_US	10000
/* How often hybd_dev_stop() kicks a worker that has not exited yet. */
#define STOP_KICK_NS		50000000L

/* Refuse ops the driver has no handler for: better now than per request. */
static int check_handlers(const struct hybd_config *cfg,
			  const struct hybd_driver *drv)
{
	const struct {
		uint32_t opf;
		bool have;
		const char *handler;
	} need[] = {
		{ HYBD_OPF_READ, drv->read, "read" },
		{ HYBD_OPF_WRITE, drv->write, "write" },
		{ HYBD_OPF_FUA, drv->write, "write" },
		{ HYBD_OPF_FLUSH, drv->flush, "flush" },
		{ HYBD_OPF_DISCARD, drv->discard, "discard" },
		{ HYBD_OPF_WRITE_ZEROES, drv->write_zeroes, "write_zeroes" },
	};
	unsigned int i;

	for (i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
		if ((cfg->ops & need[i].opf) && !need[i].have)
			return hybd__err(-EINVAL,
					 "operation %s is enabled but the driver has no %s handler",
					 hybd_opf_name(need[i].opf),
					 need[i].handler);
	}
	return 0;
}

static int srv_open(struct hybd_dev *dev)
{
	char path[64];
	int tries, fd;

	snprintf(path, sizeof(path), HYBD_DEV_DIR HYBD_SRV_NAME_FMT, dev->id);
	for (tries = 0;; tries++) {
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd >= 0)
			break;
		if (errno != ENOENT || tries == SRV_OPEN_TRIES)
			break;
		usleep(SRV_OPEN_DELAY_US);	/* udev may still be at work */
	}
	if (fd >= 0) {
		dev->srv_fd = fd;
		return 0;
	}
	switch (errno) {
	case ENOENT:
		return hybd__err(-ENOENT, "%s did not appear", path);
	case EBUSY:
		return hybd__err(-EBUSY, "%s is already open by another server",
				 path);
	default:
		return hybd__err(-errno, "cannot open %s", path);
	}
}

static int srv_get_info(struct hybd_dev *dev, struct hybd_srv_info *info)
{
	memset(info, 0, sizeof(*info));
	info->len = sizeof(*info);
	info->dev_id = dev->id;
	if (ioctl(dev->srv_fd, HYBD_SRV_GET_INFO, info) < 0)
		return hybd__err(-errno, "HYBD_SRV_GET_INFO for %s failed",
				 dev->path);
	if (!info->nr_hw_queues || info->nr_hw_queues > HYBD_MAX_QUEUES ||
	    !info->queue_map_size || info->queue_stride < info->queue_map_size ||
	    info->queue_stride % sysconf(_SC_PAGESIZE))
		return hybd__err(-EPROTO,
				 "HYBD_SRV_GET_INFO for %s: inconsistent answer (%u queues, stride %llu, map size %llu)",
				 dev->path, info->nr_hw_queues,
				 (unsigned long long)info->queue_stride,
				 (unsigned long long)info->queue_map_size);
	if (info->params.basic.dev_size)
		dev->size = info->params.basic.dev_size;
	return 0;
}

static void unmap_queues(struct hybd_dev *dev)
{
	while (dev->nr_queues) {
		struct hybd_queue *q = &dev->queues[--dev->nr_queues];

		while (__atomic_load_n(&q->completers, __ATOMIC_ACQUIRE))
			sched_yield();
		munmap(q->area, q->area_size);
		hybd__queue_exit(q);
	}
	free(dev->queues);
	dev->queues = NULL;
}

static int map_queues(struct hybd_dev *dev, const struct hybd_srv_info *info)
{
	size_t size = info->queue_map_size;
	unsigned int i;
	void *area;
	int ret;

	dev->queues = aligned_alloc(64, info->nr_hw_queues *
					sizeof(*dev->queues));
	if (!dev->queues)
		return hybd__err(-ENOMEM, "no memory for %u queues",
				 info->nr_hw_queues);
	memset(dev->queues, 0, info->nr_hw_queues * sizeof(*dev->queues));

	for (i = 0; i < info->nr_hw_queues; i++) {
		area = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED,
			    dev->srv_fd, (off_t)(i * info->queue_stride));
		if (area == MAP_FAILED) {
			ret = hybd__err(-errno, "cannot map queue %u of %s",
					i, dev->path);
			goto fail;
		}
		ret = hybd__queue_init(&dev->queues[i], dev, i, area, size,
				       info);
		if (ret) {
			munmap(area, size);
			goto fail;
		}
		dev->nr_queues++;
	}
	return 0;
fail:
	unmap_queues(dev);
	return ret;
}

/* Unmap and close: the device loses its server (if it had one). */
static void dev_release(struct hybd_dev *dev)
{
	unmap_queues(dev);
	if (dev->srv_fd >= 0)
		close(dev->srv_fd);
	dev->srv_fd = -1;
}

static void dev_free(struct hybd_dev *dev)
{
	dev_release(dev);
	/* Let threads still in hybd_dev_wait() leave before freeing. */
	pthread_mutex_lock(&dev->lock);
	while (dev->nr_waiters)
		pthread_cond_wait(&dev->cond, &dev->lock);
	pthread_mutex_unlock(&dev->lock);
	pthread_cond_destroy(&dev->cond);
	pthread_mutex_destroy(&dev->lock);
	free(dev);
}

int hybd_dev_create(const struct hybd_config *cfg,
		    const struct hybd_driver *drv, void *priv,
		    struct hybd_dev **devp)
{
	struct hybd_srv_info info;
	struct hybd_dev *dev;
	char msg[HYBD_ERRMSG_MAX];
	int ret;

	if (!cfg || !drv || !devp)
		return hybd__err(-EINVAL,
				 "hybd_dev_create: cfg, drv and devp are mandatory");
	ret = check_handlers(cfg, drv);
	if (ret)
		return ret;

	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return hybd__err(-ENOMEM, "no memory for the device");
	dev->srv_fd = -1;
	dev->size = cfg->size;
	dev->lib_flags = cfg->lib_flags;
	dev->drv = *drv;
	dev->priv = priv;
	pthread_mutex_init(&dev->lock, NULL);
	pthread_cond_init(&dev->cond, NULL);

	ret = hybd_ctl_add(cfg, &dev->id);
	if (ret)
		goto out_free;
	snprintf(dev->path, sizeof(dev->path), HYBD_DEV_DIR HYBD_DISK_NAME_FMT,
		 dev->id);

	ret = srv_open(dev);
	if (!ret)
		ret = srv_get_info(dev, &info);
	if (!ret)
		ret = map_queues(dev, &info);
	if (ret)
		goto out_del;
	*devp = dev;
	return 0;

out_del:
	snprintf(msg, sizeof(msg), "%s", hybd_errmsg());
	dev_release(dev);
	hybd__ctl_del(dev->id);
	hybd__err(ret, "%s", msg);
out_free:
	dev_free(dev);
	return ret;
}

/* The @n-th CPU (modulo their number) of @set. */
static int nth_cpu(const cpu_set_t *set, unsigned int n)
{
	int cpu, count = CPU_COUNT(set);

	n %= count;
	for (cpu = 0; cpu < CPU_SETSIZE; cpu++) {
		if (CPU_ISSET(cpu, set) && !n--)
			return cpu;
	}
	return 0;
}

/* Tell the workers to stop and join them; kicking until each one exits. */
static void stop_workers(struct hybd_dev *dev)
{
	unsigned int i;

	hybd_store_release(&dev->stop, 1);
	for (i = 0; i < dev->nr_queues; i++) {
		struct hybd_queue *q = &dev->queues[i];
		struct timespec ts;

		if (!q->has_thread)
			continue;
		for (;;) {
			ioctl(dev->srv_fd, HYBD_SRV_KICK, (unsigned long)q->id);
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += STOP_KICK_NS;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			if (pthread_timedjoin_np(q->thread, NULL, &ts) != ETIMEDOUT)
				break;
		}
		q->has_thread = false;
	}
}

static int start_workers(struct hybd_dev *dev)
{
	cpu_set_t allowed, one;
	pthread_attr_t attr;
	sigset_t all, old;
	unsigned int i;
	int pin, ret = 0;

	pin = !(dev->lib_flags & HYBD_CFG_NO_AFFINITY) &&
	      !sched_getaffinity(0, sizeof(allowed), &allowed) &&
	      CPU_COUNT(&allowed) > 0;

	/* Workers never take signals: they belong to the application. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	hybd_store_release(&dev->stop, 0);
	for (i = 0; i < dev->nr_queues; i++) {
		struct hybd_queue *q = &dev->queues[i];

		pthread_attr_init(&attr);
		if (pin) {
			CPU_ZERO(&one);
			CPU_SET(nth_cpu(&allowed, i), &one);
			pthread_attr_setaffinity_np(&attr, sizeof(one), &one);
		}
		pthread_mutex_lock(&dev->lock);
		dev->nr_running++;
		pthread_mutex_unlock(&dev->lock);
		ret = pthread_create(&q->thread, &attr, hybd__worker, q);
		pthread_attr_destroy(&attr);
		if (ret) {
			pthread_mutex_lock(&dev->lock);
			dev->nr_running--;
			pthread_mutex_unlock(&dev->lock);
			ret = hybd__err(-ret, "cannot start the worker of queue %u",
					i);
			break;
		}
		q->has_thread = true;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret)
		stop_workers(dev);
	return ret;
}

int hybd_dev_start(struct hybd_dev *dev)
{
	int ret;

	if (!dev)
		return hybd__err(-EINVAL, "hybd_dev_start: no device");
	if (dev->started)
		return hybd__err(-EALREADY, "%s is already started", dev->path);

	ret = start_workers(dev);
	if (ret)
		return ret;
	do {
		ret = ioctl(dev->srv_fd, HYBD_SRV_START, 0);
	} while (ret < 0 && errno == EINTR);
	if (ret < 0) {
		ret = -errno;
		stop_workers(dev);
		return hybd__err(ret, "cannot start %s (HYBD_SRV_START)",
				 dev->path);
	}
	pthread_mutex_lock(&dev->lock);
	dev->started = true;
	pthread_mutex_unlock(&dev->lock);
	return 0;
}

int hybd_dev_stop(struct hybd_dev *dev)
{
	if (!dev || !dev->started)
		return hybd__err(-EINVAL, "hybd_dev_stop: device not started");
	stop_workers(dev);
	return 0;
}

int hybd_dev_wait(struct hybd_dev *dev)
{
	int ret;

	if (!dev)
		return hybd__err(-EINVAL, "hybd_dev_wait: no device");
	pthread_mutex_lock(&dev->lock);
	if (!dev->started) {
		pthread_mutex_unlock(&dev->lock);
		return hybd__err(-EINVAL, "%s was not started", dev->path);
	}
	dev->nr_waiters++;
	while (dev->nr_running)
		pthread_cond_wait(&dev->cond, &dev->lock);
	ret = dev->worker_err;
	dev->nr_waiters--;
	pthread_cond_broadcast(&dev->cond);
	pthread_mutex_unlock(&dev->lock);
	if (ret)
		return hybd__err(ret, "a worker of %s failed", dev->path);
	return 0;
}

int hybd_dev_delete(struct hybd_dev *dev)
{
	unsigned int running;
	int ret;

	if (!dev)
		return hybd__err(-EINVAL, "hybd_dev_delete: no device");
	pthread_mutex_lock(&dev->lock);
	running = dev->nr_running;
	pthread_mutex_unlock(&dev->lock);

	if (running) {
		/* Graceful: the kernel drains the disk through the workers. */
		ret = hybd_ctl_del(dev->id);
		if (ret && ret != -ENODEV && ret != -ENOENT)
			return ret;
		stop_workers(dev);
		dev_free(dev);
		return 0;
	}

	/* Nobody serves: closing fails what is outstanding, then delete. */
	stop_workers(dev);
	dev_release(dev);
	ret = hybd_ctl_del(dev->id);
	if (ret == -ENODEV || ret == -ENOENT)
		ret = 0;
	dev_free(dev);
	return ret;
}

int hybd_dev_id(const struct hybd_dev *dev)
{
	return dev->id;
}

const char *hybd_dev_path(const struct hybd_dev *dev)
{
	return dev->path;
}

void *hybd_dev_priv(const struct hybd_dev *dev)
{
	return dev->priv;
}
