/*
 * unsupported.c -- what this librdmacm does not do, each failing at once with the errno
 * docs/rdmacm.md §4 lists (never a crash or a hang):
 *
 *   multicast (rdma_join_multicast, _ex, rdma_leave_multicast)    ENOSYS
 *   ECE (rdma_set_local_ece, rdma_get_remote_ece, rdma_reject_ece) EOPNOTSUPP
 *   rsockets (rsocket, rbind, ..., riowrite)                       ENOSYS
 *
 * The node service's CM has no multicast group management (an SA MCMemberRecord join on
 * native IB, IGMP on RoCE) and no ECE; rsockets is a socket library of its own on top of
 * rdma_cm that this library does not carry.
 */
#include <errno.h>
#include <rdma/rsocket.h>

#include "rdmacm.h"

RC_EXPORT int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
	(void)id; (void)addr; (void)context;
	rc_trace("rdma_join_multicast: multicast is not supported");
	return rc_err(ENOSYS);
}

RC_EXPORT int rdma_join_multicast_ex(struct rdma_cm_id *id,
				     struct rdma_cm_join_mc_attr_ex *mc_join_attr, void *context)
{
	(void)id; (void)mc_join_attr; (void)context;
	return rc_err(ENOSYS);
}

RC_EXPORT int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	(void)id; (void)addr;
	return rc_err(ENOSYS);
}

RC_EXPORT int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id; (void)ece;
	return rc_err(EOPNOTSUPP);
}

RC_EXPORT int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id; (void)ece;
	return rc_err(EOPNOTSUPP);
}

RC_EXPORT int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data, uint8_t len)
{
	(void)id; (void)private_data; (void)len;
	return rc_err(EOPNOTSUPP);
}

#define NOSYS(ret) do { errno = ENOSYS; return (ret); } while (0)

RC_EXPORT int rsocket(int domain, int type, int protocol)
{ (void)domain; (void)type; (void)protocol; NOSYS(-1); }
RC_EXPORT int rbind(int s, const struct sockaddr *a, socklen_t l)
{ (void)s; (void)a; (void)l; NOSYS(-1); }
RC_EXPORT int rlisten(int s, int backlog)
{ (void)s; (void)backlog; NOSYS(-1); }
RC_EXPORT int raccept(int s, struct sockaddr *a, socklen_t *l)
{ (void)s; (void)a; (void)l; NOSYS(-1); }
RC_EXPORT int rconnect(int s, const struct sockaddr *a, socklen_t l)
{ (void)s; (void)a; (void)l; NOSYS(-1); }
RC_EXPORT int rshutdown(int s, int how)
{ (void)s; (void)how; NOSYS(-1); }
RC_EXPORT int rclose(int s)
{ (void)s; NOSYS(-1); }
RC_EXPORT ssize_t rrecv(int s, void *b, size_t n, int f)
{ (void)s; (void)b; (void)n; (void)f; NOSYS(-1); }
RC_EXPORT ssize_t rrecvfrom(int s, void *b, size_t n, int f, struct sockaddr *a, socklen_t *l)
{ (void)s; (void)b; (void)n; (void)f; (void)a; (void)l; NOSYS(-1); }
RC_EXPORT ssize_t rrecvmsg(int s, struct msghdr *m, int f)
{ (void)s; (void)m; (void)f; NOSYS(-1); }
RC_EXPORT ssize_t rsend(int s, const void *b, size_t n, int f)
{ (void)s; (void)b; (void)n; (void)f; NOSYS(-1); }
RC_EXPORT ssize_t rsendto(int s, const void *b, size_t n, int f, const struct sockaddr *a,
			  socklen_t l)
{ (void)s; (void)b; (void)n; (void)f; (void)a; (void)l; NOSYS(-1); }
RC_EXPORT ssize_t rsendmsg(int s, const struct msghdr *m, int f)
{ (void)s; (void)m; (void)f; NOSYS(-1); }
RC_EXPORT ssize_t rread(int s, void *b, size_t n)
{ (void)s; (void)b; (void)n; NOSYS(-1); }
RC_EXPORT ssize_t rreadv(int s, const struct iovec *v, int n)
{ (void)s; (void)v; (void)n; NOSYS(-1); }
RC_EXPORT ssize_t rwrite(int s, const void *b, size_t n)
{ (void)s; (void)b; (void)n; NOSYS(-1); }
RC_EXPORT ssize_t rwritev(int s, const struct iovec *v, int n)
{ (void)s; (void)v; (void)n; NOSYS(-1); }
RC_EXPORT int rpoll(struct pollfd *fds, nfds_t n, int t)
{ (void)fds; (void)n; (void)t; NOSYS(-1); }
RC_EXPORT int rselect(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *t)
{ (void)n; (void)r; (void)w; (void)e; (void)t; NOSYS(-1); }
RC_EXPORT int rgetpeername(int s, struct sockaddr *a, socklen_t *l)
{ (void)s; (void)a; (void)l; NOSYS(-1); }
RC_EXPORT int rgetsockname(int s, struct sockaddr *a, socklen_t *l)
{ (void)s; (void)a; (void)l; NOSYS(-1); }
RC_EXPORT int rsetsockopt(int s, int lv, int o, const void *v, socklen_t l)
{ (void)s; (void)lv; (void)o; (void)v; (void)l; NOSYS(-1); }
RC_EXPORT int rgetsockopt(int s, int lv, int o, void *v, socklen_t *l)
{ (void)s; (void)lv; (void)o; (void)v; (void)l; NOSYS(-1); }
RC_EXPORT int rfcntl(int s, int cmd, ...)
{ (void)s; (void)cmd; NOSYS(-1); }
RC_EXPORT off_t riomap(int s, void *b, size_t n, int p, int f, off_t o)
{ (void)s; (void)b; (void)n; (void)p; (void)f; (void)o; NOSYS((off_t)-1); }
RC_EXPORT int riounmap(int s, void *b, size_t n)
{ (void)s; (void)b; (void)n; NOSYS(-1); }
RC_EXPORT size_t riowrite(int s, const void *b, size_t n, off_t o, int f)
{ (void)s; (void)b; (void)n; (void)o; (void)f; errno = ENOSYS; return 0; }
