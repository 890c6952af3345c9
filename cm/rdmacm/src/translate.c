/*
 * translate.c -- libibcm's events as rdma_cm's (the kernel's rdma_cm, drivers/infiniband/
 * core/cma.c, cma_ib_handler / cma_ib_req_handler / cma_sidr_rep_handler, and
 * librdmacm's own steps on top of them).
 *
 *   ibcm event                     rdma_cm event (and what this library does first)
 *   CONNECT_REQUEST (RC/UC/XRC)    CONNECT_REQUEST on a new id of the listener's channel
 *   SIDR_REQUEST                   CONNECT_REQUEST (param.ud); answered by rdma_accept
 *   CONNECT_RESPONSE               id with a QP: its INIT/RTR/RTS transitions, then the RTU
 *                                  (ibcm_establish), and ESTABLISHED; else CONNECT_RESPONSE
 *                                  (rdma_establish sends the RTU; no ESTABLISHED follows)
 *   ESTABLISHED                    ESTABLISHED (passive: the RTU arrived)
 *   REJECTED                       REJECTED, status = the REJ reason (QP to ERR)
 *   UNREACHABLE                    UNREACHABLE, status -ETIMEDOUT
 *   CONNECT_ERROR                  none after this side's own reject or destroy; else
 *                                  UNREACHABLE -ETIMEDOUT (a timeout) or CONNECT_ERROR
 *   DISCONNECTED                   DISCONNECTED (the peer's DREQ, or the DREP / DREQ
 *                                  timeout after rdma_disconnect)
 *   SIDR_REPLY                     status 0: ESTABLISHED (param.ud: AH, QPN, Q_Key);
 *                                  else UNREACHABLE, status = the SIDR status
 *   others (XRC reports, LAP/APR)  none
 */
#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

#include "rdmacm.h"

static void conn_param(struct rc_event *e, const struct ibcm_event *ev, size_t max)
{
	size_t len = ev->private_data_len;

	if (len > max)
		len = max;
	if (len > sizeof(e->private_data))
		len = sizeof(e->private_data);
	if (len && ev->private_data)
		memcpy(e->private_data, ev->private_data, len);
	e->ev.param.conn.private_data = len ? e->private_data : NULL;
	e->ev.param.conn.private_data_len = (uint8_t)len;
	e->ev.param.conn.responder_resources = ev->responder_resources;
	e->ev.param.conn.initiator_depth = ev->initiator_depth;
	e->ev.param.conn.flow_control = ev->flow_control;
	e->ev.param.conn.retry_count = ev->retry_count;
	e->ev.param.conn.rnr_retry_count = ev->rnr_retry_count;
	e->ev.param.conn.srq = ev->srq;
	e->ev.param.conn.qp_num = ev->remote_qpn;
}

static void ud_param(struct rc_event *e, struct rc_id *r, const struct ibcm_event *ev)
{
	size_t len = ev->private_data_len;

	if (len > sizeof(e->private_data))
		len = sizeof(e->private_data);
	if (len && ev->private_data)
		memcpy(e->private_data, ev->private_data, len);
	e->ev.param.ud.private_data = len ? e->private_data : NULL;
	e->ev.param.ud.private_data_len = (uint8_t)(len > 255 ? 255 : len);
	rc_ud_ah_attr(r, &e->ev.param.ud.ah_attr);
	e->ev.param.ud.qp_num = ev->remote_qpn;
	e->ev.param.ud.qkey = ev->qkey;
}

/* Releases the reference of an id's libibcm handle (its final event came). */
static void handle_done(struct rc_id *r)
{
	r->conn = 0;
	if (r->state != RC_LISTEN)
		r->state = RC_CLOSED;
	rc_id_put(r);
}

static void on_request(struct rc_id *l, struct ibcm_event *ev, struct ibcm_ctx *ctx)
{
	int sidr = ev->event == IBCM_EVENT_SIDR_REQUEST;
	struct rc_channel *c;
	struct rc_event *e;
	struct rc_id *r;

	if (!l || l->destroyed || l->state != RC_LISTEN) {
		/* the listener went away while the request was on its way */
		if (!sidr)
			ibcm_reject(ctx, ev->conn, 28, NULL, 0);
		ibcm_ack_event(ctx, ev);  /* a SIDR_REQUEST acknowledged unanswered: "rejected" */
		return;
	}
	c = l->chan;
	r = rc_id_new(c, l->id.context, l->id.ps, l->id.qp_type);
	if (!r) {
		if (!sidr)
			ibcm_reject(ctx, ev->conn, 28, NULL, 0);
		ibcm_ack_event(ctx, ev);
		return;
	}
	r->conn = ev->conn;
	r->refs++;                /* the handle's */
	r->listener = l;
	l->refs++;
	r->state = RC_CONNECT;
	r->dev = l->dev;
	r->id.verbs = l->id.verbs;
	r->id.pd = l->dev ? l->dev->pd : NULL;
	r->id.port_num = l->id.port_num;
	r->sgid_index = l->sgid_index;
	ibcm_set_context(ctx, ev->conn, (void *)(uintptr_t)r->key);
	/* the route: this side is the address the client connected to, the peer the client */
	if (ev->rdma_cm_dst && *ev->rdma_cm_dst)
		rc_sockaddr_parse(ev->rdma_cm_dst, &r->id.route.addr.src_storage);
	if (ev->rdma_cm_src && *ev->rdma_cm_src)
		rc_sockaddr_parse(ev->rdma_cm_src, &r->id.route.addr.dst_storage);
	if (r->id.route.addr.src_addr.sa_family)
		rc_addr_local(r, &r->id.route.addr.src_addr);
	rc_ip_gid(&r->id.route.addr.dst_addr, &r->id.route.addr.addr.ibaddr.dgid);
	rc_route_fill(r, NULL);
	r->req_responder_resources = ev->responder_resources;
	r->req_initiator_depth = ev->initiator_depth;
	ibcm_accept_param_init(ctx, &r->accept);  /* cannot fail with a valid pointer */
	r->accept.responder_resources = ev->responder_resources;
	r->accept.initiator_depth = ev->initiator_depth;
	e = rc_event_new(r, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
	if (!e) {
		ibcm_reject(ctx, ev->conn, 28, NULL, 0);
		ibcm_ack_event(ctx, ev);
		return;
	}
	e->listener = l;
	l->refs++;
	e->ev.listen_id = &l->id;
	if (sidr) {
		ud_param(e, r, ev);
		e->ev.param.ud.qp_num = 0;
		e->ev.param.ud.qkey = 0;
		r->sidr_req = ev;     /* acknowledged once answered */
	} else {
		conn_param(e, ev, IBCM_REQ_RDMA_CM_PRIVATE_DATA_MAX);
	}
	rc_event_queue(e);
	if (!sidr)
		ibcm_ack_event(ctx, ev);
}

static void on_response(struct rc_id *r, struct ibcm_event *ev, struct ibcm_ctx *ctx)
{
	struct rc_event *e;
	int st;

	if (r->destroyed)
		return;  /* rdma_destroy_id has cancelled it: the final event follows */
	if (r->id.qp && !r->manual_establish) {
		/* librdmacm's ucma_process_conn_resp: RTR, RTS, then the RTU */
		if (rc_qp_modify_cm(r, IBV_QPS_INIT, NULL) || rc_qp_modify_cm(r, IBV_QPS_RTR, NULL) ||
		    rc_qp_modify_cm(r, IBV_QPS_RTS, NULL)) {
			r->connect_error = errno;
			rc_qp_error(r);
			ibcm_reject(ctx, r->conn, 28, NULL, 0);
			return;  /* libibcm's CONNECT_ERROR ("rejected locally") reports it */
		}
		st = ibcm_establish(ctx, r->conn, NULL, 0);
		if (st && st != IBCM_ECLOSED)
			r->connect_error = rc_errno(st);
		return;  /* libibcm's ESTABLISHED follows */
	}
	e = rc_event_new(r, RDMA_CM_EVENT_CONNECT_RESPONSE, 0);
	if (!e)
		return;
	conn_param(e, ev, IBCM_REP_PRIVATE_DATA_MAX);
	rc_event_queue(e);
}

static void on_established(struct rc_id *r, struct ibcm_event *ev)
{
	struct rc_event *e;

	if (r->destroyed)
		return;
	if (!r->listener && r->manual_establish) {
		r->state = RC_ESTABLISHED;
		return;  /* rdma_establish: the kernel reports nothing more */
	}
	r->state = RC_ESTABLISHED;
	e = rc_event_new(r, RDMA_CM_EVENT_ESTABLISHED, 0);
	if (!e)
		return;
	if (r->listener) {
		conn_param(e, ev, IBCM_RTU_PRIVATE_DATA_MAX);
		e->ev.param.conn.qp_num = 0;
	} else {
		conn_param(e, ev, IBCM_REP_PRIVATE_DATA_MAX);
	}
	rc_event_queue(e);
}

static void on_final(struct rc_id *r, struct ibcm_event *ev)
{
	enum rdma_cm_event_type type;
	struct rc_event *e;
	int status = 0;

	if (r->destroyed || r->rejected_here) {
		if (r->connect_error && !r->destroyed) {
			/* our QP transitions failed at the REP: as librdmacm, CONNECT_ERROR */
			rc_event_queue_now(r, RDMA_CM_EVENT_CONNECT_ERROR, -r->connect_error);
		}
		handle_done(r);
		return;
	}
	switch (ev->event) {
	case IBCM_EVENT_REJECTED:
		type = RDMA_CM_EVENT_REJECTED;
		status = ev->rej_reason;
		if (r->id.qp && r->id.qp_type != IBV_QPT_UD)
			rc_qp_error(r);
		break;
	case IBCM_EVENT_UNREACHABLE:
		type = RDMA_CM_EVENT_UNREACHABLE;
		status = -ETIMEDOUT;
		break;
	case IBCM_EVENT_DISCONNECTED:
		type = RDMA_CM_EVENT_DISCONNECTED;
		break;
	case IBCM_EVENT_SIDR_REPLY:
		if (ev->sidr_status == 0) {
			type = RDMA_CM_EVENT_ESTABLISHED;
		} else {
			type = RDMA_CM_EVENT_UNREACHABLE;
			status = (int)ev->sidr_status;
		}
		break;
	default: /* CONNECT_ERROR */
		if (r->connect_error) {
			type = RDMA_CM_EVENT_CONNECT_ERROR;
			status = -r->connect_error;
		} else if (ev->status == IBCM_ETIMEDOUT) {
			type = RDMA_CM_EVENT_UNREACHABLE;
			status = -ETIMEDOUT;
		} else if (ev->status == IBCM_EGONE) {
			type = RDMA_CM_EVENT_DEVICE_REMOVAL;
			status = -ENODEV;
		} else {
			type = RDMA_CM_EVENT_CONNECT_ERROR;
			status = ev->rej_reason ? -ECONNREFUSED : -ECONNABORTED;
		}
		rc_trace("id %p: connection error: %s", (void *)r, ev->reason);
		break;
	}
	e = rc_event_new(r, type, status);
	if (e) {
		if (ev->event == IBCM_EVENT_SIDR_REPLY)
			ud_param(e, r, ev);
		else if (ev->event == IBCM_EVENT_REJECTED)
			conn_param(e, ev, IBCM_REJ_PRIVATE_DATA_MAX);
		else if (ev->event == IBCM_EVENT_DISCONNECTED)
			conn_param(e, ev, IBCM_DREQ_PRIVATE_DATA_MAX);
		if (ev->event == IBCM_EVENT_REJECTED || ev->event == IBCM_EVENT_DISCONNECTED)
			e->ev.param.conn.qp_num = 0;
		rc_event_queue(e);
	}
	if (ev->event == IBCM_EVENT_SIDR_REPLY && ev->sidr_status == 0) {
		r->conn = 0;
		r->state = RC_ESTABLISHED;
		rc_id_put(r);
		return;
	}
	handle_done(r);
}

void rc_translate(struct ibcm_event *ev)
{
	struct ibcm_ctx *ctx = rc_session();
	struct rc_id *r = rc_id_find((uint64_t)(uintptr_t)ev->context);

	rc_trace("libibcm %s conn %llu status %d (%s)", ibcm_event_str(ev->event),
		 (unsigned long long)ev->conn, ev->status, ev->reason ? ev->reason : "");
	switch (ev->event) {
	case IBCM_EVENT_CONNECT_REQUEST:
	case IBCM_EVENT_SIDR_REQUEST:
		on_request(r, ev, ctx);
		return;  /* acknowledged there (or kept until answered) */
	case IBCM_EVENT_CONNECT_RESPONSE:
		if (r && r->conn == ev->conn)
			on_response(r, ev, ctx);
		break;
	case IBCM_EVENT_ESTABLISHED:
		if (r && r->conn == ev->conn)
			on_established(r, ev);
		break;
	case IBCM_EVENT_REJECTED:
	case IBCM_EVENT_UNREACHABLE:
	case IBCM_EVENT_CONNECT_ERROR:
	case IBCM_EVENT_DISCONNECTED:
	case IBCM_EVENT_SIDR_REPLY:
		if (r && r->conn == ev->conn)
			on_final(r, ev);
		break;
	default:
		break;
	}
	ibcm_ack_event(ctx, ev);
}
