/*
 * id.c -- rdma_cm_id: create, destroy, bind, listen, connect, accept, reject, disconnect,
 * establish, notify, migrate, options.
 *
 * An id's libibcm handle carries the id's key (not its address) as its context, so an
 * event that arrives for an id destroyed meanwhile finds nothing and is dropped. An id is
 * freed once rdma_destroy_id was called and no event, handle or request refers to it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "rdmacm.h"

#define KEY_BUCKETS 4096
#define SIDR_RETRIES 3
static struct rc_id *keys[KEY_BUCKETS];
static uint64_t next_key = 1;

struct rc_id *rc_id_find(uint64_t key)
{
	struct rc_id *r;

	for (r = keys[key % KEY_BUCKETS]; r; r = r->hnext)
		if (r->key == key)
			return r;
	return NULL;
}

int rc_ps_qp_type(enum rdma_port_space ps, enum ibv_qp_type *qpt)
{
	switch (ps) {
	case RDMA_PS_TCP:
	case RDMA_PS_IB:
		*qpt = IBV_QPT_RC;
		return 0;
	case RDMA_PS_UDP:
	case RDMA_PS_IPOIB:
		*qpt = IBV_QPT_UD;
		return 0;
	default:
		return -1;
	}
}

struct rc_id *rc_id_new(struct rc_channel *c, void *context, enum rdma_port_space ps,
			enum ibv_qp_type qp_type)
{
	struct rc_id *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	r->id.channel = &c->ch;
	r->id.context = context;
	r->id.ps = ps;
	r->id.qp_type = qp_type;
	r->id.route.addr.addr.ibaddr.pkey = htons(0xffff);
	r->chan = c;
	r->pid = getpid();
	r->sync = c->sync_owned;
	r->refs = 1;              /* the application's, until rdma_destroy_id */
	r->key = next_key++;
	r->hnext = keys[r->key % KEY_BUCKETS];
	keys[r->key % KEY_BUCKETS] = r;
	return r;
}

void rc_id_put(struct rc_id *r)
{
	struct rc_id **p;

	if (--r->refs > 0)
		return;
	for (p = &keys[r->key % KEY_BUCKETS]; *p; p = &(*p)->hnext) {
		if (*p == r) {
			*p = r->hnext;
			break;
		}
	}
	free(r->ep_qp_attr);
	free(r);
}

struct rc_id *rc_id_of(struct rdma_cm_id *id)
{
	return (struct rc_id *)id;
}

int rc_usable(const struct rc_id *r)
{
	if (!r)
		return rc_err(EINVAL);
	if (r->pid != getpid())
		return rc_err(EBADF);  /* a fork child's copy of its parent's id */
	return 0;
}

RC_EXPORT int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id,
			     void *context, enum rdma_port_space ps)
{
	enum ibv_qp_type qpt;
	struct rc_channel *c;
	struct rc_id *r;

	if (!id || rc_ps_qp_type(ps, &qpt))
		return rc_err(EINVAL);
	if (rc_forked())
		return rc_err(EBADF);
	if (channel) {
		c = (struct rc_channel *)channel;
		if (c->pid != getpid())
			return rc_err(EBADF);  /* a fork child's copy of its parent's channel */
	} else {
		c = rc_channel_new(1);
		if (!c)
			return -1;
	}
	pthread_mutex_lock(&rc_lock);
	r = rc_id_new(c, context, ps, qpt);
	if (r && !channel)
		r->own_chan = c;
	pthread_mutex_unlock(&rc_lock);
	if (!r) {
		if (!channel)
			rc_channel_free(c);
		return rc_err(ENOMEM);
	}
	*id = &r->id;
	return 0;
}

/* Takes the id's queued events off its channel (rdma_destroy_id, rdma_migrate_id). */
static struct rc_event *unqueue(struct rc_id *r)
{
	struct rc_channel *c = r->chan;
	struct rc_event *e, *n, *taken = NULL, **tail = &taken, *keep = NULL, **ktail = &keep;

	for (e = c->head; e; e = n) {
		n = e->next;
		e->next = NULL;
		if (e->id == r) {
			*tail = e;
			tail = &e->next;
		} else {
			*ktail = e;
			ktail = &e->next;
		}
	}
	c->head = keep;
	c->tail = NULL;
	for (e = keep; e; e = e->next)
		c->tail = e;
	if (!keep && taken)
		rc_channel_drained(c);  /* the queue is empty now */
	return taken;
}

RC_EXPORT int rdma_destroy_id(struct rdma_cm_id *id)
{
	struct rc_id *r = rc_id_of(id);
	struct ibcm_ctx *ctx;
	struct rc_channel *own = NULL;
	struct rc_event *e;

	if (!id)
		return rc_err(EINVAL);
	if (r->pid != getpid())
		return 0;  /* a fork child's copy: the parent's id is the parent's to destroy */
	if (r->id.event) {
		rdma_ack_cm_event(r->id.event);
		r->id.event = NULL;
	}
	ctx = rc_forked() ? NULL : rc_session();
	pthread_mutex_lock(&rc_lock);
	r->destroyed = 1;
	if (ctx && r->listen_sid) {
		ibcm_unlisten(ctx, r->listen_sid);
		r->listen_sid = 0;
		/* requests already queued for it are refused as they are routed (translate.c) */
		rc_pump();
	}
	if (ctx && r->sidr_req) {
		/* acknowledged unanswered: libibcm answers the SIDR_REQ "rejected" */
		ibcm_ack_event(ctx, r->sidr_req);
		r->sidr_req = NULL;
		r->conn = 0;
		r->refs--;            /* the handle's reference; the application's is below */
	}
	if (ctx && r->conn && r->state != RC_CLOSED) {
		if (r->listener && !r->answered)
			ibcm_reject(ctx, r->conn, 28, NULL, 0);
		else
			ibcm_disconnect(ctx, r->conn, NULL, 0);
	}
	if (r->listener) {
		rc_id_put(r->listener);
		r->listener = NULL;
	}
	e = unqueue(r);
	/* as librdmacm: the events handed out for it must be acknowledged first (another
	 * thread's, typically: a progress thread that has yet to call rdma_ack_cm_event) */
	while (r->events_out > 0)
		pthread_cond_wait(&rc_acked, &rc_lock);
	own = r->own_chan;
	r->own_chan = NULL;
	rc_id_put(r);
	rc_events_free(e);
	pthread_mutex_unlock(&rc_lock);
	if (own)
		rc_channel_free(own);
	return 0;
}

uint16_t rc_ephemeral_port(void)
{
	uint16_t v = 0;

	if (getrandom(&v, sizeof(v), 0) != sizeof(v))
		v = (uint16_t)rand();
	/* Linux's ip_local_port_range: 32768..60999 */
	return (uint16_t)(32768 + v % (60999 - 32768 + 1));
}

static void set_port(struct sockaddr *sa, uint16_t port)
{
	if (sa->sa_family == AF_INET)
		((struct sockaddr_in *)sa)->sin_port = htons(port);
	else if (sa->sa_family == AF_INET6)
		((struct sockaddr_in6 *)sa)->sin6_port = htons(port);
}

static uint16_t get_port(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ntohs(((const struct sockaddr_in *)sa)->sin_port);
	if (sa->sa_family == AF_INET6)
		return ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
	return 0;
}

static int is_any(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ((const struct sockaddr_in *)sa)->sin_addr.s_addr == htonl(INADDR_ANY);
	if (sa->sa_family == AF_INET6)
		return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr);
	return 0;
}

int rc_service_port(const struct rc_id *r)
{
	return get_port(&r->id.route.addr.src_addr);
}

uint64_t rc_service_id(const struct rc_id *r, int dst)
{
	const struct sockaddr *sa = dst ? &r->id.route.addr.dst_addr : &r->id.route.addr.src_addr;

	return ibcm_rdma_cm_service_id((uint16_t)r->id.ps, get_port(sa));
}

/* The start of a call on an id: the id is this process's, the session is open; returns the
 * session with rc_lock held, or NULL (errno set) without it. */
static struct ibcm_ctx *enter(struct rc_id *r)
{
	struct ibcm_ctx *ctx;

	if (rc_usable(r))
		return NULL;
	ctx = rc_session();
	if (ctx)
		pthread_mutex_lock(&rc_lock);
	return ctx;
}

RC_EXPORT int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	struct rc_id *r = rc_id_of(id);
	int len;

	if (rc_usable(r))
		return -1;
	if (!addr)
		return rc_err(EINVAL);
	len = rc_sockaddr_len(addr);
	if (len <= 0)
		return rc_err(EAFNOSUPPORT);
	if (r->state != RC_IDLE)
		return rc_err(EINVAL);
	memset(&r->id.route.addr.src_storage, 0, sizeof(r->id.route.addr.src_storage));
	memcpy(&r->id.route.addr.src_storage, addr, (size_t)len);
	r->auto_port = !get_port(addr);
	if (r->auto_port)
		set_port(&r->id.route.addr.src_addr, rc_ephemeral_port());
	if (!is_any(addr)) {
		int bad;

		pthread_mutex_lock(&rc_lock);
		bad = rc_addr_local(r, addr);
		pthread_mutex_unlock(&rc_lock);
		if (bad)
			return rc_err(EADDRNOTAVAIL);
	}
	r->state = RC_BOUND;
	return 0;
}

RC_EXPORT int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	struct rc_id *r = rc_id_of(id);
	struct ibcm_ctx *ctx;
	uint64_t sid;
	int st, tries;

	(void)backlog;  /* the node service bounds what a client holds (docs/ibcmd.md) */
	if (rc_usable(r))
		return -1;
	if (r->state == RC_IDLE) {
		struct sockaddr_in any;

		memset(&any, 0, sizeof(any));
		any.sin_family = AF_INET;
		if (rdma_bind_addr(id, (struct sockaddr *)&any))
			return -1;
	}
	if (r->state != RC_BOUND)
		return rc_err(EINVAL);
	ctx = rc_session();
	if (!ctx)
		return -1;
	sid = rc_service_id(r, 0);
	st = ibcm_listen_context(ctx, sid, (void *)(uintptr_t)r->key);
	for (tries = 0; st == IBCM_EREFUSED && r->auto_port && tries < 16; tries++) {
		/* an ephemeral port another listener of the node holds: draw another, as the
		 * kernel's port allocation would not have given that one */
		set_port(&r->id.route.addr.src_addr, rc_ephemeral_port());
		sid = rc_service_id(r, 0);
		st = ibcm_listen_context(ctx, sid, (void *)(uintptr_t)r->key);
	}
	if (st == IBCM_EREFUSED)
		return rc_err(EADDRINUSE);
	if (st)
		return rc_fail(st);
	pthread_mutex_lock(&rc_lock);
	r->listen_sid = sid;
	r->state = RC_LISTEN;
	pthread_mutex_unlock(&rc_lock);
	rc_trace("id %p listens on service ID %#llx", (void *)r, (unsigned long long)sid);
	return 0;
}

/* The 36-byte CMA header (rdma_cm's IP addressing, docs/wire.md §5) from the id's source
 * address to its destination. */
static void cma_header(const struct rc_id *r, uint8_t *h)
{
	const struct sockaddr *s = &r->id.route.addr.src_addr, *d = &r->id.route.addr.dst_addr;
	uint16_t port = htons(get_port(s));

	memset(h, 0, 36);
	h[0] = 0;  /* cma_version */
	if (s->sa_family == AF_INET && d->sa_family == AF_INET) {
		h[1] = 4 << 4;
		memcpy(h + 4 + 12, &((const struct sockaddr_in *)s)->sin_addr, 4);
		memcpy(h + 20 + 12, &((const struct sockaddr_in *)d)->sin_addr, 4);
	} else {
		union ibv_gid g;

		h[1] = 6 << 4;
		rc_ip_gid(s, &g);
		memcpy(h + 4, g.raw, 16);
		rc_ip_gid(d, &g);
		memcpy(h + 20, g.raw, 16);
	}
	memcpy(h + 2, &port, 2);
}

static uint8_t min_u8(unsigned a, unsigned b)
{
	return (uint8_t)(a < b ? a : b);
}

static int connect_ud(struct rc_id *r, struct ibcm_ctx *ctx, const struct rdma_conn_param *p)
{
	struct ibcm_sidr_param sp;
	uint8_t pd[IBCM_SIDR_REQ_PRIVATE_DATA_MAX];
	char peer[INET6_ADDRSTRLEN + 8];
	uint64_t h;
	size_t ulen = p && p->private_data ? p->private_data_len : 0;
	int st;

	if (ulen > IBCM_SIDR_REQ_PRIVATE_DATA_MAX - 36)
		return rc_err(EINVAL);
	cma_header(r, pd);
	if (ulen)
		memcpy(pd + 36, p->private_data, ulen);
	rc_sockaddr_str(&r->id.route.addr.dst_addr, peer, sizeof(peer), 0);
	ibcm_sidr_param_init(&sp);
	sp.peer = peer;
	sp.service_id = rc_service_id(r, 1);
	sp.private_data = pd;
	sp.private_data_len = (uint32_t)(36 + ulen);
	sp.context = (void *)(uintptr_t)r->key;
	/* 3 retransmissions, not rdma_cm's 15: the node service budgets the datagrams each user
	 * may have outstanding toward one peer (docs/ibcmd.md), and 15 per request would let
	 * only one resolution at a time reach a peer (docs/rdmacm.md §3) */
	sp.max_retries = SIDR_RETRIES;
	st = ibcm_sidr_query(ctx, &sp, &h);
	if (st)
		return rc_fail(st);
	r->conn = h;
	r->refs++;
	r->state = RC_CONNECT;
	return 0;
}

RC_EXPORT int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	struct rc_id *r = rc_id_of(id);
	struct ibcm_conn_param cp;
	struct ibv_port_attr pa;
	struct ibcm_ctx *ctx;
	uint8_t pd[IBCM_REQ_PRIVATE_DATA_MAX];
	char peer[INET6_ADDRSTRLEN + 8];
	size_t ulen = p && p->private_data ? p->private_data_len : 0;
	uint64_t h;
	int st;

	ctx = enter(r);
	if (!ctx)
		return -1;
	if (r->state != RC_ROUTE_RESOLVED || !r->dev) {
		pthread_mutex_unlock(&rc_lock);
		return rc_err(EINVAL);
	}
	if (r->id.qp_type == IBV_QPT_UD) {
		st = connect_ud(r, ctx, p);
		pthread_mutex_unlock(&rc_lock);
		if (st)
			return st;
		return r->sync ? rc_sync_complete(r, RDMA_CM_EVENT_ESTABLISHED) : 0;
	}
	if (ulen > IBCM_REQ_RDMA_CM_PRIVATE_DATA_MAX) {
		pthread_mutex_unlock(&rc_lock);
		return rc_err(EINVAL);
	}
	ibcm_conn_param_init(&cp);
	cma_header(r, pd);
	if (ulen)
		memcpy(pd + 36, p->private_data, ulen);
	rc_sockaddr_str(&r->id.route.addr.dst_addr, peer, sizeof(peer), 0);
	cp.peer = peer;
	cp.service_id = rc_service_id(r, 1);
	cp.private_data = pd;
	cp.private_data_len = (uint32_t)(36 + ulen);
	cp.qp_num = r->id.qp ? r->id.qp->qp_num : (p ? p->qp_num : 0);
	if (!cp.qp_num) {
		pthread_mutex_unlock(&rc_lock);
		return rc_err(EINVAL);
	}
	cp.flags = IBCM_CONNECT_MANUAL_RTU;
	switch (r->id.qp_type) {
	case IBV_QPT_RC:
		cp.transport = IBCM_TRANSPORT_RC;
		break;
	case IBV_QPT_UC:
		cp.transport = IBCM_TRANSPORT_UC;
		break;
	case IBV_QPT_XRC_SEND:
		cp.transport = IBCM_TRANSPORT_XRC;
		break;
	default:
		pthread_mutex_unlock(&rc_lock);
		return rc_err(EOPNOTSUPP);
	}
	/* as librdmacm: what the application asks, within what the device has */
	r->resp_res = min_u8(p ? p->responder_resources : RDMA_MAX_RESP_RES,
			     (unsigned)r->dev->attr.max_qp_rd_atom);
	r->init_depth = min_u8(p ? p->initiator_depth : RDMA_MAX_INIT_DEPTH,
			       (unsigned)r->dev->attr.max_qp_init_rd_atom);
	cp.responder_resources = r->resp_res;
	cp.initiator_depth = r->init_depth;
	cp.retry_count = p ? min_u8(p->retry_count, 7) : 7;
	cp.rnr_retry_count = p ? min_u8(p->rnr_retry_count, 7) : 7;
	cp.srq = r->id.srq || (r->id.qp ? r->id.qp->srq != NULL : (p && p->srq));
	if (!ibv_query_port(r->dev->verbs, r->id.port_num, &pa))
		cp.path_mtu = (uint8_t)pa.active_mtu;
	cp.context = (void *)(uintptr_t)r->key;
	r->manual_establish = r->id.qp == NULL;
	st = ibcm_connect(ctx, &cp, &h);
	if (st) {
		pthread_mutex_unlock(&rc_lock);
		return rc_fail(st);
	}
	r->conn = h;
	r->refs++;
	r->state = RC_CONNECT;
	pthread_mutex_unlock(&rc_lock);
	rc_trace("id %p connects to %s:%u (service ID %#llx, QPN %#x)", (void *)r, peer,
		 (unsigned)get_port(&r->id.route.addr.dst_addr),
		 (unsigned long long)cp.service_id, cp.qp_num);
	if (r->sync)
		return rc_sync_complete(r, r->manual_establish ? RDMA_CM_EVENT_CONNECT_RESPONSE :
					RDMA_CM_EVENT_ESTABLISHED);
	return 0;
}

static int accept_ud(struct rc_id *r, struct ibcm_ctx *ctx, const struct rdma_conn_param *p)
{
	struct ibcm_sidr_rep_param rp;
	int st;

	memset(&rp, 0, sizeof(rp));
	rp.status = 0;
	rp.qp_num = r->id.qp ? r->id.qp->qp_num : (p ? p->qp_num : 0);
	rp.qkey = RDMA_UDP_QKEY;
	if (p && p->private_data) {
		if (p->private_data_len > IBCM_SIDR_REP_PRIVATE_DATA_MAX)
			return rc_err(EINVAL);
		rp.private_data = p->private_data;
		rp.private_data_len = p->private_data_len;
	}
	st = ibcm_sidr_reply(ctx, r->conn, &rp);
	ibcm_ack_event(ctx, r->sidr_req);
	r->sidr_req = NULL;
	r->conn = 0;
	r->answered = 1;
	r->refs--;               /* the handle's reference (the application holds its own) */
	if (st)
		return rc_fail(st);
	r->state = RC_ESTABLISHED;
	return 0;
}

RC_EXPORT int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	struct rc_id *r = rc_id_of(id);
	struct ibcm_ctx *ctx;
	int st;

	ctx = enter(r);
	if (!ctx)
		return -1;
	if (!r->conn || r->answered || r->state != RC_CONNECT || !r->listener) {
		pthread_mutex_unlock(&rc_lock);
		return rc_err(EINVAL);
	}
	if (r->sidr_req) {
		st = accept_ud(r, ctx, p);
		pthread_mutex_unlock(&rc_lock);
		return st;
	}
	if (!r->dev) {
		/* the address the peer connected to is on no local RDMA device (id->verbs is
		 * NULL): nothing can take the connection; rdma_reject or rdma_destroy_id answers */
		pthread_mutex_unlock(&rc_lock);
		return rc_err(ENODEV);
	}
	if (p && p->private_data && p->private_data_len > IBCM_REP_PRIVATE_DATA_MAX) {
		pthread_mutex_unlock(&rc_lock);
		return rc_err(EINVAL);
	}
	/* as librdmacm: within the device's limits and the request's offer */
	r->resp_res = min_u8(p ? p->responder_resources : RDMA_MAX_RESP_RES,
			     (unsigned)r->dev->attr.max_qp_rd_atom);
	r->resp_res = min_u8(r->resp_res, r->req_responder_resources);
	r->init_depth = min_u8(p ? p->initiator_depth : RDMA_MAX_INIT_DEPTH,
			       (unsigned)r->dev->attr.max_qp_init_rd_atom);
	r->init_depth = min_u8(r->init_depth, r->req_initiator_depth);
	r->accept.qp_num = r->id.qp ? r->id.qp->qp_num : (p ? p->qp_num : 0);
	r->accept.responder_resources = r->resp_res;
	r->accept.initiator_depth = r->init_depth;
	r->accept.rnr_retry_count = p ? min_u8(p->rnr_retry_count, 7) : 7;
	r->accept.srq = r->id.srq || (r->id.qp ? r->id.qp->srq != NULL : (p && p->srq));
	r->accept.private_data = p ? p->private_data : NULL;
	r->accept.private_data_len = p && p->private_data ? p->private_data_len : 0;
	if (!r->accept.qp_num) {
		pthread_mutex_unlock(&rc_lock);
		return rc_err(EINVAL);
	}
	if (r->id.qp && (rc_qp_modify_cm(r, IBV_QPS_INIT, &r->accept) ||
			 rc_qp_modify_cm(r, IBV_QPS_RTR, &r->accept) ||
			 rc_qp_modify_cm(r, IBV_QPS_RTS, &r->accept))) {
		int e = errno;

		ibcm_reject(ctx, r->conn, 28, NULL, 0);
		r->answered = r->rejected_here = 1;
		pthread_mutex_unlock(&rc_lock);
		return rc_err(e);
	}
	st = ibcm_accept(ctx, r->conn, &r->accept);
	r->accept.private_data = NULL;
	r->accept.private_data_len = 0;
	if (st) {
		pthread_mutex_unlock(&rc_lock);
		return rc_fail(st);
	}
	r->answered = 1;
	r->state = RC_ACCEPTED;
	pthread_mutex_unlock(&rc_lock);
	if (r->sync)
		return rc_sync_complete(r, RDMA_CM_EVENT_ESTABLISHED);
	return 0;
}

RC_EXPORT int rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t len)
{
	struct rc_id *r = rc_id_of(id);
	struct ibcm_ctx *ctx;
	int st;

	ctx = enter(r);
	if (!ctx)
		return -1;
	if (!r->conn || r->answered || (r->state != RC_CONNECT)) {
		pthread_mutex_unlock(&rc_lock);
		return rc_err(EINVAL);
	}
	if (r->sidr_req) {
		struct ibcm_sidr_rep_param rp;

		memset(&rp, 0, sizeof(rp));
		rp.status = 2;  /* rejected (IBTA table 119), as rdma_cm's IB_SIDR_REJECT */
		rp.private_data = private_data;
		rp.private_data_len = private_data ? len : 0;
		st = ibcm_sidr_reply(ctx, r->conn, &rp);
		ibcm_ack_event(ctx, r->sidr_req);
		r->sidr_req = NULL;
		r->conn = 0;
		r->refs--;
	} else {
		/* a REP awaited by an active id that gets no QP transition: reject the REP */
		st = ibcm_reject(ctx, r->conn, 28, private_data, private_data ? len : 0);
		r->rejected_here = 1;
	}
	r->answered = 1;
	r->state = RC_CLOSED;
	pthread_mutex_unlock(&rc_lock);
	return st ? rc_fail(st) : 0;
}

RC_EXPORT int rdma_disconnect(struct rdma_cm_id *id)
{
	struct rc_id *r = rc_id_of(id);
	struct ibcm_ctx *ctx;
	int st = 0;

	ctx = enter(r);
	if (!ctx)
		return -1;
	switch (r->state) {
	case RC_DISCONNECT:
	case RC_CLOSED:
	case RC_CONNECT:
	case RC_ACCEPTED:
	case RC_ESTABLISHED:
		break;
	default:
		pthread_mutex_unlock(&rc_lock);
		return rc_err(EINVAL);
	}
	/* as librdmacm: the QP goes to ERR first, so its posted work requests flush (after
	 * the peer's DREQ too: an application's completion thread waits for that) */
	if (r->id.qp && r->id.qp_type != IBV_QPT_UD)
		rc_qp_error(r);
	if (r->state != RC_DISCONNECT && r->state != RC_CLOSED && r->conn)
		st = ibcm_disconnect(ctx, r->conn, NULL, 0);
	/* else the peer's DREQ came first (or it is over): nothing left to send */
	if (r->state != RC_CLOSED)
		r->state = RC_DISCONNECT;
	pthread_mutex_unlock(&rc_lock);
	return st && st != IBCM_ECLOSED && st != IBCM_ENOENT ? rc_fail(st) : 0;
}

RC_EXPORT int rdma_establish(struct rdma_cm_id *id)
{
	struct rc_id *r = rc_id_of(id);
	struct ibcm_ctx *ctx;
	int st;

	ctx = enter(r);
	if (!ctx)
		return -1;
	if (!r->conn || r->state != RC_CONNECT || r->listener) {
		pthread_mutex_unlock(&rc_lock);
		return rc_err(EINVAL);
	}
	st = ibcm_establish(ctx, r->conn, NULL, 0);
	if (!st)
		r->state = RC_ESTABLISHED;
	pthread_mutex_unlock(&rc_lock);
	return st ? rc_fail(st) : 0;
}

RC_EXPORT int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	struct rc_id *r = rc_id_of(id);

	if (rc_usable(r))
		return -1;
	/* IBV_EVENT_COMM_EST: data arrived before the RTU. The connection is established for
	 * the data path already; the CM's state follows when the RTU (or its retransmission
	 * by the peer's REP timer) arrives. */
	if (event != IBV_EVENT_COMM_EST)
		return 0;
	return r->state == RC_ACCEPTED || r->state == RC_ESTABLISHED ? 0 : rc_err(EINVAL);
}

RC_EXPORT int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
	struct rc_id *r = rc_id_of(id);
	struct rc_channel *to, *own = NULL;
	struct rc_event *e, *n;

	if (rc_usable(r))
		return -1;
	if (channel) {
		to = (struct rc_channel *)channel;
		if (to->pid != getpid())
			return rc_err(EBADF);
	} else {
		to = rc_channel_new(1);
		if (!to)
			return -1;
	}
	pthread_mutex_lock(&rc_lock);
	e = unqueue(r);
	if (r->own_chan && r->own_chan != to)
		own = r->own_chan;
	r->own_chan = channel ? NULL : to;
	r->chan = to;
	r->id.channel = &to->ch;
	r->sync = to->sync_owned;
	for (; e; e = n) {
		n = e->next;
		rc_event_queue(e);
	}
	pthread_mutex_unlock(&rc_lock);
	if (own)
		rc_channel_free(own);
	return 0;
}

RC_EXPORT int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval,
			      size_t optlen)
{
	struct rc_id *r = rc_id_of(id);

	if (rc_usable(r))
		return -1;
	if (!optval)
		return rc_err(EINVAL);
	if (level == RDMA_OPTION_ID) {
		switch (optname) {
		case RDMA_OPTION_ID_TOS:
			if (optlen != sizeof(uint8_t))
				return rc_err(EINVAL);
			/* The REQ's traffic class is the node service's (docs/rdmacm.md §4). */
			return rc_err(ENOSYS);
		case RDMA_OPTION_ID_REUSEADDR:
		case RDMA_OPTION_ID_AFONLY:
			/* accepted without effect: the node service owns port reuse, and an id's
			 * address family is the one it is bound or resolved with (docs/rdmacm.md §2) */
			return optlen == sizeof(int) ? 0 : rc_err(EINVAL);
		case RDMA_OPTION_ID_ACK_TIMEOUT:
			if (optlen != sizeof(uint8_t) || *(uint8_t *)optval > 31)
				return rc_err(EINVAL);  /* the QP's timeout has 5 bits */
			r->ack_timeout = *(uint8_t *)optval;
			return 0;
		default:
			return rc_err(ENOSYS);
		}
	}
	if (level == RDMA_OPTION_IB && optname == RDMA_OPTION_IB_PATH)
		return rc_err(ENOSYS);  /* paths come from the node service (docs/rdmacm.md §4) */
	return rc_err(ENOSYS);
}

RC_EXPORT __be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	return id ? htons(get_port(&id->route.addr.src_addr)) : 0;
}

RC_EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	return id ? htons(get_port(&id->route.addr.dst_addr)) : 0;
}
