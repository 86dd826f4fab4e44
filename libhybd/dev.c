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
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "hybd_internal.h"

/* How long to wait for udev/devtmpfs to create /dev/hybdN-srv. */
#define SRV_OPEN_TRIES		200
#define SRV_OPEN_DELAY_US	10000
/* How often hybd_dev_stop() kicks a worker that has not exited yet. */
#define STOP_KICK_NS		50000000L
/* HYBD_CFG_ATTACH: how long the old server has to hand the device over */
#define ATTACH_WAIT_MS		60000
#define ATTACH_DELAY_US		10000

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

/*
 * HYBD_CFG_ATTACH: make device dev->id free for us.  A live device's server
 * is asked to hand over; then the node opens once it has closed it.
 */
static int srv_attach(struct hybd_dev *dev, const struct hybd_config *cfg,
		      const struct hybd_driver *drv)
{
	struct hybd_config c = *cfg;
	struct hybd_dev_info di;
	char path[64];
	unsigned int waited = 0;
	int ret, fd;

	if (!(dev->features & HYBD_F_RECOVERY))
		return hybd__err(-EOPNOTSUPP,
				 "the hybd module cannot hand a device to a new server (HYBD_F_RECOVERY): update it");
	ret = hybd_ctl_info(dev->id, &di);
	if (ret)
		return ret;
	/* refuse before a live server is asked to leave */
	if (cfg->size && cfg->size != di.params.basic.dev_size)
		return hybd__err(-EINVAL,
				 "%s has %llu bytes, the driver's config says %llu",
				 dev->path,
				 (unsigned long long)di.params.basic.dev_size,
				 (unsigned long long)cfg->size);
	c.ops = di.params.basic.ops;
	ret = check_handlers(&c, drv);
	if (ret)
		return ret;
	switch (di.state) {
	case HYBD_STATE_WAITING:
		break;
	case HYBD_STATE_LIVE:
		ret = hybd_ctl_handover(dev->id);
		if (ret)
			return ret;
		break;
	case HYBD_STATE_ADDED:
		return hybd__err(-EBUSY, "%s is not started yet: its server (pid %d) is still setting it up",
				 dev->path, di.server_pid);
	default:
		return hybd__err(-ENODEV, "%s is dead or being deleted: there is nothing to take over",
				 dev->path);
	}

	snprintf(path, sizeof(path), HYBD_DEV_DIR HYBD_SRV_NAME_FMT, dev->id);
	for (;;) {
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd >= 0)
			break;
		if (errno != EBUSY)
			return hybd__err(-errno, "cannot open %s", path);
		if (waited >= ATTACH_WAIT_MS * 1000U)
			return hybd__err(-EBUSY, "the server of %s (pid %d) did not hand it over within %u s",
					 dev->path, di.server_pid,
					 ATTACH_WAIT_MS / 1000);
		usleep(ATTACH_DELAY_US);
		waited += ATTACH_DELAY_US;
	}
	dev->srv_fd = fd;
	dev->attached = true;
	return 0;
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

/*
 * dev->cfg: what the driver asked for, with what the kernel made of it
 * (defaults resolved; an attached device's own parameters).
 */
static void set_config(struct hybd_dev *dev, const struct hybd_config *cfg,
		       const struct hybd_srv_info *info)
{
	const struct hybd_param_basic *b = &info->params.basic;
	const struct hybd_param_discard *d = &info->params.discard;
	struct hybd_config *c = &dev->cfg;

	*c = *cfg;
	/* the device's own: a device taken over may have been resized */
	dev->size = b->dev_size;
	dev->committed = dev->size;
	c->size = dev->size;
	c->dev_id = dev->id;
	c->logical_block_size = b->logical_bs;
	c->physical_block_size = b->physical_bs;
	c->max_io_bytes = info->max_io_bytes;
	c->nr_queues = info->nr_hw_queues;
	c->queue_depth = info->queue_depth;
	c->ops = b->ops;
	c->flags = b->flags;
	c->poll_ns = b->poll_ns;
	c->io_timeout = b->io_timeout;
	c->recovery_timeout = b->recovery_timeout;
	c->max_discard_bytes = d->max_discard_bytes;
	c->discard_granularity = d->discard_granularity;
	c->max_write_zeroes_bytes = d->max_write_zeroes_bytes;
	c->queue_threads = dev->queue_threads;
}

/* The size the driver serves, for hybd_dev_config() readers anywhere. */
static void set_size(struct hybd_dev *dev, uint64_t size)
{
	__atomic_store_n(&dev->size, size, __ATOMIC_RELEASE);
	__atomic_store_n(&dev->cfg.size, size, __ATOMIC_RELEASE);
}

static int srv_resize(struct hybd_dev *dev, struct hybd_srv_resize *r)
{
	int ret;

	r->len = sizeof(*r);
	do {
		ret = ioctl(dev->srv_fd, HYBD_SRV_RESIZE, r);
	} while (ret < 0 && errno == EINTR);
	return ret < 0 ? -errno : 0;
}

/* Serve the committed size, or an accepted grow's.  Under resize_lock. */
static void serve_size(struct hybd_dev *dev)
{
	uint64_t c = dev->committed;

	set_size(dev, dev->grow_pending > c ? dev->grow_pending : c);
}

/*
 * Under resize_lock: has the kernel committed a new size (queue 0's
 * dev_size, published last)?  Then serve it, and tell the driver: after
 * a shrink nothing beyond the new end is in flight or can come.  Every
 * change passes here before the next is asked or made (the workers check
 * before they answer, hybd_dev_resize() holds the lock across its own),
 * so the driver hears of each, in order.
 */
static void reconcile(struct hybd_dev *dev)
{
	struct hybd_ring_hdr *hdr = dev->queues[0].hdr;
	uint64_t size, old;

	if (!dev->has_dev_size)
		return;
	size = hybd_load_acquire(&hdr->dev_size);
	if (!size || size == dev->committed)
		return;
	old = dev->committed;
	__atomic_store_n(&dev->committed, size, __ATOMIC_RELEASE);
	dev->grow_pending = 0;
	serve_size(dev);
	if (dev->drv.resized)
		dev->drv.resized(dev, old, size);
}

/*
 * Queue 0's worker, at every turn.  Never waits for the lock: its holder
 * may be a hybd_dev_resize() whose shrink waits for this worker's
 * requests, and reconciles itself before letting go.
 */
void hybd__resize_check(struct hybd_dev *dev, struct hybd_ring_hdr *hdr)
{
	if (!dev->has_dev_size ||
	    hybd_load_acquire(&hdr->dev_size) ==
	    __atomic_load_n(&dev->committed, __ATOMIC_ACQUIRE))
		return;
	if (pthread_mutex_trylock(&dev->resize_lock))
		return;
	reconcile(dev);
	pthread_mutex_unlock(&dev->resize_lock);
}

/*
 * Queue 0's worker, HYBD_RING_RESIZE: ask the driver, tell the kernel.
 * The flag stays up until the kernel has the answer: answer each request
 * once.  Whether the resize happened, reconcile() learns later.  Waiting
 * for the lock is safe here: while the kernel asks, no hybd_dev_resize()
 * can be in its ioctl (-EBUSY at once).
 */
void hybd__resize_answer(struct hybd_dev *dev, struct hybd_ring_hdr *hdr)
{
	struct hybd_srv_resize r = { .flags = HYBD_SRV_RESIZE_F_ANSWER };
	uint32_t gen = hybd_load_acquire(&hdr->resize_gen);
	uint64_t size = hybd_read_once(&hdr->resize_size);

	if (gen == dev->resize_gen)
		return;
	pthread_mutex_lock(&dev->resize_lock);
	/* what was committed before this question, heard of first */
	reconcile(dev);
	dev->resize_gen = gen;
	r.gen = gen;
	if (!dev->drv.resize)
		r.result = -EOPNOTSUPP;
	else
		r.result = dev->drv.resize(dev, size);
	if (r.result > 0 || r.result < -4095)
		r.result = -EINVAL;
	/*
	 * A grow is served before the answer: once the kernel has it,
	 * requests beyond the old end may reach the other workers at once.
	 * A shrink changes nothing until the kernel says it happened.
	 */
	if (!r.result && size > dev->committed) {
		dev->grow_pending = size;
		serve_size(dev);
	}
	/* -ESTALE: the kernel gave up waiting and changed nothing */
	if (srv_resize(dev, &r) && !r.result) {
		dev->grow_pending = 0;
		serve_size(dev);
	}
	pthread_mutex_unlock(&dev->resize_lock);
}

int hybd_dev_resize(struct hybd_dev *dev, uint64_t size)
{
	struct hybd_srv_resize r = { .size = size };
	int ret;

	if (!dev)
		return hybd__err(-EINVAL, "hybd_dev_resize: no device");
	if (!(dev->features & HYBD_F_RESIZE))
		return hybd__err(-EOPNOTSUPP,
				 "the hybd module cannot resize devices (no HYBD_F_RESIZE): update it");
	if (size < hybd_dev_size(dev) && hybd__on_worker())
		return hybd__err(-EDEADLK,
				 "%s: a shrink waits for the requests in flight, which a worker may hold: shrink from another thread",
				 dev->path);
	pthread_mutex_lock(&dev->resize_lock);
	reconcile(dev);
	/* a grow is served from the moment the kernel has it */
	if (size > dev->committed) {
		dev->grow_pending = size;
		serve_size(dev);
	}
	ret = srv_resize(dev, &r);
	if (ret) {
		dev->grow_pending = 0;
		serve_size(dev);
	} else if (!dev->has_dev_size) {
		__atomic_store_n(&dev->committed, size, __ATOMIC_RELEASE);
		dev->grow_pending = 0;
		serve_size(dev);
	} else {
		/* published before the ioctl returned: the driver hears now */
		reconcile(dev);
	}
	pthread_mutex_unlock(&dev->resize_lock);
	return ret ? hybd__resize_err(ret, dev->id, size) : 0;
}

uint64_t hybd_dev_size(const struct hybd_dev *dev)
{
	return __atomic_load_n(&dev->size, __ATOMIC_ACQUIRE);
}

const struct hybd_config *hybd_dev_config(const struct hybd_dev *dev)
{
	return &dev->cfg;
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
	pthread_mutex_destroy(&dev->resize_lock);
	free(dev);
}

/*
 * Copy what the caller knows of a struct that may grow (@size bytes of it)
 * into @dst (@known bytes, the library's idea of it), zero-filled.  Bytes
 * of a newer caller beyond what we know must be zero: a field we would
 * ignore is an error (-E2BIG).
 */
static int copy_grown(void *dst, size_t known, const void *src, size_t size,
		      size_t min, const char *what)
{
	const unsigned char *p = src;
	size_t i;

	if (size < min)
		return hybd__err(-EINVAL, "%s of %zu bytes: too small (%zu at least)",
				 what, size, min);
	for (i = known; i < size; i++) {
		if (p[i])
			return hybd__err(-E2BIG,
					 "%s sets fields this libhybd (%u.%u) does not know",
					 what, HYBD_LIB_VERSION_MAJOR,
					 HYBD_LIB_VERSION_MINOR);
	}
	memset(dst, 0, known);
	memcpy(dst, src, size < known ? size : known);
	return 0;
}

int hybd_dev_create_sized(const struct hybd_config *cfg_in, size_t cfg_size,
			  const struct hybd_driver *drv_in, size_t drv_size,
			  void *priv, struct hybd_dev **devp)
{
	struct hybd_ctl_features feat = { .len = sizeof(feat) };
	struct hybd_params params;
	struct hybd_srv_info info;
	struct hybd_driver drv;
	struct hybd_config cfg;
	struct hybd_dev *dev;
	char msg[HYBD_ERRMSG_MAX];
	int ret;

	if (!cfg_in || !drv_in || !devp)
		return hybd__err(-EINVAL,
				 "hybd_dev_create: cfg, drv and devp are mandatory");
	ret = copy_grown(&cfg, sizeof(cfg), cfg_in, cfg_size, sizeof(cfg),
			 "struct hybd_config");
	if (!ret)
		ret = copy_grown(&drv, sizeof(drv), drv_in, drv_size,
				 HYBD_DRIVER_SIZE_1_0, "struct hybd_driver");
	if (!ret)
		ret = hybd__resolve_ops(&cfg, hybd__driver_ops(&drv));
	if (!ret && !(cfg.lib_flags & HYBD_CFG_ATTACH))
		ret = check_handlers(&cfg, &drv);
	if (ret)
		return ret;
	if (cfg.lib_flags & HYBD_CFG_ATTACH && cfg.dev_id < 0)
		return hybd__err(-EINVAL,
				 "HYBD_CFG_ATTACH: dev_id must name the device to take over");
	if (cfg.io_priv_size > HYBD_MAX_IO_PRIV)
		return hybd__err(-EINVAL, "io_priv_size %u: at most %u bytes",
				 cfg.io_priv_size, HYBD_MAX_IO_PRIV);
	if (cfg.queue_threads > HYBD_MAX_QUEUE_THREADS)
		return hybd__err(-EINVAL, "queue_threads %u: at most %u",
				 cfg.queue_threads, HYBD_MAX_QUEUE_THREADS);
	/* checked here, before the module is looked for; added as made */
	ret = hybd__config_to_params(&cfg, &params);
	if (!ret)
		ret = hybd_ctl_features(&feat);
	if (ret)
		return ret;
	/* the kernel may ask a driver that can answer */
	if (drv.resize && (feat.features & HYBD_F_RESIZE))
		params.basic.flags |= HYBD_DEV_F_RESIZE;
	if (cfg.recovery_timeout && !(feat.features & HYBD_F_RECOVERY))
		return hybd__err(-EOPNOTSUPP,
				 "the hybd module has no recovery mode (HYBD_F_RECOVERY): update it, or set no recovery timeout");

	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return hybd__err(-ENOMEM, "no memory for the device");
	dev->srv_fd = -1;
	dev->size = cfg.size;
	dev->lib_flags = cfg.lib_flags;
	dev->io_priv_size = (cfg.io_priv_size + 63) & ~63U;
	/* more threads than requests in flight would only wait */
	dev->queue_threads = cfg.queue_threads < cfg.queue_depth ?
			     cfg.queue_threads : cfg.queue_depth;
	dev->features = feat.features;
	dev->drv = drv;
	dev->priv = priv;
	pthread_mutex_init(&dev->lock, NULL);
	pthread_mutex_init(&dev->resize_lock, NULL);
	pthread_cond_init(&dev->cond, NULL);

	if (cfg.lib_flags & HYBD_CFG_ATTACH) {
		dev->id = cfg.dev_id;
		snprintf(dev->path, sizeof(dev->path),
			 HYBD_DEV_DIR HYBD_DISK_NAME_FMT, dev->id);
		ret = srv_attach(dev, &cfg, &drv);
		if (!ret)
			ret = srv_get_info(dev, &info);
		if (!ret) {
			set_config(dev, &cfg, &info);
			ret = map_queues(dev, &info);
		}
		if (ret) {
			/* the device waits on for another server */
			dev_free(dev);
			return ret;
		}
		*devp = dev;
		return 0;
	}

	ret = hybd__ctl_add_params(&params, cfg.dev_id, &dev->id);
	if (ret)
		goto out_free;
	snprintf(dev->path, sizeof(dev->path), HYBD_DEV_DIR HYBD_DISK_NAME_FMT,
		 dev->id);

	ret = srv_open(dev);
	if (!ret)
		ret = srv_get_info(dev, &info);
	if (!ret) {
		set_config(dev, &cfg, &info);
		ret = map_queues(dev, &info);
	}
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

/* The entry point of binaries built against libhybd 1.0 to 1.2. */
int (hybd_dev_create)(const struct hybd_config *cfg,
		      const struct hybd_driver *drv, void *priv,
		      struct hybd_dev **devp)
{
	return hybd_dev_create_sized(cfg, sizeof(*cfg), drv,
				     HYBD_DRIVER_SIZE_1_0, priv, devp);
}

int hybd_queue_cpus(const struct hybd_dev *dev, unsigned int index,
		    unsigned int *cpus, unsigned int room)
{
	struct hybd_srv_queue_cpus qc = { .len = sizeof(qc), .queue = index };
	unsigned char *mask = NULL;
	unsigned int cpu, n = 0;
	int ret;

	if (!(dev->features & HYBD_F_QUEUE_CPUS))
		return hybd__err(-EOPNOTSUPP,
				 "the hybd module cannot tell a queue's CPUs (HYBD_F_QUEUE_CPUS)");
	if (index >= dev->nr_queues)
		return hybd__err(-EINVAL, "%s has no queue %u", dev->path, index);
	/* the first call learns the size of the bitmap */
	for (;;) {
		qc.mask = (uintptr_t)mask;
		if (!ioctl(dev->srv_fd, HYBD_SRV_QUEUE_CPUS, &qc))
			break;
		ret = -errno;
		if (ret != -ENOSPC || mask) {
			free(mask);
			return hybd__err(ret, "HYBD_SRV_QUEUE_CPUS for %s failed",
					 dev->path);
		}
		qc.mask_bytes = (qc.nr_cpus + 7) / 8;
		mask = calloc(1, qc.mask_bytes);
		if (!mask)
			return hybd__err(-ENOMEM, "no memory for a CPU mask");
	}
	for (cpu = 0; cpu < qc.nr_cpus && mask; cpu++) {
		if (!(mask[cpu / 8] & (1U << (cpu % 8))))
			continue;
		if (n < room)
			cpus[n] = cpu;
		n++;
	}
	free(mask);
	return n;
}

struct hybd_queue *hybd_dev_queue(struct hybd_dev *dev, unsigned int index)
{
	return index < dev->nr_queues ? &dev->queues[index] : NULL;
}

unsigned int hybd_dev_nr_queues(const struct hybd_dev *dev)
{
	return dev->nr_queues;
}

unsigned int hybd_lib_version(void)
{
	return HYBD_LIB_VERSION(HYBD_LIB_VERSION_MAJOR, HYBD_LIB_VERSION_MINOR);
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

/*
 * Where the worker of queue @i runs.  blk-mq sends a queue the requests
 * submitted on its CPUs; a worker that shares one of those CPUs with the
 * submitter takes turns with it (each wakeup preempts the submitter), so
 * that one busy submitter gets a fraction of one CPU's worth of I/O while
 * the others idle.  The worker therefore runs *beside* its submitters: on
 * the CPUs (this process may use) that blk-mq maps to other queues, where
 * the scheduler picks an idle one.  A single queue, or a process confined
 * to its queue's CPUs, has nowhere beside: the worker then may run on any
 * CPU the process may.  HYBD_CFG_QUEUE_AFFINITY keeps the placement before
 * 1.8: on the queue's own CPUs (else one CPU, round-robin).
 *
 * @own gets the queue's CPUs that the process may use (empty if the
 * module does not say).  Returns false when the worker alone is best left
 * unpinned (place_worker() pins one with a pool all the same).
 */
static bool worker_cpus(struct hybd_dev *dev, unsigned int i,
			const cpu_set_t *allowed, cpu_set_t *set,
			cpu_set_t *own)
{
	unsigned int cpus[CPU_SETSIZE];
	int n, k;

	CPU_ZERO(own);
	n = dev->features & HYBD_F_QUEUE_CPUS ?
	    hybd_queue_cpus(dev, i, cpus, CPU_SETSIZE) : 0;
	for (k = 0; k < n && k < CPU_SETSIZE; k++) {
		if (cpus[k] < CPU_SETSIZE && CPU_ISSET(cpus[k], allowed))
			CPU_SET(cpus[k], own);
	}
	if (dev->lib_flags & HYBD_CFG_QUEUE_AFFINITY) {
		*set = *own;
		if (!CPU_COUNT(set))
			CPU_SET(nth_cpu(allowed, i), set);
		return true;
	}
	if (n <= 0)
		return false;	/* an old module: where does it submit? */
	CPU_XOR(set, allowed, own);	/* own is a subset of allowed */
	return CPU_COUNT(set) > 0;
}

/*
 * The one CPU where a worker runs with its pool, out of @wide, where the
 * worker alone could run (see hybd_dev_start()): the first beside its
 * queue's own CPUs @own that no other queue took (@taken), counting up
 * from them and going round; else the first beside them; with nothing
 * beside, the @nth counting down from the last of @wide, untaken if any.
 * @wide is not empty.
 */
static int worker_home(const cpu_set_t *wide, const cpu_set_t *own,
		       const cpu_set_t *taken, unsigned int nth)
{
	int cpu, k, pass, last = -1, count = CPU_COUNT(wide);

	for (cpu = 0; cpu < CPU_SETSIZE; cpu++)
		if (CPU_ISSET(cpu, own))
			last = cpu;
	for (pass = 0; pass < 2; pass++) {
		for (k = 1; k <= CPU_SETSIZE; k++) {
			cpu = (last + k) % CPU_SETSIZE;
			if (CPU_ISSET(cpu, wide) && !CPU_ISSET(cpu, own) &&
			    (pass || !CPU_ISSET(cpu, taken)))
				return cpu;
		}
	}
	for (k = 0; k < count; k++) {
		cpu = nth_cpu(wide, count - 1 - (nth + k) % count);
		if (!CPU_ISSET(cpu, taken))
			return cpu;
	}
	return nth_cpu(wide, count - 1 - nth % count);
}

/*
 * Set @attr's CPUs for the worker of queue @i, which its pool's threads
 * inherit.  A worker with a pool runs on one CPU of those its placement
 * allows (worker_home()), which is added to @taken.
 *
 * Why one CPU: the worker hands each request to a pool thread.  Free to
 * run elsewhere, that thread wakes on an idle CPU (the worker's is busy
 * handing over): an idle CPU's wakeup per request, which cost more than
 * the handler itself with data in memory (a one-queue dedup had 2.6x the
 * kernel loop's read latency under TCG with the pool spread, 1.2x on one
 * CPU).  On the worker's CPU a handover is a switch between two threads.
 */
static void place_worker(struct hybd_dev *dev, unsigned int i,
			 const cpu_set_t *allowed, cpu_set_t *taken,
			 pthread_attr_t *attr)
{
	cpu_set_t set, own;
	bool pinned = worker_cpus(dev, i, allowed, &set, &own);
	int home;

	if (dev->queue_threads > 1 &&
	    !(dev->lib_flags & (HYBD_CFG_QUEUE_AFFINITY |
				HYBD_CFG_POOL_SPREAD))) {
		home = worker_home(pinned ? &set : allowed, &own, taken,
				   dev->id + i);
		CPU_ZERO(&set);
		CPU_SET(home, &set);
		CPU_SET(home, taken);
		pinned = true;
	}
	if (pinned)
		pthread_attr_setaffinity_np(attr, sizeof(set), &set);
}

/* Wait until every started worker has run queue_init; its verdict. */
static int wait_queue_inits(struct hybd_dev *dev)
{
	struct hybd_queue *failed = NULL;
	unsigned int i;
	int ret = 0;

	pthread_mutex_lock(&dev->lock);
	for (i = 0; i < dev->nr_queues; i++) {
		struct hybd_queue *q = &dev->queues[i];

		if (!q->has_thread)
			continue;
		while (!q->init_state)
			pthread_cond_wait(&dev->cond, &dev->lock);
		if (q->init_state < 0 && !ret) {
			ret = q->init_state;
			failed = q;
		}
	}
	pthread_mutex_unlock(&dev->lock);
	if (failed)
		hybd__err(ret, "%s", failed->init_msg);
	return ret;
}

static int start_workers(struct hybd_dev *dev)
{
	cpu_set_t allowed, taken;
	pthread_attr_t attr;
	sigset_t all, old;
	unsigned int i;
	int pin, ret = 0;

	pin = !(dev->lib_flags & HYBD_CFG_NO_AFFINITY) &&
	      !sched_getaffinity(0, sizeof(allowed), &allowed) &&
	      CPU_COUNT(&allowed) > 0;
	CPU_ZERO(&taken);

	/* Workers never take signals: they belong to the application. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	hybd_store_release(&dev->stop, 0);
	for (i = 0; i < dev->nr_queues; i++) {
		struct hybd_queue *q = &dev->queues[i];

		pthread_attr_init(&attr);
		if (pin)
			place_worker(dev, i, &allowed, &taken, &attr);
		q->init_state = 0;
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
	if (!ret)
		ret = wait_queue_inits(dev);
	if (ret)
		stop_workers(dev);
	return ret;
}

/*
 * A worker is done: the first error wins, the last one out wakes waiters.
 * -ENODEV is no error: the device was deleted.
 */
void hybd__worker_stopped(struct hybd_queue *q, int err)
{
	struct hybd_dev *dev = q->dev;

	pthread_mutex_lock(&dev->lock);
	if (err == -ENODEV) {
		dev->gone = true;
		err = 0;
	}
	if (err && !dev->worker_err)
		dev->worker_err = err;
	if (!--dev->nr_running)
		pthread_cond_broadcast(&dev->cond);
	pthread_mutex_unlock(&dev->lock);
}

/*
 * HYBD_CFG_ATTACH: the kernel rewinds the rings and issues again what the
 * old server left; the workers start only then, from the rewound indices.
 */
static int resume(struct hybd_dev *dev)
{
	unsigned int i;
	int ret;

	do {
		ret = ioctl(dev->srv_fd, HYBD_SRV_START, 0);
	} while (ret < 0 && errno == EINTR);
	if (ret < 0)
		return hybd__err(-errno, "cannot resume %s (HYBD_SRV_START)",
				 dev->path);
	for (i = 0; i < dev->nr_queues; i++) {
		struct hybd_queue *q = &dev->queues[i];

		q->sq_head = hybd_load_acquire(&q->hdr->sq_head);
		q->cq_tail = hybd_load_acquire(&q->hdr->cq_tail);
	}
	/* if this fails, closing the node leaves the device waiting again */
	ret = start_workers(dev);
	if (ret)
		return ret;
	pthread_mutex_lock(&dev->lock);
	dev->started = true;
	pthread_mutex_unlock(&dev->lock);
	return 0;
}

int hybd_dev_start(struct hybd_dev *dev)
{
	int ret;

	if (!dev)
		return hybd__err(-EINVAL, "hybd_dev_start: no device");
	if (dev->started)
		return hybd__err(-EALREADY, "%s is already started", dev->path);
	if (dev->attached)
		return resume(dev);

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
	bool gone;
	int ret;

	if (!dev)
		return hybd__err(-EINVAL, "hybd_dev_delete: no device");
	if (hybd_load_acquire(&dev->handed_over)) {
		/* the new server has it: let go, delete nothing */
		stop_workers(dev);
		dev_free(dev);
		return 0;
	}
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

	/*
	 * Nobody serves: closing fails what is outstanding, then delete,
	 * unless a worker saw the device deleted already: its id may be
	 * another device's by now.
	 */
	stop_workers(dev);
	pthread_mutex_lock(&dev->lock);
	gone = dev->gone;
	pthread_mutex_unlock(&dev->lock);
	dev_release(dev);
	ret = gone ? 0 : hybd_ctl_del(dev->id);
	if (ret == -ENODEV || ret == -ENOENT)
		ret = 0;
	dev_free(dev);
	return ret;
}

int hybd_dev_add_backing(struct hybd_dev *dev, int fd, unsigned int flags,
			 uint64_t *size)
{
	struct hybd_srv_backing b = { .len = sizeof(b), .fd = fd,
				      .flags = flags };

	if (!(dev->features & HYBD_F_BACKING))
		return hybd__err(-EOPNOTSUPP,
				 "the hybd module takes no backing targets (HYBD_F_BACKING): update it");
	if (ioctl(dev->srv_fd, HYBD_SRV_ADD_BACKING, &b) < 0) {
		int err = -errno;

		switch (err) {
		case -EBADF:
			return hybd__err(err, "fd %d is not open, or not for %s",
					 fd, flags & HYBD_BACKING_F_WRITE ?
					 "reading and writing" : "reading");
		case -EOPNOTSUPP:
			return hybd__err(err, "fd %d: no direct I/O there (or unknown flags 0x%x)",
					 fd, flags);
		case -ENOSPC:
			return hybd__err(err, "%s has %u backing targets already",
					 dev->path, HYBD_MAX_BACKINGS);
		case -EINVAL:
			return hybd__err(err, "fd %d: not a regular file or block device, an empty block device, open with O_APPEND for writing, or its direct I/O alignment does not divide the block size of %s",
					 fd, dev->path);
		case -EPERM:
			return hybd__err(err, "fd %d: an append-only file (chattr +a): remapped writes go anywhere in it",
					 fd);
		case -ELOOP:
			return hybd__err(err, "fd %d is %s itself, or on it, or on a device built on it: its I/O could come back to it",
					 fd, dev->path);
		default:
			return hybd__err(err, "HYBD_SRV_ADD_BACKING for %s failed",
					 dev->path);
		}
	}
	if (size)
		*size = b.size;
	return b.index;
}

int hybd_dev_del_backing(struct hybd_dev *dev, unsigned int index)
{
	if (ioctl(dev->srv_fd, HYBD_SRV_DEL_BACKING, (unsigned long)index) < 0)
		return hybd__err(-errno, "%s has no backing target %u",
				 dev->path, index);
	return 0;
}

int hybd_dev_remap_barrier(struct hybd_dev *dev)
{
	if (ioctl(dev->srv_fd, HYBD_SRV_REMAP_BARRIER, 0UL) < 0)
		return hybd__err(-errno, "HYBD_SRV_REMAP_BARRIER on %s failed",
				 dev->path);
	return 0;
}

int hybd_dev_serving(struct hybd_dev *dev)
{
	int n;

	pthread_mutex_lock(&dev->lock);
	n = dev->nr_running;
	pthread_mutex_unlock(&dev->lock);
	return n > 0;
}

int hybd_dev_handed_over(const struct hybd_dev *dev)
{
	return hybd_load_acquire(&dev->handed_over);
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

/*
 * hybd_run(): tell a supervisor that the device is up.  systemd's
 * Type=notify protocol: a datagram "READY=1" to the unix socket named by
 * $NOTIFY_SOCKET ('@' for the abstract namespace).  Best effort.
 */
static void notify_ready(void)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t len;
	int fd;

	if (!path || (path[0] != '/' && path[0] != '@'))
		return;
	len = strlen(path);
	if (len >= sizeof(sa.sun_path))
		return;
	memcpy(sa.sun_path, path, len);
	if (sa.sun_path[0] == '@')
		sa.sun_path[0] = '\0';
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	sendto(fd, "READY=1", 7, MSG_NOSIGNAL, (struct sockaddr *)&sa,
	       offsetof(struct sockaddr_un, sun_path) + len);
	close(fd);
}

struct run_waiter {
	struct hybd_dev	*dev;
	int		efd;
	int		ret;
	char		msg[HYBD_ERRMSG_MAX];
};

/* hybd_run()'s second thread: wait for the workers, then say so. */
static void *run_wait(void *arg)
{
	struct run_waiter *w = arg;
	uint64_t one = 1;

	w->ret = hybd_dev_wait(w->dev);
	if (w->ret)
		snprintf(w->msg, sizeof(w->msg), "%s", hybd_errmsg());
	(void)!write(w->efd, &one, sizeof(one));
	return NULL;
}

int hybd_run_sized(const struct hybd_config *cfg, size_t cfg_size,
		   const struct hybd_driver *drv, size_t drv_size, void *priv)
{
	struct run_waiter w = { .efd = -1 };
	struct pollfd pfd[2];
	sigset_t stop, old;
	struct hybd_dev *dev;
	pthread_t thread;
	int sfd, ret;

	sigemptyset(&stop);
	sigaddset(&stop, SIGINT);
	sigaddset(&stop, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &stop, &old);
	sfd = signalfd(-1, &stop, SFD_CLOEXEC | SFD_NONBLOCK);
	w.efd = eventfd(0, EFD_CLOEXEC);
	if (sfd < 0 || w.efd < 0) {
		ret = hybd__err(-errno, "hybd_run: no signalfd or eventfd");
		goto out;
	}

	ret = hybd_dev_create_sized(cfg, cfg_size, drv, drv_size, priv, &dev);
	if (ret)
		goto out;
	if (dev->drv.prepare) {
		ret = dev->drv.prepare(dev);
		if (ret > 0)
			ret = -EINVAL;
		if (ret)
			hybd__err(ret, "the driver's prepare hook failed: %s",
				  strerror(-ret));
	}
	if (!ret)
		ret = hybd_dev_start(dev);
	if (ret) {
		char msg[HYBD_ERRMSG_MAX];

		snprintf(msg, sizeof(msg), "%s", hybd_errmsg());
		hybd_dev_delete(dev);
		hybd__err(ret, "%s", msg);
		goto out;
	}
	w.dev = dev;
	ret = pthread_create(&thread, NULL, run_wait, &w);
	if (ret) {
		hybd_dev_delete(dev);
		ret = hybd__err(-ret, "hybd_run: cannot start a thread");
		goto out;
	}
	if (drv_size > offsetof(struct hybd_driver, ready) && drv->ready)
		drv->ready(dev);
	notify_ready();

	pfd[0].fd = sfd;
	pfd[0].events = POLLIN;
	pfd[1].fd = w.efd;
	pfd[1].events = POLLIN;
	for (;;) {
		if (poll(pfd, 2, -1) < 0 && errno != EINTR)
			break;
		if (pfd[1].revents)
			break;		/* the workers are gone */
		if (pfd[0].revents) {
			struct signalfd_siginfo si;

			(void)!read(sfd, &si, sizeof(si));
			/*
			 * Graceful: the kernel writes back what it holds
			 * through the workers, which then exit.  If it
			 * refuses, keep serving: stopping now would fail
			 * that data.  Another signal tries again.
			 */
			hybd_ctl_del(dev->id);
		}
	}
	hybd_dev_stop(dev);
	pthread_join(thread, NULL);
	hybd_dev_delete(dev);
	ret = w.ret;
	if (ret)
		hybd__err(ret, "%s", w.msg);
out:
	if (sfd >= 0)
		close(sfd);
	if (w.efd >= 0)
		close(w.efd);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return ret;
}
