/*
 * channel.c -- event channels: rdma_create_event_channel, rdma_get_cm_event,
 * rdma_ack_cm_event.
 *
 * librdmacm's channel is the fd of /dev/infiniband/rdma_cm; here all of a process's
 * connections share one libibcm session, so each channel keeps its own queue. Its public
 * `fd` is an epoll fd over two others: an eventfd that is readable while the channel's
 * queue holds events, and libibcm's event fd (readable while the session holds events not
 * yet routed to a channel). poll/select/epoll on `channel->fd` therefore wake when this
 * channel may have an event; rdma_get_cm_event routes the session's events to their
 * channels (rc_pump) and takes this channel's first. O_NONBLOCK set on `channel->fd`
 * (fcntl) makes rdma_get_cm_event fail with EAGAIN instead of waiting, as librdmacm's.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "rdmacm.h"

static struct rc_channel *channels;
static int session_gone;

struct rc_channel *rc_channel_new(int sync_owned)
{
	struct rc_channel *c;
	struct epoll_event ee;
	int sfd;

	if (!rc_session())
		return NULL;
	sfd = rc_session_fd();
	c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	c->ch.fd = epoll_create1(EPOLL_CLOEXEC);
	if (c->efd < 0 || c->ch.fd < 0)
		goto err;
	memset(&ee, 0, sizeof(ee));
	ee.events = EPOLLIN;
	ee.data.fd = c->efd;
	if (epoll_ctl(c->ch.fd, EPOLL_CTL_ADD, c->efd, &ee))
		goto err;
	ee.data.fd = sfd;
	if (sfd >= 0 && epoll_ctl(c->ch.fd, EPOLL_CTL_ADD, sfd, &ee))
		goto err;
	c->sync_owned = sync_owned;
	c->pid = getpid();
	pthread_mutex_lock(&rc_lock);
	c->next = channels;
	channels = c;
	pthread_mutex_unlock(&rc_lock);
	return c;
err:
	{
		int e = errno;

		if (c->efd >= 0)
			close(c->efd);
		if (c->ch.fd >= 0)
			close(c->ch.fd);
		free(c);
		errno = e;
		return NULL;
	}
}

static struct rc_channel *channel_of(struct rdma_event_channel *ch)
{
	struct rc_channel *c;

	for (c = channels; c; c = c->next)
		if (&c->ch == ch)
			return c;
	return NULL;
}

void rc_events_free(struct rc_event *e)
{
	struct rc_event *n;

	for (; e; e = n) {
		n = e->next;
		if (e->listener)
			rc_id_put(e->listener);
		rc_id_put(e->id);
		free(e);
	}
}

void rc_channel_drained(struct rc_channel *c)
{
	uint64_t n;

	if (read(c->efd, &n, sizeof(n)) < 0) {
		/* EAGAIN: already drained */
	}
}

void rc_channel_free(struct rc_channel *c)
{
	struct rc_channel **p;

	pthread_mutex_lock(&rc_lock);
	for (p = &channels; *p; p = &(*p)->next) {
		if (*p == c) {
			*p = c->next;
			break;
		}
	}
	rc_events_free(c->head);
	c->head = c->tail = NULL;
	close(c->ch.fd);
	close(c->efd);
	c->destroyed = 1;
	if (!c->waiters)
		free(c);
	/* else a thread waits in rdma_get_cm_event on it: that thread frees it (below) */
	pthread_mutex_unlock(&rc_lock);
}

/* A thread whose channel was destroyed under its wait: as a read blocked on librdmacm's
 * closed channel file, it never returns (no event can come any more). */
static __attribute__((noreturn)) void wait_for_ever(void)
{
	static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
	static pthread_cond_t never = PTHREAD_COND_INITIALIZER;

	pthread_mutex_lock(&m);
	for (;;)
		pthread_cond_wait(&never, &m);  /* a cancellation point */
}

RC_EXPORT struct rdma_event_channel *rdma_create_event_channel(void)
{
	struct rc_channel *c = rc_channel_new(0);

	return c ? &c->ch : NULL;
}

RC_EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	struct rc_channel *c;

	pthread_mutex_lock(&rc_lock);
	c = channel ? channel_of(channel) : NULL;
	pthread_mutex_unlock(&rc_lock);
	if (c)
		rc_channel_free(c);
}

struct rc_event *rc_event_new(struct rc_id *id, enum rdma_cm_event_type type, int status)
{
	struct rc_event *e = calloc(1, sizeof(*e));

	if (!e)
		return NULL;
	e->ev.id = &id->id;
	e->ev.event = type;
	e->ev.status = status;
	e->id = id;
	id->refs++;
	return e;
}

void rc_event_queue(struct rc_event *e)
{
	struct rc_channel *c = e->id->chan;
	uint64_t one = 1;

	rc_trace("id %p: %s status %d", (void *)e->id, rdma_event_str(e->ev.event), e->ev.status);
	e->next = NULL;
	if (c->tail) {
		c->tail->next = e;  /* the fd is readable already */
	} else {
		c->head = e;
		if (write(c->efd, &one, sizeof(one)) < 0) {
			/* cannot fail: the counter is 0 or 1 */
		}
	}
	c->tail = e;
}

void rc_event_queue_now(struct rc_id *id, enum rdma_cm_event_type type, int status)
{
	struct rc_event *e = rc_event_new(id, type, status);

	if (e)
		rc_event_queue(e);
}

void rc_pump(void)
{
	struct ibcm_ctx *ctx;
	struct ibcm_event *ev;
	int st;

	if (session_gone || rc_forked())
		return;
	ctx = rc_session();
	if (!ctx)
		return;
	for (;;) {
		st = ibcm_get_event(ctx, &ev);
		if (st == IBCM_EAGAIN)
			return;
		if (st != IBCM_OK) {
			/* IBCM_EGONE: the node service is gone and every event was taken */
			session_gone = 1;
			return;
		}
		if (ev->event == IBCM_EVENT_SERVICE_GONE)
			session_gone = 1;
		rc_translate(ev);
	}
}

/* Takes the first event of `c`; waits for one unless `nonblock`. Called with rc_lock held
 * (the channel was found under it); returns with it released. */
int rc_wait_event(struct rc_channel *c, struct rc_event **out, int nonblock)
{
	struct pollfd pfd;
	int ret, err;

	for (;;) {
		rc_pump();
		if (c->head) {
			struct rc_event *e = c->head;

			c->head = e->next;
			if (!c->head) {
				c->tail = NULL;
				rc_channel_drained(c);
			}
			e->next = NULL;
			/* rdma_destroy_id waits until these are acknowledged (as librdmacm's, where a
			 * CONNECT_REQUEST is the listener's event, not the new id's) */
			if (e->listener)
				e->listener->events_out++;
			else
				e->id->events_out++;
			pthread_mutex_unlock(&rc_lock);
			*out = e;
			return 0;
		}
		if (session_gone) {
			pthread_mutex_unlock(&rc_lock);
			return rc_err(ENODEV);
		}
		if (nonblock) {
			pthread_mutex_unlock(&rc_lock);
			return rc_err(EAGAIN);
		}
		pfd.fd = c->ch.fd;
		pfd.events = POLLIN;
		pfd.revents = 0;
		c->waiters++;  /* the channel stays allocated while this thread polls it */
		pthread_mutex_unlock(&rc_lock);
		ret = poll(&pfd, 1, -1);
		err = errno;
		pthread_mutex_lock(&rc_lock);
		c->waiters--;
		if (c->destroyed) {
			/* rdma_destroy_event_channel ran meanwhile (another thread's) */
			if (!c->waiters)
				free(c);
			pthread_mutex_unlock(&rc_lock);
			wait_for_ever();
		}
		if (ret < 0 && err != EINTR) {
			pthread_mutex_unlock(&rc_lock);
			return rc_err(err);
		}
	}
}

RC_EXPORT int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	struct rc_channel *c;
	struct rc_event *e;
	int fl;

	if (!channel || !event)
		return rc_err(EINVAL);
	pthread_mutex_lock(&rc_lock);
	c = channel_of(channel);
	if (!c) {
		pthread_mutex_unlock(&rc_lock);
		return rc_err(EINVAL);  /* not a channel (or one destroyed already) */
	}
	if (c->pid != getpid()) {
		pthread_mutex_unlock(&rc_lock);
		return rc_err(EBADF);  /* a fork child's copy of its parent's channel */
	}
	fl = fcntl(c->ch.fd, F_GETFL);
	if (rc_wait_event(c, &e, fl >= 0 && (fl & O_NONBLOCK)))
		return -1;
	*event = &e->ev;
	return 0;
}

RC_EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	struct rc_event *e = (struct rc_event *)event;

	if (!event)
		return rc_err(EINVAL);
	pthread_mutex_lock(&rc_lock);
	if (e->listener) {
		e->listener->events_out--;
		rc_id_put(e->listener);
	} else {
		e->id->events_out--;
	}
	rc_id_put(e->id);
	pthread_cond_broadcast(&rc_acked);
	pthread_mutex_unlock(&rc_lock);
	free(e);
	return 0;
}

int rc_sync_complete(struct rc_id *r, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;
	int status;

	if (r->id.event) {
		rdma_ack_cm_event(r->id.event);
		r->id.event = NULL;
	}
	if (rdma_get_cm_event(r->id.channel, &ev))
		return -1;
	r->id.event = ev;
	status = ev->status;
	if (ev->event == want && !status)
		return 0;
	if (ev->event == RDMA_CM_EVENT_REJECTED)
		return rc_err(ECONNREFUSED);
	if (status < 0)
		return rc_err(-status);
	if (status > 0)
		return rc_err(status);
	return rc_err(ECONNRESET);
}

static const char *const event_names[] = {
	[RDMA_CM_EVENT_ADDR_RESOLVED] = "RDMA_CM_EVENT_ADDR_RESOLVED",
	[RDMA_CM_EVENT_ADDR_ERROR] = "RDMA_CM_EVENT_ADDR_ERROR",
	[RDMA_CM_EVENT_ROUTE_RESOLVED] = "RDMA_CM_EVENT_ROUTE_RESOLVED",
	[RDMA_CM_EVENT_ROUTE_ERROR] = "RDMA_CM_EVENT_ROUTE_ERROR",
	[RDMA_CM_EVENT_CONNECT_REQUEST] = "RDMA_CM_EVENT_CONNECT_REQUEST",
	[RDMA_CM_EVENT_CONNECT_RESPONSE] = "RDMA_CM_EVENT_CONNECT_RESPONSE",
	[RDMA_CM_EVENT_CONNECT_ERROR] = "RDMA_CM_EVENT_CONNECT_ERROR",
	[RDMA_CM_EVENT_UNREACHABLE] = "RDMA_CM_EVENT_UNREACHABLE",
	[RDMA_CM_EVENT_REJECTED] = "RDMA_CM_EVENT_REJECTED",
	[RDMA_CM_EVENT_ESTABLISHED] = "RDMA_CM_EVENT_ESTABLISHED",
	[RDMA_CM_EVENT_DISCONNECTED] = "RDMA_CM_EVENT_DISCONNECTED",
	[RDMA_CM_EVENT_DEVICE_REMOVAL] = "RDMA_CM_EVENT_DEVICE_REMOVAL",
	[RDMA_CM_EVENT_MULTICAST_JOIN] = "RDMA_CM_EVENT_MULTICAST_JOIN",
	[RDMA_CM_EVENT_MULTICAST_ERROR] = "RDMA_CM_EVENT_MULTICAST_ERROR",
	[RDMA_CM_EVENT_ADDR_CHANGE] = "RDMA_CM_EVENT_ADDR_CHANGE",
	[RDMA_CM_EVENT_TIMEWAIT_EXIT] = "RDMA_CM_EVENT_TIMEWAIT_EXIT",
};

RC_EXPORT const char *rdma_event_str(enum rdma_cm_event_type event)
{
	if ((unsigned)event < sizeof(event_names) / sizeof(event_names[0]) && event_names[event])
		return event_names[event];
	return "UNKNOWN EVENT";
}
