/*
 * ibcm-xrc C shim, RC part: flat, errno-returning wrappers around the libibverbs calls an RC
 * QP with data needs (device and PD, completion channel and CQ, memory regions, RC QPs,
 * posting and polling). ibv_post_send, ibv_post_recv, ibv_poll_cq and ibv_req_notify_cq are
 * `static inline` in <infiniband/verbs.h>, so, as for the XRC verbs in shim.c, they are
 * compiled here against the system header. Modify-QP goes through shim.c's
 * ibcm_xrc_modify_qp (its attribute struct covers RC).
 *
 * Conventions as in shim.c: 0 or a positive errno; results through out-pointers; Rust never
 * looks inside a libibverbs structure. The structs below are this shim's own, mirrored in
 * src/verbs/rc/sys.rs.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

/* Mirrored in src/verbs/rc/sys.rs (`DevAttr`). */
struct ibcm_rc_dev_attr {
	uint64_t max_mr_size;
	uint32_t max_qp_wr;
	uint32_t max_cqe;
	uint32_t max_sge;
	uint8_t max_qp_rd_atom;
	uint8_t max_qp_init_rd_atom;
	uint8_t phys_port_cnt;
	uint8_t pad;
};

/* Mirrored in src/verbs/rc/sys.rs (`PortAttr`). */
struct ibcm_rc_port_attr {
	uint32_t state;
	uint32_t max_mtu;
	uint32_t active_mtu;
	uint32_t gid_tbl_len;
	uint8_t link_layer;
	uint8_t pad[3];
};

/* Mirrored in src/verbs/rc/sys.rs (`Wc`). */
struct ibcm_rc_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode; /* this shim's: 0 send, 1 RDMA write, 2 RDMA read, 3 recv, 255 other */
	uint32_t byte_len;
	uint32_t qp_num;
	uint32_t vendor_err;
	uint32_t pad;
};

struct ibcm_rc_dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
};

struct ibcm_rc_cq {
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
};

struct ibcm_rc_mr {
	struct ibv_mr *mr;
	void *buf;
	size_t len;
};

static int errno_or(int fallback)
{
	return errno ? errno : fallback;
}

int ibcm_rc_open(const char *name, struct ibcm_rc_dev **out, struct ibcm_rc_dev_attr *attr)
{
	struct ibv_device **list;
	struct ibv_device *dev = NULL;
	struct ibv_device_attr a;
	struct ibcm_rc_dev *d;
	int num = 0, i, ret;

	*out = NULL;
	errno = 0;
	list = ibv_get_device_list(&num);
	if (!list)
		return ENODEV;
	for (i = 0; i < num; i++) {
		if (strcmp(ibv_get_device_name(list[i]), name) == 0) {
			dev = list[i];
			break;
		}
	}
	if (!dev) {
		ibv_free_device_list(list);
		return num == 0 ? ENODEV : ENOENT;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		ibv_free_device_list(list);
		return ENOMEM;
	}
	errno = 0;
	d->ctx = ibv_open_device(dev);
	ibv_free_device_list(list);
	if (!d->ctx) {
		ret = errno_or(EIO);
		free(d);
		return ret;
	}
	memset(&a, 0, sizeof(a));
	ret = ibv_query_device(d->ctx, &a);
	if (ret)
		goto err;
	errno = 0;
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd) {
		ret = errno_or(ENOMEM);
		goto err;
	}
	attr->max_mr_size = a.max_mr_size;
	attr->max_qp_wr = (uint32_t)a.max_qp_wr;
	attr->max_cqe = (uint32_t)a.max_cqe;
	attr->max_sge = (uint32_t)a.max_sge;
	attr->max_qp_rd_atom = a.max_qp_rd_atom > 255 ? 255 : (uint8_t)a.max_qp_rd_atom;
	attr->max_qp_init_rd_atom =
		a.max_qp_init_rd_atom > 255 ? 255 : (uint8_t)a.max_qp_init_rd_atom;
	attr->phys_port_cnt = a.phys_port_cnt;
	*out = d;
	return 0;
err:
	ibv_close_device(d->ctx);
	free(d);
	return ret;
}

void ibcm_rc_close(struct ibcm_rc_dev *d)
{
	if (!d)
		return;
	ibv_dealloc_pd(d->pd);
	ibv_close_device(d->ctx);
	free(d);
}

int ibcm_rc_query_port(struct ibcm_rc_dev *d, uint8_t port, struct ibcm_rc_port_attr *out)
{
	struct ibv_port_attr a;
	int ret;

	memset(&a, 0, sizeof(a));
	ret = ibv_query_port(d->ctx, port, &a);
	if (ret)
		return ret;
	out->state = (uint32_t)a.state;
	out->max_mtu = (uint32_t)a.max_mtu;
	out->active_mtu = (uint32_t)a.active_mtu;
	out->gid_tbl_len = (uint32_t)a.gid_tbl_len;
	out->link_layer = a.link_layer;
	return 0;
}

int ibcm_rc_query_gid(struct ibcm_rc_dev *d, uint8_t port, int index, uint8_t gid[16])
{
	union ibv_gid g;
	int ret;

	ret = ibv_query_gid(d->ctx, port, index, &g);
	if (ret)
		return ret;
	memcpy(gid, g.raw, 16);
	return 0;
}

/* A CQ with its own completion channel: the channel's fd is non-blocking, the CQ is armed. */
int ibcm_rc_cq_create(struct ibcm_rc_dev *d, int cqe, struct ibcm_rc_cq **out, int *fd)
{
	struct ibcm_rc_cq *c;
	int flags, ret;

	*out = NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return ENOMEM;
	errno = 0;
	c->channel = ibv_create_comp_channel(d->ctx);
	if (!c->channel) {
		ret = errno_or(ENOMEM);
		free(c);
		return ret;
	}
	flags = fcntl(c->channel->fd, F_GETFL);
	if (flags < 0 || fcntl(c->channel->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
		ret = errno_or(EINVAL);
		goto err_channel;
	}
	errno = 0;
	c->cq = ibv_create_cq(d->ctx, cqe, NULL, c->channel, 0);
	if (!c->cq) {
		ret = errno_or(ENOMEM);
		goto err_channel;
	}
	ret = ibv_req_notify_cq(c->cq, 0);
	if (ret) {
		ibv_destroy_cq(c->cq);
		goto err_channel;
	}
	*fd = c->channel->fd;
	*out = c;
	return 0;
err_channel:
	ibv_destroy_comp_channel(c->channel);
	free(c);
	return ret;
}

int ibcm_rc_cq_destroy(struct ibcm_rc_cq *c)
{
	int ret;

	ret = ibv_destroy_cq(c->cq);
	if (ret)
		return ret;
	ibv_destroy_comp_channel(c->channel);
	free(c);
	return 0;
}

int ibcm_rc_cq_arm(struct ibcm_rc_cq *c)
{
	return ibv_req_notify_cq(c->cq, 0);
}

/* Takes one completion event off the channel without blocking and acknowledges it:
 * 0 = one taken, EAGAIN = none pending. */
int ibcm_rc_cq_take_event(struct ibcm_rc_cq *c)
{
	struct ibv_cq *ev_cq;
	void *ev_ctx;

	errno = 0;
	if (ibv_get_cq_event(c->channel, &ev_cq, &ev_ctx))
		return errno_or(EAGAIN);
	ibv_ack_cq_events(ev_cq, 1);
	return 0;
}

static uint32_t wc_opcode(enum ibv_wc_opcode op)
{
	switch (op) {
	case IBV_WC_SEND:
		return 0;
	case IBV_WC_RDMA_WRITE:
		return 1;
	case IBV_WC_RDMA_READ:
		return 2;
	case IBV_WC_RECV:
		return 3;
	default:
		return 255;
	}
}

/* Polls up to n completions into out: returns their number (>= 0) or a negative errno. */
int ibcm_rc_cq_poll(struct ibcm_rc_cq *c, struct ibcm_rc_wc *out, int n)
{
	struct ibv_wc wc[16];
	int got, i;

	if (n > 16)
		n = 16;
	got = ibv_poll_cq(c->cq, n, wc);
	if (got < 0)
		return -EIO;
	for (i = 0; i < got; i++) {
		memset(&out[i], 0, sizeof(out[i]));
		out[i].wr_id = wc[i].wr_id;
		out[i].status = (uint32_t)wc[i].status;
		/* opcode and byte_len are only valid for a successful completion */
		out[i].opcode = wc[i].status == IBV_WC_SUCCESS ? wc_opcode(wc[i].opcode) : 255;
		out[i].byte_len = wc[i].byte_len;
		out[i].qp_num = wc[i].qp_num;
		out[i].vendor_err = wc[i].vendor_err;
	}
	return got;
}

/* Registers a new zeroed, page-aligned buffer of len bytes. */
int ibcm_rc_mr_reg(struct ibcm_rc_dev *d, size_t len, int access, struct ibcm_rc_mr **out,
		   uint64_t *addr, uint32_t *lkey, uint32_t *rkey)
{
	struct ibcm_rc_mr *m;
	long page = sysconf(_SC_PAGESIZE);
	int ret;

	*out = NULL;
	if (len == 0)
		return EINVAL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return ENOMEM;
	ret = posix_memalign(&m->buf, page > 0 ? (size_t)page : 4096, len);
	if (ret) {
		free(m);
		return ret;
	}
	memset(m->buf, 0, len);
	m->len = len;
	errno = 0;
	m->mr = ibv_reg_mr(d->pd, m->buf, len, access);
	if (!m->mr) {
		ret = errno_or(ENOMEM);
		free(m->buf);
		free(m);
		return ret;
	}
	*addr = (uint64_t)(uintptr_t)m->buf;
	*lkey = m->mr->lkey;
	*rkey = m->mr->rkey;
	*out = m;
	return 0;
}

int ibcm_rc_mr_dereg(struct ibcm_rc_mr *m)
{
	int ret;

	ret = ibv_dereg_mr(m->mr);
	if (ret)
		return ret;
	free(m->buf);
	free(m);
	return 0;
}

int ibcm_rc_mr_write(struct ibcm_rc_mr *m, size_t off, const void *src, size_t len)
{
	if (off > m->len || len > m->len - off)
		return EINVAL;
	memcpy((char *)m->buf + off, src, len);
	return 0;
}

int ibcm_rc_mr_read(struct ibcm_rc_mr *m, size_t off, void *dst, size_t len)
{
	if (off > m->len || len > m->len - off)
		return EINVAL;
	memcpy(dst, (const char *)m->buf + off, len);
	return 0;
}

int ibcm_rc_qp_create(struct ibcm_rc_dev *d, struct ibcm_rc_cq *send_cq,
		      struct ibcm_rc_cq *recv_cq, uint32_t max_send_wr, uint32_t max_recv_wr,
		      uint32_t max_inline, struct ibv_qp **out, uint32_t *qpn)
{
	struct ibv_qp_init_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_type = IBV_QPT_RC;
	a.send_cq = send_cq->cq;
	a.recv_cq = recv_cq->cq;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = max_recv_wr;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = max_inline;
	errno = 0;
	*out = ibv_create_qp(d->pd, &a);
	if (!*out)
		return errno_or(EINVAL);
	*qpn = (*out)->qp_num;
	return 0;
}

int ibcm_rc_qp_to_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

int ibcm_rc_qp_state(struct ibv_qp *qp, uint32_t *state)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr init;
	int ret;

	memset(&a, 0, sizeof(a));
	memset(&init, 0, sizeof(init));
	ret = ibv_query_qp(qp, &a, IBV_QP_STATE, &init);
	if (ret)
		return ret;
	*state = (uint32_t)a.qp_state;
	return 0;
}

/* op: 0 SEND, 1 RDMA WRITE, 2 RDMA READ. One SGE from the MR at off, len bytes. */
int ibcm_rc_post_send(struct ibv_qp *qp, uint64_t wr_id, int op, struct ibcm_rc_mr *m,
		      size_t off, uint32_t len, uint64_t raddr, uint32_t rkey, int signaled)
{
	struct ibv_send_wr wr, *bad = NULL;
	struct ibv_sge sge;

	if (off > m->len || len > m->len - off)
		return EINVAL;
	memset(&wr, 0, sizeof(wr));
	memset(&sge, 0, sizeof(sge));
	sge.addr = (uint64_t)(uintptr_t)m->buf + off;
	sge.length = len;
	sge.lkey = m->mr->lkey;
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
	switch (op) {
	case 0:
		wr.opcode = IBV_WR_SEND;
		break;
	case 1:
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
		break;
	case 2:
		wr.opcode = IBV_WR_RDMA_READ;
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
		break;
	default:
		return EINVAL;
	}
	return ibv_post_send(qp, &wr, &bad);
}

int ibcm_rc_post_recv(struct ibv_qp *qp, uint64_t wr_id, struct ibcm_rc_mr *m, size_t off,
		      uint32_t len)
{
	struct ibv_recv_wr wr, *bad = NULL;
	struct ibv_sge sge;

	if (off > m->len || len > m->len - off)
		return EINVAL;
	memset(&wr, 0, sizeof(wr));
	memset(&sge, 0, sizeof(sge));
	sge.addr = (uint64_t)(uintptr_t)m->buf + off;
	sge.length = len;
	sge.lkey = m->mr->lkey;
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return ibv_post_recv(qp, &wr, &bad);
}

/* Layout checks for the Rust mirrors. */
size_t ibcm_rc_dev_attr_size(void)
{
	return sizeof(struct ibcm_rc_dev_attr);
}

size_t ibcm_rc_port_attr_size(void)
{
	return sizeof(struct ibcm_rc_port_attr);
}

size_t ibcm_rc_wc_size(void)
{
	return sizeof(struct ibcm_rc_wc);
}
