/*
 * qp.c -- QPs, SRQs and CQs of an id (rdma_create_qp, rdma_create_qp_ex, rdma_destroy_qp,
 * rdma_create_srq, rdma_create_srq_ex, rdma_destroy_srq), and the QP attributes of each
 * transition (rdma_init_qp_attr).
 *
 * The attributes of a connection's transitions are libibcm's (ibcm_init_qp_attr, computed
 * as the kernel's ib_cm_init_qp_attr from the REQ and REP); before there is a connection,
 * INIT is the local one (port, P_Key index 0, no remote access) as rdma_cm's; a UD QP of
 * the UDP port space gets rdma_cm's Q_Key (RDMA_UDP_QKEY) and goes to RTS at creation.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rdmacm.h"

struct ibcm_port rc_port(const struct rc_id *r)
{
	struct ibcm_port p;
	struct ibv_port_attr pa;

	memset(&p, 0, sizeof(p));
	p.port_num = r->id.port_num ? r->id.port_num : 1;
	p.sgid_index = r->sgid_index;
	p.pkey_index = 0;
	p.link_layer = IBCM_LINK_LAYER_ETHERNET;
	if (r->dev && !ibv_query_port(r->dev->verbs, p.port_num, &pa)) {
		p.lmc = pa.lmc;
		if (pa.link_layer == IBV_LINK_LAYER_INFINIBAND)
			p.link_layer = IBCM_LINK_LAYER_INFINIBAND;
	}
	return p;
}

static void ah_from_ibcm(struct ibv_ah_attr *a, const struct ibcm_ah_attr *s)
{
	memset(a, 0, sizeof(*a));
	memcpy(a->grh.dgid.raw, s->grh.dgid, 16);
	a->grh.flow_label = s->grh.flow_label;
	a->grh.sgid_index = s->grh.sgid_index;
	a->grh.hop_limit = s->grh.hop_limit;
	a->grh.traffic_class = s->grh.traffic_class;
	a->dlid = s->dlid;
	a->sl = s->sl;
	a->src_path_bits = s->src_path_bits;
	a->static_rate = s->static_rate;
	a->is_global = s->is_global;
	a->port_num = s->port_num;
}

/* libibcm's attributes for `state` as ibv_qp_attr (the mask bits are ibv's). */
static int cm_attr(struct rc_id *r, int state, const struct ibcm_accept_param *accept,
		   struct ibv_qp_attr *a, int *mask)
{
	struct ibcm_port port = rc_port(r);
	struct ibcm_qp_attr q;
	struct ibcm_ctx *ctx = rc_session();
	int st;

	if (!ctx)
		return -1;
	st = ibcm_init_qp_attr(ctx, r->conn, state, &port, accept, &q, mask);
	if (st)
		return rc_fail(st);
	memset(a, 0, sizeof(*a));
	a->qp_state = (enum ibv_qp_state)q.qp_state;
	a->qp_access_flags = (int)q.qp_access_flags;
	a->pkey_index = q.pkey_index;
	a->port_num = q.port_num;
	a->path_mtu = (enum ibv_mtu)q.path_mtu;
	ah_from_ibcm(&a->ah_attr, &q.ah_attr);
	a->dest_qp_num = q.dest_qp_num;
	a->rq_psn = q.rq_psn;
	a->max_dest_rd_atomic = q.max_dest_rd_atomic;
	a->min_rnr_timer = q.min_rnr_timer;
	a->alt_pkey_index = q.alt_pkey_index;
	ah_from_ibcm(&a->alt_ah_attr, &q.alt_ah_attr);
	a->alt_port_num = q.alt_port_num;
	a->alt_timeout = q.alt_timeout;
	a->timeout = q.timeout;
	a->retry_cnt = q.retry_cnt;
	a->sq_psn = q.sq_psn;
	a->rnr_retry = q.rnr_retry;
	a->max_rd_atomic = q.max_rd_atomic;
	a->path_mig_state = (enum ibv_mig_state)q.path_mig_state;
	if (state == IBV_QPS_RTS && r->ack_timeout && (*mask & IBV_QP_TIMEOUT))
		a->timeout = r->ack_timeout;  /* RDMA_OPTION_ID_ACK_TIMEOUT */
	return 0;
}

/* The INIT attributes before a connection exists (rdma_cm's cma_ib_init_qp_attr). */
static void local_init_attr(struct rc_id *r, struct ibv_qp_attr *a, int *mask)
{
	memset(a, 0, sizeof(*a));
	a->qp_state = IBV_QPS_INIT;
	a->pkey_index = 0;
	a->port_num = r->id.port_num ? r->id.port_num : 1;
	*mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	if (r->id.qp_type == IBV_QPT_UD) {
		a->qkey = RDMA_UDP_QKEY;
		*mask |= IBV_QP_QKEY;
	} else {
		a->qp_access_flags = 0;
		*mask |= IBV_QP_ACCESS_FLAGS;
	}
}

int rc_qp_to_init_local(struct rc_id *r, struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	int mask, ret;

	local_init_attr(r, &a, &mask);
	ret = ibv_modify_qp(qp, &a, mask);
	return ret ? rc_err(ret) : 0;
}

int rc_qp_ud_ready(struct rc_id *r, struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	int ret;

	if (rc_qp_to_init_local(r, qp))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	if (ret)
		return rc_err(ret);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	return ret ? rc_err(ret) : 0;
}

int rc_qp_modify_cm(struct rc_id *r, int state, const struct ibcm_accept_param *accept)
{
	struct ibv_qp_attr a;
	int mask, ret;

	if (cm_attr(r, state, accept, &a, &mask))
		return -1;
	if (state == IBV_QPS_RTR && r->resp_res && r->resp_res != RDMA_MAX_RESP_RES)
		a.max_dest_rd_atomic = r->resp_res;
	if (state == IBV_QPS_RTS && r->init_depth && r->init_depth != RDMA_MAX_INIT_DEPTH)
		a.max_rd_atomic = r->init_depth;
	ret = ibv_modify_qp(r->id.qp, &a, mask);
	if (ret) {
		rc_trace("id %p: ibv_modify_qp to state %d failed: %d", (void *)r, state, ret);
		return rc_err(ret);
	}
	return 0;
}

int rc_qp_error(struct rc_id *r)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	return r->id.qp ? ibv_modify_qp(r->id.qp, &a, IBV_QP_STATE) : 0;
}

/* The address vector to the id's peer on RoCE (param.ud.ah_attr of UD events). */
void rc_ud_ah_attr(struct rc_id *r, struct ibv_ah_attr *ah)
{
	memset(ah, 0, sizeof(*ah));
	ah->is_global = 1;
	ah->grh.dgid = r->id.route.addr.addr.ibaddr.dgid;
	ah->grh.sgid_index = r->sgid_index;
	ah->grh.hop_limit = 64;
	ah->port_num = r->id.port_num ? r->id.port_num : 1;
}

RC_EXPORT int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr,
				int *qp_attr_mask)
{
	struct rc_id *r = rc_id_of(id);
	int ret;

	if (rc_usable(r))
		return -1;
	if (!qp_attr || !qp_attr_mask)
		return rc_err(EINVAL);
	if (r->id.qp_type == IBV_QPT_UD) {
		switch (qp_attr->qp_state) {
		case IBV_QPS_INIT:
			local_init_attr(r, qp_attr, qp_attr_mask);
			return 0;
		case IBV_QPS_RTR:
			memset(qp_attr, 0, sizeof(*qp_attr));
			qp_attr->qp_state = IBV_QPS_RTR;
			*qp_attr_mask = IBV_QP_STATE;
			return 0;
		case IBV_QPS_RTS:
			memset(qp_attr, 0, sizeof(*qp_attr));
			qp_attr->qp_state = IBV_QPS_RTS;
			*qp_attr_mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
			return 0;
		default:
			return rc_err(EINVAL);
		}
	}
	if (qp_attr->qp_state != IBV_QPS_INIT && qp_attr->qp_state != IBV_QPS_RTR &&
	    qp_attr->qp_state != IBV_QPS_RTS)
		return rc_err(EINVAL);
	if (!r->conn) {
		if (qp_attr->qp_state != IBV_QPS_INIT)
			return rc_err(EINVAL);
		local_init_attr(r, qp_attr, qp_attr_mask);
		return 0;
	}
	pthread_mutex_lock(&rc_lock);
	if (r->listener && !r->answered && !r->accept.qp_num) {
		/* before rdma_accept: the request's offer, as rdma_accept will answer it */
		r->resp_res = r->req_responder_resources;
		r->init_depth = r->req_initiator_depth;
	}
	{
		int state = qp_attr->qp_state;
		struct ibcm_accept_param acc = r->accept;

		if (!acc.qp_num)
			acc.qp_num = 1;  /* not sent: only the attributes are computed */
		ret = cm_attr(r, state, r->listener && !r->answered ? &acc : NULL, qp_attr,
			      qp_attr_mask);
		if (!ret && state == IBV_QPS_RTR && r->resp_res &&
		    r->resp_res != RDMA_MAX_RESP_RES)
			qp_attr->max_dest_rd_atomic = r->resp_res;
		if (!ret && state == IBV_QPS_RTS && r->init_depth &&
		    r->init_depth != RDMA_MAX_INIT_DEPTH)
			qp_attr->max_rd_atomic = r->init_depth;
	}
	pthread_mutex_unlock(&rc_lock);
	return ret;
}

/* CQs and completion channels for a QP created without them (librdmacm's ucma_create_cqs):
 * id->send_cq_channel / send_cq and id->recv_cq_channel / recv_cq. */
static int create_cqs(struct rc_id *r, uint32_t send_size, uint32_t recv_size)
{
	struct ibv_context *v = r->id.verbs;

	if (recv_size) {
		r->id.recv_cq_channel = ibv_create_comp_channel(v);
		if (!r->id.recv_cq_channel)
			goto err;
		r->id.recv_cq = ibv_create_cq(v, (int)recv_size, &r->id, r->id.recv_cq_channel, 0);
		if (!r->id.recv_cq)
			goto err;
	}
	if (send_size) {
		r->id.send_cq_channel = ibv_create_comp_channel(v);
		if (!r->id.send_cq_channel)
			goto err;
		r->id.send_cq = ibv_create_cq(v, (int)send_size, &r->id, r->id.send_cq_channel, 0);
		if (!r->id.send_cq)
			goto err;
	}
	r->own_cqs = 1;
	return 0;
err:
	{
		int e = errno ? errno : ENOMEM;

		r->own_cqs = 1;
		rdma_destroy_qp(&r->id);
		return rc_err(e);
	}
}

static void destroy_cqs(struct rc_id *r)
{
	if (!r->own_cqs)
		return;
	if (r->id.recv_cq)
		ibv_destroy_cq(r->id.recv_cq);
	if (r->id.recv_cq_channel)
		ibv_destroy_comp_channel(r->id.recv_cq_channel);
	if (r->id.send_cq && r->id.send_cq != r->id.recv_cq)
		ibv_destroy_cq(r->id.send_cq);
	if (r->id.send_cq_channel)
		ibv_destroy_comp_channel(r->id.send_cq_channel);
	r->id.recv_cq = r->id.send_cq = NULL;
	r->id.recv_cq_channel = r->id.send_cq_channel = NULL;
	r->own_cqs = 0;
}

static struct ibv_pd *default_pd(struct rc_id *r)
{
	if (r->id.pd)
		return r->id.pd;
	pthread_mutex_lock(&rc_lock);
	if (!r->dev->pd)
		r->dev->pd = ibv_alloc_pd(r->dev->verbs);
	pthread_mutex_unlock(&rc_lock);
	return r->dev->pd;
}

/* The transitions a new QP gets (librdmacm's ucma_init_*_qp). */
static int init_new_qp(struct rc_id *r, struct ibv_qp *qp)
{
	if (qp->qp_type == IBV_QPT_UD)
		return rc_qp_ud_ready(r, qp);
	if (qp->qp_type == IBV_QPT_XRC_RECV)
		return 0;  /* the XRC target QP's transitions come with the connection */
	return rc_qp_to_init_local(r, qp);
}

RC_EXPORT int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr)
{
	struct rc_id *r = rc_id_of(id);
	struct ibv_qp *qp;

	if (rc_usable(r))
		return -1;
	if (!attr || !r->dev || id->qp)
		return rc_err(EINVAL);
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
		attr->pd = default_pd(r);
		if (!attr->pd)
			return rc_err(ENOMEM);
		attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
	}
	if (attr->pd->context != id->verbs)
		return rc_err(EINVAL);
	if ((attr->qp_type != IBV_QPT_XRC_RECV) && (!attr->send_cq || !attr->recv_cq) &&
	    !id->send_cq && !id->recv_cq) {
		if (create_cqs(r, attr->send_cq ? 0 : attr->cap.max_send_wr + 1,
			       attr->recv_cq || attr->srq ? 0 : attr->cap.max_recv_wr + 1))
			return -1;
	}
	if (attr->qp_type != IBV_QPT_XRC_RECV) {
		if (!attr->send_cq)
			attr->send_cq = id->send_cq;
		if (!attr->recv_cq)
			attr->recv_cq = id->recv_cq ? id->recv_cq : attr->send_cq;
	}
	if (id->srq && !attr->srq)
		attr->srq = id->srq;
	qp = ibv_create_qp_ex(id->verbs, attr);
	if (!qp) {
		int e = errno ? errno : ENOMEM;

		destroy_cqs(r);
		return rc_err(e);
	}
	if (init_new_qp(r, qp)) {
		int e = errno;

		ibv_destroy_qp(qp);
		destroy_cqs(r);
		return rc_err(e);
	}
	id->qp = qp;
	id->qp_type = qp->qp_type;
	id->pd = attr->pd;
	return 0;
}

RC_EXPORT int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd,
			     struct ibv_qp_init_attr *qp_init_attr)
{
	struct ibv_qp_init_attr_ex ax;
	int ret;

	if (!id || !qp_init_attr)
		return rc_err(EINVAL);
	memset(&ax, 0, sizeof(ax));
	memcpy(&ax, qp_init_attr, sizeof(*qp_init_attr));
	ax.comp_mask = IBV_QP_INIT_ATTR_PD;
	ax.pd = pd;
	ret = rdma_create_qp_ex(id, &ax);
	if (!ret) {
		/* as ibv_create_qp: the caller's attributes get the QP's actual capacities */
		memcpy(qp_init_attr, &ax, sizeof(*qp_init_attr));
	}
	return ret;
}

RC_EXPORT void rdma_destroy_qp(struct rdma_cm_id *id)
{
	struct rc_id *r = rc_id_of(id);

	if (!id || r->pid != getpid())
		return;  /* NULL, or a fork child's copy: the QP is the parent's */
	if (id->qp)
		ibv_destroy_qp(id->qp);
	id->qp = NULL;
	destroy_cqs(r);
}

RC_EXPORT int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)
{
	struct rc_id *r = rc_id_of(id);
	struct ibv_srq *srq;

	if (rc_usable(r))
		return -1;
	if (!attr || !r->dev)
		return rc_err(EINVAL);
	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)) {
		attr->comp_mask |= IBV_SRQ_INIT_ATTR_TYPE;
		attr->srq_type = IBV_SRQT_BASIC;
	}
	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
		attr->pd = default_pd(r);
		if (!attr->pd)
			return rc_err(ENOMEM);
		attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
	}
	if (attr->srq_type == IBV_SRQT_XRC && !(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ)) {
		if (!id->recv_cq && create_cqs(r, 0, attr->attr.max_wr + 1))
			return -1;
		attr->cq = id->recv_cq;
		attr->comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
	}
	srq = ibv_create_srq_ex(id->verbs, attr);
	if (!srq)
		return rc_err(errno ? errno : ENOMEM);
	id->srq = srq;
	id->pd = attr->pd;
	return 0;
}

RC_EXPORT int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd,
			      struct ibv_srq_init_attr *attr)
{
	struct ibv_srq_init_attr_ex ax;
	int ret;

	if (!id || !attr)
		return rc_err(EINVAL);
	memset(&ax, 0, sizeof(ax));
	memcpy(&ax, attr, sizeof(*attr));
	ax.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
	ax.srq_type = id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
	ax.pd = pd;
	ret = rdma_create_srq_ex(id, &ax);
	if (!ret)
		memcpy(attr, &ax, sizeof(*attr));
	return ret;
}

RC_EXPORT void rdma_destroy_srq(struct rdma_cm_id *id)
{
	if (!id || !id->srq || rc_id_of(id)->pid != getpid())
		return;
	ibv_destroy_srq(id->srq);
	id->srq = NULL;
}
