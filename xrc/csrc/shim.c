/*
 * ibcm-xrc C shim: flat, errno-returning wrappers around the libibverbs XRC verbs.
 *
 * Most XRC verbs (ibv_open_xrcd, ibv_close_xrcd, ibv_create_qp_ex, ibv_open_qp,
 * ibv_create_srq_ex, ibv_get_srq_num, ibv_query_device_ex) are `static inline` in
 * <infiniband/verbs.h>: they find the provider's function table through `struct verbs_context`.
 * Compiling them here, against the system header, is what makes them correct; hand-ported
 * Rust copies got the ABI marker wrong (docs/xrc.md §6.1).
 *
 * Conventions: every function returns 0 or a positive errno value and writes its results
 * through out-pointers; no function keeps a pointer it was given beyond the call except the
 * device record. Rust never looks inside any libibverbs structure: it only passes the
 * pointers back. The attribute struct below is this shim's own, mirrored in src/ffi.rs.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

/* Mirrored in src/ffi.rs (`ShimAv`). */
struct ibcm_xrc_av {
	uint8_t dgid[16];
	uint32_t flow_label;
	uint16_t dlid;
	uint8_t sgid_index;
	uint8_t hop_limit;
	uint8_t traffic_class;
	uint8_t sl;
	uint8_t src_path_bits;
	uint8_t static_rate;
	uint8_t is_global;
	uint8_t port_num;
};

/* Mirrored in src/ffi.rs (`ShimQpAttr`). */
struct ibcm_xrc_qp_attr {
	uint32_t qp_state;
	uint32_t cur_qp_state;
	uint32_t path_mtu;
	uint32_t path_mig_state;
	uint32_t qkey;
	uint32_t rq_psn;
	uint32_t sq_psn;
	uint32_t dest_qp_num;
	uint32_t qp_access_flags;
	uint16_t pkey_index;
	uint16_t alt_pkey_index;
	uint8_t en_sqd_async_notify;
	uint8_t max_rd_atomic;
	uint8_t max_dest_rd_atomic;
	uint8_t min_rnr_timer;
	uint8_t port_num;
	uint8_t timeout;
	uint8_t retry_cnt;
	uint8_t rnr_retry;
	uint8_t alt_port_num;
	uint8_t alt_timeout;
	struct ibcm_xrc_av av;
	struct ibcm_xrc_av alt_av;
};

/* One opened device, with the PD and CQ that INI QPs and XRC SRQs need (created lazily). */
struct ibcm_xrc_dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
};

static int errno_or(int fallback)
{
	return errno ? errno : fallback;
}

int ibcm_xrc_open(const char *name, struct ibcm_xrc_dev **out, char *name_out,
		  size_t name_len, uint64_t *cap_flags)
{
	struct ibv_device **list;
	struct ibv_device *dev = NULL;
	struct ibv_device_attr attr;
	struct ibcm_xrc_dev *d;
	int num = 0, i, ret;

	*out = NULL;
	errno = 0;
	list = ibv_get_device_list(&num);
	/* NULL (errno ENOSYS) when the kernel has no uverbs support at all: no device either. */
	if (!list)
		return ENODEV;
	if (num == 0) {
		ibv_free_device_list(list);
		return ENODEV;
	}
	for (i = 0; i < num; i++) {
		if (!name || strcmp(ibv_get_device_name(list[i]), name) == 0) {
			dev = list[i];
			break;
		}
	}
	if (!dev) {
		ibv_free_device_list(list);
		return ENOENT;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		ibv_free_device_list(list);
		return ENOMEM;
	}
	if (name_out && name_len > 0) {
		strncpy(name_out, ibv_get_device_name(dev), name_len - 1);
		name_out[name_len - 1] = '\0';
	}
	errno = 0;
	d->ctx = ibv_open_device(dev);
	ibv_free_device_list(list);
	if (!d->ctx) {
		ret = errno_or(EIO);
		free(d);
		return ret;
	}
	memset(&attr, 0, sizeof(attr));
	ret = ibv_query_device(d->ctx, &attr);
	if (ret) {
		ibv_close_device(d->ctx);
		free(d);
		return ret;
	}
	*cap_flags = (uint64_t)attr.device_cap_flags;
	*out = d;
	return 0;
}

void ibcm_xrc_close(struct ibcm_xrc_dev *d)
{
	if (!d)
		return;
	if (d->cq)
		ibv_destroy_cq(d->cq);
	if (d->pd)
		ibv_dealloc_pd(d->pd);
	ibv_close_device(d->ctx);
	free(d);
}

static int ensure_pd_cq(struct ibcm_xrc_dev *d)
{
	if (!d->pd) {
		errno = 0;
		d->pd = ibv_alloc_pd(d->ctx);
		if (!d->pd)
			return errno_or(ENOMEM);
	}
	if (!d->cq) {
		errno = 0;
		d->cq = ibv_create_cq(d->ctx, 256, NULL, NULL, 0);
		if (!d->cq)
			return errno_or(ENOMEM);
	}
	return 0;
}

int ibcm_xrc_open_xrcd(struct ibcm_xrc_dev *d, int fd, int create, int exclusive,
		       struct ibv_xrcd **out)
{
	struct ibv_xrcd_init_attr a;

	memset(&a, 0, sizeof(a));
	a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	a.fd = fd;
	a.oflags = (create ? O_CREAT : 0) | (exclusive ? O_EXCL : 0);
	errno = 0;
	*out = ibv_open_xrcd(d->ctx, &a);
	return *out ? 0 : errno_or(EINVAL);
}

int ibcm_xrc_close_xrcd(struct ibv_xrcd *x)
{
	return ibv_close_xrcd(x);
}

int ibcm_xrc_create_tgt_qp(struct ibcm_xrc_dev *d, struct ibv_xrcd *x, struct ibv_qp **out,
			   uint32_t *qpn)
{
	struct ibv_qp_init_attr_ex a;

	memset(&a, 0, sizeof(a));
	a.qp_type = IBV_QPT_XRC_RECV;
	a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	a.xrcd = x;
	errno = 0;
	*out = ibv_create_qp_ex(d->ctx, &a);
	if (!*out)
		return errno_or(EINVAL);
	*qpn = (*out)->qp_num;
	return 0;
}

int ibcm_xrc_open_tgt_qp(struct ibcm_xrc_dev *d, struct ibv_xrcd *x, uint32_t qpn,
			 struct ibv_qp **out)
{
	struct ibv_qp_open_attr a;

	memset(&a, 0, sizeof(a));
	a.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	a.qp_num = qpn;
	a.xrcd = x;
	a.qp_type = IBV_QPT_XRC_RECV;
	errno = 0;
	*out = ibv_open_qp(d->ctx, &a);
	return *out ? 0 : errno_or(EINVAL);
}

int ibcm_xrc_create_ini_qp(struct ibcm_xrc_dev *d, uint32_t max_send_wr,
			   uint32_t max_send_sge, uint32_t max_inline, struct ibv_qp **out,
			   uint32_t *qpn)
{
	struct ibv_qp_init_attr_ex a;
	int ret;

	*out = NULL;
	ret = ensure_pd_cq(d);
	if (ret)
		return ret;
	memset(&a, 0, sizeof(a));
	a.qp_type = IBV_QPT_XRC_SEND;
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	a.pd = d->pd;
	a.send_cq = d->cq;
	a.recv_cq = d->cq;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_send_sge = max_send_sge;
	a.cap.max_inline_data = max_inline;
	errno = 0;
	*out = ibv_create_qp_ex(d->ctx, &a);
	if (!*out)
		return errno_or(EINVAL);
	*qpn = (*out)->qp_num;
	return 0;
}

int ibcm_xrc_create_srq(struct ibcm_xrc_dev *d, struct ibv_xrcd *x, uint32_t max_wr,
			uint32_t max_sge, uint32_t limit, struct ibv_srq **out, uint32_t *srqn)
{
	struct ibv_srq_init_attr_ex a;
	int ret;

	*out = NULL;
	ret = ensure_pd_cq(d);
	if (ret)
		return ret;
	memset(&a, 0, sizeof(a));
	a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
		      IBV_SRQ_INIT_ATTR_PD;
	a.srq_type = IBV_SRQT_XRC;
	a.xrcd = x;
	a.cq = d->cq;
	a.pd = d->pd;
	a.attr.max_wr = max_wr;
	a.attr.max_sge = max_sge;
	a.attr.srq_limit = limit;
	errno = 0;
	*out = ibv_create_srq_ex(d->ctx, &a);
	if (!*out)
		return errno_or(EINVAL);
	ret = ibv_get_srq_num(*out, srqn);
	if (ret) {
		ibv_destroy_srq(*out);
		*out = NULL;
		return ret;
	}
	return 0;
}

int ibcm_xrc_destroy_srq(struct ibv_srq *s)
{
	return ibv_destroy_srq(s);
}

static void fill_av(struct ibv_ah_attr *dst, const struct ibcm_xrc_av *src)
{
	memcpy(dst->grh.dgid.raw, src->dgid, 16);
	dst->grh.flow_label = src->flow_label;
	dst->grh.sgid_index = src->sgid_index;
	dst->grh.hop_limit = src->hop_limit;
	dst->grh.traffic_class = src->traffic_class;
	dst->dlid = src->dlid;
	dst->sl = src->sl;
	dst->src_path_bits = src->src_path_bits;
	dst->static_rate = src->static_rate;
	dst->is_global = src->is_global;
	dst->port_num = src->port_num;
}

int ibcm_xrc_modify_qp(struct ibv_qp *qp, const struct ibcm_xrc_qp_attr *s, int mask)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = (enum ibv_qp_state)s->qp_state;
	a.cur_qp_state = (enum ibv_qp_state)s->cur_qp_state;
	a.path_mtu = (enum ibv_mtu)s->path_mtu;
	a.path_mig_state = (enum ibv_mig_state)s->path_mig_state;
	a.qkey = s->qkey;
	a.rq_psn = s->rq_psn;
	a.sq_psn = s->sq_psn;
	a.dest_qp_num = s->dest_qp_num;
	a.qp_access_flags = s->qp_access_flags;
	a.pkey_index = s->pkey_index;
	a.alt_pkey_index = s->alt_pkey_index;
	a.en_sqd_async_notify = s->en_sqd_async_notify;
	a.max_rd_atomic = s->max_rd_atomic;
	a.max_dest_rd_atomic = s->max_dest_rd_atomic;
	a.min_rnr_timer = s->min_rnr_timer;
	a.port_num = s->port_num;
	a.timeout = s->timeout;
	a.retry_cnt = s->retry_cnt;
	a.rnr_retry = s->rnr_retry;
	a.alt_port_num = s->alt_port_num;
	a.alt_timeout = s->alt_timeout;
	fill_av(&a.ah_attr, &s->av);
	fill_av(&a.alt_ah_attr, &s->alt_av);
	return ibv_modify_qp(qp, &a, mask);
}

int ibcm_xrc_query_qp(struct ibv_qp *qp, uint32_t *state, uint32_t *dest_qpn, uint32_t *qp_type,
		      uint32_t *qpn)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr init;
	int ret;

	memset(&a, 0, sizeof(a));
	memset(&init, 0, sizeof(init));
	ret = ibv_query_qp(qp, &a, IBV_QP_STATE | IBV_QP_DEST_QPN, &init);
	if (ret)
		return ret;
	*state = (uint32_t)a.qp_state;
	*dest_qpn = a.dest_qp_num;
	*qp_type = (uint32_t)qp->qp_type;
	*qpn = qp->qp_num;
	return 0;
}

int ibcm_xrc_destroy_qp(struct ibv_qp *qp)
{
	return ibv_destroy_qp(qp);
}

/* Layout checks for the Rust mirrors. */
size_t ibcm_xrc_av_size(void)
{
	return sizeof(struct ibcm_xrc_av);
}

size_t ibcm_xrc_qp_attr_size(void)
{
	return sizeof(struct ibcm_xrc_qp_attr);
}
