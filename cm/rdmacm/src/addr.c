/*
 * addr.c -- local devices and addresses: rdma_resolve_addr, rdma_resolve_route,
 * rdma_get_devices, rdma_getaddrinfo.
 *
 * On RoCE an IP address is a GID: the local address picks the device, port and GID index
 * whose GID table holds it (RoCE v2 first, as the kernel's default GID type), and the
 * peer's GID is its address (IPv4 mapped ::ffff:a.b.c.d). The source address of a
 * connection without one is the kernel's route to the peer (a UDP socket's connect).
 * The node service sends the CM messages; the GID found here is the one the QP's address
 * vector uses, so it must be on the port the node service serves (docs/rdmacm.md §3).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rdmacm.h"

static struct rc_device *devices;

int rc_sockaddr_len(const struct sockaddr *sa)
{
	switch (sa->sa_family) {
	case AF_INET: return sizeof(struct sockaddr_in);
	case AF_INET6: return sizeof(struct sockaddr_in6);
	default: return -1;
	}
}

void rc_ip_gid(const struct sockaddr *sa, union ibv_gid *gid)
{
	memset(gid, 0, sizeof(*gid));
	if (sa->sa_family == AF_INET) {
		gid->raw[10] = 0xff;
		gid->raw[11] = 0xff;
		memcpy(gid->raw + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		memcpy(gid->raw, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
	}
}

int rc_sockaddr_str(const struct sockaddr *sa, char *buf, size_t len, int with_port)
{
	char ip[INET6_ADDRSTRLEN];
	unsigned port;

	if (sa->sa_family == AF_INET) {
		inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, ip, sizeof(ip));
		port = ntohs(((const struct sockaddr_in *)sa)->sin_port);
		return with_port ? snprintf(buf, len, "%s:%u", ip, port) : snprintf(buf, len, "%s", ip);
	}
	if (sa->sa_family == AF_INET6) {
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, ip, sizeof(ip));
		port = ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
		return with_port ? snprintf(buf, len, "[%s]:%u", ip, port) : snprintf(buf, len, "%s", ip);
	}
	return snprintf(buf, len, "?");
}

/* "IP:PORT" / "[IP6]:PORT" (libibcm's rdma_cm addresses) as a socket address. */
int rc_sockaddr_parse(const char *s, struct sockaddr_storage *ss)
{
	char host[INET6_ADDRSTRLEN + 2];
	const char *colon = strrchr(s, ':');
	size_t n;
	unsigned long port;

	memset(ss, 0, sizeof(*ss));
	if (!colon)
		return -1;
	n = (size_t)(colon - s);
	if (n == 0 || n >= sizeof(host))
		return -1;
	memcpy(host, s, n);
	host[n] = 0;
	port = strtoul(colon + 1, NULL, 10);
	if (host[0] == '[') {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;

		if (n < 2 || host[n - 1] != ']')
			return -1;
		host[n - 1] = 0;
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)port);
		return inet_pton(AF_INET6, host + 1, &s6->sin6_addr) == 1 ? 0 : -1;
	} else {
		struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
		struct in6_addr a6;

		s4->sin_family = AF_INET;
		s4->sin_port = htons((uint16_t)port);
		if (inet_pton(AF_INET, host, &s4->sin_addr) == 1)
			return 0;
		/* an IPv4-mapped IPv6 address written as IPv6 */
		if (inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_V4MAPPED(&a6)) {
			memcpy(&s4->sin_addr, a6.s6_addr + 12, 4);
			return 0;
		}
		return -1;
	}
}

/* Every device, opened once (with rc_lock held). */
static void open_devices(void)
{
	struct ibv_device **list;
	int i, n = 0;

	if (devices)
		return;
	list = ibv_get_device_list(&n);
	if (!list)
		return;
	for (i = n - 1; i >= 0; i--) {
		struct rc_device *d = calloc(1, sizeof(*d));

		if (!d)
			break;
		d->verbs = ibv_open_device(list[i]);
		if (!d->verbs || ibv_query_device(d->verbs, &d->attr)) {
			if (d->verbs)
				ibv_close_device(d->verbs);
			free(d);
			continue;
		}
		d->next = devices;
		devices = d;
	}
	ibv_free_device_list(list);
}

struct rc_device *rc_device_of(struct ibv_context *verbs)
{
	struct rc_device *d;

	for (d = devices; d; d = d->next)
		if (d->verbs == verbs)
			return d;
	return NULL;
}

/* The last GIDs found (a GID table holds up to 1,024 entries on rxe, each a query of its
 * own): an entry is used after one query shows it still holds that GID. */
struct gid_hit {
	union ibv_gid gid;
	struct rc_device *dev;
	uint8_t port, index;
	struct gid_hit *next;
};
static struct gid_hit *gid_hits;

static int gid_cached(const union ibv_gid *gid, struct rc_device **dev, uint8_t *port,
		      uint8_t *index)
{
	struct gid_hit *h;
	struct ibv_gid_entry ge;

	for (h = gid_hits; h; h = h->next) {
		if (memcmp(h->gid.raw, gid->raw, 16))
			continue;
		if (ibv_query_gid_ex(h->dev->verbs, h->port, h->index, &ge, 0) ||
		    memcmp(ge.gid.raw, gid->raw, 16))
			return -1;  /* the table changed: search it again */
		*dev = h->dev;
		*port = h->port;
		*index = h->index;
		return 0;
	}
	return -1;
}

static void gid_remember(const union ibv_gid *gid, struct rc_device *dev, uint8_t port,
			 uint8_t index)
{
	struct gid_hit *h;

	for (h = gid_hits; h; h = h->next) {
		if (!memcmp(h->gid.raw, gid->raw, 16)) {
			h->dev = dev;
			h->port = port;
			h->index = index;
			return;
		}
	}
	h = calloc(1, sizeof(*h));
	if (!h)
		return;
	h->gid = *gid;
	h->dev = dev;
	h->port = port;
	h->index = index;
	h->next = gid_hits;
	gid_hits = h;
}

/* The device, port and GID index whose GID is `gid`: RoCE v2 first, then any type. */
static int find_gid(const union ibv_gid *gid, struct rc_device **dev, uint8_t *port,
		    uint8_t *index)
{
	int pass;

	open_devices();
	if (!gid_cached(gid, dev, port, index))
		return 0;
	for (pass = 0; pass < 2; pass++) {
		struct rc_device *d;

		for (d = devices; d; d = d->next) {
			unsigned p;

			for (p = 1; p <= d->attr.phys_port_cnt; p++) {
				struct ibv_port_attr pa;
				int i;

				if (ibv_query_port(d->verbs, (uint8_t)p, &pa))
					continue;
				for (i = 0; i < pa.gid_tbl_len && i < 256; i++) {
					struct ibv_gid_entry ge;

					if (ibv_query_gid_ex(d->verbs, p, (uint32_t)i, &ge, 0))
						continue;
					if (memcmp(ge.gid.raw, gid->raw, 16))
						continue;
					if (pass == 0 && ge.gid_type != IBV_GID_TYPE_ROCE_V2)
						continue;
					*dev = d;
					*port = (uint8_t)p;
					*index = (uint8_t)i;
					gid_remember(gid, d, *port, *index);
					return 0;
				}
			}
		}
	}
	return -1;
}

int rc_addr_local(struct rc_id *r, const struct sockaddr *local)
{
	union ibv_gid gid;
	struct rc_device *d;
	uint8_t port, index;

	rc_ip_gid(local, &gid);
	if (find_gid(&gid, &d, &port, &index))
		return -1;
	r->dev = d;
	r->id.verbs = d->verbs;
	/* as librdmacm: an id on a device has the device's default PD */
	if (!d->pd)
		d->pd = ibv_alloc_pd(d->verbs);
	if (!r->id.pd)
		r->id.pd = d->pd;
	r->id.port_num = port;
	r->sgid_index = index;
	r->id.route.addr.addr.ibaddr.sgid = gid;
	return 0;
}

/* The kernel's source address for a destination: a UDP socket's after connect(). */
static int route_source(const struct sockaddr *dst, struct sockaddr_storage *src)
{
	socklen_t len = sizeof(*src);
	int fd = socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct sockaddr_storage d;
	int ret;

	if (fd < 0)
		return -1;
	memset(&d, 0, sizeof(d));
	memcpy(&d, dst, (size_t)rc_sockaddr_len(dst));
	/* any port will do for the route lookup */
	if (d.ss_family == AF_INET)
		((struct sockaddr_in *)&d)->sin_port = htons(4791);
	else
		((struct sockaddr_in6 *)&d)->sin6_port = htons(4791);
	ret = connect(fd, (struct sockaddr *)&d, (socklen_t)rc_sockaddr_len(dst));
	if (!ret)
		ret = getsockname(fd, (struct sockaddr *)src, &len);
	close(fd);
	return ret;
}

RC_EXPORT int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr,
				struct sockaddr *dst_addr, int timeout_ms)
{
	struct rc_id *r = rc_id_of(id);
	struct sockaddr_storage src;
	uint16_t port = 0;
	int dlen, status = 0;

	(void)timeout_ms;  /* resolved at once: the neighbour is the QP's business on RoCE */
	if (rc_usable(r))
		return -1;
	if (!dst_addr)
		return rc_err(EINVAL);
	dlen = rc_sockaddr_len(dst_addr);
	if (dlen <= 0)
		return rc_err(EAFNOSUPPORT);
	if (r->state != RC_IDLE && r->state != RC_BOUND)
		return rc_err(EINVAL);
	if (r->state == RC_BOUND)
		port = ntohs(rdma_get_src_port(id));
	memset(&r->id.route.addr.dst_storage, 0, sizeof(r->id.route.addr.dst_storage));
	memcpy(&r->id.route.addr.dst_storage, dst_addr, (size_t)dlen);
	memset(&src, 0, sizeof(src));
	if (src_addr && rc_sockaddr_len(src_addr) > 0) {
		memcpy(&src, src_addr, (size_t)rc_sockaddr_len(src_addr));
	} else if (r->state == RC_BOUND &&
		   !(r->id.route.addr.src_addr.sa_family == AF_INET &&
		     r->id.route.addr.src_sin.sin_addr.s_addr == 0)) {
		memcpy(&src, &r->id.route.addr.src_storage, sizeof(src));
	}
	if (!src.ss_family || (src.ss_family == AF_INET &&
			       ((struct sockaddr_in *)&src)->sin_addr.s_addr == 0)) {
		if (route_source(dst_addr, &src))
			status = -errno;
	}
	if (!status) {
		uint16_t *p = src.ss_family == AF_INET ? &((struct sockaddr_in *)&src)->sin_port :
			&((struct sockaddr_in6 *)&src)->sin6_port;

		if (port)
			*p = htons(port);
		if (!*p)
			*p = htons(rc_ephemeral_port());
		memcpy(&r->id.route.addr.src_storage, &src, sizeof(src));
		pthread_mutex_lock(&rc_lock);
		if (rc_addr_local(r, (struct sockaddr *)&src))
			status = -ENODEV;  /* no RDMA device has the source address */
		pthread_mutex_unlock(&rc_lock);
	}
	rc_ip_gid(dst_addr, &r->id.route.addr.addr.ibaddr.dgid);
	pthread_mutex_lock(&rc_lock);
	r->state = status ? r->state : RC_ADDR_RESOLVED;
	rc_event_queue_now(r, status ? RDMA_CM_EVENT_ADDR_ERROR : RDMA_CM_EVENT_ADDR_RESOLVED,
			   status);
	pthread_mutex_unlock(&rc_lock);
	if (r->sync)
		return rc_sync_complete(r, RDMA_CM_EVENT_ADDR_RESOLVED);
	return 0;
}

/* The port's data rate in Mb/s: lanes (active_width) x the lane rate (active_speed). */
static int port_mbps(const struct ibv_port_attr *pa)
{
	int lanes, lane;

	switch (pa->active_width) {
	case 1: lanes = 1; break;
	case 2: lanes = 4; break;
	case 4: lanes = 8; break;
	case 8: lanes = 12; break;
	case 16: lanes = 2; break;
	default: lanes = 1; break;
	}
	switch (pa->active_speed) {
	case 1: lane = 2500; break;
	case 2: lane = 5000; break;
	case 4: case 8: lane = 10000; break;
	case 16: lane = 14000; break;
	case 32: lane = 25000; break;
	case 64: lane = 50000; break;
	case 128: lane = 100000; break;
	default: lane = 2500; break;
	}
	return lanes * lane;
}

/* route.path_rec: RoCE has no path records, but rdma_cm reports one built from the GIDs and
 * the port (as the kernel's cma_resolve_iboe_route). */
int rc_route_fill(struct rc_id *r, const struct ibv_port_attr *pa)
{
	struct ibv_sa_path_rec *p = &r->path;
	struct ibv_port_attr own;

	memset(p, 0, sizeof(*p));
	p->sgid = r->id.route.addr.addr.ibaddr.sgid;
	p->dgid = r->id.route.addr.addr.ibaddr.dgid;
	p->pkey = htons(0xffff);
	p->hop_limit = 64;
	p->reversible = 1;
	p->numb_path = 1;
	p->mtu_selector = 2;
	p->rate_selector = 2;
	p->packet_life_time_selector = 2;
	if (!pa && r->dev && !ibv_query_port(r->dev->verbs, r->id.port_num, &own))
		pa = &own;
	if (pa) {
		p->mtu = (uint8_t)pa->active_mtu;
		p->rate = (uint8_t)mbps_to_ibv_rate(port_mbps(pa));
	}
	r->id.route.path_rec = p;
	r->id.route.num_paths = 1;
	return 0;
}

RC_EXPORT int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	struct rc_id *r = rc_id_of(id);
	struct ibv_port_attr pa;
	int status = 0, have;

	(void)timeout_ms;
	if (rc_usable(r))
		return -1;
	if (r->state != RC_ADDR_RESOLVED || !r->dev)
		return rc_err(EINVAL);
	have = !ibv_query_port(r->dev->verbs, r->id.port_num, &pa);
	if (have && pa.link_layer == IBV_LINK_LAYER_INFINIBAND)
		status = -EPROTONOSUPPORT;  /* IP addressing over native IB: docs/rdmacm.md §4 */
	pthread_mutex_lock(&rc_lock);
	if (!status) {
		rc_route_fill(r, have ? &pa : NULL);
		r->state = RC_ROUTE_RESOLVED;
	}
	rc_event_queue_now(r, status ? RDMA_CM_EVENT_ROUTE_ERROR : RDMA_CM_EVENT_ROUTE_RESOLVED,
			   status);
	pthread_mutex_unlock(&rc_lock);
	if (r->sync)
		return rc_sync_complete(r, RDMA_CM_EVENT_ROUTE_RESOLVED);
	return 0;
}

RC_EXPORT struct ibv_context **rdma_get_devices(int *num_devices)
{
	struct ibv_context **list;
	struct rc_device *d;
	int n = 0, i = 0;

	pthread_mutex_lock(&rc_lock);
	open_devices();
	for (d = devices; d; d = d->next)
		n++;
	list = calloc((size_t)n + 1, sizeof(*list));
	if (list)
		for (d = devices; d; d = d->next)
			list[i++] = d->verbs;
	pthread_mutex_unlock(&rc_lock);
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	if (num_devices)
		*num_devices = n;
	return list;
}

RC_EXPORT void rdma_free_devices(struct ibv_context **list)
{
	free(list);
}

static struct sockaddr *dup_sockaddr(const struct sockaddr *sa, socklen_t *len)
{
	int n = rc_sockaddr_len(sa);
	struct sockaddr *c;

	if (n <= 0)
		return NULL;
	c = calloc(1, (size_t)n);
	if (c)
		memcpy(c, sa, (size_t)n);
	*len = (socklen_t)n;
	return c;
}

RC_EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *n = res->ai_next;

		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
		res = n;
	}
}

/* rdma_getaddrinfo without a node or service: the hints' addresses and fields (librdmacm's) */
static int addrinfo_from_hints(const struct rdma_addrinfo *hints, struct rdma_addrinfo **res)
{
	struct rdma_addrinfo *r = calloc(1, sizeof(*r));

	if (!r)
		return rc_err(ENOMEM);
	r->ai_flags = hints->ai_flags;
	r->ai_family = hints->ai_family;
	r->ai_qp_type = hints->ai_qp_type;
	r->ai_port_space = hints->ai_port_space;
	if (hints->ai_dst_addr && hints->ai_dst_len) {
		r->ai_dst_addr = dup_sockaddr(hints->ai_dst_addr, &r->ai_dst_len);
		if (!r->ai_dst_addr)
			goto nomem;
	}
	if (hints->ai_src_addr && hints->ai_src_len) {
		r->ai_src_addr = dup_sockaddr(hints->ai_src_addr, &r->ai_src_len);
		if (!r->ai_src_addr)
			goto nomem;
	}
	*res = r;
	return 0;
nomem:
	rdma_freeaddrinfo(r);
	return rc_err(ENOMEM);
}

RC_EXPORT int rdma_getaddrinfo(const char *node, const char *service,
			       const struct rdma_addrinfo *hints, struct rdma_addrinfo **res)
{
	struct addrinfo h, *ai = NULL;
	struct rdma_addrinfo *r;
	enum ibv_qp_type qpt;
	int passive, ret;

	if (!res || (!node && !service && !hints))
		return rc_err(EINVAL);
	memset(&h, 0, sizeof(h));
	h.ai_socktype = SOCK_STREAM;
	if (hints) {
		if (hints->ai_flags & RAI_NUMERICHOST)
			h.ai_flags |= AI_NUMERICHOST;
		if (hints->ai_flags & RAI_PASSIVE)
			h.ai_flags |= AI_PASSIVE;
		if (hints->ai_family == AF_IB)
			return rc_err(EAFNOSUPPORT);  /* AF_IB addressing: docs/rdmacm.md §4 */
		h.ai_family = hints->ai_family;
	}
	passive = hints && (hints->ai_flags & RAI_PASSIVE);
	if (!node && !service)
		return addrinfo_from_hints(hints, res);
	ret = getaddrinfo(node, service, &h, &ai);
	if (ret) {
		/* as librdmacm: getaddrinfo's error code, errno set as well */
		errno = ret == EAI_SYSTEM ? errno : ENOENT;
		return ret;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		freeaddrinfo(ai);
		return rc_err(ENOMEM);
	}
	r->ai_family = ai->ai_family;
	r->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
	if (hints && hints->ai_qp_type)
		r->ai_qp_type = hints->ai_qp_type;
	else if (!rc_ps_qp_type(r->ai_port_space, &qpt))
		r->ai_qp_type = qpt;
	else
		r->ai_qp_type = IBV_QPT_RC;
	if (passive) {
		r->ai_flags = RAI_PASSIVE;
		r->ai_src_addr = dup_sockaddr(ai->ai_addr, &r->ai_src_len);
	} else {
		r->ai_dst_addr = dup_sockaddr(ai->ai_addr, &r->ai_dst_len);
		if (hints && hints->ai_src_addr && hints->ai_src_len)
			r->ai_src_addr = dup_sockaddr(hints->ai_src_addr, &r->ai_src_len);
	}
	freeaddrinfo(ai);
	if ((passive && !r->ai_src_addr) || (!passive && !r->ai_dst_addr)) {
		rdma_freeaddrinfo(r);
		return rc_err(ENOMEM);
	}
	*res = r;
	return 0;
}
