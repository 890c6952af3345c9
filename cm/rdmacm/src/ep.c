/*
 * ep.c -- the synchronous API: rdma_create_ep, rdma_get_request, rdma_destroy_ep.
 *
 * An id created without a channel (rdma_create_id with NULL, rdma_create_ep) has a
 * channel of its own, and each call that starts a step waits for that step's event
 * (rc_sync_complete), keeping it in id->event until the next step or rdma_destroy_id, as
 * librdmacm does. A listener of rdma_create_ep keeps the QP attributes it was given, and
 * rdma_get_request creates each request's QP with them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rdmacm.h"

RC_EXPORT int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res,
			     struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	struct rdma_cm_id *cm_id;
	struct rc_id *r;

	if (!id || !res)
		return rc_err(EINVAL);
	if (rdma_create_id(NULL, &cm_id, NULL, (enum rdma_port_space)res->ai_port_space))
		return -1;
	r = rc_id_of(cm_id);
	if (res->ai_qp_type)
		cm_id->qp_type = (enum ibv_qp_type)res->ai_qp_type;
	if (res->ai_flags & RAI_PASSIVE) {
		if (rdma_bind_addr(cm_id, res->ai_src_addr))
			goto err;
		if (qp_init_attr) {
			r->ep_qp_attr = malloc(sizeof(*qp_init_attr));
			if (!r->ep_qp_attr) {
				errno = ENOMEM;
				goto err;
			}
			*r->ep_qp_attr = *qp_init_attr;
			r->ep_pd = pd;
		}
		*id = cm_id;
		return 0;
	}
	if (rdma_resolve_addr(cm_id, res->ai_src_addr, res->ai_dst_addr, 2000))
		goto err;
	if (rdma_resolve_route(cm_id, 2000))
		goto err;
	if (qp_init_attr) {
		qp_init_attr->qp_type = cm_id->qp_type;
		if (rdma_create_qp(cm_id, pd, qp_init_attr))
			goto err;
	}
	*id = cm_id;
	return 0;
err:
	{
		int e = errno;

		rdma_destroy_ep(cm_id);
		errno = e;
		return -1;
	}
}

static int rc_ep_request_qp(struct rc_id *child, struct rc_id *listener)
{
	struct ibv_qp_init_attr attr;

	if (!listener->ep_qp_attr)
		return 0;
	attr = *listener->ep_qp_attr;
	attr.qp_type = child->id.qp_type;
	return rdma_create_qp(&child->id, listener->ep_pd, &attr);
}

RC_EXPORT int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
	struct rc_id *l = rc_id_of(listen);
	struct rdma_cm_event *ev;
	struct rc_id *child;

	if (rc_usable(l))
		return -1;
	if (!id)
		return rc_err(EINVAL);
	if (!l->sync)
		return rc_err(EINVAL);  /* as librdmacm: a listener of rdma_create_ep */
	if (l->id.event) {
		rdma_ack_cm_event(l->id.event);
		l->id.event = NULL;
	}
	if (rdma_get_cm_event(listen->channel, &ev))
		return -1;
	if (ev->status) {
		int e = ev->status < 0 ? -ev->status : ev->status;

		rdma_ack_cm_event(ev);
		return rc_err(e);
	}
	if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
		rdma_ack_cm_event(ev);
		return rc_err(EINVAL);
	}
	child = rc_id_of(ev->id);
	if (rdma_migrate_id(ev->id, NULL) || rc_ep_request_qp(child, l)) {
		int e = errno;

		rdma_reject(ev->id, NULL, 0);
		rdma_ack_cm_event(ev);
		rdma_destroy_id(&child->id);
		return rc_err(e);
	}
	child->id.event = ev;
	*id = ev->id;
	return 0;
}

RC_EXPORT void rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (!id)
		return;
	if (id->qp)
		rdma_destroy_qp(id);
	if (id->srq)
		rdma_destroy_srq(id);
	rdma_destroy_id(id);
}
